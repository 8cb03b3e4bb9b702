"""What the benchmarks share: the published model shapes they build with random weights (no download), and a
meter of every forward of a causal LM's decoder, attributed to the phase that ran it.

Not a benchmark itself (tests/benchmarks/test_smoke.py runs it through the benchmarks that import it).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import asdict, dataclass

# The published configs (config.json of Qwen/Qwen2.5-0.5B-Instruct and Qwen/Qwen2.5-1.5B-Instruct), written out so
# that no download is needed; the weights are random. The tokenizer is the one sdar.models.qwen builds offline.
QWEN25_SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": {
        "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "max_position_embeddings": 32768, "max_window_layers": 21, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "sliding_window": 32768, "use_sliding_window": False, "tie_word_embeddings": True,
        "vocab_size": 151936, "hidden_act": "silu", "initializer_range": 0.02, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645,
    },
    "qwen2.5-1.5b": {
        "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
        "num_key_value_heads": 2, "max_position_embeddings": 32768, "max_window_layers": 21, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "sliding_window": 32768, "use_sliding_window": False, "tie_word_embeddings": True,
        "vocab_size": 151936, "hidden_act": "silu", "initializer_range": 0.02, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645,
    },
}
SHAPES = ("tiny", "smollm2", *QWEN25_SHAPES)  # tiny: the config's own model (its warm start); smollm2: SmolLM2-135M-Instruct, real weights
# the models with their real weights (the rest are published shapes with random weights)
REAL = ("tiny", "smollm2")


def model_arg(value: str) -> str:
    """argparse's type for --model: one of SHAPES, or a local checkpoint directory (transformers' layout, its
    config.json in it: the user's own model, real weights, warm-started when the config says so), made absolute."""
    import argparse
    from pathlib import Path

    if value in SHAPES:
        return value
    path = Path(value).expanduser()
    if (path / "config.json").is_file():
        return str(path.resolve())
    why = "a directory without config.json" if path.is_dir() else "neither a model name nor a directory"
    raise argparse.ArgumentTypeError(f"{value!r} is {why}: give one of {', '.join(SHAPES)}, or a local checkpoint "
                                     "directory as transformers saves one (config.json and the weights)")


def is_checkpoint_dir(shape: str) -> bool:
    """A --model that model_arg took as a local checkpoint directory."""
    return shape not in SHAPES


def random_policy(shape: str, model_cfg, *, layers: int | None = None, device: str = "cpu", seed: int = 0):
    """An `sdar.models.Policy` of a published shape with random weights, the Qwen2.5 tokenizer and `model_cfg`'s
    training settings (a TrainConfig's `model` section: dtype, LoRA or full fine-tuning). layers: keep only the
    first N decoder layers (a CPU-sized model of the same width and vocabulary)."""
    import copy

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sdar.models import ModelSpec, Policy
    from sdar.models.policy import _prepare_tokenizer
    from sdar.models.qwen import load_qwen_tokenizer

    if shape not in QWEN25_SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; choose one of {', '.join(SHAPES)}")
    fields = dict(QWEN25_SHAPES[shape])
    if layers is not None:
        if not 1 <= layers <= fields["num_hidden_layers"]:
            raise ValueError(f"--layers must be 1..{fields['num_hidden_layers']} for {shape}, got {layers}")
        fields["num_hidden_layers"] = layers
        fields["max_window_layers"] = min(fields["max_window_layers"], layers)
    tok = _prepare_tokenizer(load_qwen_tokenizer())
    spec = ModelSpec.from_config(model_cfg, f"random:{shape}")
    config = Qwen2Config(**fields, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it runs: a 1.5B model's init on the host takes minutes
        model = Qwen2ForCausalLM(config).to(spec.torch_dtype)
    if spec.gradient_checkpointing:
        from sdar.models.policy import _enable_checkpointing

        _enable_checkpointing(model)
    if not spec.lora:
        reference = copy.deepcopy(model).eval().requires_grad_(False)
        return Policy(model, tok, spec, reference_model=reference)
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=spec.lora_r, lora_alpha=spec.lora_alpha, lora_dropout=spec.lora_dropout,
                      target_modules=list(spec.lora_target_modules), bias="none", task_type="CAUSAL_LM")
    return Policy(get_peft_model(model, lora), tok, spec)


@dataclass
class PhaseFigures:
    """One phase's forwards of the decoder. positions: input positions forwarded (rows x width, padding included);
    real: the positions the attention mask marks as tokens; model_s: seconds inside the decoder and the output head
    (on a GPU the device's seconds between CUDA events); decode_steps: forwards on a KV cache (the sampler's
    steps); grad_positions: the positions of forwards that ran with gradients (the update's micro-batches, not its
    no-grad checks)."""

    seconds: float = 0.0
    forwards: int = 0
    positions: int = 0
    real: int = 0
    grad_positions: int = 0
    model_s: float = 0.0
    decode_steps: int = 0

    @property
    def tokens_per_forward(self) -> float:
        return self.positions / self.forwards if self.forwards else 0.0

    @property
    def padding(self) -> float:
        return 1.0 - self.real / self.positions if self.positions else 0.0

    @property
    def host_s(self) -> float:
        """The phase's seconds outside the model: Python, tokenizing, environments, sampling, the softmax over the
        vocabulary, the loss, the optimizer."""
        return max(self.seconds - self.model_s, 0.0)

    def as_dict(self) -> dict:
        return {**asdict(self), "tokens_per_forward": self.tokens_per_forward, "padding": self.padding,
                "host_s": self.host_s}


