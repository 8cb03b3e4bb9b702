"""The policy-gradient loss types (TRL's loss_type menu and GSPO's sequence ratio): values and gradients by
hand, every mask and dtype, the aggregation each one sets for the arm's other terms, and parity with TRL's own
GRPOTrainer._compute_loss on the same tensors."""

import math

import pytest
import torch

from sdar.algos import LOSS_TYPES, LossBatch, aggregate, compose_loss, get_arm, policy_loss

from .conftest import TOL, masks


def one_token(ratio: float, adv: float, **kw):
    old = torch.tensor([[-1.0]])
    logp = (old + math.log(ratio)).requires_grad_(True)
    loss, stats = policy_loss(logp, old, torch.tensor([adv]), torch.ones(1, 1), **kw)
    loss.backward()
    return loss.item(), logp.grad.item(), stats, logp.item()


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# ---- the aggregation Dr. GRPO adds -------------------------------------------------------------------------


def test_seq_mean_token_sum_norm_by_hand():
    v = torch.tensor([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # sum over masked tokens / (rows * budget); without a budget the padded width T = 3
    assert aggregate(v, m, "seq-mean-token-sum-norm", budget=8).item() == pytest.approx(13 / (2 * 8))
    assert aggregate(v, m, "seq-mean-token-sum-norm").item() == pytest.approx(13 / (2 * 3))
    # an empty row still counts in B (TRL divides by the batch size), an empty mask gives 0
    m2 = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert aggregate(v, m2, "seq-mean-token-sum-norm", budget=4).item() == pytest.approx(3 / 8)
    assert aggregate(v, torch.zeros(2, 3), "seq-mean-token-sum-norm", budget=4).item() == 0.0
    with pytest.raises(ValueError, match="budget must be >= 1"):
        aggregate(v, m, "seq-mean-token-sum-norm", budget=0)


def test_seq_mean_token_sum_norm_does_not_rescale_by_length():
    # token-mean gives a long sequence's tokens less weight each; Dr. GRPO's constant keeps every token's weight
    logp = torch.zeros(2, 4, requires_grad=True)
    m = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([1.0, 1.0]), m, agg="seq-mean-token-sum-norm", budget=4)
    loss.backward()
    assert torch.allclose(logp.grad[m > 0], torch.full((5,), -1.0 / 8))
    assert (logp.grad[m == 0] == 0).all()


# ---- objectives, one token at a time -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "ratio, adv, weight, clipped",
    [
        (1.5, 1.0, 1.2, 1.0),  # truncated at 1 + eps_high = 1.2
        (0.5, 1.0, 0.5, 0.0),  # no lower bound (MiniMax-M1 tunes eps_high only)
        (1.5, -1.0, 1.2, 1.0),  # truncated for A < 0 too: the weight, not the objective, is clipped
        (1.1, 2.0, 1.1, 0.0),
    ],
)
def test_cispo_by_hand(ratio, adv, weight, clipped):
    loss, grad, stats, logp = one_token(ratio, adv, objective="cispo")
    # L = -sg(min(rho, 1 + eps_high)) * A * log pi: every token keeps the gradient -w * A through log pi
    assert loss == pytest.approx(-weight * adv * logp, rel=1e-5)
    assert grad == pytest.approx(-weight * adv, rel=1e-5)
    assert stats["clipfrac"].item() == clipped and stats["dual_clipfrac"].item() == 0.0


@pytest.mark.parametrize("ratio, adv", [(1.0, 1.0), (1.5, 1.0), (0.5, 2.0), (1.0, -1.0), (1.7, -0.5), (0.3, -2.0)])
def test_sapo_by_hand(ratio, adv):
    loss, grad, stats, _ = one_token(ratio, adv, objective="sapo", sapo_temperatures=(1.0, 1.05))
    tau = 1.0 if adv > 0 else 1.05
    s = sigmoid(tau * (ratio - 1.0))
    # L = -(4/tau) sigmoid(tau (rho - 1)) A; dL/dlogp = -(4/tau) * tau s (1 - s) * rho * A = -4 s (1 - s) rho A
    assert loss == pytest.approx(-(4.0 / tau) * s * adv, rel=1e-5)
    assert grad == pytest.approx(-4.0 * s * (1.0 - s) * ratio * adv, rel=1e-5)
    assert stats["clipfrac"].item() == 0.0
    if ratio == 1.0:  # at rho = 1 the gate's gradient is the unclipped objective's, -A
        assert grad == pytest.approx(-adv, rel=1e-6)


