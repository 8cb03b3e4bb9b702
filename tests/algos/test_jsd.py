import math

import pytest
import torch

from sdar.algos import generalized_jsd

from .conftest import TOL, masks


def kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q) if a > 0)


# student p_S = [0.5, 0.5]; teacher p_T = [0.25, 0.75]
S = torch.tensor([[[0.0, 0.0]]])
T = torch.tensor([[[0.0, math.log(3.0)]]])
PS, PT = [0.5, 0.5], [0.25, 0.75]
ONE = torch.ones(1, 1)


def test_end_points_are_the_kl_limits():
    assert generalized_jsd(S, T, ONE, beta=0.0).item() == pytest.approx(kl(PT, PS), rel=1e-6)
    assert generalized_jsd(S, T, ONE, beta=1.0).item() == pytest.approx(kl(PS, PT), rel=1e-6)


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9])
def test_interior_by_hand(beta):
    M = [beta * t + (1 - beta) * s for s, t in zip(PS, PT)]
    expected = beta * kl(PT, M) + (1 - beta) * kl(PS, M)
    assert generalized_jsd(S, T, ONE, beta=beta).item() == pytest.approx(expected, rel=1e-5)


def test_symmetry_and_zero_at_equality():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 3, 11, generator=g), torch.randn(2, 3, 11, generator=g)
    m = torch.ones(2, 3)
    assert generalized_jsd(a, b, m, beta=0.3).item() == pytest.approx(
        generalized_jsd(b, a, m, beta=0.7).item(), rel=1e-5
    )
    for beta in (0.0, 0.5, 1.0):
        assert generalized_jsd(a, a, m, beta=beta).item() == pytest.approx(0.0, abs=1e-6)
        assert generalized_jsd(a, b, m, beta=beta).item() > 0


def test_temperature_and_top_k():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(1, 2, 9, generator=g), torch.randn(1, 2, 9, generator=g)
    m = torch.ones(1, 2)
    assert generalized_jsd(a, b, m, temperature=2.0).item() == pytest.approx(
        generalized_jsd(a / 2, b / 2, m).item(), rel=1e-5
    )
    assert generalized_jsd(a, b, m, top_k=9).item() == pytest.approx(generalized_jsd(a, b, m).item(), rel=1e-5)
    assert generalized_jsd(a, b, m, top_k=1).item() == pytest.approx(0.0, abs=1e-7)
    # top-k = 2 by hand on the teacher's two best tokens
    idx = b[0, 0].topk(2).indices
    ps = torch.softmax(a[0, 0, idx], -1).tolist()
    pt = torch.softmax(b[0, 0, idx], -1).tolist()
    got = generalized_jsd(a[:, :1], b[:, :1], torch.ones(1, 1), beta=0.0, top_k=2)
    assert got.item() == pytest.approx(kl(pt, ps), rel=1e-5)


@pytest.mark.parametrize("kind", ["empty", "partial", "full"])
def test_masks_dtypes_and_huge_logits(kind, dtype):
    g = torch.Generator().manual_seed(2)
    a = torch.randn(2, 4, 13, generator=g)
    b = torch.randn(2, 4, 13, generator=g)
    m = masks(2, 4)[kind]
    sa = a.to(dtype).requires_grad_(True)
    out = generalized_jsd(sa, b.to(dtype), m, beta=0.5)
    out.backward()
    ref = generalized_jsd(a.to(dtype).double(), b.to(dtype).double(), m.double(), beta=0.5)
    assert torch.isfinite(out) and out.item() == pytest.approx(ref.item(), **TOL[dtype])
    assert torch.isfinite(sa.grad.float()).all()
    if kind == "empty":
        assert out.item() == 0.0
    for beta in (0.0, 0.5, 1.0):
        big = generalized_jsd((a * 1e4).to(dtype), (b * 1e4).to(dtype), m, beta=beta)
        assert torch.isfinite(big) and big.item() >= 0


def test_teacher_gets_no_gradient_and_gradcheck():
    g = torch.Generator().manual_seed(3)
    s = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    m = masks(2, 3)["partial"].double()
    generalized_jsd(s, t, m).backward()
    assert t.grad is None
    for beta in (0.0, 0.3, 1.0):
        assert torch.autograd.gradcheck(lambda x: generalized_jsd(x, t.detach(), m, beta=beta), (s,))


def test_bad_arguments():
    with pytest.raises(ValueError, match="beta must lie in"):
        generalized_jsd(S, T, ONE, beta=1.5)
    with pytest.raises(ValueError, match="temperature"):
        generalized_jsd(S, T, ONE, temperature=0)
    with pytest.raises(ValueError, match="top_k"):
        generalized_jsd(S, T, ONE, top_k=3)
    with pytest.raises(ValueError, match="differ"):
        generalized_jsd(S, torch.zeros(1, 1, 3), ONE)
