"""One sampling decision for every row that has one, in one batched pass: the logits processed once ([n, V] for
free rows; for constrained rows only their allowed tokens, [n, K]), each row's token drawn from its own generator
exactly as `torch.multinomial(probs, 1, generator=g)` draws it, and one transfer of tokens and log-probs to the host.

torch.multinomial of one sample is argmax(p / q) with q = an exponential draw per vocabulary entry from the row's
generator (ATen's gumbel fast path). Those V draws stay per row (they are the row's random stream, so a row's
sample does not depend on the rows beside it); on the CPU they are V uniform doubles (what `exponential_` draws
first, then maps through -log1p(-u)), mapped only where a constrained row can land. Every row then samples the
token, and reports the log-prob, that the per-row path drew (up to the float rounding of a log-softmax over its
allowed tokens instead of the whole vocabulary).
"""

from __future__ import annotations

import math

import torch

from sdar.models.logits import process_logits


def row_generators(seeds: list[int], device) -> list[torch.Generator]:
    """One generator per row, seeded with its seed."""
    gens = []
    for s in seeds:
        g = torch.Generator(device=device)
        g.manual_seed(int(s))
        gens.append(g)
    return gens


def _exponentials(gens: list[torch.Generator], vocab: int, device, at: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's V exponential draws (what torch.multinomial divides by), float32 [n, V], or with `at` ([n, K]
    vocabulary indices) only those [n, K]. Every row's generator advances by its V draws either way."""
    n = len(gens)
    if torch.device(device).type != "cpu":
        q = torch.empty(n, vocab, device=device)
        for i, g in enumerate(gens):
            q[i].exponential_(generator=g)
        return q if at is None else q.gather(1, at)
    u = torch.empty(n, vocab, dtype=torch.float64)
    for i, g in enumerate(gens):  # the CPU's exponential_ is -log1p(-u) of these uniforms, cast to float
        u[i].uniform_(generator=g)
    if at is not None:
        u = u.gather(1, at)
    return torch.log1p(-u).neg_().float()


def decide(sets: list[list[int] | None], gens: list[torch.Generator], *, temperature: float, top_p: float,
           vocab: int, logits: torch.Tensor | None = None, states: torch.Tensor | None = None, head=None
           ) -> tuple[list[int], list[float]]:
    """The next token and its log-prob for n deciding rows. sets[i]: row i's allowed tokens (two or more) or None
    (free). Logits come from `logits` [n, V] or from the last hidden states `states` [n, H] through `head` (a
    plain Linear without bias: constrained rows then take only their allowed tokens' rows of its weight)."""
    device = (logits if logits is not None else states).device
    toks, lps = [0] * len(sets), [0.0] * len(sets)
    con = [i for i, s in enumerate(sets) if s]
    free = [i for i, s in enumerate(sets) if not s]
    parts = []
    if con:
        parts.append((con, *_constrained(con, sets, gens, temperature, top_p, vocab, logits, states, head)))
    if free:
        z = logits[free] if logits is not None else head(states[free])
        logp = torch.log_softmax(process_logits(z, temperature=temperature, top_p=top_p), dim=-1)
        q = _exponentials([gens[i] for i in free], vocab, device)
        tok = (logp.exp() / q).argmax(-1, keepdim=True)
        parts.append((free, tok.squeeze(-1), logp.gather(-1, tok).squeeze(-1)))
    # one transfer: tokens (exact in float64) and log-probs
    both = torch.cat([torch.stack([t.double(), lp.double()]) for _, t, lp in parts], dim=1).tolist()
    order = [i for rows, _, _ in parts for i in rows]
    for k, i in enumerate(order):
        toks[i], lps[i] = int(both[0][k]), both[1][k]  # a float32 value, exactly
    if bad := [i for i, lp in enumerate(lps) if not math.isfinite(lp)]:
        # what torch.multinomial refuses too: a distribution with inf or nan (diverged weights), or no mass
        raise RuntimeError(f"cannot sample: the next-token distribution of {len(bad)} of {len(sets)} deciding rows "
                           "holds inf or nan, or no probability (the model's logits are not finite: diverged weights? "
                           "optim.guard_updates refuses such an update)")
    return toks, lps


def _constrained(rows, sets, gens, temperature, top_p, vocab, logits, states, head):
    """(tokens [n], log-probs [n]) of the constrained rows from their allowed tokens' logits only."""
    device = (logits if logits is not None else states).device
    K = max(len(sets[i]) for i in rows)
    # allowed tokens in vocabulary order (multinomial's argmax takes the first of equal ratios), padded with 0
    idx = torch.tensor([sorted(sets[i]) + [0] * (K - len(sets[i])) for i in rows], device=device)
    valid = torch.tensor([[k < len(sets[i]) for k in range(K)] for i in rows], device=device)
    if logits is None and type(head) is torch.nn.Linear and head.bias is None:
        # the head's rows at the allowed tokens only, accumulated in float32 as a GEMM does, in the head's dtype
        h = states[rows]
        z = torch.einsum("nh,nkh->nk", h.float(), head.weight[idx].float()).to(h.dtype)
    else:
        z = (logits[rows] if logits is not None else head(states[rows])).gather(1, idx)
    z = process_logits(z, temperature=temperature, keep=valid, top_p=top_p)
    logp = torch.log_softmax(z, dim=-1)
    q = _exponentials([gens[i] for i in rows], vocab, device, at=idx)
    ratio = (logp.exp() / q).masked_fill(~valid, -1.0)
    j = ratio.argmax(-1, keepdim=True)
    return idx.gather(1, j).squeeze(-1), logp.gather(1, j).squeeze(-1)
