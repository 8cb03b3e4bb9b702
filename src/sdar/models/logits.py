"""The one place logits become the distribution tokens are sampled from and scored under: float32, divided by
the temperature, the tokens a constrained step does not allow masked, then top-p. Sampling and scoring call it alike."""

from __future__ import annotations

import torch

# a token that cannot be drawn. Finite, not -inf: p * logits must stay 0 (not NaN) in an entropy, and exp() of it is
# exactly 0 in float32, so the allowed tokens' probabilities and log-probs are those of -inf to the last bit
MASKED = -1e9


def keep_mask(sets: list[list[int] | None], vocab: int, device: torch.device | str | None = None
              ) -> torch.Tensor | None:
    """Bool [N, V]: row n True at `sets[n]`'s tokens only, or everywhere where `sets[n]` is None or empty
    (an unconstrained position); None when no row is constrained."""
    rows = [n for n, toks in enumerate(sets) if toks]
    if not rows:
        return None
    # built where it is used, in two indexed writes whatever the number of rows (a decode step has one, a
    # scoring pass thousands): no per-row kernel, no [N, V] host-to-device copy
    keep = torch.ones(len(sets), vocab, dtype=torch.bool, device=device)
    keep[torch.tensor(rows, device=device)] = False
    at = [(n, t) for n in rows for t in sets[n]]
    keep[torch.tensor([n for n, _ in at], device=device), torch.tensor([t for _, t in at], device=device)] = True
    return keep


def process_logits(logits: torch.Tensor, *, temperature: float = 1.0, keep: torch.Tensor | None = None,
                   top_p: float = 1.0) -> torch.Tensor:
    """Logits [..., V] -> float32 logits [..., V] of the distribution softmax gives: divided by `temperature`,
    the tokens outside `keep` (bool, broadcastable to [..., V]; None = all) and, with top_p < 1, outside the
    nucleus at MASKED. The masks commute with the division (transformers applies logits processors, then
    TemperatureLogitsWarper, then TopPLogitsWarper: the same numbers), so sampling and scoring share it;
    `torch.log_softmax(process_logits(...), -1)` are the log-probs the sampler draws from and the trainer scores.
    Differentiable; bf16 is upcast first (a bf16 log-softmax over a large vocabulary loses ~2 decimal digits)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = logits.float()
    # in place only on a tensor made here (the caller's logits are left alone): one [.., V] float tensor less at
    # the peak, and the same numbers as the out-of-place ops
    owned = z is not logits
    if temperature != 1.0:
        z = z.div_(temperature) if owned else z / temperature
        owned = True
    if keep is not None:
        z = z.masked_fill_(~keep, MASKED) if owned else z.masked_fill(~keep, MASKED)
        owned = True
    if top_p < 1.0:
        z = _nucleus(z, top_p)
    return z


def _nucleus(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """`z` with the tokens outside the smallest set of probability >= top_p at MASKED (at least one kept)."""
    with torch.no_grad():
        sorted_z, order = torch.sort(z, dim=-1, descending=False)
        cum = torch.softmax(sorted_z, dim=-1).cumsum(dim=-1)
        drop = cum <= (1.0 - top_p)
        drop[..., -1] = False  # keep at least one token
        drop = drop.scatter(-1, order, drop)
    return z.masked_fill(drop, MASKED)
