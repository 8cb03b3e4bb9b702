import math

import pytest
import torch

from sdar.algos import sdar_distill_loss

from .conftest import TOL, masks


def sig(x):
    return 1 / (1 + math.exp(-x))


def test_value_and_stats_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -0.3]])
    teacher = torch.tensor([[-0.5, -3.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = sdar_distill_loss(logp, teacher, mask, beta=5.0)
    # gaps 0.5 and -1.0 -> gates sigmoid(2.5), sigmoid(-5)
    g1, g2 = sig(2.5), sig(-5.0)
    assert loss.item() == pytest.approx((g1 * 0.5 + g2 * -1.0) / 2, rel=1e-6)
    assert stats["gate_mean"].item() == pytest.approx((g1 + g2) / 2, rel=1e-6)
    assert stats["gap_mean"].item() == pytest.approx(-0.25, rel=1e-6)
    assert stats["pos_gap_frac"].item() == pytest.approx(0.5)
    assert stats["gated_gap_mean"].item() == pytest.approx((g1 * 0.5 - g2) / 2, rel=1e-6)


@pytest.mark.parametrize("kind", ["partial", "full"])
def test_gradient_is_minus_gate_over_n_and_teacher_gets_none(kind):
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 5, generator=g)).requires_grad_(True)
    teacher = (-torch.rand(3, 5, generator=g)).requires_grad_(True)
    mask = masks(3, 5)[kind]
    loss, _ = sdar_distill_loss(logp, teacher, mask, beta=5.0)
    loss.backward()
    gate = torch.sigmoid(5.0 * (teacher.detach() - logp.detach()))
    expected = -gate * mask / mask.sum()
    # if the gate were not detached, d/dlogp would add g*(1-g)*beta*(T - logp) terms
    assert torch.allclose(logp.grad, expected, atol=1e-7)
    assert teacher.grad is None


def test_gate_does_not_depend_on_gradient_path_through_beta():
    # two betas give gradients that differ only through the gate's value
    logp = torch.tensor([[-1.0]], requires_grad=True)
    teacher = torch.tensor([[-0.2]])
    for beta in (0.0, 1.0, 5.0, 50.0):
        logp.grad = None
        sdar_distill_loss(logp, teacher, torch.ones(1, 1), beta=beta)[0].backward()
        assert logp.grad.item() == pytest.approx(-sig(beta * 0.8), rel=1e-6)


def test_beta_zero_is_exactly_half():
    g = torch.Generator().manual_seed(1)
    logp, teacher = torch.randn(4, 7, generator=g), torch.randn(4, 7, generator=g)
    _, stats = sdar_distill_loss(logp, teacher, torch.ones(4, 7), beta=0.0)
    assert stats["gate_mean"].item() == 0.5
    from sdar.algos import sdar_gate

    gate, _ = sdar_gate(logp, teacher, beta=0.0)
    assert (gate == 0.5).all()


def test_asymmetry_rejected_tokens_are_not_pushed_down():
    logp = torch.tensor([[-2.0, -2.0]], requires_grad=True)
    teacher = torch.tensor([[-30.0, 15.0]])  # gap -28 (teacher rejects), +17 (endorses)
    loss, stats = sdar_distill_loss(logp, teacher, torch.ones(1, 2), beta=5.0)
    loss.backward()
    assert abs(logp.grad[0, 0].item()) < 1e-30  # contributes (almost) nothing
    assert logp.grad[0, 1].item() == pytest.approx(-0.5)  # pulled up with full weight 1/n
    # the gradient never pushes a token down: d loss / d logp <= 0 everywhere
    g = torch.Generator().manual_seed(2)
    lp = torch.randn(8, 16, generator=g).requires_grad_(True)
    sdar_distill_loss(lp, torch.randn(8, 16, generator=g) * 5, torch.ones(8, 16))[0].backward()
    assert (lp.grad <= 0).all()


@pytest.mark.parametrize("kind", ["empty", "partial", "full"])
def test_masks_and_dtypes(kind, dtype):
    g = torch.Generator().manual_seed(3)
    logp = -torch.rand(2, 6, generator=g) * 3
    teacher = -torch.rand(2, 6, generator=g) * 3
    m = masks(2, 6)[kind]
    lp = logp.to(dtype).requires_grad_(True)
    loss, stats = sdar_distill_loss(lp, teacher.to(dtype), m)
    loss.backward()
    a, b = lp.detach().double(), teacher.to(dtype).double()
    gate = torch.sigmoid(5 * (b - a))
    expected = (gate * (b - a) * m).sum() / m.sum().clamp(min=1)
    assert torch.isfinite(loss) and loss.item() == pytest.approx(expected.item(), **TOL[dtype])
    assert torch.isfinite(lp.grad.float()).all() and (lp.grad.float()[m == 0] == 0).all()
    for v in stats.values():
        assert torch.isfinite(v)
    if kind == "empty":
        assert loss.item() == 0.0 and stats["gate_mean"].item() == 0.0


def test_large_log_prob_gaps_stay_finite():
    logp = torch.tensor([[-1e4, 0.0]], requires_grad=True)
    teacher = torch.tensor([[0.0, -1e4]])
    loss, stats = sdar_distill_loss(logp, teacher, torch.ones(1, 2))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert stats["gate_mean"].item() == pytest.approx(0.5)


def test_seq_mean_aggregation():
    logp = torch.zeros(2, 2)
    teacher = torch.tensor([[1.0, 1.0], [2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, _ = sdar_distill_loss(logp, teacher, mask, beta=0.0, agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx((0.5 * 1.0 + 0.5 * 2.0) / 2)
