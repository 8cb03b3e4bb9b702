import math

import pytest
import torch

from sdar.algos import aggregate


def test_token_mean_and_seq_means_by_hand():
    v = torch.tensor([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(v, m, "token-mean").item() == pytest.approx((1 + 2 + 10) / 3)
    assert aggregate(v, m, "seq-mean-token-mean").item() == pytest.approx((1.5 + 10) / 2)
    assert aggregate(v, m, "seq-mean-token-sum").item() == pytest.approx((3 + 10) / 2)
    assert aggregate(v, m, "token-sum").item() == pytest.approx(13.0)


def test_empty_rows_are_skipped_in_seq_mean_and_all_empty_is_zero():
    v = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    m = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert aggregate(v, m, "seq-mean-token-mean").item() == pytest.approx(2.0)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum"):
        out = aggregate(v, torch.zeros(2, 2), agg)
        assert out.item() == 0.0 and not math.isnan(out.item())


def test_padding_with_inf_or_nan_does_not_leak():
    v = torch.tensor([[1.0, float("inf")], [2.0, float("nan")]])
    m = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    assert aggregate(v, m).item() == pytest.approx(1.5)


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="mask shape"):
        aggregate(torch.zeros(2, 3), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="unknown aggregation 'mean'.*token-mean"):
        aggregate(torch.zeros(2, 2), torch.ones(2, 2), "mean")
