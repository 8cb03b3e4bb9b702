"""Composer channel 3 in training (issue 13.2/13.3): each step's trajectories replayed by the N-teacher
pool (the local pool over real HTTP), its DPO pairs tokenised as the policy writes actions, the DPO term
exactly `replay_coef x dpo_loss` on them, pairs from step k in step k+1's loss, pairs handed in by file."""

from __future__ import annotations

import math

import pytest
import torch

from sdar.algos import dpo_loss, get_arm
from sdar.train.replay import PairSet, read_pair_set, tokenise_pairs, write_pair_set

from .conftest import make_trainer, small_config


def _cfg(tmp_path, arm="grpo_replay", **kw):
    # one update per step, so every micro-batch is scored on the step's starting weights
    return small_config(tmp_path, arm=arm, **{"ppo.mini_batch_size": 100000, "ppo.micro_batch_size": 4,
                        "tracking": False, "rollout.max_turns": 4, **kw})


def _capture(monkeypatch, trainer):
    import sdar.train.update as tr

    seen, real = [], tr.compose_loss

    def capture(arm, batch, **kw):
        if batch.dpo_chosen_logp is not None:
            seen.append((batch.dpo_chosen_logp.detach().clone(), batch.dpo_rejected_logp.detach().clone(),
                         batch.dpo_ref_chosen_logp.clone(), batch.dpo_ref_rejected_logp.clone(),
                         batch.dpo_chosen_logp.requires_grad))
        return real(arm, batch, **kw)

    monkeypatch.setattr(tr, "compose_loss", capture)
    return seen


def test_the_dpo_term_is_replay_coef_times_dpo_on_the_pools_pairs(tiny_ckpt, tmp_path, monkeypatch):
    trainer = make_trainer(_cfg(tmp_path, **{"replay.lag": 0}))
    try:
        seen = _capture(monkeypatch, trainer)
        pairs_seen = []
        real_due = trainer.replay.due
        monkeypatch.setattr(trainer.replay, "due", lambda *a: pairs_seen.append(real_due(*a)) or pairs_seen[-1])
        m = trainer.train_step(0).metrics
    finally:
        trainer.replay.close()
    (pairs,) = pairs_seen
    # the local pool (two rule experts) overruled the weak warm start somewhere, over real HTTP
    assert m["replay/calls"] > 0 and m["replay/turns"] > 0
    assert m["replay/pairs_in_loss"] == len(pairs) == m["replay/pairs"] > 0
    # every pair in exactly one micro-batch, scored with grad
    assert sum(len(c) for c, *_ in seen) == len(pairs) and all(g for *_, g in seen)
    chosen = torch.cat([c for c, *_ in seen])
    rejected = torch.cat([r for _, r, *_ in seen])
    # the reference is the start (a fresh LoRA adapter): its log-probs equal the policy's at step 0, so
    # every margin is 0 (to float noise) and the DPO loss is log 2
    torch.testing.assert_close(torch.cat([rc for _, _, rc, *_ in seen]), chosen, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.cat([rr for *_, rr, _ in seen]), rejected, rtol=0, atol=1e-5)
    assert m["loss/replay_dpo"] == pytest.approx(math.log(2.0), abs=1e-5)
    assert abs(m["replay/reward_margin"]) < 1e-6
    # the captured batch numbers are the pairs' own summed log-probs (forced tokens add log 1 = 0)
    for c, r, rc, rr, _ in seen:
        loss, _ = dpo_loss(c, r, rc, rr, beta=get_arm("grpo_replay").dpo_beta)
        assert float(loss) == pytest.approx(math.log(2.0), abs=1e-5)
    assert torch.all(chosen <= 0) and torch.all(rejected <= 0)
    # the chosen side is the agreed teacher action, the rejected side the student's own response
    for meta in pairs.meta:
        assert meta["chosen"] != meta["rejected"] and meta["agree"] >= 2


def test_pairs_of_step_k_enter_the_loss_at_step_k_plus_1(tiny_ckpt, tmp_path):
    trainer = make_trainer(_cfg(tmp_path, steps=2))
    try:
        m0 = trainer.train_step(0).metrics
        m1 = trainer.train_step(1).metrics
    finally:
        trainer.replay.close()
    assert m0["replay/pairs_in_loss"] == 0 and "loss/replay_dpo" not in m0
    # step 1's loss holds the pairs step 0's replay made (its stats are those of that replay)
    assert m1["replay/pairs_in_loss"] == m1["replay/pairs"] > 0
    assert "loss/replay_dpo" in m1 and m1["replay/calls"] >= m0["replay/calls"]
    assert m1["replay/cost_usd"] == 0.0  # the local pool's prices are 0


