import pytest
import torch

from sdar.algos import (
    ARMS,
    LossBatch,
    compose_loss,
    dpo_loss,
    entropy_from_logits,
    generalized_jsd,
    get_arm,
    kl_k3,
    policy_loss,
    sdar_distill_loss,
)

from .conftest import masks


def make_batch(seed=0, B=4, T=6, V=11, kind="partial", dtype=torch.float32, **extra):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g).to(dtype).requires_grad_(True)
    tokens = torch.randint(0, V, (B, T), generator=g)
    logp = torch.log_softmax(logits.float(), -1).gather(-1, tokens[..., None]).squeeze(-1)
    old = (logp.detach() + 0.1 * torch.randn(B, T, generator=g)).to(dtype)
    ref = (logp.detach() + 0.2 * torch.randn(B, T, generator=g)).to(dtype)
    teacher = (logp.detach() + 0.5 * torch.randn(B, T, generator=g)).to(dtype)
    adv = torch.randn(B, generator=g)
    return LossBatch(
        logp=logp, old_logp=old, advantages=adv, mask=masks(B, T)[kind], ref_logp=ref,
        teacher_logp=teacher, logits=logits, **extra,
    )


def test_registry_holds_the_paper_arms():
    assert set(ARMS) >= {"grpo", "grpo_opsd", "sdar", "opsd", "skill_grpo"}
    assert get_arm("grpo").sdar_coef == 0.0
    assert get_arm("grpo_opsd").gate_beta == 0.0 and get_arm("grpo_opsd").sdar_coef == 0.01
    assert get_arm("sdar").gate_beta == 5.0 and get_arm("sdar").sdar_coef == 0.01
    assert get_arm("opsd").pg_coef == 0.0 and get_arm("opsd").sdar_coef > 0
    assert get_arm("skill_grpo").skills_in_student_prompt and get_arm("skill_grpo").sdar_coef == 0
    for arm in ARMS.values():  # paper defaults shared by every arm
        assert (arm.kl_coef, arm.entropy_coef, arm.clip_low, arm.clip_high, arm.dual_clip) == (
            0.01, 0.001, 0.2, 0.2, 3.0)
    composer = {"grpo_hint": (0.1, 0.0, 0.0), "grpo_replay": (0.0, 0.05, 0.0), "composer": (0.1, 0.05, 0.0),
                "sdar_composer": (0.1, 0.05, 0.01)}
    for arm in ARMS.values():  # the Composer channel arms weight their channels; the paper's do not
        want = composer.get(arm.name, (0.0, 0.0, arm.sdar_coef))
        assert (arm.hint_distill_coef, arm.replay_coef, arm.sdar_coef) == want, arm.name
    # issue 13.3: the ablation matrix is GRPO plus channels, nothing else changed (sdar_composer: SDAR's gate)
    assert all(get_arm(n).pg_coef == 1.0 for n in composer)
    assert get_arm("sdar_composer").gate_beta == get_arm("sdar").gate_beta == 5.0


def test_unknown_arm_and_setting_errors_name_the_fix():
    with pytest.raises(ValueError, match="unknown arm 'sdarr'; choose one of grpo, grpo_opsd, sdar"):
        get_arm("sdarr")
    with pytest.raises(ValueError, match="unknown arm setting"):
        get_arm("sdar", lamda=0.1)
    assert get_arm("sdar", kl_coef=0.001).kl_coef == 0.001
    assert get_arm("sdar").kl_coef == 0.01  # the registry is not mutated


@pytest.mark.parametrize("name", ["grpo", "grpo_opsd", "sdar", "opsd", "skill_grpo"])
@pytest.mark.parametrize("kind", ["empty", "partial", "full"])
def test_total_is_the_weighted_sum_of_components(name, kind):
    arm = get_arm(name)
    b = make_batch(kind=kind)
    total, metrics = compose_loss(arm, b)
    pg, _ = policy_loss(b.logp, b.old_logp, b.advantages, b.mask)
    kl = kl_k3(b.logp, b.ref_logp, b.mask)
    ent = entropy_from_logits(b.logits, b.mask)
    sd, _ = sdar_distill_loss(b.logp, b.teacher_logp, b.mask, beta=arm.gate_beta)
    expected = arm.pg_coef * pg + arm.kl_coef * kl - arm.entropy_coef * ent + arm.sdar_coef * sd
    assert total.item() == pytest.approx(expected.item(), rel=1e-6, abs=1e-7)
    for key, value in (("loss/pg", pg), ("loss/kl", kl), ("loss/entropy", ent), ("loss/sdar", sd)):
        assert metrics[key].item() == pytest.approx(value.item(), rel=1e-6, abs=1e-7)
    assert metrics["loss/total"].item() == pytest.approx(total.item())
    assert not metrics["loss/total"].requires_grad
    for key in ("sdar/gate_mean", "sdar/gap_mean", "sdar/pos_gap_frac", "pg/clipfrac"):
        assert key in metrics
    if kind == "empty":
        assert total.item() == 0.0


def test_sdar_minus_grpo_gradient_is_the_gated_term():
    b1, b2 = make_batch(seed=3, kind="full"), make_batch(seed=3, kind="full")
    for b, name in ((b1, "grpo"), (b2, "sdar")):
        b.logp.retain_grad()
        compose_loss(name, b)[0].backward()
    gate = torch.sigmoid(5.0 * (b2.teacher_logp - b2.logp.detach()))
    n = b2.mask.sum()
    assert torch.allclose(b2.logp.grad - b1.logp.grad, -0.01 * gate / n, atol=1e-7)
    # grpo saw the teacher for logging only: its gradient is that of a batch without it
    b3 = make_batch(seed=3, kind="full")
    b3.teacher_logp = None
    b3.logp.retain_grad()
    compose_loss("grpo", b3)[0].backward()
    assert torch.allclose(b1.logp.grad, b3.logp.grad)