def decoder_types(model) -> set[type]:
    """The classes of the decoder stacks inside `model` (Qwen2Model, LlamaModel, ...): a transformers model with a
    list of layers and token embeddings. Every copy the trainer makes (a merged adapter, the plain reference) has
    the same class."""
    import torch
    from transformers import PreTrainedModel

    return {type(m) for m in model.modules() if isinstance(m, PreTrainedModel)
            and isinstance(getattr(m, "layers", None), torch.nn.ModuleList) and hasattr(m, "embed_tokens")}


class ForwardMeter:
    """Counts every forward of a decoder of `types`, whichever module object runs it and whichever function calls
    it, through global module hooks (torch.nn.modules.module.register_module_forward_*_hook): nothing in the
    trainer is patched, so moving its functions around cannot break the count. The output head (a linear layer
    onto `vocab` logits) is timed as model time too. `with meter.phase("rollout"):` attributes the forwards and
    the seconds inside the block to that phase; forwards outside any phase go to "other".

    On a GPU the model's time is the device's, between CUDA events recorded in the hooks, and nothing is
    synchronised but at a phase's start and end: the host keeps queuing kernels ahead as it would unmetered, and a
    phase's seconds minus its model seconds are the time the device was not running the model (host-bound)."""

    def __init__(self, types: set[type], vocab: int) -> None:
        import torch

        if not types:
            raise ValueError("no decoder class to meter: the model has no transformers decoder stack")
        self.types, self.vocab, self.linear, self.torch = tuple(types), vocab, torch.nn.Linear, torch
        self.figures: dict[str, PhaseFigures] = defaultdict(PhaseFigures)
        self.current = "other"
        self._started: dict[int, object] = {}  # module -> its forward's start (perf_counter, or a CUDA event)
        self._pending: list[tuple[str, object, object, object]] = []  # (phase, start, end, real tokens) on a GPU
        self._handles: list = []

    @classmethod
    def of(cls, model) -> ForwardMeter:
        """A meter of `model`'s decoder class and output head (a transformers causal LM, peft-wrapped or not)."""
        return cls(decoder_types(model), int(model.get_output_embeddings().out_features))

    def __enter__(self) -> ForwardMeter:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        self._handles = [register_module_forward_pre_hook(self._pre),
                         register_module_forward_hook(self._post, with_kwargs=True, always_call=True)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def reset(self) -> None:
        self.figures = defaultdict(PhaseFigures)

    def phase(self, name: str):
        meter = self

        class _Phase:
            def __enter__(self):
                self.before, meter.current = meter.current, name
                _sync()
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                _sync()
                meter.figures[name].seconds += time.perf_counter() - self.t0
                meter.current = self.before
                meter._settle()

        return _Phase()

    def _settle(self) -> None:
        """Fold the GPU's recorded forwards into the figures (their events have completed: the phase synchronised)."""
        for phase, start, end, real in self._pending:
            f = self.figures[phase]
            f.model_s += start.elapsed_time(end) / 1000
            f.real += int(real)
        self._pending = []

    def _timed(self, module) -> bool:
        return isinstance(module, self.types) or (isinstance(module, self.linear) and module.out_features == self.vocab)

    def _clock(self, module):
        """Now, as this module's forward sees it: a CUDA event recorded on the current stream, or perf_counter."""
        weight = next(module.parameters(), None)
        if weight is not None and weight.is_cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _pre(self, module, args) -> None:
        if self._timed(module):
            self._started[id(module)] = self._clock(module)

    def _post(self, module, args, kwargs, output) -> None:
        if not self._timed(module) or id(module) not in self._started:
            return
        start, end = self._started.pop(id(module)), self._clock(module)
        f = self.figures[self.current]
        on_gpu = not isinstance(start, float)
        if not on_gpu:
            f.model_s += end - start
        decoder = isinstance(module, self.types)
        if decoder:
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is None:  # inputs_embeds [B, T, H]
                ids = kwargs["inputs_embeds"][..., 0]
            rows, width = ids.shape[0], ids.shape[-1]
            mask = kwargs.get("attention_mask")
            real = mask[:, -width:].sum() if mask is not None and getattr(mask, "dim", lambda: 0)() == 2 else rows * width
            if mask is not None and getattr(mask, "dim", lambda: 0)() == 4 and mask.shape[-2] == width:
                # a tree mask (sdar.models.packing): a real position attends to itself, a pad does not
                diag = mask[:, 0].diagonal(dim1=-2, dim2=-1)
                real = (diag if diag.dtype == self.torch.bool else diag == 0).sum()
            # on a KV cache: the mask covers more positions than the input (whatever the cache's argument is called:
            # past_key_values, or cache from transformers 5.24 on)
            past = kwargs.get("cache", kwargs.get("past_key_values"))
            cached = (mask is not None and mask.shape[-1] > width) or (
                past is not None and (past.get_seq_length() if hasattr(past, "get_seq_length") else 1) > 0)
            f.forwards += 1
            f.positions += rows * width
            f.grad_positions += rows * width if self.torch.is_grad_enabled() else 0
            f.decode_steps += int(cached)
        if on_gpu:  # read when the phase ends: reading a GPU tensor now would synchronise
            self._pending.append((self.current, start, end, real if decoder else 0))
        elif decoder:
            f.real += int(real)


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def matmul_rate(dtype, device: str = "cpu", n: int = 2048, seconds: float = 2.0) -> float:
    """FLOP/s of an n x n by n x n matrix product in `dtype` on `device`, measured now (the best of repeated runs of
    about `seconds` in all, after one warm-up): the rate a model's linear layers can reach at most."""
    import torch

    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    a @ b
    _sync()
    best, spent = float("inf"), 0.0
    while spent < seconds:
        t0 = time.perf_counter()
        a @ b
        _sync()
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
    return 2 * n**3 / best


def linear_flops_per_position(model) -> dict[str, float]:
    """FLOPs per forwarded position of the decoder's linear layers (2 x their weights: projections and MLP; the output
    head, computed at a subset of positions, and attention's scores, small at these lengths, are left out, so a floor
    built on it is a lower bound): {"forward": 2N, "train": 4N with LoRA (backward to the inputs through the frozen
    weights; the adapter's own gradients are negligible) or 6N with full fine-tuning (the weights' gradients too)}."""
    import torch

    head = model.get_output_embeddings()
    seen, n = set(), 0
    for name, mod in model.named_modules():
        # the adapters' own r x d matrices (peft's lora_A / lora_B) are not counted: they are the base layer's delta
        if isinstance(mod, torch.nn.Linear) and mod is not head and "lora_" not in name and id(mod.weight) not in seen:
            seen.add(id(mod.weight))
            n += mod.weight.numel()
    full = any(p.requires_grad for p in model.get_input_embeddings().parameters())
    return {"forward": 2.0 * n, "train": (6.0 if full else 4.0) * n, "linear_weights": float(n)}


ATTENTION_OPS = ("aten::bmm", "aten::baddbmm", "aten::_softmax", "aten::_softmax_backward_data", "aten::_safe_softmax",
                 "aten::isneginf")


def op_attribution(prof, vocab: int, lora_r: int | None) -> dict:
    """Where a profiled CPU region's seconds went (`prof`: a finished torch.profiler.profile with record_shapes),
    by each op's self time: the matrix multiplies of the decoder's linear layers, of the LoRA adapter (a dimension
    of `lora_r`), of the output head (a dimension of `vocab`), attention (batched matmuls, the softmax and its
    masking, the fused kernels), and everything else (norms, activations, casts, the loss, the optimizer), its
    largest ops named. Matmul parts carry their FLOPs (2 x M x K x N from the recorded shapes)."""
    parts = {k: {"seconds": 0.0, "flops": 0.0} for k in ("linear layers", "LoRA adapter", "output head", "attention",
                                                            "everything else")}
    rest: dict[str, float] = {}
    for e in prof.key_averages(group_by_input_shape=True):
        s = e.self_cpu_time_total / 1e6
        shapes = [tuple(x) for x in (e.input_shapes or []) if isinstance(x, (list, tuple))]
        mats = [x for x in shapes if len(x) in (2, 3)]
        flops = 0.0
        if e.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm") and len(mats) >= 2:
            a, b = mats[-2], mats[-1]  # addmm / baddbmm: (bias, a, b)
            flops = 2.0 * math.prod(a) * b[-1] * e.count
        dims = {d for x in mats for d in x}
        if e.key in ("aten::mm", "aten::addmm", "aten::bmm") and vocab in dims:
            part = "output head"
        elif e.key in ("aten::mm", "aten::addmm"):
            part = "LoRA adapter" if lora_r is not None and lora_r in dims else "linear layers"
        elif e.key in ATTENTION_OPS or "scaled_dot_product" in e.key:
            part = "attention"
        else:
            part = "everything else"
            rest[e.key] = rest.get(e.key, 0.0) + s
        parts[part]["seconds"] += s
        parts[part]["flops"] += flops
    total = sum(p["seconds"] for p in parts.values())
    top = sorted(rest.items(), key=lambda kv: -kv[1])[:4]
    return {"parts": parts, "total_s": total, "rest_top": top}
