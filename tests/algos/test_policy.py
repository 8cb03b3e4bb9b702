import math

import pytest
import torch

from sdar.algos import policy_loss

from .conftest import TOL, masks


def one_token(ratio: float, adv: float, **kw):
    old = torch.tensor([[-1.0]])
    logp = (old + math.log(ratio)).requires_grad_(True)
    loss, stats = policy_loss(logp, old, torch.tensor([adv]), torch.ones(1, 1), **kw)
    loss.backward()
    return loss.item(), logp.grad.item(), stats


@pytest.mark.parametrize(
    "ratio, adv, expected_loss, expected_grad, clipped, dual",
    [
        # A > 0, ratio above 1 + eps: clipped branch, flat, no gradient
        (1.5, 1.0, -1.2, 0.0, 1.0, 0.0),
        # A > 0, ratio below 1 - eps: unclipped branch (pessimistic), gradient -A*rho
        (0.5, 1.0, -0.5, -0.5, 0.0, 0.0),
        # A > 0 inside the trust region
        (1.1, 2.0, -2.2, -2.2, 0.0, 0.0),
        # A < 0, ratio above 1 + eps but under the dual-clip cap: unclipped, gradient -A*rho
        (1.5, -1.0, 1.5, 1.5, 0.0, 0.0),
        # A < 0, ratio below 1 - eps: clipped at 1 - eps, no gradient
        (0.5, -1.0, 0.8, 0.0, 1.0, 0.0),
        # A < 0, ratio 5 > c = 3: dual-clip caps the loss at -A*c, no gradient
        (5.0, -1.0, 3.0, 0.0, 0.0, 1.0),
    ],
)
def test_clip_regions_by_hand(ratio, adv, expected_loss, expected_grad, clipped, dual):
    loss, grad, stats = one_token(ratio, adv)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert grad == pytest.approx(expected_grad, rel=1e-5, abs=1e-7)
    assert stats["clipfrac"].item() == clipped
    assert stats["dual_clipfrac"].item() == dual


def test_dual_clip_disabled_and_clip_higher():
    loss, grad, _ = one_token(5.0, -1.0, dual_clip=None)
    assert loss == pytest.approx(5.0) and grad == pytest.approx(5.0)
    # DAPO clip-higher: eps_high 0.28 lets ratio 1.25 through for A > 0, eps_low stays 0.2
    loss, grad, _ = one_token(1.25, 1.0, clip_high=0.28)
    assert loss == pytest.approx(-1.25) and grad == pytest.approx(-1.25)
    loss, _, _ = one_token(0.7, -1.0, clip_high=0.28)
    assert loss == pytest.approx(0.8)


def test_token_mean_vs_seq_mean_by_hand():
    # ratios all 1 -> per-token loss = -A
    logp = torch.zeros(2, 3)
    adv = torch.tensor([1.0, 4.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    tm, _ = policy_loss(logp, logp, adv, mask)
    sm, _ = policy_loss(logp, logp, adv, mask, agg="seq-mean-token-mean")
    assert tm.item() == pytest.approx(-(1 + 1 + 1 + 4) / 4)
    assert sm.item() == pytest.approx(-(1 + 4) / 2)


def test_per_sequence_and_per_token_advantages_agree():
    g = torch.Generator().manual_seed(0)
    logp, old = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    adv = torch.randn(3, generator=g)
    m = torch.ones(3, 5)
    a, _ = policy_loss(logp, old, adv, m)
    b, _ = policy_loss(logp, old, adv[:, None].expand(3, 5), m)
    assert a.item() == pytest.approx(b.item())


@pytest.mark.parametrize("kind", ["empty", "partial", "full"])
def test_masks_and_dtypes(kind, dtype):
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(2, 4, generator=g)
    logp32 = old + 0.3 * torch.randn(2, 4, generator=g)
    adv = torch.tensor([1.0, -2.0])
    m = masks(2, 4)[kind]
    logp = logp32.to(dtype).requires_grad_(True)
    loss, stats = policy_loss(logp, old.to(dtype), adv, m)
    loss.backward()
    # reference: the formula token by token in float64 on the same (rounded) inputs
    lp, od = logp.detach().double(), old.to(dtype).double()
    ratio = torch.exp(lp - od)
    a = adv.double()[:, None].expand(2, 4)
    per = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2))
    per = torch.where(a < 0, torch.minimum(per, -3 * a), per)
    expected = (per * m).sum() / m.sum().clamp(min=1)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert loss.item() == pytest.approx(expected.item(), **TOL[dtype])
    assert torch.isfinite(logp.grad.float()).all()
    assert (logp.grad.float()[m == 0] == 0).all()
    if kind == "empty":
        assert loss.item() == 0.0 and stats["clipfrac"].item() == 0.0


def test_infinite_padding_does_not_leak():
    logp = torch.tensor([[-1.0, float("-inf")]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.0]])
    loss, _ = policy_loss(logp, old, torch.tensor([1.0]), torch.tensor([[1.0, 0.0]]))
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)
    assert torch.isfinite(logp.grad).all()


def test_gradcheck_float64_inside_smooth_regions():
    g = torch.Generator().manual_seed(2)
    old = torch.randn(3, 4, generator=g, dtype=torch.float64)
    # keep ratios away from the kinks at 0.8, 1.2 and the dual-clip cap
    logp = (old + 0.05 * torch.randn(3, 4, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    m = masks(3, 4)["partial"].double()
    assert torch.autograd.gradcheck(lambda lp: policy_loss(lp, old, adv, m)[0], (logp,))


def test_bad_settings():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss(x, x, torch.zeros(1), x, dual_clip=0.5)
    with pytest.raises(ValueError, match="mask shape"):
        policy_loss(x, x, torch.zeros(1), torch.zeros(1, 2))
