"""`sdar plan`: GPU memory per model role (actor, reference, rollout engine, teacher) of the SDAR
on-policy loop, whether it fits, which AWS instance to rent and what a run costs.

Everything is computed from the architecture with the formulas written next to each number, so a
person can check them by hand (tests/test_plan.py does). `make_plan(model, gpus=8, gpu_mem=80)`
is the importable entry point; `sdar plan` prints it as a table (or `--json`). `sdar plan --config
configs/paper/alfworld-qwen2.5-7b.yaml` takes the run's settings from a training config
(`settings_from_config`); flags given explicitly override them.

Units: B = bytes, GiB = 2**30 bytes. `--gpu-mem` is the card's nominal size, read as GiB.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

GiB = 2**30


class PlanError(ValueError):
    """Bad input to the planner; the message says what was wrong and what to do."""


# ---------------------------------------------------------------------------------------------
# architectures


@dataclass(frozen=True)
class Arch:
    """A decoder-only transformer of the Qwen2/Llama family (RMSNorm, GQA, SwiGLU MLP, RoPE)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tie_embeddings: bool
    qkv_bias: bool = True  # Qwen2 has biases on q, k, v (not on o); Llama/SmolLM2 has none
    head_dim: int | None = None  # None = hidden // heads
    published_params: float | None = None  # the total the model card states, for the tests

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.hd

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.hd

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of the seven linear layers of one decoder layer (the LoRA targets)."""
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_params(self) -> int:
        """One decoder layer: q/k/v (+ biases), o_proj, 3 MLP matrices, 2 RMSNorm weights."""
        weights = sum(a * b for a, b in self.linear_shapes().values())
        biases = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        return weights + biases + 2 * self.hidden

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def lm_head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab * self.hidden

    def root_params(self) -> int:
        """What is outside the decoder layers: embeddings, lm_head (if untied), final norm."""
        return self.embedding_params() + self.lm_head_params() + self.hidden

    def params(self) -> int:
        return self.layers * self.layer_params() + self.root_params()

    def lora_params(self, r: int) -> int:
        """LoRA A [r, in] and B [out, r] on all seven linear layers of every decoder layer."""
        return self.layers * sum(r * (a + b) for a, b in self.linear_shapes().values())

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """K and V of every layer for one token: 2 * layers * kv_heads * head_dim * bytes."""
        return 2 * self.layers * self.kv_heads * self.hd * bytes_per_value


# Real config.json numbers of the published checkpoints. Qwen2.5-7B/14B pad their vocabulary to
# 152064 rows (0.5B-3B: 151936) and do not tie the lm_head; that is what makes 7.62B and 14.77B.
ARCHS: dict[str, Arch] = {
    a.name.lower(): a
    for a in (
        Arch("Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936, True, published_params=0.49e9),
        Arch("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, True, published_params=1.54e9),
        Arch("Qwen2.5-3B", 2048, 36, 16, 2, 11008, 151936, True, published_params=3.09e9),
        Arch("Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, False, published_params=7.61e9),
        Arch("Qwen2.5-14B", 5120, 48, 40, 8, 13824, 152064, False, published_params=14.7e9),
        Arch("SmolLM2-135M", 576, 30, 9, 3, 1536, 49152, True, False, published_params=134.5e6),
        # the packaged tiny-qwen2.yaml on the default 4096-token local tokenizer (CPU runs)
        Arch("tiny", 256, 4, 4, 2, 768, 4096, True),
    )
}
_ALIASES = {"smollm2": "smollm2-135m", "qwen2.5": "qwen2.5-7b"}


def _normalize(name: str) -> str:
    key = name.strip().lower()
    for prefix in ("qwen/", "huggingfacetb/"):
        key = key.removeprefix(prefix)
    key = key.removesuffix("-instruct")
    return _ALIASES.get(key, key)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmbt]?)\s*$", re.IGNORECASE)
_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_size(text: str) -> float | None:
    """'7b' -> 7e9, '135M' -> 1.35e8, '7e9' -> 7e9; None when `text` is not a size."""
    m = _SIZE.match(text)
    if not m:
        return None
    value = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if value < 1e6:
        raise PlanError(
            f"model size {text!r} is too small to be a parameter count; "
            "write it with a unit, like 7b, 1.5b, 135m or 7e9"
        )
    return value


def _scaled_arch(target: float, template: Arch) -> Arch:
    """A Qwen2-like architecture of about `target` parameters: the template's depth scaled by the
    cube root of the size ratio, then the width (a multiple of head_dim) that comes closest."""
    layers = max(2, round(template.layers * (target / template.params()) ** (1 / 3)))
    hd, ratio = template.hd, template.intermediate / template.hidden
    best = None
    for heads in range(2, 257):
        h = heads * hd
        kv = math.gcd(heads, template.kv_heads)
        inter = max(hd, round(ratio * h / 128) * 128)
        cand = Arch(f"generic-{target / 1e9:g}B", h, layers, heads, kv, inter, template.vocab,
                    template.tie_embeddings, template.qkv_bias)
        if best is None or abs(cand.params() - target) < abs(best.params() - target):
            best = cand
    return best


def resolve_model(text: str) -> tuple[Arch, str]:
    """An architecture for `--model`: a table name, a size (7b, 7e9) or a local config.json path.
    Returns (arch, a sentence saying where the architecture came from)."""
    if not text or not text.strip():
        raise PlanError("--model is empty; " + _known_models_hint())
    key = _normalize(text)
    if key in ARCHS:
        a = ARCHS[key]
        return a, "built-in table of config.json numbers"
    path = Path(text).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        return arch_from_config(path), f"read from {path}"
    size = parse_size(text)
    if size is None:
        raise PlanError(f"unknown model {text!r}; " + _known_models_hint())
    real = [a for a in ARCHS.values() if a.name != "tiny"]
    nearest = min(real, key=lambda a: abs(math.log(a.params() / size)))
    if abs(math.log(nearest.params() / size)) <= math.log(1.2):
        return nearest, (
            f"size {text} -> nearest table architecture {nearest.name} "
            f"({nearest.params() / 1e9:.2f}B params)"
        )
    qwen = [a for a in real if a.name.startswith("Qwen")]
    template = min(qwen, key=lambda a: abs(math.log(a.params() / size)))
    a = _scaled_arch(size, template)
    return a, (
        f"size {text}: no table architecture within 20%, generic scaling of {template.name}: "
        f"{a.layers} layers, hidden {a.hidden}, {a.heads} heads ({a.kv_heads} KV), "
        f"MLP {a.intermediate} = {a.params() / 1e9:.2f}B params"
    )


def arch_from_config(path: str | Path) -> Arch:
    """An Arch from a Hugging Face config.json (Qwen2, Llama and similar decoder configs)."""
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanError(f"cannot read a model config from {path}: {exc}") from None
    cfg = cfg.get("text_config", cfg)
    need = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "vocab_size")
    missing = [k for k in need if k not in cfg]
    if missing:
        raise PlanError(
            f"{path} lacks {', '.join(missing)}; pass a decoder config.json "
            "(Qwen2/Llama style) or a model name/size"
        )
    model_type = str(cfg.get("model_type", ""))
    return Arch(
        name=str(cfg.get("_name_or_path") or Path(path).parent.name or model_type or "config"),
        hidden=int(cfg["hidden_size"]),
        layers=int(cfg["num_hidden_layers"]),
        heads=int(cfg["num_attention_heads"]),
        kv_heads=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
        intermediate=int(cfg["intermediate_size"]),
        vocab=int(cfg["vocab_size"]),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", model_type.startswith("qwen2"))),
        head_dim=cfg.get("head_dim"),
    )


def _known_models_hint() -> str:
    names = ", ".join(a.name for a in ARCHS.values())
    return f"known models: {names}; or a size (7b, 1.5b, 7e9) or a local config.json path"


# ---------------------------------------------------------------------------------------------
# instances and prices

# us-east-1 on-demand Linux list prices (USD per instance hour) as of 2025-01. They change: AWS cut
# P4/P5 on-demand prices by up to 45% in June 2025. Check https://aws.amazon.com/ec2/pricing/on-demand/
# (or `aws pricing get-products`) before trusting a cost, and pass --price to override.
PRICES_AS_OF = "2025-01"


@dataclass(frozen=True)
class Instance:
    name: str
    gpus: int
    gpu: str
    gpu_mem: int  # GiB per GPU (nominal)
    on_demand: float  # USD per hour, us-east-1, PRICES_AS_OF


INSTANCES: tuple[Instance, ...] = (
    Instance("g6.xlarge", 1, "L4", 24, 0.805),
    Instance("g5.xlarge", 1, "A10G", 24, 1.006),
    Instance("g6e.xlarge", 1, "L40S", 48, 1.861),
    Instance("g6.12xlarge", 4, "L4", 24, 4.602),
    Instance("g5.12xlarge", 4, "A10G", 24, 5.672),
    Instance("g6e.12xlarge", 4, "L40S", 48, 10.493),
    Instance("g6.48xlarge", 8, "L4", 24, 13.350),
    Instance("g5.48xlarge", 8, "A10G", 24, 16.288),
    Instance("g6e.48xlarge", 8, "L40S", 48, 30.131),
    Instance("p4d.24xlarge", 8, "A100", 40, 32.773),
    Instance("p4de.24xlarge", 8, "A100", 80, 40.966),
    Instance("p5.48xlarge", 8, "H100", 80, 98.320),
)
_INSTANCE_BY_NAME = {i.name: i for i in INSTANCES}


# ---------------------------------------------------------------------------------------------
# settings


@dataclass
class PlanSettings:
    """Every knob of the plan, with its default. Paper defaults (../shared/ALGORITHM.md) where the
    paper gives one; the sequence lengths follow verl-agent's ALFWorld script."""

    gpus: int = 8  # GPUs in the run
    gpu_mem: float = 80.0  # GiB per GPU (nominal card size)
    lora: bool = False  # LoRA adapter (base frozen) instead of a full fine-tune
    lora_r: int = 16  # LoRA rank on q, k, v, o, gate, up, down
    shard: bool = True  # FSDP / ZeRO-3: weights, grads and Adam sharded over the training GPUs
    checkpointing: bool = True  # gradient checkpointing: keep only each layer's input
    seq_len: int = 2560  # tokens of one turn-sample: prompt 2048 + response 512
    teacher_extra_tokens: int = 1024  # privileged skills prepended to the teacher's prompt
    micro_batch: int = 2  # sequences per forward/backward on one GPU (training and scoring)
    group_size: int = 8  # G rollouts per task (paper)
    tasks_per_step: int = 16  # tasks per RL step (paper; 128 for search)
    colocate: bool = True  # vLLM on the training GPUs, asleep during scoring/update (as verl does)
    rollout_gpus: int | None = None  # split mode: GPUs that only run vLLM (default: half)
    rollout_tp: int | None = None  # vLLM tensor parallel (default: smallest holding the batch)
    vllm_mem_util: float | None = None  # vLLM gpu_memory_utilization (0.35 colocated, 0.85 split)
    headroom: float = 0.10  # share of each card kept free: CUDA context, NCCL, fragmentation
    steps: int = 150  # RL steps per run (paper)
    step_seconds: float = 600.0  # wall seconds per RL step: a user input (--step-seconds help)
    runs: int = 1  # training runs priced (arms x seeds)
    instance: str | None = None  # force an instance type (default: the cheapest that fits)
    price: float | None = None  # override the on-demand USD/hour of the instance
    spot: bool = False  # rank and headline by spot price
    spot_discount: float = 0.6  # spot price = on-demand * (1 - discount); check the spot history
    spot_price: float | None = None  # USD/hour of one spot instance (overrides the discount)
    spot_overhead: float = 0.10  # extra wall time on spot: interruptions, restarts from checkpoints

    def validate(self) -> None:
        def positive(name: str, value: float | None, allow_none: bool = False) -> None:
            if value is None and allow_none:
                return
            if value is None or value <= 0:
                raise PlanError(f"--{name.replace('_', '-')} must be > 0, got {value}")

        for name in ("gpus", "gpu_mem", "lora_r", "seq_len", "micro_batch", "group_size",
                     "tasks_per_step", "steps", "step_seconds", "runs"):
            positive(name, getattr(self, name))
        for name in ("rollout_gpus", "rollout_tp", "price", "spot_price"):
            positive(name, getattr(self, name), allow_none=True)
        if self.teacher_extra_tokens < 0:
            raise PlanError(f"--teacher-extra-tokens must be >= 0, got {self.teacher_extra_tokens}")
        if self.vllm_mem_util is not None and not 0 < self.vllm_mem_util < 1:
            raise PlanError(f"--vllm-mem-util must be in (0, 1), got {self.vllm_mem_util}")
        if not 0 <= self.headroom < 1:
            raise PlanError(f"--headroom must be in [0, 1), got {self.headroom}")
        if not 0 <= self.spot_discount < 1:
            raise PlanError(f"--spot-discount must be in [0, 1), got {self.spot_discount}")
        if self.spot_overhead < 0:
            raise PlanError(f"--spot-overhead must be >= 0, got {self.spot_overhead}")
        if not self.colocate:
            if self.gpus < 2:
                raise PlanError(
                    "a split (--no-colocate) needs at least 2 GPUs: one for vLLM, one to train; "
                    "use --colocate on a single GPU"
                )
            k = self.split_rollout_gpus
            if not 1 <= k < self.gpus:
                raise PlanError(
                    f"--rollout-gpus must leave at least one training GPU: 1 <= {k} < {self.gpus}"
                )
        if self.instance is not None and self.instance not in _INSTANCE_BY_NAME:
            raise PlanError(
                f"unknown instance {self.instance!r}; choose one of "
                + ", ".join(i.name for i in INSTANCES)
            )

    @property
    def split_rollout_gpus(self) -> int:
        return self.rollout_gpus if self.rollout_gpus is not None else self.gpus // 2

    @property
    def train_gpus(self) -> int:
        return self.gpus if self.colocate else self.gpus - self.split_rollout_gpus

    @property
    def n_rollout_gpus(self) -> int:
        return self.gpus if self.colocate else self.split_rollout_gpus

    @property
    def util(self) -> float:
        if self.vllm_mem_util is not None:
            return self.vllm_mem_util
        # colocated: sdar's VLLMBackend default; dedicated GPUs: below vLLM's own 0.9, so that
        # the card keeps the same headroom as the training GPUs and a little more
        return 0.35 if self.colocate else 0.85

    @property
    def rollout_sequences(self) -> int:
        return self.group_size * self.tasks_per_step

    @property
    def usable_bytes(self) -> float:
        return self.gpu_mem * GiB * (1 - self.headroom)


