"""The arms of the comparison as named `ArmConfig`s, and their registry. Torch-free, so that a
training config's `arm` and `arm_overrides` are checked when it is loaded (`sdar.config`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

# how per-token values become one scalar (sdar.algos.aggregate); the names are verl's loss_agg_mode
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum", "seq-mean-token-sum-norm")
OBJECTIVES = ("clip", "cispo", "sapo")
RATIO_LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class LossType:
    """A named policy-gradient loss (TRL's `loss_type`): the per-token objective, the aggregation of the arm's
    token-level terms, and how a mini-batch's micro-batches are normalised (None: `ppo.loss_normalisation`).

    objective: clip (PPO-clip, with the arm's asymmetric clip and dual-clip), cispo (the truncated, detached IS
        weight times log pi), sapo (a soft sigmoid gate in place of the clip); formulas in `sdar.algos.policy`.
    agg: None keeps the arm's own `agg` (loss_type ppo); otherwise it replaces it for every token-level term but
        the entropy bonus, a token mean as in TRL (`ArmConfig.entropy_aggregation`).
    normalisation: micro_batch = each micro-batch aggregated over its own rows, the mini-batch the mean of them
        (TRL's per-step losses divided by gradient accumulation); mini_batch = one aggregation over all the
        mini-batch's tokens on every rank (TRL's num_items_in_batch).
    trl: what it matches in TRL (GRPOConfig) and verl; differs: where ours is not the same, or "".
    """

    name: str
    objective: str
    agg: str | None
    normalisation: str | None
    trl: str
    differs: str = ""


LOSS_TYPES: dict[str, LossType] = {t.name: t for t in (
    LossType("ppo", "clip", None, None,
             "verl policy_loss.loss_mode=vanilla with the arm's agg (the SDAR reference's actor loss)",
             "dual-clip c=3 on A<0 (verl clip_ratio_c); the aggregation is the arm's agg"),
    LossType("grpo", "clip", "seq-mean-token-mean", "micro_batch",
             "TRL loss_type=grpo; verl loss_agg_mode=seq-mean-token-mean",
             "the arm's dual-clip (c=3) stays on unless dual_clip: null; TRL has none (its delta caps the ratio "
             "for every A)"),
    LossType("bnpo", "clip", "token-mean", "micro_batch",
             "TRL loss_type=bnpo (token mean over each micro-batch)", "dual-clip as for grpo"),
    LossType("dr_grpo", "clip", "seq-mean-token-sum-norm", "micro_batch",
             "TRL loss_type=dr_grpo (sum / (B * max_completion_length)); verl seq-mean-token-sum-norm",
             "the constant is rollout.max_response_tokens; dual-clip as for grpo"),
    LossType("dapo", "clip", "token-mean", "mini_batch",
             "TRL loss_type=dapo (token sum over the tokens of the whole batch, every process); verl token-mean",
             "DAPO's clip-higher is clip_high: 0.28, set it yourself as in TRL; dual-clip as for grpo"),
    LossType("cispo", "cispo", "token-mean", "mini_batch",
             "TRL loss_type=cispo; MiniMax-M1's CISPO",
             "the weight is capped at 1 + clip_high (MiniMax's eps_high); TRL caps it at epsilon_high itself"),
    LossType("sapo", "sapo", "seq-mean-token-mean", "micro_batch",
             "TRL loss_type=sapo with sapo_temperature_pos/neg", ""),
)}


@dataclass(frozen=True)
class ArmConfig:
    """One arm of the comparison: the weights and knobs of the composed loss (`sdar.algos.compose_loss`). A field's
    "bound" is the range a config's arm_overrides may give it, checked when the config is loaded (sdar.config)."""

    name: str = field(metadata={"help": "The arm's registered name (a config picks it with `arm:`)."})
    description: str = field(default="", metadata={"help": "One line for `sdar arms` and the reports."})
    pg_coef: float = field(default=1.0, metadata={
        "help": "Weight of the PPO-clip policy-gradient term (0 = no RL signal)."})
    kl_coef: float = field(default=0.01, metadata={
        "help": "Weight of the k3 KL to the reference (paper: 0.01; 0.001 for search tasks)."})
    entropy_coef: float = field(default=0.001, metadata={
        "help": "Weight of the entropy bonus, subtracted from the loss (paper: 0.001)."})
    sdar_coef: float = field(default=0.0, metadata={
        "help": "lambda: weight of the gated teacher-distillation term (0 = off; paper: 0.01)."})
    gate_beta: float = field(default=5.0, metadata={
        "help": "Gate sharpness (paper: 5); 0 gives the constant gate 0.5 (naive OPSD).", "bound": "> 0"})
    skills_in_student_prompt: bool = field(default=False, metadata={
        "help": "The student itself sees the privileged skills in its prompt (skill_grpo)."})
    hint_distill_coef: float = field(default=0.0, metadata={
        "help": "Weight of Composer channel 2, generalized JSD to the hinted teacher at error sites (the recipe's alpha)."})
    replay_coef: float = field(default=0.0, metadata={
        "help": "Weight of Composer channel 3, DPO on N-teacher trace-replay pairs (the recipe's beta_r)."})
    clip_low: float = field(default=0.2, metadata={
        "help": "PPO eps_low: the ratio's lower clip is 1 - clip_low.", "bound": "[0, 1)"})
    clip_high: float = field(default=0.2, metadata={
        "help": "PPO eps_high: the ratio's upper clip is 1 + clip_high (raise it for DAPO clip-higher).",
        "bound": ">= 0"})
    dual_clip: float | None = field(default=3.0, metadata={
        "help": "Dual-clip c bounding the loss of negative advantages; null disables it.", "bound": "> 1"})
    agg: str = field(default="token-mean", metadata={
        "help": "How per-token losses become one number under loss_type ppo: " + " | ".join(AGG_MODES)
                + " (the other loss types set their own)."})
    loss_type: str = field(default="ppo", metadata={
        "help": "The policy-gradient loss, TRL's menu: " + " | ".join(LOSS_TYPES) + ". ppo is the paper's "
                "(PPO-clip, dual-clip, agg); the others set the objective and the aggregation of every token-level "
                "term as TRL does (docs/algorithms.md, `sdar arms --loss-types`)."})
    importance_sampling_level: str = field(default="token", metadata={
        "help": "token: one importance ratio per token; sequence: GSPO's, exp(mean log-ratio over the response), "
                "shared by its tokens (GSPO pairs it with loss_type grpo and clip ranges near 3e-4/4e-4)."})
    sapo_temperature_pos: float = field(default=1.0, metadata={
        "help": "SAPO's gate temperature for tokens with positive advantage (loss_type sapo; TRL's default).",
        "bound": "> 0"})
    sapo_temperature_neg: float = field(default=1.05, metadata={
        "help": "SAPO's gate temperature for tokens with non-positive advantage (loss_type sapo; TRL's default).",
        "bound": "> 0"})
    jsd_beta: float = field(default=0.5, metadata={
        "help": "Generalized-JSD interpolation of the hint channel: 0 = KL(teacher||student), 1 = KL(student||teacher).",
        "bound": "[0, 1]"})
    jsd_temperature: float = field(default=1.0, metadata={
        "help": "The hint channel compares softmax(logits / jsd_temperature) of student and teacher.", "bound": "> 0"})
    jsd_top_k: int | None = field(default=None, metadata={
        "help": "Restrict the hint channel's distributions to the teacher's top-k tokens; null = the whole vocabulary.",
        "bound": ">= 1"})
    dpo_beta: float = field(default=0.1, metadata={"help": "DPO beta of the replay channel.", "bound": "> 0"})
    extra_coefs: tuple[tuple[str, float], ...] = field(default=(), metadata={
        "help": "Weights of registered loss terms that have no field here, as (coef name, weight) pairs "
                "(in a config: a mapping of name to weight)."})

    def __post_init__(self) -> None:
        choices = {"agg": (self.agg, AGG_MODES), "loss_type": (self.loss_type, tuple(LOSS_TYPES)),
                   "importance_sampling_level": (self.importance_sampling_level, RATIO_LEVELS)}
        for key, (value, valid) in choices.items():
            if value not in valid:
                raise ValueError(f"arm {self.name!r}: {key}={value!r} is not one of {', '.join(valid)}")
        fixed = LOSS_TYPES[self.loss_type].agg
        if fixed is not None and self.agg not in ("token-mean", fixed):
            raise ValueError(f"arm {self.name!r}: loss_type {self.loss_type} aggregates as {fixed}, so agg={self.agg!r} "
                             "would be ignored; drop agg, or use loss_type ppo to choose the aggregation yourself")
        if min(self.sapo_temperature_pos, self.sapo_temperature_neg) <= 0:
            raise ValueError(f"arm {self.name!r}: sapo temperatures must be > 0, got {self.sapo_temperature_pos}, "
                             f"{self.sapo_temperature_neg}")

    @property
    def aggregation(self) -> str:
        """How the arm's token-level terms are aggregated: its loss type's, or `agg` under loss_type ppo."""
        return LOSS_TYPES[self.loss_type].agg or self.agg

    @property
    def entropy_aggregation(self) -> str:
        """The entropy bonus's aggregation: `agg` under loss_type ppo (verl's, as the reference); under TRL's loss
        types TRL's token mean, so that H does not depend on how the policy term is normalised."""
        return self.agg if self.loss_type == "ppo" else "token-mean"

    def normalisation(self, configured: str) -> str:
        """How a mini-batch's micro-batches are normalised: the loss type's, or `configured`
        (`ppo.loss_normalisation`) under loss types that leave it open (ppo)."""
        return LOSS_TYPES[self.loss_type].normalisation or configured

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


# what a config's `arm_overrides` may set: every ArmConfig field but the name (`arm:` picks the arm)
OVERRIDABLE = tuple(f.name for f in fields(ArmConfig) if f.name != "name")

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
        gate_beta=0.0,
    )
)
register_arm(
    ArmConfig("sdar", "GRPO + sigmoid-gated self-distillation (SDAR)", sdar_coef=0.01, gate_beta=5.0)
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
        gate_beta=5.0,
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
                       sdar_coef=0.01, gate_beta=5.0, hint_distill_coef=0.1, replay_coef=0.05))


def get_arm(name: str, **overrides) -> ArmConfig:
    """The registered arm `name`, optionally with some settings overridden."""
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; choose one of {', '.join(ARMS)}")
    arm = ARMS[name]
    return arm.with_overrides(**overrides) if overrides else arm


def arms_table() -> list[dict[str, object]]:
    """One row per registered arm with the settings that tell arms apart."""
    cols = ("loss_type", "pg_coef", "kl_coef", "entropy_coef", "sdar_coef", "gate_beta", "skills_in_student_prompt",
            "hint_distill_coef", "replay_coef")
    return [{"arm": a.name, **{c: getattr(a, c) for c in cols}, "description": a.description} for a in ARMS.values()]


def loss_types_table() -> list[dict[str, object]]:
    """One row per loss type: its objective, aggregation, normalisation, what it matches and where it differs."""
    return [{"loss_type": t.name, "objective": t.objective, "agg": t.agg or "the arm's agg",
             "normalisation": t.normalisation or "ppo.loss_normalisation", "matches": t.trl, "differs": t.differs}
            for t in LOSS_TYPES.values()]
