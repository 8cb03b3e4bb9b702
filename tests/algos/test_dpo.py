import math

import pytest
import torch

from sdar.algos import dpo_loss

from .conftest import TOL


def test_value_stats_and_gradient_by_hand():
    c = torch.tensor([-1.0], requires_grad=True)
    r = torch.tensor([-2.0], requires_grad=True)
    rc, rr = torch.tensor([-1.5]), torch.tensor([-1.5])
    loss, stats = dpo_loss(c, r, rc, rr, beta=0.1)
    # margin = 0.1 * ((-1 + 1.5) - (-2 + 1.5)) = 0.1
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.1)), rel=1e-6)
    assert stats["reward_chosen"].item() == pytest.approx(0.05)
    assert stats["reward_rejected"].item() == pytest.approx(-0.05)
    assert stats["reward_margin"].item() == pytest.approx(0.1)
    assert stats["accuracy"].item() == 1.0
    loss.backward()
    s = 1 / (1 + math.exp(0.1))  # sigmoid(-margin)
    assert c.grad.item() == pytest.approx(-0.1 * s, rel=1e-6)
    assert r.grad.item() == pytest.approx(0.1 * s, rel=1e-6)


def test_mean_over_pairs_mask_and_empty(dtype):
    c = torch.tensor([-1.0, -3.0, 0.0]).to(dtype)
    r = torch.tensor([-2.0, -1.0, 0.0]).to(dtype)
    z = torch.zeros(3, dtype=dtype)
    loss, stats = dpo_loss(c, r, z, z, beta=1.0, mask=torch.tensor([1.0, 1.0, 0.0]))
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(2.0))) / 2
    assert loss.item() == pytest.approx(expected, **TOL[dtype])
    assert stats["accuracy"].item() == pytest.approx(0.5)
    empty = torch.zeros(0, dtype=dtype)
    loss, stats = dpo_loss(empty, empty, empty, empty)
    assert loss.item() == 0.0 and not torch.isnan(stats["reward_margin"])
    loss, _ = dpo_loss(c, r, z, z, mask=torch.zeros(3))
    assert loss.item() == 0.0


def test_reference_gets_no_gradient_and_gradcheck():
    g = torch.Generator().manual_seed(0)
    c = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    r = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    rc = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    rr = torch.randn(4, generator=g, dtype=torch.float64)
    dpo_loss(c, r, rc, rr)[0].backward()
    assert rc.grad is None
    assert torch.autograd.gradcheck(lambda a, b: dpo_loss(a, b, rc.detach(), rr, beta=0.5)[0], (c, r))


def test_extreme_margins_stay_finite():
    c = torch.tensor([1e4, -1e4], requires_grad=True)
    r = torch.tensor([-1e4, 1e4])
    z = torch.zeros(2)
    loss, _ = dpo_loss(c, r, z, z, beta=1.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(c.grad).all()


def test_bad_arguments():
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="beta must be > 0"):
        dpo_loss(x, x, x, x, beta=0.0)
    with pytest.raises(ValueError, match="share one shape"):
        dpo_loss(x, torch.zeros(3), x, x)