# ---------------------------------------------------------------------------------------------
# memory


PHASES = ("rollout", "teacher", "update")
_PHASE_TITLE = {
    "rollout": "rollout (vLLM generates)",
    "teacher": "teacher scoring (no grad)",
    "update": "actor update (fwd + bwd)",
}

# vLLM's own working memory besides weights and KV cache: CUDA graphs and non-torch allocations
# (about 1 GiB in its startup log), its profiling forward over max_num_batched_tokens, and the
# sampler's fp32 logits for max_num_seqs sequences (vLLM defaults: 8192 tokens, 256 sequences).
VLLM_FIXED = 1 * GiB
VLLM_BATCHED_TOKENS = 8192
VLLM_MAX_SEQS = 256


@dataclass
class Item:
    role: str  # actor | reference | rollout | teacher
    name: str
    formula: str
    bytes: float  # per GPU
    phases: tuple[str, ...]  # the phases whose peak it is part of; () = shown for information only
    note: str = ""

    @property
    def gib(self) -> float:
        return self.bytes / GiB


@dataclass
class PhasePeak:
    phase: str
    gpus: int
    bytes: float
    usable: float
    fits: bool


@dataclass
class MemoryPlan:
    arch: Arch
    source: str
    settings: PlanSettings
    items: list[Item]
    phases: list[PhasePeak]
    rollout: dict[str, Any]
    problems: list[str]

    @property
    def fits(self) -> bool:
        return not self.problems and all(p.fits for p in self.phases)

    @property
    def peak(self) -> float:
        return max(p.bytes for p in self.phases)


