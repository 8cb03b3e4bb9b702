"""The one way token rows become a batch: ids and attention mask, padded on the right (scoring: every row's
positions start at 0) or on the left (sampling: every row's next token is in the last column)."""

from __future__ import annotations

import torch


def padded(seqs: list[list[int]], pad_id: int, *, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), both long [B, L] with L the longest row: each row's tokens, then `pad_id` (or,
    with `left`, first the pads), the mask 1 on the real tokens. An empty row is all padding. Positions over
    the real tokens: `sdar.models.logprobs.position_ids_from_mask(mask)`."""
    L = max((len(s) for s in seqs), default=0)
    rows = [([pad_id] * (L - len(s)) + list(s)) if left else (list(s) + [pad_id] * (L - len(s))) for s in seqs]
    marks = [([0] * (L - len(s)) + [1] * len(s)) if left else ([1] * len(s) + [0] * (L - len(s))) for s in seqs]
    return (torch.tensor(rows, dtype=torch.long).view(len(seqs), L),
            torch.tensor(marks, dtype=torch.long).view(len(seqs), L))
