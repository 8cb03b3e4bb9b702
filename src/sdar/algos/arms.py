"""The one function that composes any arm's loss, from registered loss terms (the arms themselves,
named `ArmConfig`s, are in the torch-free `sdar.algos.arm_config`).

`L = pg_coef*L_pg + kl_coef*KL - entropy_coef*H + sdar_coef*L_sdar
     + hint_distill_coef*JSD_hint + replay_coef*L_dpo`; every component is returned for logging.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from sdar.algos.arm_config import ARMS, LOSS_TYPES, ArmConfig, arms_table, get_arm, register_arm  # noqa: F401 (re-exported)
from sdar.algos.dpo import dpo_loss
from sdar.algos.jsd import generalized_jsd
from sdar.algos.kl import entropy_per_token, kl_k3
from sdar.algos._agg import aggregate, upcast
from sdar.algos.policy import policy_loss
from sdar.algos.sdar import sdar_distill_loss


@dataclass
class LossBatch:
    """Everything one mini-batch can feed the composed loss. Shapes: B sequences, T tokens.

    logp: [B, T] current log-probs of the sampled tokens (with grad).
    old_logp: [B, T] log-probs under the sampling policy.
    advantages: [B] or [B, T].
    mask: [B, T] response mask.
    ref_logp: [B, T] under the frozen reference (needed when kl_coef != 0).
    teacher_logp: [B, T] under theta_old with privileged skills (needed when sdar_coef != 0;
        when given to any arm, the gate statistics are logged without entering the loss).
    logits: [B, T, V] current logits, for the entropy term; or pass `entropy` [B, T].
    hint_*: Composer channel 2 inputs; dpo_*: channel 3 inputs ([P] summed log-probs).
    budget: the constant per-sequence token budget of the seq-mean-token-sum-norm aggregation (loss_type dr_grpo:
        the rollout's max_response_tokens); None = each tensor's padded width.
    """

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logp: torch.Tensor | None = None
    teacher_logp: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    hint_student_logits: torch.Tensor | None = None
    hint_teacher_logits: torch.Tensor | None = None
    hint_mask: torch.Tensor | None = None
    dpo_chosen_logp: torch.Tensor | None = None
    dpo_rejected_logp: torch.Tensor | None = None
    dpo_ref_chosen_logp: torch.Tensor | None = None
    dpo_ref_rejected_logp: torch.Tensor | None = None
    budget: int | None = None
    extras: dict = field(default_factory=dict)


def _input(batch: LossBatch, name: str):
    """A loss input: a LossBatch field, or an entry of `batch.extras` (a new term's own inputs)."""
    return getattr(batch, name) if hasattr(batch, name) else batch.extras.get(name)


def _require(batch: LossBatch, arm: ArmConfig, names: tuple[str, ...], why: str) -> None:
    missing = [n for n in names if _input(batch, n) is None]
    if missing:
        raise ValueError(f"arm {arm.name!r} needs {', '.join(missing)} in the batch ({why}); compute it or set that weight to 0")


@dataclass(frozen=True)
class LossTerm:
    """One term of the composed loss: `total += sign * coef * value`.

    name: the metric is `loss/<name>`; stats: the term's statistics go under `<stats>/<key>`.
    coef: the ArmConfig field holding its weight (or a key of `ArmConfig.extra_coefs`).
    inputs: the LossBatch fields (or `extras` keys) it reads; required when the weight is not 0.
    fn(arm, batch) -> (value, stats): the term as a scalar, and a dict of detached statistics.
    always: computed (for its metric) whenever its inputs are there, even at weight 0; False = only
        when weighted. any_input: one of `inputs` suffices (entropy: logits or entropy).
    optional: a batch may lack the inputs even when weighted (the term is then skipped): replay pairs
        ride in only some of a step's micro-batches.
    """

    name: str
    coef: str
    inputs: tuple[str, ...]
    fn: Callable[[ArmConfig, LossBatch], tuple[torch.Tensor, dict]]
    sign: float = 1.0
    stats: str | None = None
    always: bool = True
    any_input: bool = False
    optional: bool = False

    def weight(self, arm: ArmConfig) -> float:
        if hasattr(arm, self.coef):
            return float(getattr(arm, self.coef))
        return float(dict(arm.extra_coefs).get(self.coef, 0.0))

    def available(self, batch: LossBatch) -> bool:
        have = [_input(batch, n) is not None for n in self.inputs]
        return any(have) if self.any_input else all(have)


LOSS_TERMS: dict[str, LossTerm] = {}


def register_loss_term(term: LossTerm) -> LossTerm:
    """Add a term to every arm's loss (its weight, from `term.coef`, decides whether it counts). A new
    channel is this one call plus its inputs (LossBatch fields or `extras` keys)."""
    LOSS_TERMS[term.name] = term
    return term


def _pg(arm: ArmConfig, b: LossBatch):
    return policy_loss(b.logp, b.old_logp, b.advantages, b.mask, clip_low=arm.clip_low, clip_high=arm.clip_high,
                       dual_clip=arm.dual_clip, agg=arm.aggregation, objective=LOSS_TYPES[arm.loss_type].objective,
                       importance_sampling_level=arm.importance_sampling_level,
                       sapo_temperatures=(arm.sapo_temperature_pos, arm.sapo_temperature_neg), budget=b.budget)


def _kl(arm: ArmConfig, b: LossBatch):
    return kl_k3(b.logp, b.ref_logp, b.mask, agg=arm.aggregation, budget=b.budget), {}


def _entropy(arm: ArmConfig, b: LossBatch):
    ent_tok = b.entropy if b.entropy is not None else entropy_per_token(b.logits)
    return aggregate(ent_tok, b.mask, arm.entropy_aggregation, b.budget), {}


def _sdar(arm: ArmConfig, b: LossBatch):
    return sdar_distill_loss(b.logp, b.teacher_logp, b.mask, beta=arm.gate_beta, agg=arm.aggregation, budget=b.budget)


def _hint(arm: ArmConfig, b: LossBatch):
    jsd = generalized_jsd(b.hint_student_logits, b.hint_teacher_logits, b.hint_mask, beta=arm.jsd_beta,
                          temperature=arm.jsd_temperature, top_k=arm.jsd_top_k, agg=arm.aggregation, budget=b.budget)
    return jsd, {}


def _replay(arm: ArmConfig, b: LossBatch):
    names = ("dpo_chosen_logp", "dpo_rejected_logp", "dpo_ref_chosen_logp", "dpo_ref_rejected_logp")
    return dpo_loss(*(getattr(b, n) for n in names), beta=arm.dpo_beta)


register_loss_term(LossTerm("pg", "pg_coef", ("logp", "old_logp", "advantages", "mask"), _pg, stats="pg"))
register_loss_term(LossTerm("kl", "kl_coef", ("ref_logp",), _kl))
register_loss_term(LossTerm("entropy", "entropy_coef", ("logits", "entropy"), _entropy, sign=-1.0, any_input=True))
register_loss_term(LossTerm("sdar", "sdar_coef", ("teacher_logp",), _sdar, stats="sdar"))
register_loss_term(LossTerm("hint_jsd", "hint_distill_coef", ("hint_student_logits", "hint_teacher_logits", "hint_mask"),
                            _hint, always=False))
register_loss_term(LossTerm("replay_dpo", "replay_coef", ("dpo_chosen_logp", "dpo_rejected_logp", "dpo_ref_chosen_logp",
                                                         "dpo_ref_rejected_logp"), _replay, stats="replay", always=False,
                            optional=True))


def compose_loss(arm: ArmConfig | str, batch: LossBatch, scales: dict[str, float] | None = None
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The total loss of `batch` under `arm`, and every component under its own name.

    Every registered `LossTerm` in order: `total += sign * weight * value` when its weight is not 0
    (a missing input is then an error naming it); `loss/<name>` (and its statistics) are logged when
    computed. Built in: `loss/pg`, `loss/kl`, `loss/entropy` (the entropy H itself, subtracted),
    `loss/sdar`, `loss/hint_jsd`, `loss/replay_dpo`, plus `pg/*`, `sdar/*` and `replay/*` statistics.
    All metrics are detached scalars. A term whose weight is 0 is not added (so a NaN in an unused
    input cannot leak into the total).
    scales: term name -> a factor on that term in the total (a data-parallel rank's share of the term's own
    denominator: `sdar.train.distributed.RowSplit.share`); the metrics stay unscaled.
    """
    if isinstance(arm, str):
        arm = get_arm(arm)
    metrics: dict[str, torch.Tensor] = {}
    total = torch.zeros((), dtype=upcast(batch.logp).dtype, device=batch.logp.device)
    for term in LOSS_TERMS.values():
        w = term.weight(arm)
        if w != 0.0 and not term.available(batch):
            if term.optional:
                continue
            if term.any_input:
                raise ValueError(f"arm {arm.name!r} has {term.coef} != 0 but the batch has neither "
                                 f"{' nor '.join(term.inputs)}; pass one or set {term.coef}=0")
            _require(batch, arm, term.inputs, f"{term.coef} != 0")
        if not (w != 0.0 or (term.always and term.available(batch))):
            continue
        value, stats = term.fn(arm, batch)
        metrics[f"loss/{term.name}"] = value.detach()
        if term.stats:
            metrics.update({f"{term.stats}/{k}": v for k, v in stats.items()})
        if w != 0.0:
            total = total + term.sign * w * (value if scales is None else scales.get(term.name, 1.0) * value)
    metrics["loss/total"] = total.detach()
    return total, metrics


def metric_term(key: str) -> str | None:
    """The loss term a metric of `compose_loss` belongs to (`loss/<name>`, or its statistics `<stats>/...`); None for
    `loss/total` and names no term has."""
    head, _, rest = key.partition("/")
    if head == "loss":
        return rest if rest in LOSS_TERMS else None
    return next((t.name for t in LOSS_TERMS.values() if t.stats == head), None)
