"""Bytes per GPU of each model role (actor, reference, vLLM rollout engine, teacher) in each phase
of one SDAR step, with the formula behind every number, and whether the step fits."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sdar.sizing.arch import Arch
from sdar.sizing.settings import SizingSettings
from sdar.sizing.units import GiB, SizingError

PHASES = ("rollout", "teacher", "update")
PHASE_TITLE = {
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
class MemoryBudget:
    """The memory of one RL step: every item (bytes per GPU), each phase's peak, vLLM's sizing
    (`rollout`, from _rollout_engine) and why it does not fit (`problems`, empty when it fits)."""

    arch: Arch
    source: str
    settings: SizingSettings
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


def _rollout_engine(a: Arch, s: SizingSettings) -> dict[str, Any]:
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
            raise SizingError(
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


def memory_budget(arch: Arch, s: SizingSettings, source: str = "") -> MemoryBudget:
    """Bytes per GPU of every model role in each phase of one RL step, and the fit verdict."""
    s.validate()
    engine = _rollout_engine(arch, s)
    items = [*_actor_items(arch, s), *_reference_items(arch, s), *_rollout_items(arch, s, engine),
             *_teacher_items(arch, s)]
    phases = _phase_peaks(items, s)
    return MemoryBudget(arch, source, s, items, phases, engine, _problems(arch, s, engine, phases))


def _shards(s: SizingSettings) -> tuple[int, str]:
    """The ways the training state is sharded, and its ' / S' for a formula ('' unsharded)."""
    S = s.train_gpus if s.shard else 1
    return S, f" / {S}" if S > 1 else ""


def _resident(s: SizingSettings) -> tuple[str, ...]:
    """The phases of what stays on the training GPUs through the whole step."""
    return ("rollout", "teacher", "update") if s.colocate else ("teacher", "update")


def _actor_items(a: Arch, s: SizingSettings) -> list[Item]:
    """The actor: its training state stays on the GPU through the whole step; FSDP's gathered
    units, the activations and the logits come and go with scoring and the update."""
    P, (S, per), resident = a.params(), _shards(s), _resident(s)
    items: list[Item] = []
    if s.lora:
        A = a.lora_params(s.lora_r)
        items += [
            Item("actor", "base weights bf16 (frozen)", f"2 B x {_n(P)}{per}", 2 * P / S, resident),
            Item("actor", f"LoRA r={s.lora_r}: fp32 adapter + grads + Adam m,v",
                 f"(4+4+8) B x {_n(A)}{per}", 16 * A / S, resident),
        ]
    else:  # mixed-precision Adam as in ZeRO (Rajbhandari et al. 2020): 2 + 2 + 12 B/param
        items += [
            Item("actor", "weights bf16", f"2 B x {_n(P)}{per}", 2 * P / S, resident),
            Item("actor", "gradients bf16", f"2 B x {_n(P)}{per}", 2 * P / S, resident),
            Item("actor", "master weights fp32", f"4 B x {_n(P)}{per}", 4 * P / S, resident),
            Item("actor", "Adam m, v fp32", f"8 B x {_n(P)}{per}", 8 * P / S, resident),
        ]
    # sdar's FSDP (sdar.train.fsdp.gathered) gathers every unit at the start of a phase and keeps the weights whole
    # through it, as verl's hybrid engine does for generation: the phases' forwards are rank-local (a rank's rows,
    # lengths and prefixes are its own), so the per-unit all-gathers of ZeRO-3 would need lock-step forwards. The
    # update accumulates the gradients whole and reduce-scatters them once per mini-batch.
    if S > 1:
        items.append(Item("actor", "FSDP whole weights (gathered per phase)", f"2 B x {_n(P)}", 2 * P, resident))
        grads = (4 * a.lora_params(s.lora_r), f"4 B x {_n(a.lora_params(s.lora_r))} adapter") if s.lora \
            else (2 * P, f"2 B x {_n(P)}")
        items.append(Item("actor", "FSDP whole grads until the reduce-scatter", grads[1], grads[0], ("update",)))
    tok = s.micro_batch * s.seq_len
    per_layer = activation_bytes_per_layer(a, tok)
    head = tok * 2 * 2 * a.hidden  # final-norm input and lm_head input
    tok_txt = f"{s.micro_batch} x {s.seq_len} tok"
    on, off = ("update",), ()
    items += [
        Item("actor", "activations, checkpointing",
             f"{tok_txt} x ({a.layers} x 2h + {per_layer // tok} + 4h) B",
             a.layers * tok * 2 * a.hidden + per_layer + head,  # layer inputs + 1 layer recomputed
             on if s.checkpointing else off, "" if s.checkpointing else "not used"),
        Item("actor", "activations, no checkpointing",
             f"{tok_txt} x ({a.layers} x {per_layer // tok} + 4h) B", a.layers * per_layer + head,
             off if s.checkpointing else on, "not used" if s.checkpointing else ""),
        # sdar.models.logprobs keeps the fp32 logits for backward, whose backward adds log p and p:
        # three fp32 [tokens, V] tensors, the update's peak for a 150k vocabulary
        Item("actor", "logits fp32 (x3: logits, log p, p)", f"3 x 4 B x {tok_txt} x {a.vocab}",
             12 * tok * a.vocab, ("update",)),
    ]
    return items


def _reference_items(a: Arch, s: SizingSettings) -> list[Item]:
    """The reference: the frozen initial policy, for the KL term."""
    if s.lora:
        return [Item("reference", "base with the adapter disabled", "no extra copy", 0,
                     _resident(s))]
    P, (S, per) = a.params(), _shards(s)
    items = [Item("reference", "frozen weights bf16", f"2 B x {_n(P)}{per}", 2 * P / S, _resident(s))]
    if S > 1:  # gathered whole for the scoring phase, with the actor
        items.append(Item("reference", "FSDP whole weights (scoring phase)", f"2 B x {_n(P)}", 2 * P, ("teacher",)))
    return items


def _rollout_items(a: Arch, s: SizingSettings, r: dict[str, Any]) -> list[Item]:
    """The rollout engine: vLLM with its own weight copy and KV cache, inside its memory
    reservation (`r`, from _rollout_engine)."""
    P, gen = a.params(), ("rollout",)
    tp_txt = f" / {r['tp']}" if r["tp"] > 1 else ""
    kv_tok = a.kv_bytes_per_token()
    kv_split = f" / {min(r['tp'], a.kv_heads)}" if r["tp"] > 1 else ""
    waves = r["waves"]
    return [
        Item("rollout", f"vLLM weights bf16 (TP={r['tp']})",
             f"2 B x {_n(P)}{' + LoRA' if s.lora else ''}{tp_txt}", r["weights"], gen),
        Item("rollout", "vLLM runtime overhead",
             f"1 GiB + {VLLM_BATCHED_TOKENS} tok fwd + {VLLM_MAX_SEQS} x {a.vocab} x 4 B",
             r["runtime"], gen),
        Item("rollout", "vLLM KV cache pool",
             f"{s.util:g} x {s.gpu_mem:g} GiB - weights - runtime", max(r["pool"], 0), gen),
        Item("rollout", "KV cache needed by the rollout batch",
             f"{r['seqs_per_replica']} seqs x {s.seq_len} tok x {kv_tok} B/tok{kv_split}",
             r["kv_needed"], (),
             "fits in the pool" if waves == 1
             else (f"{waves} waves" if waves else "pool too small")),
    ]


def _teacher_items(a: Arch, s: SizingSettings) -> list[Item]:
    """The teacher: theta_old with the skills in its prompt: the actor's weights, no gradient."""
    kv_tok = a.kv_bytes_per_token()
    t_tok = s.micro_batch * (s.seq_len + s.teacher_extra_tokens)
    t_txt = f"{s.micro_batch} x {s.seq_len + s.teacher_extra_tokens} tok"
    score = ("teacher",)
    return [
        Item("teacher", "weights", "shares the actor's", 0, score),
        Item("teacher", "K/V of the teacher context", f"{kv_tok} B/tok x {t_txt}", kv_tok * t_tok,
             score),
        Item("teacher", "forward working set (1 layer)", f"{t_txt} x 2 B x (2h + 3I)",
             forward_working_bytes(a, t_tok), score),
        Item("teacher", "logits bf16 + fp32 copy", f"6 B x {t_txt} x {a.vocab}",
             6 * t_tok * a.vocab, score),
    ]


def _phase_peaks(items: list[Item], s: SizingSettings) -> list[PhasePeak]:
    """Each phase's peak per GPU: the sum of the items that are part of it."""
    usable, phases = s.usable_bytes, []
    for ph in PHASES:
        total = sum(i.bytes for i in items if ph in i.phases)
        gpus = s.n_rollout_gpus if ph == "rollout" else s.train_gpus
        phases.append(PhasePeak(ph, gpus, total, usable, total <= usable * (1 + 1e-9)))
    return phases


def _problems(a: Arch, s: SizingSettings, r: dict[str, Any], phases: list[PhasePeak]) -> list[str]:
    """Why the step does not fit, one sentence each; empty when it fits."""
    P, (S, _), usable = a.params(), _shards(s), s.usable_bytes
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
            problems.append(f"{PHASE_TITLE[p.phase]} needs {p.bytes / GiB:.1f} GiB per GPU, "
                            f"{p.usable / GiB:.1f} GiB usable "
                            f"({s.gpu_mem:g} GiB - {s.headroom:.0%} headroom)")
    return problems