def test_pairs_are_written_as_the_policy_writes_actions(tiny_ckpt, tmp_path):
    from sdar.agent.constrained import action_trie
    from sdar.replay import ReplayPair

    trainer = make_trainer(_cfg(tmp_path, arm="grpo"))
    trajs = trainer.collect(0)
    tr, ti = next((i, j) for i, t in enumerate(trajs) for j, turn in enumerate(t.turns)
                  if len(turn.view.admissible_actions) > 1)
    turn = trajs[tr].turns[ti]
    other = next(a for a in turn.view.admissible_actions if a != turn.action)
    pairs = [ReplayPair(traj=tr, turn=ti, chosen=other, rejected=turn.action, agree=2, teachers=2),
             ReplayPair(traj=tr, turn=ti, chosen="fly to the moon", rejected=turn.action, agree=2, teachers=2)]
    ps = tokenise_pairs(pairs, trajs, trainer.tokenizer, "household", constrained=True)
    assert len(ps) == 1  # an action constrained decoding could never write is dropped
    eos = trainer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    trie = action_trie(trainer.tokenizer, "household", turn.view.admissible_actions, eos)
    assert ps.chosen[0] in trie.sequences and ps.chosen[0][-1] == eos
    assert ps.chosen_allowed[0] == trie.allowed_along(ps.chosen[0])
    assert ps.rejected[0] == turn.response_ids and ps.prompts[0] == turn.prompt_ids
    assert ps.rejected_allowed[0] == turn.allowed
    # scored like the student: the trie renormalisation makes forced positions log 1
    lp = trainer.scorer.summed(trainer.model, ps.prompts, ps.chosen, ps.chosen_allowed)
    assert lp.shape == (1,) and float(lp) <= 0
    # a JSONL round trip keeps every field
    back = read_pair_set(write_pair_set(ps, tmp_path / "pairs.jsonl"))
    assert back.to_records() == ps.to_records()
    with pytest.raises(FileNotFoundError, match="run the teacher_replay step"):
        read_pair_set(tmp_path / "none.jsonl")
    with pytest.raises(ValueError, match="lacks"):
        PairSet.from_records([{"prompt_ids": [1]}])


def test_pairs_handed_in_by_file_join_the_first_step(tiny_ckpt, tmp_path):
    first = make_trainer(_cfg(tmp_path / "a", **{"replay.lag": 0}))
    try:
        first.replay.submit(first.collect(0))
        pairs = first.replay.replays.take()
    finally:
        first.replay.close()
    assert len(pairs) > 0
    path = write_pair_set(pairs, tmp_path / "given.jsonl")
    trainer = make_trainer(_cfg(tmp_path / "b", **{"replay.pairs_path": str(path)}))
    try:
        m = trainer.train_step(0).metrics
    finally:
        trainer.replay.close()
    # lag 1: step 0 has no replay of its own yet, so its pairs are exactly the file's
    assert m["replay/pairs_in_loss"] == len(pairs)
    assert m["loss/replay_dpo"] == pytest.approx(math.log(2.0), abs=1e-5)


def test_the_api_key_never_reaches_logs_mlflow_or_the_compiled_pipeline(tiny_ckpt, tmp_path, monkeypatch, capsys):
    """Issue 13.2: a configured pool's key comes from the environment variable its endpoint names; it is
    sent to the teacher and appears nowhere else: not in the console, the MLflow params/tags/artifacts,
    the run directory, or the compiled pipeline (which only names the Secret)."""
    from dataclasses import replace

    from mlflow.tracking import MlflowClient

    from sdar.pipeline.runner import compile_pipeline
    from sdar.replay import serve_local_pool
    from sdar.tracking import default_tracking_uri

    secret = "sk-test-9f8e7d6c5b4a-never-log-me"
    monkeypatch.setenv("SDAR_TEST_TEACHER_KEY", secret)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with serve_local_pool("household") as local:
        teachers = [replace(e, api_key_env="SDAR_TEST_TEACHER_KEY").to_dict() for e in local.endpoints]
        cfg = _cfg(tmp_path / "run", arm="grpo_replay", steps=2, tracking=True, **{"checkpoint.every": 2,
                   "replay.teachers": teachers, "replay.lag": 0})
        summary = make_trainer(cfg).run()
    assert summary["history"][-1]["replay/calls"] > 0  # the pool was really asked
    out = capsys.readouterr()
    assert secret not in out.out + out.err
    client = MlflowClient(tracking_uri=default_tracking_uri(str(tmp_path / "run")))
    run = client.get_run(summary["run_id"])
    logged = " ".join(f"{k}={v}" for k, v in run.data.params.items() if k.startswith("replay."))
    assert logged.count("SDAR_TEST_TEACHER_KEY") == len(teachers)  # the variable's name only
    blob = repr(run.data.params) + repr(run.data.tags)
    assert secret not in blob
    for f in (tmp_path / "run").rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    yaml_text = compile_pipeline(tmp_path / "p.yaml", "cluster").read_text()
    assert secret not in yaml_text and "sdar-teachers" in yaml_text