def _n(x: float) -> str:
    """A count for a formula: 7.62e9 -> '7.62B', 40370176 -> '40.4M', 2560 -> '2560'."""
    for unit, scale in (("B", 1e9), ("M", 1e6)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:g}"


def activation_bytes_per_layer(a: Arch, tokens: int) -> int:
    """bf16 activations one decoder layer saves for backward, for `tokens` = micro_batch * seq.

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
    (arXiv:2205.05198), eq. 1: s*b*h*(34 + 5*a*s/h) bytes per layer for GPT (MHA, 4h GeLU MLP,
    dropout, s x s attention scores). The same count for a Qwen2 layer: flash attention keeps no
    s x s matrix (the 5as/h term goes), there is no dropout mask, K/V are GQA-narrow and the MLP is
    SwiGLU with 4 intermediate-wide tensors. Per token, 2 B each: norm-1 input h, QKV input h,
    Q q_dim, K and V kv_dim each, attention output q_dim, norm-2 input h, MLP input h, gate, up,
    silu(gate) and their product I each: 2 * (4h + 2 q_dim + 2 kv_dim + 4I) = 12h + 4kv_dim + 8I
    bytes when q_dim = h.
    """
    return tokens * 2 * (4 * a.hidden + 2 * a.q_dim + 2 * a.kv_dim + 4 * a.intermediate)


def forward_working_bytes(a: Arch, tokens: int) -> int:
    """The largest live set of one layer in a no-grad forward: residual stream and normed input
    (h each) plus gate, up and their product (I each), bf16."""
    return tokens * 2 * (2 * a.hidden + 3 * a.intermediate)


