"""PPO-clip policy loss with asymmetric clipping and dual-clip, over response tokens.

`L_pg = agg( max(-A*rho, -A*clip(rho, 1-eps_low, 1+eps_high)) )`, and for A < 0 the
per-token loss is additionally capped at `-A*c` (dual-clip, c = 3 by default).
"""

from __future__ import annotations

import torch

from sdar.algos._agg import aggregate, as_mask, masked_mean, upcast

# log-ratios beyond this are numerically meaningless and would overflow exp()
_LOG_RATIO_CLAMP = 20.0


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    agg: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate loss.

    logp: [B, T] log-probs of the sampled tokens under the current policy (with grad).
    old_logp: [B, T] the same under the sampling policy theta_old (no grad).
    advantages: [B] (one per sequence, broadcast over tokens) or [B, T].
    mask: [B, T] 1 for response tokens that count.
    clip_low, clip_high: eps_low and eps_high (DAPO clip-higher sets clip_high > clip_low).
    dual_clip: c > 1 caps the loss of A < 0 tokens at -A*c; None disables it.
    Returns (loss scalar in float32, float64 for float64 input; stats) with stats `clipfrac` (the clipped branch is
    active), `dual_clipfrac` (the dual-clip cap is active), `approx_kl` (mean old - logp)
    and `ratio_mean`; stats are detached.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (the paper uses 3.0) or None to disable it, got {dual_clip}")
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    m = as_mask(mask, logp)
    adv = upcast(advantages)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)
    adv = adv.expand_as(logp).detach()
    log_ratio = (upcast(logp) - upcast(old_logp.detach())).clamp(
        -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP
    )
    ratio = torch.exp(log_ratio)
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
    loss = aggregate(pg, m, agg)
    stats = {
        "clipfrac": masked_mean(clipped, m),
        "dual_clipfrac": masked_mean(dual_active, m),
        "approx_kl": masked_mean(-log_ratio, m),
        "ratio_mean": masked_mean(ratio, m),
    }
    return loss, stats