def test_sequence_level_ratio_by_hand():
    # two counted tokens with log-ratios 0.1 and 0.3, one padded token with a wild one that must not count
    old = torch.tensor([[-1.0, -2.0, -3.0]])
    logp = (old + torch.tensor([[0.1, 0.3, 5.0]])).requires_grad_(True)
    m = torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = policy_loss(logp, old, torch.tensor([1.0]), m, clip_high=0.5, importance_sampling_level="sequence")
    loss.backward()
    s = math.exp(0.2)  # exp(mean log-ratio) = 1.2214, inside [0.8, 1.5]: the unclipped branch
    assert loss.item() == pytest.approx(-s, rel=1e-6)
    # d(-s)/d logp_t = -s / n for each counted token; nothing for the padded one
    assert logp.grad[0, :2].tolist() == pytest.approx([-s / 2, -s / 2], rel=1e-6)
    assert logp.grad[0, 2].item() == 0.0
    assert stats["ratio_mean"].item() == pytest.approx(s, rel=1e-6)
    # beyond 1 + eps_high the sequence is clipped as a whole: flat, no gradient on any of its tokens
    logp2 = (old + torch.tensor([[0.4, 0.6, 0.0]])).requires_grad_(True)
    loss2, stats2 = policy_loss(logp2, old, torch.tensor([1.0]), m, importance_sampling_level="sequence")
    loss2.backward()
    assert loss2.item() == pytest.approx(-1.2) and (logp2.grad == 0).all() and stats2["clipfrac"].item() == 1.0


