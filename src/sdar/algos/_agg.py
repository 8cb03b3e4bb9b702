"""Masked aggregation shared by every loss: how per-token values become one scalar.

An empty mask always aggregates to 0 (never NaN), so a batch with no valid tokens is a no-op.
"""

from __future__ import annotations

import torch

from sdar.algos.arm_config import AGG_MODES  # noqa: F401 (re-exported; torch-free, for config checks)


def upcast(x: torch.Tensor) -> torch.Tensor:
    """Losses are computed in float32 (float64 stays float64, so gradcheck can run)."""
    return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


def as_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The mask as a float tensor in `like`'s compute dtype; raises on a shape mismatch."""
    if mask.shape != like.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match values shape {tuple(like.shape)}; pass a [B, T] mask aligned with the response tokens")
    return mask.to(device=like.device, dtype=upcast(like).dtype)


def aggregate(values: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean", budget: int | None = None
              ) -> torch.Tensor:
    """Reduce per-token `values` [B, T] over `mask` [B, T] to a scalar (float32, or float64 for float64 input).

    token-mean:               sum(v * m) / sum(m) over the whole batch (the paper's default)
    seq-mean-token-mean:      mean over non-empty sequences of each sequence's token mean
    seq-mean-token-sum:       mean over non-empty sequences of each sequence's token sum
    token-sum:                sum(v * m)
    seq-mean-token-sum-norm:  sum(v * m) / (B * budget), B counting every row (Dr. GRPO, arXiv:2503.20783: a constant per-sequence
                              budget, the maximum response length, so no sequence's length rescales its tokens;
                              verl's mode of that name, TRL's dr_grpo); budget None = the padded width T
    """
    m = as_mask(mask, values)
    # where(), not a product: padding may hold inf/NaN, and 0 * inf would leak NaN
    v = upcast(values)
    v = torch.where(m > 0, v, torch.zeros((), dtype=v.dtype, device=v.device)) * m
    if agg == "token-mean":
        return v.sum() / m.sum().clamp(min=1.0)
    if agg == "token-sum":
        return v.sum()
    if agg == "seq-mean-token-sum-norm":
        if budget is not None and budget < 1:
            raise ValueError(f"the seq-mean-token-sum-norm budget must be >= 1 token, got {budget}")
        return v.sum() / float(max(v.shape[0], 1) * (budget or max(v.shape[-1], 1)))
    if agg in ("seq-mean-token-mean", "seq-mean-token-sum"):
        n_tok = m.sum(dim=-1)
        seq = v.sum(dim=-1)
        if agg == "seq-mean-token-mean":
            seq = seq / n_tok.clamp(min=1.0)
        nonempty = (n_tok > 0).to(v.dtype)
        return (seq * nonempty).sum() / nonempty.sum().clamp(min=1.0)
    raise ValueError(f"unknown aggregation {agg!r}; choose one of {', '.join(AGG_MODES)}")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token mean of `values` over `mask`, detached, for logging (0 when the mask is empty)."""
    return aggregate(values.detach(), mask, "token-mean")
