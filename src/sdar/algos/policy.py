"""The policy-gradient term over response tokens, with the objectives TRL's and verl's users know.

rho = pi_theta / pi_old per token (importance_sampling_level token) or, GSPO's (arXiv:2507.18071), one ratio per
sequence `s_i = exp(mean_t log rho_i,t)` shared by its tokens (sequence). Per token, with A the advantage:

clip (PPO, the paper's):  `max(-A*rho, -A*clip(rho, 1-eps_low, 1+eps_high))`, and for A < 0 capped at `-A*c`
    (dual-clip, c = 3 by default); Schulman et al. 2017, Ye et al. 2020 (dual-clip), Yu et al. 2025 (DAPO's
    clip-higher eps_high > eps_low).
cispo (MiniMax-M1, arXiv:2506.13585, eq. 4):  `-sg(min(rho, 1+eps_high)) * A * log pi_theta`: the importance
    weight is truncated and detached, so every token keeps a gradient `-w*A` through log pi.
sapo (Soft Adaptive Policy Optimization, arXiv:2511.20347):  `-(4/tau) * sigmoid(tau*(rho-1)) * A`, tau =
    tau_pos for A > 0 else tau_neg: a smooth gate in place of the hard clip whose gradient at rho = 1 is the
    unclipped one's (-A), decaying away from it.

The per-token values are then aggregated over the mask (`sdar.algos.aggregate`), as the loss type says.
"""

from __future__ import annotations

import torch

from sdar.algos._agg import aggregate, as_mask, masked_mean, upcast
from sdar.algos.arm_config import OBJECTIVES, RATIO_LEVELS

# log-ratios beyond this are numerically meaningless and would overflow exp()
_LOG_RATIO_CLAMP = 20.0


def log_importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor, m: torch.Tensor, level: str = "token"
                         ) -> torch.Tensor:
    """log rho [B, T]: per token, or (GSPO, level sequence) each sequence's mean token log-ratio over the mask,
    broadcast over its tokens (TRL: importance_sampling_level)."""
    if level not in RATIO_LEVELS:
        raise ValueError(f"importance_sampling_level={level!r} is not one of {', '.join(RATIO_LEVELS)}")
    log_ratio = (upcast(logp) - upcast(old_logp.detach())).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    if level == "token":
        return log_ratio
    zero = torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
    per_seq = torch.where(m > 0, log_ratio, zero).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
    return per_seq.expand_as(log_ratio)


def _clip(ratio, adv, clip_low, clip_high, dual_clip):
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(pg_unclipped, pg_clipped)
    clipped = (pg_clipped > pg_unclipped).to(pg.dtype)
    dual_active = torch.zeros_like(pg)
    if dual_clip is not None:
        cap = -adv * dual_clip
        neg = adv < 0
        dual_active = (neg & (pg > cap)).to(pg.dtype)
        pg = torch.where(neg, torch.minimum(pg, cap), pg)
    return pg, clipped, dual_active


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    agg: str = "token-mean",
    *,
    objective: str = "clip",
    importance_sampling_level: str = "token",
    sapo_temperatures: tuple[float, float] = (1.0, 1.05),
    budget: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy-gradient loss (module docstring for the formulas).

    logp: [B, T] log-probs of the sampled tokens under the current policy (with grad).
    old_logp: [B, T] the same under the sampling policy theta_old (no grad).
    advantages: [B] (one per sequence, broadcast over tokens) or [B, T].
    mask: [B, T] 1 for response tokens that count.
    clip_low, clip_high: eps_low and eps_high (DAPO clip-higher sets clip_high > clip_low); cispo truncates its
        weight at 1 + clip_high; sapo uses neither.
    dual_clip: c > 1 caps the clip objective's loss of A < 0 tokens at -A*c; None disables it.
    objective: clip | cispo | sapo. importance_sampling_level: token | sequence (GSPO).
    sapo_temperatures: (tau_pos, tau_neg). agg, budget: the aggregation (`sdar.algos.aggregate`).
    Returns (loss scalar in float32, float64 for float64 input; stats) with stats `clipfrac` (tokens on the
    clipped branch; cispo: whose weight was truncated; sapo: 0, it has no clip), `dual_clipfrac` (the dual-clip
    cap is active), `approx_kl` (mean old - logp, per token) and `ratio_mean` (mean rho over the masked tokens,
    at the chosen level); stats are detached.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r} is not one of {', '.join(OBJECTIVES)}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (the paper uses 3.0) or None to disable it, got {dual_clip}")
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    if min(sapo_temperatures) <= 0:
        raise ValueError(f"sapo temperatures must be > 0, got {sapo_temperatures}")
    m = as_mask(mask, logp)
    adv = upcast(advantages)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)
    adv = adv.expand_as(logp).detach()
    log_ratio = log_importance_ratio(logp, old_logp, m, importance_sampling_level)
    ratio = torch.exp(log_ratio)
    clipped = dual_active = torch.zeros_like(ratio)
    if objective == "clip":
        pg, clipped, dual_active = _clip(ratio, adv, clip_low, clip_high, dual_clip)
    elif objective == "cispo":
        weight = torch.clamp(ratio, max=1.0 + clip_high).detach()
        clipped = (ratio.detach() > 1.0 + clip_high).to(ratio.dtype)
        pg = -weight * adv * upcast(logp)
    else:
        tau_pos, tau_neg = sapo_temperatures
        tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
        pg = -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * adv
    loss = aggregate(pg, m, agg, budget)
    stats = {
        "clipfrac": masked_mean(clipped, m),
        "dual_clipfrac": masked_mean(dual_active, m),
        "approx_kl": masked_mean((upcast(old_logp) - upcast(logp)).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP), m),
        "ratio_mean": masked_mean(ratio, m),
    }
    return loss, stats