@pytest.mark.parametrize("objective", ["clip", "cispo", "sapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("kind", ["empty", "partial", "full"])
def test_masks_and_dtypes(objective, level, kind, dtype):
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(2, 4, generator=g)
    logp32 = old + 0.3 * torch.randn(2, 4, generator=g)
    adv = torch.tensor([1.0, -2.0])
    m = masks(2, 4)[kind]
    logp = logp32.to(dtype).requires_grad_(True)
    loss, stats = policy_loss(logp, old.to(dtype), adv, m, objective=objective, importance_sampling_level=level,
                              agg="seq-mean-token-mean")
    loss.backward()
    # reference: the formula token by token in float64 on the same (rounded) inputs
    lp, od, a = logp.detach().double(), old.to(dtype).double(), adv.double()[:, None].expand(2, 4)
    lr = lp - od
    if level == "sequence":
        lr = ((lr * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)).expand(2, 4)
    r = torch.exp(lr)
    if objective == "clip":
        per = torch.maximum(-a * r, -a * r.clamp(0.8, 1.2))
        per = torch.where(a < 0, torch.minimum(per, -3 * a), per)
    elif objective == "cispo":
        per = -r.clamp(max=1.2) * a * lp
    else:
        tau = torch.where(a > 0, 1.0, 1.05).double()
        per = -(4 / tau) * torch.sigmoid(tau * (r - 1)) * a
    n = m.sum(-1)
    seq = (per * m).sum(-1) / n.clamp(min=1)
    expected = seq[n > 0].mean() if (n > 0).any() else torch.tensor(0.0)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert loss.item() == pytest.approx(expected.item(), **TOL[dtype])
    assert torch.isfinite(logp.grad.float()).all() and (logp.grad.float()[m == 0] == 0).all()
    if kind == "empty":
        assert loss.item() == 0.0 and stats["ratio_mean"].item() == 0.0


@pytest.mark.parametrize("objective", ["clip", "sapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_gradcheck_float64(objective, level):
    g = torch.Generator().manual_seed(4)
    old = torch.randn(3, 4, generator=g, dtype=torch.float64)
    # small steps keep ratios away from the clip's kinks at 0.8 and 1.2 and cispo's at 1.2
    logp = (old + 0.05 * torch.randn(3, 4, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    m = masks(3, 4)["partial"].double()
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert torch.autograd.gradcheck(lambda lp: policy_loss(lp, old, adv, m, agg=agg, budget=6, objective=objective,
                                                               importance_sampling_level=level)[0], (logp,))


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_cispo_gradient_is_the_detached_weight(level):
    # CISPO's weight is stop-gradient, so its gradient is not the derivative of its value (gradcheck does not
    # apply): per token it is -w * A times the aggregation's factor, whatever w's own dependence on log pi
    g = torch.Generator().manual_seed(4)
    old = torch.randn(3, 4, generator=g, dtype=torch.float64)
    logp = (old + 0.3 * torch.randn(3, 4, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    m = masks(3, 4)["partial"].double()
    lr = (logp - old).detach()
    if level == "sequence":
        lr = ((lr * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)).expand(3, 4)
    w = torch.exp(lr).clamp(max=1.2)
    factors = {"token-mean": 1.0 / m.sum(), "seq-mean-token-sum-norm": 1.0 / (3 * 6),
               "seq-mean-token-mean": (1.0 / m.sum(-1).clamp(min=1) / (m.sum(-1) > 0).sum())[:, None]}
    for agg, factor in factors.items():
        loss, _ = policy_loss(logp, old, adv, m, agg=agg, budget=6, objective="cispo", importance_sampling_level=level)
        (grad,) = torch.autograd.grad(loss, logp)
        assert torch.allclose(grad, -w * adv[:, None] * m * factor), agg


def test_bad_settings_name_the_problem():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="objective='ppo2' is not one of clip, cispo, sapo"):
        policy_loss(x, x, torch.zeros(1), x, objective="ppo2")
    with pytest.raises(ValueError, match="importance_sampling_level='seq' is not one of token, sequence"):
        policy_loss(x, x, torch.zeros(1), x, importance_sampling_level="seq")
    with pytest.raises(ValueError, match="sapo temperatures must be > 0"):
        policy_loss(x, x, torch.zeros(1), x, objective="sapo", sapo_temperatures=(0.0, 1.0))
    with pytest.raises(ValueError, match="loss_type='drgrpo' is not one of ppo, grpo"):
        get_arm("grpo", loss_type="drgrpo")
    with pytest.raises(ValueError, match="loss_type grpo aggregates as seq-mean-token-mean.*drop agg"):
        get_arm("grpo", loss_type="grpo", agg="token-sum")


# ---- loss types through the composed loss ------------------------------------------------------------------


def _batch(seed=5, B=3, T=5, **kw):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) - 0.5
    logp = (old + 0.1 * torch.randn(B, T, generator=g)).requires_grad_(True)
    m = torch.ones(B, T)
    m[0, 3:] = 0
    m[2, 1:] = 0
    return LossBatch(logp=logp, old_logp=old, advantages=torch.tensor([1.0, -1.0, 0.5]), mask=m,
                     ref_logp=old - 0.05, teacher_logp=old + 0.2 * torch.randn(B, T, generator=g),
                     entropy=torch.rand(B, T, generator=g), **kw)


@pytest.mark.parametrize("loss_type", [t for t in LOSS_TYPES if t != "ppo"])
@pytest.mark.parametrize("arm_name", ["grpo", "sdar", "opsd"])
def test_every_token_term_takes_the_loss_types_aggregation(loss_type, arm_name):
    arm = get_arm(arm_name, loss_type=loss_type)
    b = _batch(budget=7)
    total, metrics = compose_loss(arm, b)
    agg = LOSS_TYPES[loss_type].agg
    lr = b.logp - b.old_logp
    kl = torch.exp(b.ref_logp - b.logp) - (b.ref_logp - b.logp) - 1
    gate = torch.sigmoid(arm.gate_beta * (b.teacher_logp - b.logp.detach()))
    expected = {
        "loss/pg": policy_loss(b.logp, b.old_logp, b.advantages, b.mask, agg=agg, budget=7,
                               objective=LOSS_TYPES[loss_type].objective)[0],
        "loss/kl": aggregate(kl, b.mask, agg, 7),
        "loss/entropy": aggregate(b.entropy, b.mask, "token-mean"),  # TRL: H is a token mean whatever the type
        "loss/sdar": aggregate(gate * (b.teacher_logp - b.logp), b.mask, agg, 7),
    }
    for k, v in expected.items():
        assert metrics[k].item() == pytest.approx(v.item(), rel=1e-5, abs=1e-7), k
    by_hand = (arm.pg_coef * expected["loss/pg"] + arm.kl_coef * expected["loss/kl"]
               - arm.entropy_coef * expected["loss/entropy"] + arm.sdar_coef * expected["loss/sdar"])
    assert total.item() == pytest.approx(by_hand.item(), rel=1e-5)
    assert torch.isfinite(lr).all()
    total.backward()
    assert torch.isfinite(b.logp.grad).all() and (b.logp.grad[b.mask == 0] == 0).all()


def test_ppo_keeps_the_arms_aggregation_and_default_numbers():
    b = _batch()
    for agg in ("token-mean", "seq-mean-token-sum"):
        arm = get_arm("sdar", agg=agg)
        _, metrics = compose_loss(arm, b)
        assert arm.loss_type == "ppo" and arm.aggregation == agg == arm.entropy_aggregation
        assert metrics["loss/entropy"].item() == pytest.approx(aggregate(b.entropy, b.mask, agg).item())


def test_hint_channel_takes_the_aggregation():
    g = torch.Generator().manual_seed(6)
    s, t = torch.randn(2, 3, 7, generator=g), torch.randn(2, 3, 7, generator=g)
    hm = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    b = _batch(budget=4, hint_student_logits=s, hint_teacher_logits=t, hint_mask=hm)
    _, a = compose_loss(get_arm("grpo_hint", loss_type="dr_grpo"), b)
    _, c = compose_loss(get_arm("grpo_hint"), b)
    from sdar.algos import generalized_jsd

    assert a["loss/hint_jsd"].item() == pytest.approx(
        generalized_jsd(s, t, hm, agg="seq-mean-token-sum-norm", budget=4).item(), rel=1e-6)
    assert c["loss/hint_jsd"].item() == pytest.approx(generalized_jsd(s, t, hm).item(), rel=1e-6)
    assert a["loss/hint_jsd"].item() != pytest.approx(c["loss/hint_jsd"].item())


# ---- parity with TRL's GRPOTrainer._compute_loss -----------------------------------------------------------


def _trl_loss(loss_type, level, logp, old, adv, mask, ref, entropy, *, beta, ent_coef, eps_low, eps_high, max_len):
    """TRL's own _compute_loss on these tensors: a GRPOTrainer without a model, whose log-prob pass returns `logp`
    (TRL's code as installed, so a change in TRL's formulas shows here)."""
    from types import SimpleNamespace

    from accelerate import Accelerator

    from trl.trainer.grpo_trainer import GRPOTrainer

    t = GRPOTrainer.__new__(GRPOTrainer)  # make test installs trl (EXTRAS); its absence is a failure here
    t.__dict__.update(
        loss_type=loss_type, importance_sampling_level=level, beta=beta, epsilon_low=eps_low, epsilon_high=eps_high,
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, use_vllm=False, aux_loss_enabled=False,
        current_gradient_accumulation_steps=1, max_completion_length=max_len, accelerator=Accelerator(cpu=True),
        _entropy_bonus_enabled=ent_coef != 0.0, entropy_coef=ent_coef, use_adaptive_entropy=False,
        _metrics={"train": __import__("collections").defaultdict(list)}, model=SimpleNamespace(training=True),
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, sapo_temperature_pos=1.0,
                             sapo_temperature_neg=1.05, steps_per_generation=1),
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, entropy, None),
    )
    B, T = mask.shape
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
              "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": mask.sum()}
    return t._compute_loss(SimpleNamespace(training=True), inputs)


@pytest.mark.parametrize("loss_type", [t for t in LOSS_TYPES if t != "ppo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_matches_trl(loss_type, level):
    b = _batch(seed=7, budget=6)
    # the arm's knobs as TRL has them: no dual-clip; CISPO's cap 1 + clip_high is TRL's epsilon_high itself
    arm = get_arm("grpo", loss_type=loss_type, importance_sampling_level=level, dual_clip=None, clip_low=0.2,
                  clip_high=0.28, kl_coef=0.04, entropy_coef=0.01)
    ours, _ = compose_loss(arm, b)
    (g_ours,) = torch.autograd.grad(ours, b.logp)
    logp = b.logp.detach().clone().requires_grad_(True)
    theirs = _trl_loss(loss_type, level, logp, b.old_logp, b.advantages, b.mask, b.ref_logp, b.entropy,
                          beta=0.04, ent_coef=0.01, eps_low=0.2, eps_high=1.28 if loss_type == "cispo" else 0.28,
                          max_len=6)
    (g_theirs,) = torch.autograd.grad(theirs, logp)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-7)
    assert torch.allclose(g_ours, g_theirs, rtol=1e-5, atol=1e-8)
