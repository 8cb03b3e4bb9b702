"""The training loop computes what the reference (ZJU-REAL/SDAR, a verl-agent fork) computes: forced tokens
out of the losses, the teacher's context built from the student's tokens, rewards, penalties, family
defaults and the optimisation loop (README "Reference parity" table)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from sdar.agent.prompts import TurnView, chat_ids, prefix_ids
from sdar.agent.rollout import Trajectory, Turn, episode_reward, penalized, turn_rewards
from sdar.config import FAMILY_DEFAULTS, load_config
from sdar.models.scorer import needed_lengths
from sdar.models.scoring import free_token_mask
from sdar.train.distributed import RowSplit
from sdar.train.runtime import Shortcuts
from sdar.train.update import micro_batches

from .conftest import make_trainer, small_config


# ---- 1. forced tokens --------------------------------------------------------------------------------
def test_free_token_mask_drops_exactly_the_single_choice_positions():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    allowed = [[[5, 6], [7], [8]], None, [[1], [1], [2, 3], [4]]]
    free = free_token_mask(allowed, mask)
    assert free.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0]]
    assert torch.equal(free_token_mask(allowed, mask, forced_free=True), mask)  # the old behaviour


def _captured_masks(trainer, monkeypatch):
    import sdar.train.update as tr

    seen = []
    real = tr.compose_loss

    def capture(arm, batch, **kw):
        seen.append((batch.mask.detach().clone(), batch.logp.detach().clone(), batch.teacher_logp))
        return real(arm, batch, **kw)

    monkeypatch.setattr(tr, "compose_loss", capture)
    return seen


@pytest.mark.parametrize("mask_forced", [True, False])
def test_forced_tokens_are_left_out_of_every_loss_term_and_statistic(tiny_ckpt, tmp_path, monkeypatch, mask_forced):
    cfg = small_config(tmp_path, arm="sdar", steps=1, tracking=False, **{"ppo.mini_batch_size": 100000,
                       "ppo.micro_batch_size": 100000}, **{"rollout.mask_forced_tokens": mask_forced})
    trainer = make_trainer(cfg)
    seen = _captured_masks(trainer, monkeypatch)
    m = trainer.train_step(0).metrics
    (mask, logp, teacher_logp), = seen
    trajs_allowed_forced = m["tokens/forced_frac"]
    # constrained decoding forces most tokens of an action once its first tokens are chosen
    assert 0.2 < trajs_allowed_forced < 1.0
    used = float(mask.sum())
    if mask_forced:
        assert used == pytest.approx(m["tokens/free"])
        # on the loss mask no token has log-prob 0 under both models (what a forced token has)
        both_zero = (logp.abs() < 1e-6) & (teacher_logp.abs() < 1e-6) & (mask > 0)
        assert not bool(both_zero.any())
        assert m["sdar/gap_mean"] == pytest.approx(m["teacher/gap_free_tokens"], abs=1e-5)
    else:
        # every response token enters the loss; the token means are diluted by the forced zeros
        assert m["tokens/free"] == pytest.approx(used)
        assert m["sdar/gap_mean"] == pytest.approx(m["teacher/gap_all_tokens"], abs=1e-5)
        assert abs(m["teacher/gap_all_tokens"]) < abs(m["teacher/gap_free_tokens"])


# ---- 2. the teacher's context (the prompt-level tests are in tests/teacher/test_privileged.py) ----------------


@pytest.mark.parametrize("placement", ["prefix", "user"])
def test_trainer_teacher_sees_the_student_context_when_the_student_dropped_history(tiny_ckpt, tmp_path, placement):
    # a student budget that forces history to be dropped, a teacher budget that would have kept it
    cfg = small_config(tmp_path, arm="sdar", steps=1, tracking=False, **{"teacher.max_prompt_tokens": 4096,
                       "rollout.history": 2, "rollout.max_turns": 4, "rollout.privileged_placement": placement})
    trainer = make_trainer(cfg)
    trajs = trainer.collect(0)
    # each turn with history as if its budget had been one token short: the student drops a pair (refitted
    # here rather than re-rolled, so the episodes stay the ones sampled)
    from sdar.agent.prompts import fit_prompt_ids

    for tr in trajs:
        for t in tr.turns:
            if t.view.history:
                t.prompt_ids, t.history_dropped = fit_prompt_ids(trainer.tokenizer, trainer.builder, t.view,
                                                                 len(t.prompt_ids) - 1)
    dropped = [(tr, t) for tr in trajs for t in tr.turns if t.history_dropped > 0]
    assert dropped, "the budget must make the student drop history"
    teacher = trainer.teacher.prompts(trajs)
    flat = [(tr, t) for tr in trajs for t in tr.turns]
    tok = trainer.tokenizer
    for ids, (tr, t) in zip(teacher, flat):
        if placement == "prefix":
            assert ids == prefix_ids(tok, tr.skills) + t.prompt_ids
        else:  # the same pairs as the student: its prompt is the teacher's with the skills taken out
            plain = chat_ids(tok, trainer.builder.messages(t.view, history=trainer.builder.history - t.history_dropped))
            assert plain == t.prompt_ids
            assert tok.decode(ids).count("Observation:") == tok.decode(t.prompt_ids).count("Observation:")


# ---- 5. rewards, penalties, family defaults -----------------------------------------------------------
def _traj(won: bool, reward: float, formats: list[bool], valid: list[bool]) -> Trajectory:
    view = TurnView(task="t", step=0, max_steps=5, observation="o")
    turns = [Turn(view=view, prompt_ids=[1], response_ids=[2], response_text="", action="a", valid=v, env_valid=True,
                  reward=0.0, format_valid=f) for f, v in zip(formats, valid)]
    return Trajectory("task", "type", 0, skills="", turns=turns, won=won, reward=reward)


def test_reference_reward_is_ten_on_a_win_for_household_and_shop():
    assert episode_reward(_traj(True, 1.0, [], []), "household") == 10.0
    assert episode_reward(_traj(False, 0.0, [], []), "household") == 0.0
    # shop: a purchase scoring 0.75 is not a win and earns 0; the continuous score stays available
    assert episode_reward(_traj(False, 0.75, [], []), "shop") == 0.0
    assert episode_reward(_traj(True, 1.0, [], []), "shop") == 10.0
    assert episode_reward(_traj(False, 0.75, [], []), "shop", "env") == 0.75
    assert episode_reward(_traj(True, 1.0, [], []), "searchqa") == 1.0  # exact match as the env scores it
    with pytest.raises(ValueError, match="unknown reward"):
        episode_reward(_traj(True, 1.0, [], []), "shop", "dense")


def test_penalty_counts_format_errors_only_unless_asked_for_the_strict_definition():
    # turn 0 well-formed but inadmissible, turn 1 malformed, turn 2 fine
    tr = _traj(True, 1.0, [True, False, True], [False, False, True])
    got = [r for _, _, r in turn_rewards([tr], 0.1, "format", "household", "reference")]
    assert got == pytest.approx([10.0, 9.9, 10.0])
    strict = [r for _, _, r in turn_rewards([tr], 0.1, "invalid", "household", "reference")]
    assert strict == pytest.approx([9.9, 9.9, 10.0])
    assert penalized(tr.turns[1], "format") and not penalized(tr.turns[0], "format")
    with pytest.raises(ValueError, match="penalize"):
        penalized(tr.turns[0], "sometimes")


@pytest.mark.parametrize("family,turns,history,kl,penalty,mini", [
    ("household", 50, 2, 0.01, 0.1, 256), ("shop", 15, 2, 0.01, 0.1, 64), ("searchqa", 4, 4, 0.001, 0.01, 256)])
def test_family_defaults_follow_the_reference_scripts(family, turns, history, kl, penalty, mini):
    from sdar.algos import get_arm

    cfg = load_config(None, {"env.family": family})
    assert (cfg.rollout.max_turns, cfg.rollout.history, cfg.rollout.invalid_penalty, cfg.ppo.mini_batch_size) == (
        turns, history, penalty, mini)
    assert get_arm(cfg.arm, **cfg.arm_overrides).kl_coef == kl
    # what a config sets wins over the family default
    own = load_config(None, {"env.family": family, "rollout.max_turns": 7, "arm_overrides.kl_coef": 0.5})
    assert own.rollout.max_turns == 7 and own.arm_overrides["kl_coef"] == 0.5
    assert set(FAMILY_DEFAULTS) == {"household", "shop", "searchqa"}


def test_opsd_arm_is_the_reference_opsd_script():
    from sdar.algos import get_arm

    arm = get_arm("opsd")
    assert (arm.pg_coef, arm.sdar_coef, arm.gate_beta) == (0.0, 0.01, 5.0)


def test_choices_are_checked_at_load():
    for key, value in (("reward", "dense"), ("ppo.loss_normalisation", "seq"), ("rollout.penalize", "x"),
                       ("rollout.privileged_placement", "system"), ("ppo.micro_batch_size", 0)):
        with pytest.raises(ValueError, match=key.split(".")[-1]):
            load_config(None, {key: value})


# ---- 6. optimisation -------------------------------------------------------------------------------
def test_micro_batch_weights_average_micro_batch_means_or_span_the_mini_batch():
    split = RowSplit(tokens=[3, 1, 1, 1, 2], offset=0, count=5)
    rows = [0, 1, 2, 3, 4]
    micro = micro_batches(split, rows, 2, "token-mean", "micro_batch")
    assert [p for p, _ in micro] == [[0, 1], [2, 3], [4]]
    assert [w for _, w in micro] == pytest.approx([1 / 3] * 3)
    mini = micro_batches(split, rows, 2, "token-mean", "mini_batch")
    assert [w for _, w in mini] == pytest.approx([4 / 8, 2 / 8, 2 / 8])
    # two ranks: rank 1 holds rows 3, 4; its weights plus rank 0's give the single-process ones
    r0, r1 = RowSplit(split.tokens, 0, 3), RowSplit(split.tokens, 3, 2)
    for mode in ("micro_batch", "mini_batch"):
        alone = [w for _, w in micro_batches(split, rows, 2, "token-mean", mode)]
        summed = [a + b for (_, a), (_, b) in zip(micro_batches(r0, rows, 2, "token-mean", mode),
                                                   micro_batches(r1, rows, 2, "token-mean", mode))]
        assert summed == pytest.approx(alone)


def test_the_update_takes_mini_batches_in_rollout_order(tiny_ckpt, tmp_path, monkeypatch):
    import sdar.train.update as tr

    cfg = small_config(tmp_path, arm="grpo", steps=1, tracking=False, **{"ppo.mini_batch_size": 6, "ppo.micro_batch_size": 4})
    trainer = make_trainer(cfg)
    assert trainer.optimizer.param_groups[0]["weight_decay"] == 0.01  # AdamW as verl's actor
    rows_seen = []
    real = tr.Updater._micro_loss

    def spy(self, b, state, mb, *args):
        rows_seen.append(list(mb))
        return real(self, b, state, mb, *args)

    monkeypatch.setattr(tr.Updater, "_micro_loss", spy)
    m = trainer.train_step(0).metrics
    n = int(m["turn_samples"])
    expected = []
    for start in range(0, n, 6):  # mini-batches of 6 in rollout order, micro-batches of 4 and 2
        rows = list(range(start, min(start + 6, n)))
        expected += [rows[k : k + 4] for k in range(0, len(rows), 4)]
    assert rows_seen == expected
    assert m["updates"] == len(range(0, n, 6))


@pytest.mark.parametrize("normalisation", ["micro_batch", "mini_batch"])
def test_the_gradient_is_the_normalised_sum_of_micro_batch_losses(tiny_ckpt, tmp_path, monkeypatch, normalisation):
    """By hand: micro_batch = mean over micro-batches of their token-mean losses; mini_batch = the token
    mean over the whole mini-batch (micro-batch losses weighted by their free tokens)."""
    import sdar.train.update as tr

    cfg = small_config(tmp_path, arm="sdar", steps=1, tracking=False, **{"ppo.mini_batch_size": 100000, "ppo.micro_batch_size": 3,
                       "ppo.loss_normalisation": normalisation})
    trainer = make_trainer(cfg)
    trainer.optimizer.step = lambda: None  # keep the weights: the gradient is what is compared
    trainer.cfg.optim.grad_clip = 1e9
    parts = []
    real = tr.Updater._micro_loss

    def spy(self, b, state, mb, *rest):
        parts.append((mb, float(b.free[mb].sum()), (b, state, mb, *rest)))
        return real(self, b, state, mb, *rest)

    monkeypatch.setattr(tr.Updater, "_micro_loss", spy)
    assert trainer.train_step(0).metrics["updates"] == 1
    got = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert len(parts) >= 3
    trainer.optimizer.zero_grad(set_to_none=True)
    tokens = sum(t for _, t, _ in parts)
    for _, t, args in parts:
        total, _ = real(trainer.updater, *args[:-1], 1.0)  # the micro-batch's loss unweighted (its last argument: the weight)
        w = 1.0 / len(parts) if normalisation == "micro_batch" else t / tokens
        (total * w).backward()
    for n, p in trainer.model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-7)


def test_teacher_gap_is_taken_at_the_rollout_temperature(tiny_ckpt, tmp_path):
    from sdar.models.scoring import response_logprobs

    trainer = make_trainer(small_config(tmp_path, arm="sdar", steps=1, tracking=False, **{"rollout.temperature": 0.5}))
    trajs = trainer.collect(0)
    prompts = [t.prompt_ids for tr in trajs for t in tr.turns]
    responses = [t.response_ids for tr in trajs for t in tr.turns]
    allowed = [t.allowed for tr in trajs for t in tr.turns]

    def gap_at(temp):
        s = response_logprobs(trainer.model, prompts, responses, pad_id=trainer.pad_id, allowed=allowed, temperature=temp)
        trainer.teacher.scorer = dataclasses.replace(trainer.teacher.scorer, temperature=temp)
        t = trainer.teacher.score(trainer.model, trajs)
        free = free_token_mask(allowed, s.mask)
        return float(((t.logp - s.logp) * free).sum() / free.sum())

    assert trainer.teacher_gap(trajs) == pytest.approx(gap_at(0.5), abs=1e-6)
    assert abs(gap_at(0.5) - gap_at(1.0)) > 1e-4


def test_privileged_skills_json_holds_the_texts_the_teacher_saw(tiny_ckpt, tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    trainer = make_trainer(small_config(tmp_path, arm="sdar", steps=1))
    summary = trainer.run()
    path = MlflowClient(mlflow_uri).download_artifacts(summary["run_id"], "privileged_skills.json", str(tmp_path))
    logged = json.loads(open(path).read())
    assert logged == trainer.teacher.skills_seen and logged
    trajs = trainer.collect(0)  # step 0's tasks again: the same texts, task by task
    for tr in trajs:
        assert logged[tr.task_type][tr.task_id] == tr.skills
    # target_only + top_k 2 + compact: far shorter than the whole library's text for the type
    from sdar_envs import make_env

    env = make_env("household", **trainer.cfg.env.kwargs)
    lib = env.skill_library()
    env.close()
    for task_type, by_task in logged.items():
        for text in by_task.values():
            assert len(text) < len(lib.render(task_type))


@pytest.mark.parametrize("mini", [6, 100000])
def test_old_logp_from_the_first_forward_changes_nothing(tiny_ckpt, tmp_path, mini):
    """The first mini-batch's old_logp taken from the update's own forward: the same update, the same
    statistics, one scoring pass less (all of it when the mini-batch holds the whole step)."""
    results = {}
    for reuse in (True, False):
        trainer = make_trainer(small_config(tmp_path / str(reuse), arm="sdar", steps=1, tracking=False,
                                            **{"ppo.mini_batch_size": mini}), shortcuts=Shortcuts(reuse_old_logp=reuse))
        m = trainer.train_step(0).metrics
        results[reuse] = (m, _updated(trainer))
    (m1, w1), (m0, w0) = results[True], results[False]
    for key in ("loss/pg", "loss/kl", "loss/sdar", "pg/ratio_mean", "pg/approx_kl", "sdar/gap_mean",
                "teacher/gap_free_tokens", "teacher/gap_all_tokens"):
        assert m1[key] == pytest.approx(m0[key], abs=1e-5), key
    if mini == 100000:
        assert m1["pg/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    _assert_same_update(w1, w0, trainer.cfg.optim.lr)


@pytest.mark.parametrize("mini", [6, 100000])
def test_old_logp_from_the_sampler_changes_nothing(tiny_ckpt, tmp_path, mini):
    """Issue 14.2: with the trainer's own model as the (constrained) sampler, old_logp is the sampling
    pass's log-probs: no scoring pass, the same update and statistics, and a first PPO ratio of 1."""
    results = {}
    for on in (True, False):
        trainer = make_trainer(small_config(tmp_path / str(on), arm="sdar", steps=1, tracking=False,
                                            **{"ppo.mini_batch_size": mini}),
                               shortcuts=Shortcuts(reuse_old_logp=False, old_logp_from_sampler=on))
        calls = []
        import sdar.models.scorer as sr
        import sdar.models.scoring as sc

        real = sc.response_logprobs
        sc.response_logprobs = sr.response_logprobs = lambda *a, **k: calls.append(len(a[1])) or real(*a, **k)
        try:
            m = trainer.train_step(0).metrics
        finally:
            sc.response_logprobs = sr.response_logprobs = real
        rows = int(m["turn_samples"])
        results[on] = (m, calls, rows, {n: p.detach().clone() for n, p in trainer.model.named_parameters()
                                        if p.requires_grad})
    (m1, c1, rows, w1), (m0, c0, _, w0) = results[True], results[False]
    # the old_logp pass over every row is gone (the reference's remains; the guard probes one row)
    assert c0.count(rows) == c1.count(rows) + 1 and 0 not in c1
    for key in ("loss/pg", "loss/kl", "loss/sdar", "pg/ratio_mean", "pg/approx_kl", "sdar/gap_mean",
                "teacher/gap_free_tokens"):
        assert m1[key] == pytest.approx(m0[key], abs=1e-5), key
    if mini == 100000:
        assert m1["pg/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    for k in w0:
        torch.testing.assert_close(w1[k], w0[k], atol=1e-5, rtol=1e-4)


def test_merged_inference_changes_nothing(tiny_ckpt, tmp_path):
    """Issue 14 (scoring.merged_inference): sampling, old_logp and the teacher on the plain module with the adapter merged
    in, the reference on the plain base: once the adapter has moved (step 1), the same samples, the same
    statistics and update as the peft module, and a first PPO ratio of 1 within 1e-5."""
    from peft import PeftModel

    results = {}
    for on in (True, False):
        trainer = make_trainer(small_config(tmp_path / str(on), arm="sdar", steps=2, tracking=False,
                                            **{"ppo.mini_batch_size": 100000}), shortcuts=Shortcuts(merged_inference=on))
        trainer.train_step(0)
        sampler = trainer.backend.inference()
        assert isinstance(sampler, PeftModel) != on and (sampler is trainer.model) != on
        trajs = {}
        trainer.collect = lambda step, real=trainer.collect, trajs=trajs: trajs.setdefault("t", real(step))
        m = trainer.train_step(1).metrics
        results[on] = (m, [t.response_ids for tr in trajs["t"] for t in tr.turns],
                       {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad})
    (m1, s1, w1), (m0, s0, w0) = results[True], results[False]
    assert s1 == s0
    for key in ("loss/pg", "loss/kl", "loss/sdar", "pg/ratio_mean", "pg/approx_kl", "sdar/gap_mean",
                "teacher/gap_free_tokens", "teacher/gap_all_tokens"):
        assert m1[key] == pytest.approx(m0[key], abs=1e-5), key
    assert m0["loss/kl"] != 0.0  # the adapter has moved: the reference differs from the policy
    assert m1["pg/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    for k in w0:
        torch.testing.assert_close(w1[k], w0[k], atol=1e-5, rtol=1e-4)


def test_shared_prefix_rollouts_change_nothing(tiny_ckpt, tmp_path):
    """Issue 14 (rollout.share_prefix): a task's rollouts encode the prompt start they share once per turn; the
    same samples, statistics and update as every prompt encoded whole, the sampler's log-probs still the
    trainer's old_logp (first PPO ratio 1 within 1e-5), and fewer positions through the model."""
    results = {}
    for on in (True, False):
        trainer = make_trainer(small_config(tmp_path / str(on), arm="sdar", steps=2, tracking=False,
                                            **{"ppo.mini_batch_size": 100000}), shortcuts=Shortcuts(share_prefix=on))
        trajs = []
        trainer.collect = lambda step, real=trainer.collect, trajs=trajs: trajs.append(real(step)) or trajs[-1]
        metrics = [trainer.train_step(k).metrics for k in (0, 1)]
        results[on] = (metrics, [t.response_ids for batch in trajs for tr in batch for t in tr.turns],
                       trainer.backend.decode_stats.prefill_tokens,
                       {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad})
    (m1, s1, n1, w1), (m0, s0, n0, w0) = results[True], results[False]
    assert s1 == s0
    for a, b in zip(m1, m0):
        for key in ("loss/pg", "loss/kl", "loss/sdar", "pg/ratio_mean", "sdar/gap_mean", "teacher/gap_free_tokens"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
        assert a["pg/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert n1 < n0
    for k in w0:
        torch.testing.assert_close(w1[k], w0[k], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_update_forward_from_shared_prefixes_gives_the_plain_forwards_numbers_and_gradients(tiny_ckpt, tmp_path,
                                                                                                  dtype):
    """Issue 14.4: the update's forward with a task's shared prompt start encoded once (with gradient) and the
    rest in groups of similar length: the same log-probs, entropies and LoRA gradients as one padded forward of
    the micro-batch, constrained rows and temperature 0.7 included."""
    import copy

    from sdar.models.scoring import response_logprobs
    from sdar.models.scoring import grouped_prefix_logprobs

    trainer = make_trainer(small_config(tmp_path, arm="sdar", steps=1, tracking=False))
    trajs = trainer.collect(0)
    flat = [(tr.task_id, t) for tr in trajs for t in tr.turns][:24]
    assert len({g for g, _ in flat}) > 1 and len(flat) > len({g for g, _ in flat})
    model = copy.deepcopy(trainer.model).to(dtype).train()
    with torch.no_grad():  # a LoRA that has moved (B != 0), so every adapter weight receives a gradient
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    args = ([t.prompt_ids for _, t in flat], [t.response_ids for _, t in flat])
    kw = dict(pad_id=trainer.pad_id, allowed=[t.allowed for _, t in flat], temperature=0.7, grad=True,
              with_entropy=True)
    out, grads = [], []
    for run in (lambda: grouped_prefix_logprobs(model, *args, [g for g, _ in flat], **kw),
                lambda: response_logprobs(model, *args, length_buckets=False, **kw)):
        model.zero_grad(set_to_none=True)
        r = run()
        w = torch.linspace(-1, 1, r.logp.numel(), device=r.logp.device).view_as(r.logp)
        ((r.logp * w * r.mask).sum() / r.mask.sum() + 0.1 * (r.entropy * r.mask).sum() / r.mask.sum()).backward()
        out.append(r)
        grads.append({n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None})
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    (shared, plain), (g1, g0) = out, grads
    assert torch.equal(shared.mask, plain.mask)
    torch.testing.assert_close(shared.logp, plain.logp, rtol=0, atol=tol)
    torch.testing.assert_close(shared.entropy, plain.entropy, rtol=0, atol=tol)
    assert g1.keys() == g0.keys() and any("lora" in n for n in g0)
    assert all(float(g0[n].abs().sum()) > 0 for n in g0)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=tol * 10, atol=tol * 10 * max(float(g0[n].abs().max()), 1e-6))


@pytest.mark.parametrize("flags", [{"prefix_cache": False}, {"length_buckets": False}, {"dedup": False}, {}])
def test_the_update_with_length_groups_and_prefix_reuse_changes_nothing(tiny_ckpt, tmp_path, flags):
    """Issue 14.4: a step with the update's forwards regrouped (length groups, a task's prompt start once, each
    distinct row once) makes the same update, with the same statistics, as with all three switched off."""
    import sdar.models.scoring as sc

    results = {}
    for name, extra in (("on", flags), ("off", {"prefix_cache": False, "length_buckets": False, "dedup": False})):
        # micro-batches of 6 rows, rollouts at temperature 0.1: the G rollouts of a task play equal turns, some in
        # one micro-batch (the update dedups within one)
        trainer = make_trainer(small_config(tmp_path / name, arm="sdar", steps=1, tracking=False, **{
            "ppo.mini_batch_size": 12, "ppo.micro_batch_size": 6, "rollout.temperature": 0.1}),
            shortcuts=Shortcuts(**extra))
        calls, deduped = [], []  # the prefix path's grad flags; whether a forward with gradients ran fewer rows
        real, real_once = sc.shared_prefix_logprobs, sc._scored_once

        def once(*a, **k):
            out = real_once(*a, **k)
            deduped.append(out is not None and out.logp.requires_grad)
            return out

        sc.shared_prefix_logprobs = lambda *a, **k: calls.append(k.get("grad", False)) or real(*a, **k)
        sc._scored_once = once
        try:
            m = trainer.train_step(0).metrics
        finally:
            sc.shared_prefix_logprobs, sc._scored_once = real, real_once
        results[name] = (m, calls, _updated(trainer), any(deduped))
    (m1, c1, w1, d1), (m0, c0, w0, d0) = results["on"], results["off"]
    assert (True in c1) == flags.get("prefix_cache", True) and True not in c0  # the update used the prefix path
    # with dedup the update forwarded a micro-batch's equal rows once (the G rollouts' equal first turns)
    assert d1 == flags.get("dedup", True) and not d0
    for key in ("loss/pg", "loss/kl", "loss/sdar", "pg/ratio_mean", "pg/approx_kl", "sdar/gap_mean", "loss/total"):
        assert m1[key] == pytest.approx(m0[key], abs=1e-5), key
    _assert_same_update(w1, w0, trainer.cfg.optim.lr)


def _updated(trainer) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name -> (trainable weight, Adam's first moment) after the trainer's step(s)."""
    state = trainer.optimizer.state
    return {n: (p.detach().clone(), state[p]["exp_avg"].clone()) for n, p in trainer.model.named_parameters()
            if p.requires_grad}


def _assert_same_update(w1, w0, lr: float) -> None:
    """The same Adam step to float rounding: the same gradient (the first moment, 0.1 x the gradient after one
    step) and the same weights to 1% of a step. Adam moves a weight by lr x g / (|g| + eps): where |g| is far
    below its eps (1e-8), float rounding in g moves the weight by up to lr x |rounding| / eps (2.8e-6 seen at
    lr 1e-3, |g| 1e-9), while any real change (a step of the wrong sign or size) is 100x larger."""
    assert w1.keys() == w0.keys()
    for k in w0:
        (after1, grad1), (after0, grad0) = w1[k], w0[k]
        torch.testing.assert_close(grad1, grad0, rtol=1e-3, atol=1e-3 * float(grad0.abs().max()))
        torch.testing.assert_close(after1, after0, atol=1e-2 * lr, rtol=0)


def test_unique_rows_merges_only_rows_equal_in_prompt_response_allowed_and_group():
    from sdar.models.scoring import unique_rows

    prompts = [[1, 2], [1, 2], [1, 2], [1, 2], [1, 3], [1, 2]]
    responses = [[5, 6], [5, 6], [5, 6], [5, 7], [5, 6], [5, 6]]
    allowed = [[[5, 9], [6]], [[5, 9], [6]], [[5], [6]], [[5, 9], [7]], [[5, 9], [6]], [[5, 9], [6]]]
    first, inverse = unique_rows(prompts, responses, allowed)
    assert first == [0, 2, 3, 4] and inverse == [0, 0, 1, 2, 3, 0]  # row 2: other allowed set; 3: other response
    first, inverse = unique_rows(prompts, responses, allowed, groups=["a", "a", "a", "a", "a", "b"])
    assert first == [0, 2, 3, 4, 5] and inverse == [0, 0, 1, 2, 3, 4]  # another group is another row
    assert unique_rows(prompts, responses, None) == ([0, 3, 4], [0, 0, 0, 1, 2, 0])
    assert unique_rows([], [], None) == ([], [])


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("grouped", [False, True])
def test_dedup_scoring_forwards_each_distinct_row_once_with_the_same_numbers(tiny_ckpt, tmp_path, dtype, grouped, grad):
    """Issue 14 (scoring.dedup): rows equal in prompt, response and allowed tokens are forwarded once and take
    that forward's log-probs and entropies: the same numbers as scoring every row (fp32 1e-5, bf16 3e-2), fewer
    positions through the model, constrained rows and temperature 0.7 included. With gradients (the update's
    micro-batch) every copy's loss reaches the one forward: the same loss and gradient as forwarding each copy."""
    import copy

    from sdar.models.scoring import grouped_prefix_logprobs, prefix_trie_positions, response_logprobs, unique_rows

    trainer = make_trainer(small_config(tmp_path, arm="sdar", steps=1, tracking=False))
    flat = [(tr.task_id, t) for tr in trainer.collect(0) for t in tr.turns][:20]
    n = len(flat)
    assert n >= 10
    flat = flat + flat[3:9] + flat[:2]  # some rows twice, at other places of the batch
    prompts, responses = [t.prompt_ids for _, t in flat], [t.response_ids for _, t in flat]
    allowed, groups = [t.allowed for _, t in flat], [g for g, _ in flat]
    first, _ = unique_rows(prompts, responses, allowed, groups)
    assert len(first) <= n < len(flat)
    model = copy.deepcopy(trainer.model).to(dtype).train(grad)
    with torch.no_grad():  # a LoRA that has moved (B != 0), so every adapter weight receives a gradient
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    seen = []
    # the decoder: scoring runs it and the output head at the needed positions (sdar.models.logprobs.logits_at)
    model.get_decoder().register_forward_pre_hook(lambda m, a, k: seen.append(int((k.get("input_ids") if k.get("input_ids")
                                    is not None else a[0]).numel())), with_kwargs=True)
    out, grads = {}, {}
    for dedup in (True, False):
        seen.clear()
        model.zero_grad(set_to_none=True)
        kw = dict(pad_id=trainer.pad_id, allowed=allowed, temperature=0.7, with_entropy=True, batch_size=8,
                  dedup=dedup, grad=grad)
        r = (grouped_prefix_logprobs(model, prompts, responses, groups, **kw) if grouped else
             response_logprobs(model, prompts, responses, **kw))
        if grad:  # every row its own weight, as advantages give them
            w = torch.linspace(-1, 1, r.logp.numel()).view_as(r.logp)
            ((r.logp * w * r.mask).sum() / r.mask.sum() + 0.1 * (r.entropy * r.mask).sum() / r.mask.sum()).backward()
            grads[dedup] = {k: p.grad.float().clone() for k, p in model.named_parameters() if p.grad is not None}
        out[dedup] = (r, sum(seen))
    (on, n_on), (off, n_off) = out[True], out[False]
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert torch.equal(on.mask, off.mask) and on.logp.shape == off.logp.shape
    torch.testing.assert_close(on.logp, off.logp, rtol=0, atol=tol)
    torch.testing.assert_close(on.entropy, off.entropy, rtol=0, atol=tol)
    assert n_on < n_off  # positions through the model
    # neither forwards fewer positions than the exact minimum, the prefix trie of the distinct sequences
    assert n_on >= prefix_trie_positions([p + r for p, r in zip(prompts, responses)])
    if grad:
        g1, g0 = grads[True], grads[False]
        assert g1.keys() == g0.keys() and any("lora" in k for k in g0)
        for k in g0:
            torch.testing.assert_close(g1[k], g0[k], rtol=tol * 10, atol=tol * 10 * max(float(g0[k].abs().max()), 1e-6))
    # a duplicated row carries exactly its first copy's numbers
    assert torch.equal(on.logp[n], on.logp[3]) and torch.equal(on.logp[n + 6], on.logp[0])


def test_dedup_scoring_changes_no_step_and_switches_off(tiny_ckpt, tmp_path, monkeypatch):
    """Issue 14 (scoring.dedup): a step with the scoring passes deduplicated makes the same update and statistics
    as with it off, and scores fewer rows when the batch repeats a turn-sample."""
    import sdar.models.scoring as sc

    results = {}
    for on in (True, False):
        trainer = make_trainer(small_config(tmp_path / str(on), arm="sdar", steps=1, tracking=False,
                                            **{"ppo.mini_batch_size": 100000}, group_size=4,
                                            **{"rollout.temperature": 0.3}),  # a task's rollouts often agree
                               shortcuts=Shortcuts(dedup=on))
        rows, trajs = [], []

        def counted(model, p, *a, real=sc._grouped_prefix_logprobs, **k):
            if not k.get("grad"):  # the no-grad passes (reference, teacher), not the update's forwards
                rows.append(len(p))
            return real(model, p, *a, **k)

        monkeypatch.setattr(sc, "_grouped_prefix_logprobs", counted)
        trainer.collect = lambda step, real_c=trainer.collect: trajs.append(real_c(step)) or trajs[-1]
        m = trainer.train_step(0).metrics
        monkeypatch.undo()
        t = [x for tr in trajs[0] for x in tr.turns]
        distinct = len(sc.unique_rows([x.prompt_ids for x in t], [x.response_ids for x in t], [x.allowed for x in t])[0])
        results[on] = (m, sum(r for r in rows if r > 1), len(t), distinct, _updated(trainer))
    (m1, r1, n1, d1, w1), (m0, r0, n0, d0, w0) = results[True], results[False]
    assert (n1, d1) == (n0, d0) and d1 < n1  # the same batch, and it repeats turn-samples (a task's first turns)
    assert r0 == 2 * n0 and r1 < r0  # reference + teacher: every row when off, fewer when on
    for key in ("loss/pg", "loss/kl", "loss/sdar", "pg/ratio_mean", "sdar/gap_mean", "teacher/gap_free_tokens",
                "loss/total"):
        assert m1[key] == pytest.approx(m0[key], abs=1e-5), key
    _assert_same_update(w1, w0, trainer.cfg.optim.lr)


def test_head_at_free_tokens_changes_no_step_and_switches_off(tiny_ckpt, tmp_path, monkeypatch):
    """Issue 14 (scoring.head_at_free_tokens): a step whose forwards (scoring passes and update) run the output head only at
    the response tokens that are not forced makes the same update and statistics as with the head over every
    response span, and runs the head at fewer positions."""
    results = {}
    for on in (True, False):
        trainer = make_trainer(small_config(tmp_path / str(on), arm="sdar", steps=1, tracking=False),
                               shortcuts=Shortcuts(head_at_free_tokens=on))
        rows = []
        for module in {trainer.model, trainer.policy.inference_model()}:
            module.get_output_embeddings().register_forward_pre_hook(
                lambda mod, a: rows.append(a[0].numel() // a[0].shape[-1]))
        m = trainer.train_step(0).metrics
        results[on] = (m, sum(rows), _updated(trainer))
    (m1, h1, w1), (m0, h0, w0) = results[True], results[False]
    assert m1["tokens/forced_frac"] > 0.3 and h1 < 0.7 * h0  # the forced tokens (and prompt positions) skipped
    for key in ("loss/pg", "loss/kl", "loss/sdar", "pg/ratio_mean", "sdar/gap_mean", "teacher/gap_free_tokens",
                "loss/total", "loss/entropy"):
        assert m1[key] == pytest.approx(m0[key], abs=1e-5), key
    _assert_same_update(w1, w0, trainer.cfg.optim.lr)


def test_trim_forced_tails_changes_no_step_and_forwards_fewer_positions(tiny_ckpt, tmp_path):
    """Issue 46 (Shortcuts.trim_forced_tails): a step whose scoring passes and update forward each response only up
    to its last token that is not forced makes the same update and statistics (forced tokens have log-prob 0,
    entropy 0 and no gradient under every model) as forwarding every response token, with fewer positions."""
    results = {}
    for on in (True, False):
        trainer = make_trainer(small_config(tmp_path / str(on), arm="sdar", steps=1, tracking=False),
                               shortcuts=Shortcuts(trim_forced_tails=on))
        positions = []  # every decoder forward's positions (the rollout's, the scoring passes', the update's)
        decoders = {id(d): d for d in (trainer.model.get_decoder(), trainer.policy.inference_model().get_decoder())}
        for d in decoders.values():
            d.register_forward_pre_hook(lambda mod, args, kwargs: positions.append(kwargs["input_ids"].numel())
                                        if kwargs.get("input_ids") is not None else None, with_kwargs=True)
        collected = []
        trainer.collect = lambda step, real=trainer.collect: collected.append(real(step)) or collected[-1]
        m = trainer.train_step(0).metrics
        results[on] = (m, sum(positions), _updated(trainer), collected)
    (m1, n1, w1, c1), (m0, n0, w0, c0) = results[True], results[False]
    turns = [t for batch in c0 for tr in batch for t in tr.turns]
    tails = sum(len(t.response_ids) - k for t, k in zip(turns, needed_lengths(
        [t.response_ids for t in turns], [t.allowed for t in turns])))
    assert m1["tokens/forced_frac"] > 0.3 and tails > 0 and n1 < n0  # the rollouts end in forced tokens
    for key in ("loss/pg", "loss/kl", "loss/sdar", "pg/ratio_mean", "sdar/gap_mean", "teacher/gap_free_tokens",
                "loss/total", "loss/entropy", "tokens/free"):
        assert m1[key] == pytest.approx(m0[key], abs=1e-5), key
    _assert_same_update(w1, w0, trainer.cfg.optim.lr)


def test_packed_forwards_and_the_lookahead_sampler_change_nothing(tiny_ckpt, tmp_path):
    """Issue 40 points 3, 4 (rollout.sampler: lookahead, scoring.packed): a turn's constrained rows sampled from one
    packed forward of their prompts and tries, every scoring pass and update micro-batch one packed forward: the
    same samples, statistics and update as the defaults, the sampler's log-probs still old_logp (first PPO ratio 1
    within 1e-5), no decode step, and fewer forwards."""
    results = {}
    for name, extra in (("packed", {"rollout.sampler": "lookahead", "scoring.packed": True}), ("plain", {})):
        trainer = make_trainer(small_config(tmp_path / name, arm="sdar", steps=2, tracking=False,
                                            **{"ppo.mini_batch_size": 100000}, **extra))
        trajs, calls = [], []
        trainer.collect = lambda step, real=trainer.collect, trajs=trajs: trajs.append(real(step)) or trajs[-1]
        hook = torch.nn.modules.module.register_module_forward_pre_hook(
            lambda m, a: calls.append(1) if type(m).__name__ == "Qwen2Model" else None)
        try:
            metrics = [trainer.train_step(k).metrics for k in (0, 1)]
        finally:
            hook.remove()
        results[name] = (metrics, [t.response_ids for batch in trajs for tr in batch for t in tr.turns],
                         trainer.backend.decode_stats.forwards, len(calls), _updated(trainer))
    (m1, s1, d1, f1, w1), (m0, s0, d0, f0, w0) = results["packed"], results["plain"]
    assert s1 == s0
    for a, b in zip(m1, m0):
        for key in ("loss/pg", "loss/kl", "loss/sdar", "pg/ratio_mean", "sdar/gap_mean", "teacher/gap_free_tokens"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
        assert a["pg/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert d1 == 0 < d0 and f1 < f0 / 2
    _assert_same_update(w1, w0, trainer.cfg.optim.lr)


def test_the_hint_and_replay_channels_packed_change_nothing(tiny_ckpt, tmp_path):
    """Issue 45.1: with scoring.packed the composer arm's hint logits and DPO pairs' sums are packed forwards too: two
    steps make the same hint and replay losses, statistics and update as the plain forwards (pairs from step 1)."""
    results = {}
    for name, packed in (("packed", True), ("plain", False)):
        trainer = make_trainer(small_config(tmp_path / name, arm="sdar_composer", steps=2, tracking=False,
                                            tasks_per_step=3, **{"scoring.packed": packed, "rollout.sampler": "batched",
                                            "rollout.max_response_tokens": 6}))  # cut responses: error sites
        metrics = [trainer.train_step(k).metrics for k in (0, 1)]
        results[name] = (metrics, _updated(trainer))
    (m1, w1), (m0, w0) = results["packed"], results["plain"]
    assert m1[0]["loss/hint_jsd"] > 0 and m1[1]["replay/pairs_in_loss"] > 0 and m1[1]["loss/replay_dpo"] > 0  # both ran
    for a, b in zip(m1, m0):
        assert a["turn_samples"] == b["turn_samples"] and a["replay/pairs_in_loss"] == b["replay/pairs_in_loss"]
        assert a.keys() == b.keys()
        for key in ("loss/hint_jsd", "loss/replay_dpo", "loss/pg", "loss/sdar", "loss/total"):
            assert a.get(key) == pytest.approx(b.get(key), abs=1e-5), key
    _assert_same_update(w1, w0, trainer.cfg.optim.lr)
