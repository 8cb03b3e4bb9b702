"""Arms as named loss configurations, and the one function that composes any arm's loss.

`L = pg_coef*L_pg + kl_coef*KL - entropy_coef*H + sdar_coef*L_sdar
     + hint_distill_coef*JSD_hint + replay_coef*L_dpo`; every component is returned for logging.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Callable

import torch

from sdar.algos.dpo import dpo_loss
from sdar.algos.jsd import generalized_jsd
from sdar.algos.kl import entropy_per_token, kl_k3
from sdar.algos._agg import aggregate, upcast
from sdar.algos.policy import policy_loss
from sdar.algos.sdar import sdar_distill_loss


@dataclass(frozen=True)
class ArmConfig:
    """One arm of the comparison: the weights and knobs of the composed loss."""

    name: str
    description: str = ""
    pg_coef: float = 1.0  # weight of the PPO-clip policy-gradient term (0 = no RL signal)
    kl_coef: float = 0.01  # k3 KL to the reference; the paper uses 0.001 for search tasks
    entropy_coef: float = 0.001  # entropy bonus (subtracted from the loss)
    sdar_coef: float = 0.0  # lambda: weight of the teacher-distillation term (0 = off)
    sdar_beta: float = 5.0  # gate sharpness; 0 gives the constant gate 0.5 (naive OPSD)
    skills_in_student_prompt: bool = False  # the student itself sees the skills (skill_grpo)
    hint_distill_coef: float = 0.0  # alpha: Composer channel 2, JSD at error sites
    replay_coef: float = 0.0  # beta_r: Composer channel 3, DPO on N-teacher replay pairs
    clip_low: float = 0.2  # PPO eps_low
    clip_high: float = 0.2  # PPO eps_high (raise it for DAPO clip-higher)
    dual_clip: float | None = 3.0  # dual-clip c for negative advantages; None disables
    agg: str = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum | token-sum
    jsd_beta: float = 0.5  # generalized-JSD interpolation for the hint channel
    jsd_temperature: float = 1.0
    jsd_top_k: int | None = None
    dpo_beta: float = 0.1
    extra_coefs: tuple[tuple[str, float], ...] = ()  # weights of registered loss terms with no field here

    @property
    def needs_teacher(self) -> bool:
        """Whether the privileged teacher must score the batch for the loss itself."""
        return self.sdar_coef != 0.0

    def with_overrides(self, **overrides) -> "ArmConfig":
        """A copy with some fields changed; unknown field names are an error."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown arm setting(s) {unknown}; valid settings: {', '.join(sorted(known))}")
        return dataclasses.replace(self, **overrides)


ARMS: dict[str, ArmConfig] = {}


def register_arm(arm: ArmConfig) -> ArmConfig:
    """Add an arm to the registry (a new variant is one call)."""
    ARMS[arm.name] = arm
    return arm


register_arm(ArmConfig("grpo", "GRPO backbone: PPO-clip + k3 KL + entropy, no distillation"))
register_arm(
    ArmConfig(
        "grpo_opsd",
        "GRPO + naive on-policy self-distillation (constant gate 0.5)",
        sdar_coef=0.01,
        sdar_beta=0.0,
    )
)
register_arm(
    ArmConfig("sdar", "GRPO + sigmoid-gated self-distillation (SDAR)", sdar_coef=0.01, sdar_beta=5.0)
)
# As the reference's OPSD script (ZJU-REAL/SDAR examples/opsd_trainer/run_alfworld_3b.sh: pg_loss_coef=0,
# sdar_coef=0.01, gate_beta 5): lambda stays 0.01, so distillation is weighed against KL 0.01 and entropy
# 0.001 exactly as in the sdar arm, with the policy gradient switched off.
register_arm(
    ArmConfig(
        "opsd",
        "Gated self-distillation alone (no policy gradient); KL and entropy kept",
        pg_coef=0.0,
        sdar_coef=0.01,
        sdar_beta=5.0,
    )
)
register_arm(
    ArmConfig(
        "skill_grpo",
        "GRPO with the skills in the student's own prompt (paper baseline)",
        skills_in_student_prompt=True,
    )
)


# Composer channel 2 (ALGORITHM.md section 5): GRPO + hint distillation at error sites, alpha 0.1
register_arm(ArmConfig("grpo_hint", "GRPO + hint distillation (generalized JSD) at environment-marked error sites",
                       hint_distill_coef=0.1))
# Composer channel 3: GRPO + DPO on N-teacher trace-replay pairs, beta_r 0.05; and the seed's ablation matrix
register_arm(ArmConfig("grpo_replay", "GRPO + DPO on pairs where >= min_agree teachers overrule the student",
                       replay_coef=0.05))
register_arm(ArmConfig("composer", "GRPO + hint distillation + trace-replay DPO (Composer channels 2 and 3)",
                       hint_distill_coef=0.1, replay_coef=0.05))
register_arm(ArmConfig("sdar_composer", "SDAR + hint distillation + trace-replay DPO (all three channels)",
                       sdar_coef=0.01, sdar_beta=5.0, hint_distill_coef=0.1, replay_coef=0.05))


def get_arm(name: str, **overrides) -> ArmConfig:
    """The registered arm `name`, optionally with some settings overridden."""
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; choose one of {', '.join(ARMS)}")
    arm = ARMS[name]
    return arm.with_overrides(**overrides) if overrides else arm


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
                       dual_clip=arm.dual_clip, agg=arm.agg)


def _kl(arm: ArmConfig, b: LossBatch):
    return kl_k3(b.logp, b.ref_logp, b.mask, agg=arm.agg), {}


def _entropy(arm: ArmConfig, b: LossBatch):
    ent_tok = b.entropy if b.entropy is not None else entropy_per_token(b.logits)
    return aggregate(ent_tok, b.mask, arm.agg), {}


def _sdar(arm: ArmConfig, b: LossBatch):
    return sdar_distill_loss(b.logp, b.teacher_logp, b.mask, beta=arm.sdar_beta, agg=arm.agg)


def _hint(arm: ArmConfig, b: LossBatch):
    jsd = generalized_jsd(b.hint_student_logits, b.hint_teacher_logits, b.hint_mask, beta=arm.jsd_beta,
                          temperature=arm.jsd_temperature, top_k=arm.jsd_top_k, agg=arm.agg)
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


def compose_loss(arm: ArmConfig | str, batch: LossBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The total loss of `batch` under `arm`, and every component under its own name.

    Every registered `LossTerm` in order: `total += sign * weight * value` when its weight is not 0
    (a missing input is then an error naming it); `loss/<name>` (and its statistics) are logged when
    computed. Built in: `loss/pg`, `loss/kl`, `loss/entropy` (the entropy H itself, subtracted),
    `loss/sdar`, `loss/hint_jsd`, `loss/replay_dpo`, plus `pg/*`, `sdar/*` and `replay/*` statistics.
    All metrics are detached scalars. A term whose weight is 0 is not added (so a NaN in an unused
    input cannot leak into the total).
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
            total = total + term.sign * w * value
    metrics["loss/total"] = total.detach()
    return total, metrics


def arms_table() -> list[dict[str, object]]:
    """One row per registered arm with the settings that tell arms apart."""
    cols = ("pg_coef", "kl_coef", "entropy_coef", "sdar_coef", "sdar_beta", "skills_in_student_prompt",
            "hint_distill_coef", "replay_coef")
    return [{"arm": a.name, **{c: getattr(a, c) for c in cols}, "description": a.description} for a in ARMS.values()]
