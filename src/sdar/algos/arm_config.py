"""The arms of the comparison as named `ArmConfig`s, and their registry. Torch-free, so that a
training config's `arm` and `arm_overrides` are checked when it is loaded (`sdar.config`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class ArmConfig:
    """One arm of the comparison: the weights and knobs of the composed loss (`sdar.algos.compose_loss`)."""

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
        "help": "Gate sharpness (paper: 5); 0 gives the constant gate 0.5 (naive OPSD)."})
    skills_in_student_prompt: bool = field(default=False, metadata={
        "help": "The student itself sees the privileged skills in its prompt (skill_grpo)."})
    hint_distill_coef: float = field(default=0.0, metadata={
        "help": "Weight of Composer channel 2, generalized JSD to the hinted teacher at error sites (the recipe's alpha)."})
    replay_coef: float = field(default=0.0, metadata={
        "help": "Weight of Composer channel 3, DPO on N-teacher trace-replay pairs (the recipe's beta_r)."})
    clip_low: float = field(default=0.2, metadata={"help": "PPO eps_low: the ratio's lower clip is 1 - clip_low."})
    clip_high: float = field(default=0.2, metadata={
        "help": "PPO eps_high: the ratio's upper clip is 1 + clip_high (raise it for DAPO clip-higher)."})
    dual_clip: float | None = field(default=3.0, metadata={
        "help": "Dual-clip c bounding the loss of negative advantages; null disables it."})
    agg: str = field(default="token-mean", metadata={
        "help": "How per-token losses become one number: token-mean | seq-mean-token-mean | seq-mean-token-sum | "
                "token-sum (sdar.algos.AGG_MODES)."})
    jsd_beta: float = field(default=0.5, metadata={
        "help": "Generalized-JSD interpolation of the hint channel: 0 = KL(teacher||student), 1 = KL(student||teacher)."})
    jsd_temperature: float = field(default=1.0, metadata={
        "help": "The hint channel compares softmax(logits / jsd_temperature) of student and teacher."})
    jsd_top_k: int | None = field(default=None, metadata={
        "help": "Restrict the hint channel's distributions to the teacher's top-k tokens; null = the whole vocabulary."})
    dpo_beta: float = field(default=0.1, metadata={"help": "DPO beta of the replay channel."})
    extra_coefs: tuple[tuple[str, float], ...] = field(default=(), metadata={
        "help": "Weights of registered loss terms that have no field here, as (coef name, weight) pairs "
                "(in a config: a mapping of name to weight)."})

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
    cols = ("pg_coef", "kl_coef", "entropy_coef", "sdar_coef", "gate_beta", "skills_in_student_prompt",
            "hint_distill_coef", "replay_coef")
    return [{"arm": a.name, **{c: getattr(a, c) for c in cols}, "description": a.description} for a in ARMS.values()]