def _rollout_engine(a: Arch, s: PlanSettings) -> dict[str, Any]:
    """vLLM sizing: tensor-parallel size, its weights, KV cache pool and how many sequences fit."""
    gpus, budget = s.n_rollout_gpus, s.util * s.gpu_mem * GiB
    weights_total = 2 * a.params() + (2 * a.lora_params(s.lora_r) if s.lora else 0)
    runtime = (
        VLLM_FIXED + forward_working_bytes(a, VLLM_BATCHED_TOKENS) + VLLM_MAX_SEQS * a.vocab * 4
    )
    kv_tok = a.kv_bytes_per_token()
    seqs = s.rollout_sequences

    def sized(tp: int) -> dict[str, Any]:
        replicas = gpus // tp
        per_replica = math.ceil(seqs / replicas)
        kv_split = min(tp, a.kv_heads)  # KV heads shard over TP ranks, beyond that they replicate
        weights = weights_total / tp
        pool = budget - weights - runtime
        need = per_replica * s.seq_len * kv_tok / kv_split
        at_once = max(0, int(pool * kv_split // (s.seq_len * kv_tok)))
        return {
            "tp": tp,
            "replicas": replicas,
            "seqs_per_replica": per_replica,
            "weights": weights,
            "runtime": runtime,
            "pool": pool,
            "budget": budget,
            "kv_needed": need,
            "seqs_at_once": min(at_once, per_replica),
            "waves": math.ceil(per_replica / at_once) if at_once else None,
        }

    if s.rollout_tp is not None:
        if gpus % s.rollout_tp or a.heads % s.rollout_tp:
            raise PlanError(
                f"--rollout-tp {s.rollout_tp} must divide the {gpus} rollout GPUs and the "
                f"{a.heads} attention heads of {a.name}"
            )
        return sized(s.rollout_tp) | {"tp_reason": "--rollout-tp"}
    options = [
        sized(tp) for tp in (1, 2, 4, 8, 16) if tp <= gpus and gpus % tp == 0 and a.heads % tp == 0
    ]
    one_wave = [o for o in options if o["waves"] == 1]
    if one_wave:
        return one_wave[0] | {"tp_reason": "smallest TP whose KV pool holds the whole batch"}
    best = max(options, key=lambda o: (o["seqs_at_once"] * o["replicas"], -o["tp"]))
    return best | {"tp_reason": "the TP that runs the most sequences at once"}


def memory_plan(arch: Arch, s: PlanSettings, source: str = "") -> MemoryPlan:
    """Bytes per GPU of every model role in each phase of one RL step, and the fit verdict."""
    s.validate()
    a, P = arch, arch.params()
    S = s.train_gpus if s.shard else 1  # ways the training state is sharded
    per = f" / {S}" if S > 1 else ""
    resident = ("rollout", "teacher", "update") if s.colocate else ("teacher", "update")
    items: list[Item] = []

    def add(role: str, name: str, formula: str, nbytes: float, phases: tuple[str, ...],
            note: str = "") -> None:
        items.append(Item(role, name, formula, nbytes, phases, note))

    # actor: the training state stays on the GPU through the whole step
    if s.lora:
        A = a.lora_params(s.lora_r)
        add("actor", "base weights bf16 (frozen)", f"2 B x {_n(P)}{per}", 2 * P / S, resident)
        add("actor", f"LoRA r={s.lora_r}: fp32 adapter + grads + Adam m,v",
            f"(4+4+8) B x {_n(A)}{per}", 16 * A / S, resident)
    else:  # mixed-precision Adam as in ZeRO (Rajbhandari et al. 2020): 2 + 2 + 12 B/param
        add("actor", "weights bf16", f"2 B x {_n(P)}{per}", 2 * P / S, resident)
        add("actor", "gradients bf16", f"2 B x {_n(P)}{per}", 2 * P / S, resident)
        add("actor", "master weights fp32", f"4 B x {_n(P)}{per}", 4 * P / S, resident)
        add("actor", "Adam m, v fp32", f"8 B x {_n(P)}{per}", 8 * P / S, resident)
    # FSDP/ZeRO-3 gathers one unit at a time plus a prefetched one; the root unit (embeddings,
    # lm_head, final norm) stays gathered through forward and backward. A full fine-tune also
    # holds the unsharded gradients of those units until their reduce-scatter.
    unit = a.root_params() + 2 * a.layer_params()
    if S > 1:
        unit_txt = f"({_n(a.root_params())} root + 2 x {_n(a.layer_params())} layer)"
        add("actor", "FSDP gathered weights", f"2 B x {unit_txt}", 2 * unit, ("teacher", "update"))
        if not s.lora:
            add("actor", "FSDP unsharded grads", f"2 B x {unit_txt}", 2 * unit, ("update",))
    tok = s.micro_batch * s.seq_len
    per_layer = activation_bytes_per_layer(a, tok)
    head = tok * 2 * 2 * a.hidden  # final-norm input and lm_head input
    tok_txt = f"{s.micro_batch} x {s.seq_len} tok"
    on, off = ("update",), ()
    add("actor", "activations, checkpointing",
        f"{tok_txt} x ({a.layers} x 2h + {per_layer // tok} + 4h) B",
        a.layers * tok * 2 * a.hidden + per_layer + head,  # layer inputs + 1 layer recomputed
        on if s.checkpointing else off, "" if s.checkpointing else "not used")
    add("actor", "activations, no checkpointing",
        f"{tok_txt} x ({a.layers} x {per_layer // tok} + 4h) B", a.layers * per_layer + head,
        off if s.checkpointing else on, "not used" if s.checkpointing else "")
    # sdar.models.logprobs keeps the fp32 logits for backward, whose backward adds log p and p:
    # three fp32 [tokens, V] tensors, the update's peak for a 150k vocabulary
    add("actor", "logits fp32 (x3: logits, log p, p)", f"3 x 4 B x {tok_txt} x {a.vocab}",
        12 * tok * a.vocab, ("update",))

    # reference: the frozen initial policy, for the KL term
    if s.lora:
        add("reference", "base with the adapter disabled", "no extra copy", 0, resident)
    else:
        add("reference", "frozen weights bf16", f"2 B x {_n(P)}{per}", 2 * P / S, resident)

    # rollout engine: vLLM with its own weight copy and KV cache, inside its memory reservation
    r = _rollout_engine(a, s)
    gen = ("rollout",)
    tp_txt = f" / {r['tp']}" if r["tp"] > 1 else ""
    add("rollout", f"vLLM weights bf16 (TP={r['tp']})",
        f"2 B x {_n(P)}{' + LoRA' if s.lora else ''}{tp_txt}", r["weights"], gen)
    add("rollout", "vLLM runtime overhead",
        f"1 GiB + {VLLM_BATCHED_TOKENS} tok fwd + {VLLM_MAX_SEQS} x {a.vocab} x 4 B",
        r["runtime"], gen)
    add("rollout", "vLLM KV cache pool",
        f"{s.util:g} x {s.gpu_mem:g} GiB - weights - runtime", max(r["pool"], 0), gen)
    kv_tok = a.kv_bytes_per_token()
    kv_split = f" / {min(r['tp'], a.kv_heads)}" if r["tp"] > 1 else ""
    waves = r["waves"]
    add("rollout", "KV cache needed by the rollout batch",
        f"{r['seqs_per_replica']} seqs x {s.seq_len} tok x {kv_tok} B/tok{kv_split}",
        r["kv_needed"], (),
        "fits in the pool" if waves == 1 else (f"{waves} waves" if waves else "pool too small"))

    # teacher: theta_old with the skills in its prompt: the actor's weights, no gradient
    t_tok = s.micro_batch * (s.seq_len + s.teacher_extra_tokens)
    t_txt = f"{s.micro_batch} x {s.seq_len + s.teacher_extra_tokens} tok"
    score = ("teacher",)
    add("teacher", "weights", "shares the actor's", 0, score)
    add("teacher", "K/V of the teacher context", f"{kv_tok} B/tok x {t_txt}", kv_tok * t_tok, score)
    add("teacher", "forward working set (1 layer)", f"{t_txt} x 2 B x (2h + 3I)",
        forward_working_bytes(a, t_tok), score)
    add("teacher", "logits bf16 + fp32 copy", f"6 B x {t_txt} x {a.vocab}",
        6 * t_tok * a.vocab, score)

    usable = s.usable_bytes
    phases = []
    for ph in PHASES:
        total = sum(i.bytes for i in items if ph in i.phases)
        gpus = s.n_rollout_gpus if ph == "rollout" else s.train_gpus
        phases.append(PhasePeak(ph, gpus, total, usable, total <= usable * (1 + 1e-9)))

    problems = []
    if 2 * P / S > usable:
        problems.append(f"the bf16 weights alone take {2 * P / S / GiB:.1f} GiB per GPU, more than "
                        f"the {usable / GiB:.1f} GiB usable on a {s.gpu_mem:g} GiB card")
    if r["pool"] <= 0 or not r["seqs_at_once"]:
        problems.append(f"vLLM's {s.util:g} x {s.gpu_mem:g} GiB reservation cannot hold its "
                        f"weights ({r['weights'] / GiB:.1f} GiB at TP={r['tp']}), runtime and one "
                        "sequence's KV cache; raise --vllm-mem-util or --rollout-tp, "
                        "or use bigger GPUs")
    for p in phases:
        if not p.fits:
            problems.append(f"{_PHASE_TITLE[p.phase]} needs {p.bytes / GiB:.1f} GiB per GPU, "
                            f"{p.usable / GiB:.1f} GiB usable "
                            f"({s.gpu_mem:g} GiB - {s.headroom:.0%} headroom)")
    return MemoryPlan(a, source, s, items, phases, r, problems)


# ---------------------------------------------------------------------------------------------
# instances and cost


def instances_needed(inst: Instance, gpus: int) -> int:
    return math.ceil(gpus / inst.gpus)


def _candidate(inst: Instance, gpus: int) -> bool:
    """One node that holds every GPU, or several full 8-GPU nodes: FSDP over many 1- or 4-GPU nodes
    on plain Ethernet is not a setup worth recommending."""
    return gpus <= inst.gpus or inst.gpus == 8


def run_cost(s: PlanSettings, inst: Instance) -> dict[str, float]:
    """cost = runs * steps * step_seconds / 3600 * hourly price * instances; spot adds the overhead
    wall time (interruptions, restarts from checkpoint) at the spot price."""
    count = instances_needed(inst, s.gpus)
    hourly = s.price if s.price is not None else inst.on_demand
    spot_hourly = s.spot_price if s.spot_price is not None else hourly * (1 - s.spot_discount)
    hours = s.runs * s.steps * s.step_seconds / 3600
    spot_hours = hours * (1 + s.spot_overhead)
    return {
        "instance": inst.name,
        "instances": count,
        "gpus_rented": count * inst.gpus,
        "on_demand_hourly": hourly * count,
        "spot_hourly": spot_hourly * count,
        "hours": hours,
        "spot_hours": spot_hours,
        "on_demand_cost": hours * hourly * count,
        "spot_cost": spot_hours * spot_hourly * count,
    }


def _fits_on(arch: Arch, s: PlanSettings, inst: Instance) -> bool:
    try:
        return memory_plan(arch, replace(s, gpu_mem=inst.gpu_mem, instance=None)).fits
    except PlanError:
        return False


def options_that_fit(arch: Arch, s: PlanSettings) -> list[dict[str, Any]]:
    """Every catalog instance on which this plan fits with the same GPU count, cheapest first."""
    key = "spot_cost" if s.spot else "on_demand_cost"
    out = [
        run_cost(s, i) | {"gpu": i.gpu, "gpu_mem": i.gpu_mem}
        for i in INSTANCES
        if _candidate(i, s.gpus) and _fits_on(arch, s, i)
    ]
    return sorted(out, key=lambda c: (c[key], c["instances"]))


def recommend(arch: Arch, s: PlanSettings, plan: MemoryPlan) -> dict[str, Any] | None:
    """The cheapest instance with GPUs of at least --gpu-mem on which the plan fits, or the
    --instance asked for."""
    if s.instance:
        inst = _INSTANCE_BY_NAME[s.instance]
        return run_cost(s, inst) | {"gpu": inst.gpu, "gpu_mem": inst.gpu_mem, "why": "--instance"}
    if not plan.fits:
        return None
    key = "spot_cost" if s.spot else "on_demand_cost"
    same = [
        run_cost(s, i) | {"gpu": i.gpu, "gpu_mem": i.gpu_mem}
        for i in INSTANCES
        if i.gpu_mem >= s.gpu_mem and _candidate(i, s.gpus) and _fits_on(arch, s, i)
    ]
    if not same:
        return None
    best = min(same, key=lambda c: (c[key], c["instances"]))
    price = "spot" if s.spot else "on-demand"
    return best | {"why": f"cheapest ({price}) with >= {s.gpu_mem:g} GiB GPUs that fits"}


def suggestions(arch: Arch, s: PlanSettings) -> list[str]:
    """What would make a plan that does not fit, fit."""
    out = []
    for n in range(s.gpus + 1, 129):
        t = replace(s, gpus=n)
        try:
            if memory_plan(arch, t).fits:
                out.append(f"more GPUs: {n} x {s.gpu_mem:g} GiB fits (--gpus {n})")
                break
        except PlanError:
            continue
    if not s.lora:
        try:
            if memory_plan(arch, replace(s, lora=True)).fits:
                out.append(f"LoRA: --lora fits on {s.gpus} x {s.gpu_mem:g} GiB")
        except PlanError:
            pass
    if not s.checkpointing and memory_plan(arch, replace(s, checkpointing=True)).fits:
        out.append("gradient checkpointing: --checkpointing fits")
    if s.micro_batch > 1 and memory_plan(arch, replace(s, micro_batch=1)).fits:
        out.append("a smaller micro-batch: --micro-batch 1 fits")
    if s.colocate and s.gpus >= 2:
        try:
            if memory_plan(arch, replace(s, colocate=False)).fits:
                k = s.gpus // 2
                out.append(f"a split: --no-colocate ({s.gpus - k} train + {k} vLLM GPUs) fits")
        except PlanError:
            pass
    bigger = options_that_fit(arch, replace(s, instance=None))
    if bigger:
        b = bigger[0]
        out.append(f"a bigger instance: {b['instances']} x {b['instance']} "
                   f"({b['gpu']} {b['gpu_mem']} GiB) fits (--gpu-mem {b['gpu_mem']})")
    else:  # whole 8-GPU nodes, full or LoRA
        for nodes in (1, 2, 4):
            t = replace(s, gpus=8 * nodes, instance=None)
            found = options_that_fit(arch, t) or (
                options_that_fit(arch, replace(t, lora=True)) if not s.lora else []
            )
            if found:
                b = found[0]
                lora = "" if s.lora or options_that_fit(arch, t) else " --lora"
                out.append(f"a bigger instance: {b['instances']} x {b['instance']} "
                           f"({b['gpu']} {b['gpu_mem']} GiB) fits with --gpus {8 * nodes} "
                           f"--gpu-mem {b['gpu_mem']}{lora}")
                break
    if not out:
        out.append(
            f"nothing in the catalog fits {s.gpus} GPU(s) of this model; try --lora, more --gpus "
            "or a shorter --seq-len"
        )
    return out


@dataclass
class Plan:
    memory: MemoryPlan
    recommendation: dict[str, Any] | None
    alternatives: list[dict[str, Any]]
    suggestions: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def to_dict(self) -> dict[str, Any]:
        m, s = self.memory, self.memory.settings
        return {
            "model": {
                "name": m.arch.name,
                "source": m.source,
                "params": m.arch.params(),
                "lora_params": m.arch.lora_params(s.lora_r) if s.lora else 0,
                "arch": asdict(m.arch),
            },
            "settings": asdict(s)
            | {
                "train_gpus": s.train_gpus,
                "rollout_gpus": s.n_rollout_gpus,
                "vllm_mem_util": s.util,
            },
            "items": [asdict(i) | {"gib": round(i.gib, 3)} for i in m.items],
            "phases": [
                asdict(p) | {"gib": round(p.bytes / GiB, 3), "usable_gib": round(p.usable / GiB, 3)}
                for p in m.phases
            ],
            "rollout": {k: v for k, v in m.rollout.items()},
            "fits": self.fits,
            "peak_gib": round(m.peak / GiB, 3),
            "problems": m.problems,
            "suggestions": self.suggestions,
            "recommendation": self.recommendation,
            "alternatives": self.alternatives,
            "prices_as_of": PRICES_AS_OF,
        }


def make_plan(model: str | Arch, **settings: Any) -> Plan:
    """The whole plan: memory per role and phase, the verdict, the instance and the cost.
    `settings` are PlanSettings fields (gpus=8, gpu_mem=80, lora=True, ...)."""
    if isinstance(model, Arch):
        arch, source = model, model.name
    else:
        arch, source = resolve_model(model)
    unknown = sorted(set(settings) - set(PlanSettings.__dataclass_fields__))
    if unknown:
        raise PlanError(
            f"unknown setting(s) {unknown}; valid: {', '.join(PlanSettings.__dataclass_fields__)}"
        )
    s = PlanSettings(**settings)
    mem = memory_plan(arch, s, source)
    alts = options_that_fit(arch, s)
    rec = recommend(arch, s, mem)
    return Plan(mem, rec, alts, [] if mem.fits else suggestions(arch, s))


# ---------------------------------------------------------------------------------------------
# settings from a training config

# PlanSettings field -> the training-config value it is read from (`sdar plan --config`)
CONFIG_KEYS: dict[str, str] = {
    "gpus": "launch.nodes * launch.gpus_per_node",
    "lora": "model.lora",
    "lora_r": "model.lora_r",
    "checkpointing": "model.gradient_checkpointing",
    "seq_len": "rollout.max_prompt_tokens + rollout.max_response_tokens",
    "teacher_extra_tokens": "teacher_max_prompt_tokens - rollout.max_prompt_tokens",
    "micro_batch": "micro_batch_size",
    "group_size": "group_size",
    "tasks_per_step": "tasks_per_step",
    "steps": "steps",
}


@dataclass
class ConfigSettings:
    """What a training config (`sdar.config.load_config`) says about a plan: the model's name as the
    config writes it, the PlanSettings read from it, and why a setting was left to the planner."""

    path: str
    model: str
    settings: dict[str, Any]
    skipped: dict[str, str] = field(default_factory=dict)


def settings_from_config(path: str | Path) -> ConfigSettings:
    """The plan a training config describes (the keys in CONFIG_KEYS): model, LoRA or full, GPUs
    (launch.nodes x launch.gpus_per_node), group size, tasks per step, micro-batch, sequence length
    (prompt + response), the teacher's extra tokens (its prompt budget beyond the student's) and
    steps. A config without GPUs (launch.gpus_per_node 0) leaves `gpus` to the planner."""
    from sdar.config import load_config

    try:
        cfg = load_config(path)
    except (OSError, ValueError, TypeError) as exc:
        raise PlanError(f"cannot read the training config {path}: {exc}") from None
    r, m = cfg.rollout, cfg.model
    out: dict[str, Any] = {
        "lora": m.lora,
        "checkpointing": m.gradient_checkpointing,
        "seq_len": r.max_prompt_tokens + r.max_response_tokens,
        "teacher_extra_tokens": max(0, cfg.teacher_max_prompt_tokens - r.max_prompt_tokens),
        "micro_batch": cfg.micro_batch_size,
        "group_size": cfg.group_size,
        "tasks_per_step": cfg.tasks_per_step,
        "steps": cfg.steps,
    }
    skipped: dict[str, str] = {}
    if m.lora:
        out["lora_r"] = m.lora_r
    gpus = cfg.launch.nodes * cfg.launch.gpus_per_node
    if gpus > 0:
        out["gpus"] = gpus
    else:
        skipped["gpus"] = (f"launch.gpus_per_node is {cfg.launch.gpus_per_node} (a CPU run): "
                           "the planner's default or --gpus")
    return ConfigSettings(str(path), m.name_or_path, out, skipped)


def resolve_config_model(name: str, path: str | Path) -> tuple[Arch, str]:
    """`resolve_model` for a config's model.name_or_path ("Qwen/Qwen2.5-7B-Instruct" is the table's
    Qwen2.5-7B), with an error that says the planner does not know it and what to pass instead."""
    try:
        arch, source = resolve_model(name)
    except PlanError as exc:
        raise PlanError(
            f"the model of {path}, model.name_or_path {name!r}, is unknown to the planner ({exc}); "
            "pass --model with a known name, its size (e.g. 7b) or its config.json path"
        ) from None
    return arch, f"{source}; model.name_or_path {name} in {path}"


# ---------------------------------------------------------------------------------------------
# output


def render(plan: Plan, console=None) -> None:
    """Print the plan as rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    m, s, a = plan.memory, plan.memory.settings, plan.memory.arch
    mode = f"LoRA r={s.lora_r}" if s.lora else "full fine-tune"
    layout = (
        f"colocated (vLLM util {s.util:g})"
        if s.colocate
        else f"split: {s.train_gpus} train + {s.n_rollout_gpus} vLLM GPUs (util {s.util:g})"
    )
    sharded = s.shard and s.train_gpus > 1
    sharding = f"FSDP-sharded over {s.train_gpus}" if sharded else "not sharded"
    console.print(f"[bold]{a.name}[/bold]: {a.params() / 1e9:.2f}B params ({m.source}); "
                  f"{s.gpus} x {s.gpu_mem:g} GiB, {mode}, {sharding}, {layout}")
    console.print(
        f"rollout batch {s.tasks_per_step} tasks x G={s.group_size} = {s.rollout_sequences} seqs "
        f"x {s.seq_len} tok; teacher +{s.teacher_extra_tokens} tok; micro-batch {s.micro_batch}; "
        f"checkpointing {'on' if s.checkpointing else 'off'}"
    )

    t = Table(title="memory per GPU by model role")
    for col, kw in (
        ("role", {}),
        ("item", {}),
        ("formula", {"overflow": "fold"}),
        ("GiB/GPU", {"justify": "right"}),
        ("in phase", {}),
    ):
        t.add_column(col, **kw)
    short = {"rollout": "R", "teacher": "T", "update": "U"}
    last_role = None
    for i in m.items:
        where = "+".join(short[p] for p in i.phases) if i.phases else (i.note or "info")
        style = "dim" if not i.phases else None
        t.add_row(
            i.role if i.role != last_role else "",
            i.name,
            i.formula,
            f"{i.gib:.2f}",
            where,
            style=style,
            end_section=False,
        )
        last_role = i.role
    console.print(t)
    console.print(
        f"[dim]h={a.hidden}, I={a.intermediate} (MLP), kv={a.kv_dim} (K/V width), vocab {a.vocab}; "
        f"1 layer's saved activations = 12h+4kv+8I = {activation_bytes_per_layer(a, 1)} B/tok "
        f"(Korthikanti et al. 2022, adapted); K/V = 2 x {a.layers} layers x {a.kv_heads} heads x "
        f"{a.hd} x 2 B = {a.kv_bytes_per_token()} B/tok[/dim]"
    )

    p = Table(title=f"peak per GPU by phase (R, T, U above); "
                    f"usable = {s.gpu_mem:g} GiB - {s.headroom:.0%} headroom")
    for col in ("phase", "GPUs", "peak GiB", "usable GiB", "verdict"):
        p.add_column(col, justify="right" if "GiB" in col or col == "GPUs" else "left")
    for ph in m.phases:
        p.add_row(
            _PHASE_TITLE[ph.phase],
            str(ph.gpus),
            f"{ph.bytes / GiB:.1f}",
            f"{ph.usable / GiB:.1f}",
            "[green]fits[/green]" if ph.fits else "[red]does not fit[/red]",
        )
    console.print(p)
    r = m.rollout
    console.print(
        f"vLLM: TP={r['tp']} ({r['tp_reason']}), {r['replicas']} replica(s), "
        f"{r['seqs_per_replica']} seqs each, {r['seqs_at_once']} at once"
        + (f", {r['waves']} wave(s)" if r["waves"] else "")
    )
    if m.fits:
        console.print(f"[bold green]FITS[/bold green]: peak {m.peak / GiB:.1f} of "
                      f"{s.usable_bytes / GiB:.1f} GiB usable per GPU")
    else:
        console.print("[bold red]DOES NOT FIT[/bold red]")
        for prob in m.problems:
            console.print(f"  - {prob}")
        console.print("to make it fit:")
        for sug in plan.suggestions:
            console.print(f"  - {sug}")

    head = "spot" if s.spot else "on-demand"
    c = Table(
        title=f"cost of {s.runs} run(s): {s.steps} steps x {s.step_seconds:g} s "
        f"(us-east-1 list prices as of {PRICES_AS_OF}: check them)"
    )
    for col in (
        "instance",
        "GPUs",
        "count",
        "on-demand $/h",
        "spot $/h",
        "hours",
        "on-demand $",
        "spot $",
    ):
        c.add_column(col, justify="left" if col == "instance" else "right")
    rows = list(plan.alternatives)
    rec = plan.recommendation
    if rec and all(x["instance"] != rec["instance"] for x in rows):
        rows.insert(0, rec)
    for x in rows:
        mark = " *" if rec and x["instance"] == rec["instance"] else ""
        c.add_row(
            x["instance"] + mark,
            f"{x['gpu']} {x['gpu_mem']}G",
            str(x["instances"]),
            f"{x['on_demand_hourly']:.2f}",
            f"{x['spot_hourly']:.2f}",
            f"{x['hours']:.1f}",
            f"{x['on_demand_cost']:,.0f}",
            f"{x['spot_cost']:,.0f}",
        )
    if rows:
        console.print(c)
    if rec:
        cost = rec["spot_cost"] if s.spot else rec["on_demand_cost"]
        console.print(
            f"recommended: [bold]{rec['instances']} x {rec['instance']}[/bold] ({rec['why']}): "
            f"{head} ${cost:,.0f} for the run"
            + (
                f"; spot ${rec['spot_cost']:,.0f} (discount {s.spot_discount:.0%}, "
                f"+{s.spot_overhead:.0%} time for interruptions)"
                if not s.spot
                else ""
            )
        )
        if rec["instances"] > 1:
            console.print(
                "  (more than one node: FSDP and weight sync cross EFA; expect slower steps)"
            )
    elif m.fits:
        console.print("no catalog instance has GPUs this large; pick one from the table above")
    console.print(
        "[dim]step time is your input (--step-seconds); slower GPUs (L4, A10G, L40S) take "
        "longer per step than the same count of A100/H100, so compare run costs with measured "
        "step times.[/dim]"
    )


def _cmd_plan(args: argparse.Namespace) -> int:
    names = [f for f in PlanSettings.__dataclass_fields__ if hasattr(args, f)]
    flags = {f: getattr(args, f) for f in names if getattr(args, f) is not None}
    try:
        settings: dict[str, Any] = {}
        from_config: ConfigSettings | None = None
        if args.config:
            from_config = settings_from_config(args.config)
            settings.update(from_config.settings)
        settings.update(flags)  # an explicit flag wins over the config
        if args.gpu_mem is None:
            inst = _INSTANCE_BY_NAME.get(args.instance)
            settings["gpu_mem"] = inst.gpu_mem if inst else 80.0
        if args.model is not None:
            plan = make_plan(args.model, **settings)
        elif from_config is not None:
            arch, source = resolve_config_model(from_config.model, from_config.path)
            plan = make_plan(arch, **settings)
            plan.memory.source = source
        else:
            raise PlanError("give --model (a name, a size or a config.json path) or --config "
                            "(a training config, e.g. configs/paper/alfworld-qwen2.5-7b.yaml)")
    except PlanError as exc:
        print(f"sdar plan: error: {exc}", file=sys.stderr)
        return 2
    config_info = None
    if from_config is not None:
        config_info = {
            "path": from_config.path,
            "model": from_config.model,
            "model_used": args.model is None,
            "read": {k: {"value": v, "from": CONFIG_KEYS[k]}
                     for k, v in from_config.settings.items() if k not in flags},
            "overridden_by_flags": sorted(k for k in from_config.settings if k in flags)
            + (["model"] if args.model is not None else []),
            "not_read": from_config.skipped,
        }
    if args.json:
        data = plan.to_dict()
        if config_info is not None:
            data["config"] = config_info
        print(json.dumps(data, indent=2))
    else:
        from rich.console import Console

        console = Console(width=args.width or max(120, Console().width))
        if config_info is not None:
            _render_config(config_info, console)
        render(plan, console)
    return 0 if plan.fits else 1


def _render_config(info: dict[str, Any], console) -> None:
    """One line: the settings taken from the training config (JSON `config.read` says from which
    keys), and those that flags overrode."""
    read = ", ".join(f"{k} {v['value']}" for k, v in info["read"].items())
    model = f"model.name_or_path {info['model']}"
    if not info["model_used"]:
        model += ", not used: --model"
    console.print(f"settings from [bold]{info['path']}[/bold] ({model}): {read}")
    if info["overridden_by_flags"]:
        console.print(f"flags override the config's: {', '.join(info['overridden_by_flags'])}")
    for key, why in info["not_read"].items():
        console.print(f"[dim]{key} not read: {why}[/dim]")


def register(sub: argparse._SubParsersAction) -> None:
    d = PlanSettings()
    p = sub.add_parser(
        "plan",
        help="GPU memory per model role and the cost of a run (sizing a cluster)",
        description="Memory per GPU of the four model roles of the SDAR loop (actor, reference, "
        "vLLM rollout engine, teacher), whether they fit, the AWS instance to rent and the cost.",
        epilog="Exit status: 0 fits, 1 does not fit (the plan and what would fit are printed), "
        "2 bad input.",
    )
    p.add_argument(
        "--config",
        default=None,
        help="a training config (e.g. configs/paper/alfworld-qwen2.5-7b.yaml): the model, LoRA "
        "or full, GPUs (launch.nodes x launch.gpus_per_node), group size, tasks per step, "
        "micro-batch, sequence length (rollout.max_prompt_tokens + max_response_tokens), "
        "teacher extra tokens (teacher_max_prompt_tokens - rollout.max_prompt_tokens) and steps "
        "come from it; a flag given explicitly overrides it",
    )
    p.add_argument(
        "--model",
        default=None,
        help="Qwen2.5-0.5B/1.5B/3B/7B/14B (Qwen/Qwen2.5-7B-Instruct works too), SmolLM2-135M, "
        "tiny; a size (7b, 7e9); or a config.json path. Required unless --config gives "
        "model.name_or_path (this flag then overrides it)",
    )
    p.add_argument("--gpus", type=int, default=None, help=f"GPUs in the run (default {d.gpus})")
    p.add_argument(
        "--gpu-mem",
        type=float,
        default=None,
        help="GiB per GPU, the card's nominal size (default 80, or the --instance's)",
    )
    p.add_argument(
        "--lora",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="LoRA adapter on a frozen base; --no-lora: a full fine-tune (default: full)",
    )
    p.add_argument("--lora-r", type=int, default=None, help=f"LoRA rank (default {d.lora_r})")
    p.add_argument(
        "--shard",
        action=argparse.BooleanOptionalAction,
        default=d.shard,
        help="FSDP/ZeRO-3 sharding of weights, grads and Adam over the training GPUs (default on)",
    )
    p.add_argument(
        "--checkpointing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="gradient checkpointing (default on)",
    )
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help=f"tokens per turn-sample, prompt + response (default {d.seq_len} = 2048 + 512)",
    )
    p.add_argument(
        "--teacher-extra-tokens",
        type=int,
        default=None,
        help=f"skills tokens prepended to the teacher's prompt (default {d.teacher_extra_tokens})",
    )
    p.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help=f"sequences per GPU per forward/backward (default {d.micro_batch})",
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=None,
        help=f"G rollouts per task (default {d.group_size})",
    )
    p.add_argument(
        "--tasks-per-step",
        type=int,
        default=None,
        help=f"tasks per RL step (default {d.tasks_per_step})",
    )
    p.add_argument(
        "--colocate",
        action=argparse.BooleanOptionalAction,
        default=d.colocate,
        help="vLLM on the training GPUs, asleep while scoring/updating, as verl does (default); "
        "--no-colocate splits the GPUs",
    )
    p.add_argument(
        "--rollout-gpus",
        type=int,
        default=None,
        help="with --no-colocate: GPUs for vLLM (default half)",
    )
    p.add_argument(
        "--rollout-tp",
        type=int,
        default=None,
        help="vLLM tensor-parallel size (default: the smallest whose KV pool holds the batch)",
    )
    p.add_argument(
        "--vllm-mem-util",
        type=float,
        default=None,
        help="vLLM gpu_memory_utilization (default 0.35 colocated, 0.85 on dedicated GPUs)",
    )
    p.add_argument(
        "--headroom",
        type=float,
        default=d.headroom,
        help=f"share of each card kept free for CUDA context and fragmentation "
        f"(default {d.headroom})",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"RL steps per run (default {d.steps}, the paper's)",
    )
    p.add_argument(
        "--step-seconds",
        type=float,
        default=d.step_seconds,
        help=f"wall seconds per RL step: your input (default {d.step_seconds:g}, a placeholder "
        "for a 16-task x 8-rollout household step of up to 50 turns on 8 A100/H100; "
        "measure a few steps with `sdar train` and pass the number)",
    )
    p.add_argument(
        "--runs", type=int, default=d.runs, help="training runs priced, arms x seeds (default 1)"
    )
    p.add_argument(
        "--instance",
        default=None,
        help="price this instance type instead of the cheapest that fits",
    )
    p.add_argument(
        "--price",
        type=float,
        default=None,
        help="on-demand USD per instance hour (overrides the table)",
    )
    p.add_argument(
        "--spot", action="store_true", help="rank instances and headline the cost by spot price"
    )
    p.add_argument(
        "--spot-discount",
        type=float,
        default=d.spot_discount,
        help=f"spot = on-demand x (1 - discount) (default {d.spot_discount}; "
        "check the spot price history)",
    )
    p.add_argument(
        "--spot-price",
        type=float,
        default=None,
        help="spot USD per instance hour (overrides the discount)",
    )
    p.add_argument(
        "--spot-overhead",
        type=float,
        default=d.spot_overhead,
        help=f"extra wall time on spot for interruptions and restarts (default {d.spot_overhead})",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--width", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_plan)
