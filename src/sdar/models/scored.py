"""What a scoring pass returns (`ScoredBatch`: log-probs aligned on the response) and the masks it aligns on:
shared by every scoring layout (`sdar.models.scoring`'s padded and prefix-cached passes, `sdar.models.packing`'s
packed one)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def allowed_mask(prompts: list[list[int]], responses: list[list[int]], allowed: list[list[list[int]] | None],
                 width: int, vocab: int, start: int = 0) -> torch.Tensor:
    """Bool [B, width - start, V]: True everywhere except at the positions that predict response tokens
    of constrained turns, where only that step's allowed tokens are True (right-padded rows); positions
    before `start` are left out (their logits are not computed, see token_logprobs' first_position)."""
    mask = torch.ones(len(prompts), width - start, vocab, dtype=torch.bool)
    for i, (p, r, a) in enumerate(zip(prompts, responses, allowed)):
        if a is None:
            continue
        for k, toks in enumerate(a[: len(r)]):
            if toks:
                pos = len(p) - 1 + k - start  # the logits at this position predict response token k
                mask[i, pos] = False
                mask[i, pos, toks] = True
    return mask


def response_mask(responses: list[list[int]], T: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Float [B, T]: 1 on each row's response tokens, 0 after them."""
    mask = torch.zeros(len(responses), T)
    for j, r in enumerate(responses):
        mask[j, : len(r)] = 1
    return mask if device is None else mask.to(device)


@dataclass
class ScoredBatch:
    """logp: [B, T] log-probs of the response tokens (T = longest response), entropy: [B, T]
    or None, mask: [B, T] 1 on real response tokens."""

    logp: torch.Tensor
    entropy: torch.Tensor | None
    mask: torch.Tensor
    # with prompt_lm=True: summed log-probs of the prompt tokens (after the first) and their count
    prompt_logp_sum: torch.Tensor | None = None
    prompt_tokens: int = 0


def forced(toks: list[int] | None, tok: int) -> bool:
    """Whether a constrained step allowed exactly `tok`: its log-prob is 0 and its entropy 0 under every model
    scoring it in the same allowed set (None: an unconstrained step)."""
    return bool(toks) and len(toks) == 1 and toks[0] == tok


def pick(xs: list | None, rows: list[int]) -> list | None:
    """`xs` at `rows` (None stays None: a batch without allowed tokens): a batch's per-row lists cut to some rows."""
    return None if xs is None else [xs[i] for i in rows]
