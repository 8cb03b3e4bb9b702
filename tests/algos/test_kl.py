import math

import pytest
import torch

from sdar.algos import entropy_from_logits, kl_k3

from .conftest import TOL, masks


def test_k3_by_hand():
    # pi = 0.5, pi_ref = 0.25: r = ref - logp = ln 0.5, k3 = 0.5 - ln 0.5 - 1
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    assert kl_k3(logp, ref, torch.ones(1, 1)).item() == pytest.approx(0.5 - math.log(0.5) - 1)


def test_k3_is_zero_at_equality_nonnegative_and_clamped():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=g)
    assert kl_k3(x, x, torch.ones(4, 6)).item() == 0.0
    assert kl_k3(x, torch.randn(4, 6, generator=g), torch.ones(4, 6)).item() > 0
    # ref - logp = 5: exp(5) - 5 - 1 = 142 > 10, clamped
    assert kl_k3(torch.zeros(1, 1), torch.full((1, 1), 5.0), torch.ones(1, 1)).item() == 10.0
    # huge differences stay finite
    big = kl_k3(torch.zeros(1, 1), torch.full((1, 1), 1e4), torch.ones(1, 1))
    assert big.item() == 10.0


def test_k3_gradient_by_hand_and_ref_gets_none():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]], requires_grad=True)
    kl_k3(logp, ref, torch.ones(1, 2)).backward()
    expected = (1 - torch.exp(ref.detach() - logp.detach())) / 2
    assert torch.allclose(logp.grad, expected)
    assert ref.grad is None


@pytest.mark.parametrize("kind", ["empty", "partial", "full"])
def test_k3_masks_dtypes(kind, dtype):
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(2, 4, generator=g)
    ref = -torch.rand(2, 4, generator=g)
    m = masks(2, 4)[kind]
    out = kl_k3(logp.to(dtype), ref.to(dtype), m)
    lp, rf = logp.to(dtype).double(), ref.to(dtype).double()
    per = torch.exp(rf - lp) - (rf - lp) - 1
    expected = (per * m).sum() / m.sum().clamp(min=1)
    assert torch.isfinite(out) and out.item() == pytest.approx(expected.item(), **TOL[dtype])


def test_k3_gradcheck():
    g = torch.Generator().manual_seed(2)
    logp = torch.randn(2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    ref = torch.randn(2, 3, generator=g, dtype=torch.float64)
    m = masks(2, 3)["partial"].double()
    assert torch.autograd.gradcheck(lambda lp: kl_k3(lp, ref, m), (logp,))


def test_entropy_by_hand():
    # uniform over 4 -> ln 4; probs [0.25, 0.75] -> -(.25 ln .25 + .75 ln .75)
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -1e9, -1e9]]])
    ent = entropy_from_logits(logits, torch.tensor([[1.0, 0.0]]))
    assert ent.item() == pytest.approx(math.log(4))
    ent = entropy_from_logits(logits, torch.tensor([[0.0, 1.0]]))
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), rel=1e-5)


@pytest.mark.parametrize("kind", ["empty", "partial", "full"])
def test_entropy_large_logits_masks_dtypes(kind, dtype):
    g = torch.Generator().manual_seed(3)
    logits = (1e4 * torch.randn(2, 3, 50, generator=g)).to(dtype).requires_grad_(True)
    m = masks(2, 3)[kind]
    ent = entropy_from_logits(logits, m)
    ent.backward()
    assert torch.isfinite(ent) and torch.isfinite(logits.grad.float()).all()
    # logits of magnitude 1e4 are (almost) one-hot: entropy ~ 0
    assert 0.0 <= ent.item() < 1e-3
    small = torch.randn(2, 3, 50, generator=g)
    ent = entropy_from_logits(small.to(dtype), m)
    p = torch.softmax(small.to(dtype).double(), -1)
    expected = ((-(p * p.log()).sum(-1)) * m).sum() / m.sum().clamp(min=1)
    assert ent.item() == pytest.approx(expected.item(), **TOL[dtype])


def test_entropy_gradcheck():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    m = masks(2, 3)["partial"].double()
    assert torch.autograd.gradcheck(lambda z: entropy_from_logits(z, m), (logits,))
