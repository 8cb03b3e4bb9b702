"""SDAR's sigmoid-gated self-distillation from a privileged-context teacher.

Per token: gap = logT - sg[logp]; gate g = sg[sigmoid(beta * gap)]; loss = agg(g * (logT - logp)).
Endorsed tokens (gap > 0) are pulled up; rejected ones (gap < 0) are only down-weighted.
"""

from __future__ import annotations

import torch

from sdar.algos._agg import aggregate, as_mask, masked_mean, upcast


def sdar_gate(logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float = 5.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The detached (gate, gap) pair, both [B, T] in the compute dtype. beta = 0 gives the constant gate 0.5."""
    gap = upcast(teacher_logp.detach()) - upcast(logp.detach())
    return torch.sigmoid(beta * gap), gap


def sdar_distill_loss(
    logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 5.0,
    agg: str = "token-mean",
    budget: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Gated distillation loss toward the privileged teacher.

    logp: [B, T] student log-probs of the sampled tokens (with grad).
    teacher_logp: [B, T] log-probs of the same tokens under theta_old with the skills in
        the prompt; detached here, whatever the caller passes.
    mask: [B, T] response mask. beta: gate sharpness (0 = naive OPSD, gate 0.5).
    Returns (loss, stats). With token-mean, d loss / d logp = -g * mask / n_tokens: only
    logp carries gradient. Stats: gate_mean, gap_mean, pos_gap_frac (gap > 0), and
    gated_gap_mean (mean of g * gap).
    """
    m = as_mask(mask, logp)
    gate, gap = sdar_gate(logp, teacher_logp, beta)
    per_token = gate * (upcast(teacher_logp.detach()) - upcast(logp))
    loss = aggregate(per_token, m, agg, budget)
    stats = {
        "gate_mean": masked_mean(gate, m),
        "gap_mean": masked_mean(gap, m),
        "pos_gap_frac": masked_mean((gap > 0).to(gap.dtype), m),
        "gated_gap_mean": masked_mean(gate * gap, m),
    }
    return loss, stats
