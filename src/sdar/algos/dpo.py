"""Direct preference optimisation loss for the N-teacher trace-replay channel.

`-log sigmoid(b * ((lp_c - ref_c) - (lp_r - ref_r)))`, reference log-probs precomputed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sdar.algos._agg import upcast


def dpo_loss(
    chosen_logp: torch.Tensor,
    rejected_logp: torch.Tensor,
    ref_chosen_logp: torch.Tensor,
    ref_rejected_logp: torch.Tensor,
    beta: float = 0.1,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean DPO loss over pairs.

    chosen_logp, rejected_logp: [P] summed log-probs of each pair's chosen / rejected
        action under the policy (with grad).
    ref_chosen_logp, ref_rejected_logp: [P] the same under the frozen reference (no grad).
    beta: DPO temperature b. mask: optional [P] of valid pairs.
    Returns (loss, stats) with reward_chosen, reward_rejected, reward_margin
    (means of b * (lp - ref)) and accuracy (share of pairs with a positive margin).
    No pairs (or an empty mask) give loss 0, never NaN.
    """
    if beta <= 0:
        raise ValueError(f"DPO beta must be > 0 (the default is 0.1), got {beta}")
    shapes = {t.shape for t in (chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp)}
    if len(shapes) != 1:
        raise ValueError(f"DPO inputs must share one shape [P], got {sorted(tuple(s) for s in shapes)}")
    chosen = beta * (upcast(chosen_logp) - upcast(ref_chosen_logp.detach()))
    rejected = beta * (upcast(rejected_logp) - upcast(ref_rejected_logp.detach()))
    margin = chosen - rejected
    w = torch.ones_like(margin) if mask is None else mask.to(margin.dtype)
    n = w.sum().clamp(min=1.0)
    loss = (-F.logsigmoid(margin) * w).sum() / n

    def mean(x: torch.Tensor) -> torch.Tensor:
        return (x.detach() * w).sum() / n

    stats = {
        "reward_chosen": mean(chosen),
        "reward_rejected": mean(rejected),
        "reward_margin": mean(margin),
        "accuracy": mean((margin > 0).to(margin.dtype)),
    }
    return loss, stats
