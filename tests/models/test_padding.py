"""padded: the one way rows become a batch, right-padded for scoring and left-padded for sampling."""

from __future__ import annotations

import torch

from sdar.models.logprobs import position_ids_from_mask
from sdar.models.padding import padded


def test_right_and_left_padding():
    ids, mask = padded([[5, 6, 7], [8], []], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]
    ids, mask = padded([[5, 6, 7], [8]], pad_id=9, left=True)
    assert ids.tolist() == [[5, 6, 7], [9, 9, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert position_ids_from_mask(mask).tolist() == [[0, 1, 2], [0, 0, 0]]
    assert ids.dtype == mask.dtype == torch.long
    ids, mask = padded([], pad_id=0)
    assert ids.shape == mask.shape == (0, 0)
