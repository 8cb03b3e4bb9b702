"""The algorithm core: pure tensor functions with explicit masks, and arms as named configs.

Nothing here does I/O or knows about models; the trainer feeds tensors in.
"""

from sdar.algos._agg import AGG_MODES, aggregate
from sdar.algos.advantages import grpo_advantages
from sdar.algos.arms import ARMS, ArmConfig, LossBatch, arms_table, compose_loss, get_arm, register_arm
from sdar.algos.dpo import dpo_loss
from sdar.algos.jsd import generalized_jsd
from sdar.algos.kl import entropy_from_logits, entropy_per_token, kl_k3, kl_k3_per_token
from sdar.algos.policy import policy_loss
from sdar.algos.sdar import sdar_distill_loss, sdar_gate

__all__ = [
    "AGG_MODES",
    "ARMS",
    "ArmConfig",
    "LossBatch",
    "aggregate",
    "arms_table",
    "compose_loss",
    "dpo_loss",
    "entropy_from_logits",
    "entropy_per_token",
    "generalized_jsd",
    "get_arm",
    "grpo_advantages",
    "kl_k3",
    "kl_k3_per_token",
    "policy_loss",
    "register_arm",
    "sdar_distill_loss",
    "sdar_gate",
]