def test_naive_opsd_gate_is_half():
    _, metrics = compose_loss("grpo_opsd", make_batch())
    assert metrics["sdar/gate_mean"].item() == 0.5


def test_unused_nan_input_cannot_poison_the_total():
    b = make_batch()
    b.teacher_logp = torch.full_like(b.old_logp, float("nan"))
    total, metrics = compose_loss("grpo", b)
    assert torch.isfinite(total)
    total, _ = compose_loss("sdar", b)
    assert torch.isnan(total)  # the trainer's non-finite guard must catch this one


def test_missing_inputs_are_reported():
    b = make_batch()
    b.teacher_logp = None
    with pytest.raises(ValueError, match="arm 'sdar' needs teacher_logp"):
        compose_loss("sdar", b)
    b = make_batch()
    b.ref_logp = None
    with pytest.raises(ValueError, match="needs ref_logp"):
        compose_loss("grpo", b)
    b = make_batch()
    b.logits = None
    with pytest.raises(ValueError, match="neither logits nor entropy"):
        compose_loss("grpo", b)
    with pytest.raises(ValueError, match="needs hint_student_logits"):
        compose_loss(get_arm("sdar", hint_distill_coef=0.1), make_batch())
    # replay pairs ride in only some micro-batches: a weighted DPO term without pairs is skipped, not an error
    total, metrics = compose_loss(get_arm("sdar", replay_coef=0.05), make_batch(seed=3))
    assert "loss/replay_dpo" not in metrics
    assert total.item() == pytest.approx(compose_loss("sdar", make_batch(seed=3))[0].item())


def test_composer_channels_add_their_weighted_terms():
    g = torch.Generator().manual_seed(5)
    hs, ht = torch.randn(4, 6, 11, generator=g), torch.randn(4, 6, 11, generator=g)
    hm = masks(4, 6)["partial"]
    pc, pr = torch.randn(3, generator=g), torch.randn(3, generator=g)
    rc, rr = torch.randn(3, generator=g), torch.randn(3, generator=g)
    extra = dict(hint_student_logits=hs, hint_teacher_logits=ht, hint_mask=hm, dpo_chosen_logp=pc,
                 dpo_rejected_logp=pr, dpo_ref_chosen_logp=rc, dpo_ref_rejected_logp=rr)
    base, _ = compose_loss("sdar", make_batch(**extra))
    arm = get_arm("sdar", hint_distill_coef=0.5, replay_coef=0.25, jsd_beta=0.2)
    total, metrics = compose_loss(arm, make_batch(**extra))
    jsd = generalized_jsd(hs, ht, hm, beta=0.2)
    dpo, _ = dpo_loss(pc, pr, rc, rr)
    assert total.item() == pytest.approx((base + 0.5 * jsd + 0.25 * dpo).item(), rel=1e-6)
    assert metrics["loss/hint_jsd"].item() == pytest.approx(jsd.item())
    assert metrics["loss/replay_dpo"].item() == pytest.approx(dpo.item())
    assert "replay/accuracy" in metrics
    # channels at weight 0 are not computed at all
    _, m0 = compose_loss("sdar", make_batch(**extra))
    assert "loss/hint_jsd" not in m0 and "loss/replay_dpo" not in m0


def test_bf16_batch_matches_fp32():
    t32, _ = compose_loss("sdar", make_batch(seed=7, kind="full"))
    t16, m16 = compose_loss("sdar", make_batch(seed=7, kind="full", dtype=torch.bfloat16))
    assert t16.dtype == torch.float32
    assert t16.item() == pytest.approx(t32.item(), rel=5e-2, abs=5e-2)


def test_precomputed_entropy_equals_logits():
    b = make_batch(seed=8)
    t1, _ = compose_loss("sdar", b)
    from sdar.algos import entropy_per_token

    b2 = make_batch(seed=8)
    b2.entropy, b2.logits = entropy_per_token(b2.logits), None
    t2, _ = compose_loss("sdar", b2)
    assert t1.item() == pytest.approx(t2.item(), rel=1e-6)


def test_a_new_loss_term_is_one_registered_function(monkeypatch):
    """Issue 13.3: a channel is a registered LossTerm plus its inputs (a LossBatch field or an `extras`
    key); its weight comes from the arm (a field or `extra_coefs`), and it is logged as loss/<name>."""
    from sdar.algos import arms as A

    monkeypatch.setattr(A, "LOSS_TERMS", dict(A.LOSS_TERMS))

    def squared_logp(arm, b):
        return (b.extras["scale"] * b.logp.pow(2) * b.mask).sum() / b.mask.sum(), {"rows": torch.tensor(float(b.logp.shape[0]))}

    A.register_loss_term(A.LossTerm("sq", "sq_coef", ("scale",), squared_logp, stats="sq", always=False))
    b = make_batch()
    base, base_m = compose_loss("grpo", b)
    arm = get_arm("grpo", extra_coefs=(("sq_coef", 0.5),))
    with pytest.raises(ValueError, match="needs scale"):
        compose_loss(arm, b)
    b.extras["scale"] = 2.0
    total, m = compose_loss(arm, b)
    want = 2.0 * (b.logp.pow(2) * b.mask).sum() / b.mask.sum()
    torch.testing.assert_close(m["loss/sq"], want.detach())
    torch.testing.assert_close(total, base + 0.5 * want)
    assert m["sq/rows"] == b.logp.shape[0]
    assert "loss/sq" not in base_m and "loss/sq" not in compose_loss("grpo", b)[1], "weight 0 and always=False: not computed"
