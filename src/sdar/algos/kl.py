"""Regularisers: the k3 KL estimator to the reference policy, and token entropy.

Both are loss terms over response tokens: `+kl_coef * KL` and `-entropy_coef * H`.
"""

from __future__ import annotations

import torch

from sdar.algos._agg import aggregate, as_mask, upcast

_KL_INNER_CLAMP = 20.0  # keeps exp() finite before the estimator's own clamp
KL_CLAMP = 10.0


def kl_k3_per_token(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate `exp(ref - logp) - (ref - logp) - 1`, clamped to [-10, 10]. [B, T]"""
    diff = (upcast(ref_logp.detach()) - upcast(logp)).clamp(
        -_KL_INNER_CLAMP, _KL_INNER_CLAMP
    )
    return (torch.exp(diff) - diff - 1.0).clamp(-KL_CLAMP, KL_CLAMP)


def kl_k3(
    logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean", budget: int | None = None
) -> torch.Tensor:
    """k3 ("low-variance") KL(pi_theta || pi_ref) estimate, aggregated over `mask`.

    logp, ref_logp, mask: [B, T]. ref_logp receives no gradient. Returns a scalar in the compute dtype.
    """
    return aggregate(kl_k3_per_token(logp, ref_logp), as_mask(mask, logp), agg, budget)


def entropy_per_token(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position: `logsumexp(z) - sum(softmax(z) * z)`. [B, T, V] -> [B, T]

    Computed in float32 (float64 for float64 input) from logits, stable for logits of any magnitude.
    """
    z = upcast(logits)
    logp = torch.log_softmax(z, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def entropy_from_logits(
    logits: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean"
) -> torch.Tensor:
    """Mean token entropy of the policy over `mask`.

    logits: [B, T, V]; mask: [B, T]. Returns a scalar (the loss uses `-coef * H`).
    """
    ent = entropy_per_token(logits)
    return aggregate(ent, as_mask(mask, ent), agg)
