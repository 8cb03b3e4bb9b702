import math

import pytest
import torch

from sdar.algos import grpo_advantages


def test_two_groups_by_hand():
    # group a: r = [1, 0] -> mean 0.5, unbiased std sqrt(0.5) -> A = +-0.5/0.7071
    # group b: r = [1, 2, 3] -> mean 2, std 1 -> A = [-1, 0, 1]
    adv = grpo_advantages([1.0, 0.0, 1.0, 2.0, 3.0], ["a", "a", "b", "b", "b"], eps=0.0)
    expected = [0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5), -1.0, 0.0, 1.0]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)


def test_eps_enters_the_denominator():
    adv = grpo_advantages([1.0, 2.0, 3.0], [0, 0, 0], eps=1.0)
    assert adv.tolist() == pytest.approx([-0.5, 0.0, 0.5])


def test_group_ids_as_int_tensor_and_interleaved():
    r = torch.tensor([0.0, 10.0, 1.0, 20.0])
    g = torch.tensor([7, 3, 7, 3])
    adv = grpo_advantages(r, g, eps=0.0)
    s = 1 / math.sqrt(0.5) * 0.5
    assert adv.tolist() == pytest.approx([-s, -s, s, s], abs=1e-6)


def test_singleton_and_zero_variance_groups_give_zero_not_nan():
    adv = grpo_advantages([5.0, 1.0, 1.0, 1.0, 0.0, 1.0], [0, 1, 1, 1, 2, 2])
    assert not torch.isnan(adv).any()
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert adv[4] < 0 < adv[5]


def test_no_std_normalisation():
    adv = grpo_advantages([1.0, 3.0, 10.0], [0, 0, 1], norm_by_std=False)
    assert adv.tolist() == pytest.approx([-1.0, 1.0, 0.0])


def test_group_mean_of_advantages_is_zero():
    g = torch.randint(0, 5, (200,), generator=torch.Generator().manual_seed(0))
    r = torch.rand(200, generator=torch.Generator().manual_seed(1))
    adv = grpo_advantages(r, g)
    for k in g.unique():
        assert adv[g == k].mean().item() == pytest.approx(0.0, abs=1e-5)
        assert adv[g == k].std().item() == pytest.approx(1.0, abs=1e-4)


def test_bad_inputs():
    with pytest.raises(ValueError, match="one group id per reward"):
        grpo_advantages([1.0, 2.0], [0])
    with pytest.raises(ValueError, match="NaN or inf"):
        grpo_advantages([1.0, float("nan")], [0, 0])
    with pytest.raises(ValueError, match="1-D"):
        grpo_advantages(torch.zeros(2, 2), [0, 0])
    assert grpo_advantages([], []).numel() == 0
