"""The algorithm core: pure tensor functions with explicit masks, and arms as named configs.

Nothing here does I/O or knows about models; the trainer feeds tensors in. Names resolve
lazily so that `sdar` commands that never touch tensors do not import torch.
"""

import importlib

_EXPORTS = {
    "AGG_MODES": "_agg", "aggregate": "_agg",
    "grpo_advantages": "advantages",
    "ARMS": "arm_config", "ArmConfig": "arm_config", "arms_table": "arm_config", "get_arm": "arm_config",
    "register_arm": "arm_config", "LOSS_TYPES": "arm_config", "LossType": "arm_config",
    "loss_types_table": "arm_config",
    "LossBatch": "arms", "compose_loss": "arms", "LOSS_TERMS": "arms", "LossTerm": "arms", "register_loss_term": "arms",
    "dpo_loss": "dpo",
    "generalized_jsd": "jsd",
    "entropy_from_logits": "kl", "entropy_per_token": "kl", "kl_k3": "kl", "kl_k3_per_token": "kl",
    "log_importance_ratio": "policy", "policy_loss": "policy",
    "sdar_distill_loss": "sdar", "sdar_gate": "sdar",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"sdar.algos.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'sdar.algos' has no attribute {name!r}")


def __dir__():
    return __all__
