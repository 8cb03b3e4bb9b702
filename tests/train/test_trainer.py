import dataclasses
import json

import pytest
import torch

from sdar.storage import open_store
from sdar.train.checkpoint import latest_checkpoint
from sdar.train import train

from .conftest import make_trainer, small_config

ARMS = ("grpo", "grpo_opsd", "sdar")


@pytest.mark.parametrize("arm", ARMS)
def test_each_arm_trains_logs_and_checkpoints(arm, tiny_ckpt, tmp_path, mlflow_uri):
    cfg = small_config(tmp_path / arm, arm=arm)
    trainer = make_trainer(cfg)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    summary = trainer.run()
    hist = summary["history"]
    assert [h["step"] for h in hist] == [0, 1]
    for h in hist:
        for key in ("loss/pg", "loss/kl", "loss/entropy", "loss/sdar", "loss/total", "sdar/gate_mean",
                    "sdar/gap_mean", "sdar/pos_gap_frac", "reward", "success", "episode_length",
                    "invalid_action_rate", "tokens_per_s", "time/step_s"):
            assert key in h, key
        assert h["updates"] >= 1 and h["turn_samples"] >= 4
        assert 0.0 <= h["sdar/gate_mean"] <= 1.0
    if arm == "grpo_opsd":
        assert all(h["sdar/gate_mean"] == pytest.approx(0.5) for h in hist)
    # the adapter moved and only trainable (LoRA) weights exist in the update
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[n], after[n].detach()) for n in before)
    assert all("lora" in n for n in before)
    # checkpoint of the last step, in the store
    assert latest_checkpoint(open_store(str(tmp_path / arm)))[0] == 2
    # MLflow: one run with per-step metrics and the privileged texts
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    run = client.get_run(summary["run_id"])
    assert run.data.tags["arm"] == arm
    assert len(client.get_metric_history(run.info.run_id, "loss/pg")) == 2
    path = client.download_artifacts(run.info.run_id, "privileged_skills.json", str(tmp_path))
    skills = json.loads(open(path).read())  # {task type: {task id: the text the teacher saw}}
    assert skills == trainer.teacher.skills_seen
    assert sum(len(v) for v in skills.values()) >= cfg.tasks_per_step


def test_resume_continues_exactly_like_an_uninterrupted_run(tiny_ckpt, tmp_path, mlflow_uri):
    full = train(small_config(tmp_path / "full", steps=3, arm="sdar"))["history"]
    # "killed" after step 1: the run stops with its checkpoint written, then the same command reruns
    train(small_config(tmp_path / "killed", steps=1, arm="sdar"))
    resumed = make_trainer(small_config(tmp_path / "killed", steps=3, arm="sdar"))
    assert resumed.resume() and resumed.step == 1
    resumed.step = 0
    hist = resumed.run()["history"]
    assert [h["step"] for h in hist] == [0, 1, 2]
    for a, b in zip(full, hist):
        for key in ("loss/total", "loss/pg", "loss/sdar", "reward", "sdar/gap_mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), (a["step"], key)


def test_nonfinite_loss_is_skipped_and_training_continues(tiny_ckpt, tmp_path, mlflow_uri, monkeypatch):
    import sdar.train.update as tr

    real = tr.compose_loss
    calls = {"n": 0}

    def poisoned(arm, batch, **kw):
        calls["n"] += 1
        total, metrics = real(arm, batch, **kw)
        return (total * float("nan"), metrics) if calls["n"] == 1 else (total, metrics)

    monkeypatch.setattr(tr, "compose_loss", poisoned)
    # one update in all, skipped: allow that share (the run-level failure is tested in test_guards.py)
    trainer = make_trainer(small_config(tmp_path, arm="sdar", steps=1, **{"ppo.mini_batch_size": 1000, "optim.max_skipped_update_frac": 1.0}))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.run()
    assert trainer.guard.skipped == 1
    # the only update of the step was skipped: the weights never saw the NaN
    for n, p in trainer.model.named_parameters():
        if p.requires_grad:
            assert torch.equal(before[n], p.detach()) and torch.isfinite(p).all()


def test_checkpoints_to_s3_and_resumes_from_there(tiny_ckpt, tmp_path, mlflow_uri, s3_server):
    bucket = s3_server.make_bucket()
    uri = f"s3://{bucket}/household/sdar"
    train(small_config(tmp_path / "a", steps=1, **{"checkpoint.uri": uri}))
    store = open_store(uri)
    assert latest_checkpoint(store)[0] == 1
    assert any(k.endswith("trainable.pt") for k in store.list("checkpoints"))
    t = make_trainer(small_config(tmp_path / "b", steps=2, **{"checkpoint.uri": uri}))
    assert t.resume() and t.step == 1


def test_arms_that_do_not_need_the_teacher_can_skip_it(tiny_ckpt, tmp_path, mlflow_uri):
    import math

    hist = train(small_config(tmp_path, arm="grpo", steps=1, **{"teacher.for_all_arms": False}))["history"]
    assert "sdar/gate_mean" not in hist[0] and math.isnan(hist[0]["teacher/gap_all_tokens"])
    assert hist[0]["updates"] >= 1
    # an arm that needs the teacher scores it regardless of the switch
    hist = train(small_config(tmp_path / "s", arm="sdar", steps=1, **{"teacher.for_all_arms": False}))["history"]
    assert "sdar/gate_mean" in hist[0]


def test_sdar_tracking_off_in_the_environment_turns_mlflow_off_for_sdar_train(tiny_ckpt, tmp_path, mlflow_uri, monkeypatch):
    # machines without MLflow (a bare GPU box) train with SDAR_TRACKING=0 and no config change
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("SDAR_TRACKING", "0")
    summary = train(small_config(tmp_path, arm="grpo", steps=1, **{"teacher.for_all_arms": False}))
    assert summary["run_id"] is None and (tmp_path / "history.json").is_file()
    assert MlflowClient(mlflow_uri).search_experiments(filter_string="name = 'household-tiny'") == []


def test_rollouts_are_scored_at_their_sampling_temperature(tiny_ckpt, tmp_path, mlflow_uri):
    # one mini-batch per step: before it updates, the policy is the sampling policy, so the PPO
    # ratio is exactly 1 when old and current log-probs are both taken at the rollout temperature
    cfg = small_config(tmp_path, arm="sdar", steps=1, **{"ppo.mini_batch_size": 100000, "rollout.temperature": 0.5})
    h = train(cfg)["history"][0]
    assert h["updates"] == 1
    assert h["pg/approx_kl"] == pytest.approx(0.0, abs=1e-6) and h["pg/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match="rollout.temperature"):  # checked when the config is loaded
        small_config(tmp_path / "greedy", arm="grpo", steps=1, **{"rollout.temperature": 0.0})


def test_teacher_engine_is_bypassed_and_counted_at_other_temperatures(tiny_ckpt, tmp_path):
    # vLLM's prompt log-probs are of the raw logits: at another rollout temperature the teacher is scored
    # by the trainer's forward, and every such turn counts as a fallback (the engine is a stand-in that
    # must not be called: vLLM cannot be installed here)
    from sdar.models.scoring import response_logprobs

    class MustNotScore:
        def prompt_logprobs(self, *a, **k):
            raise AssertionError("the vLLM engine scored at a temperature it cannot")

    trainer = make_trainer(small_config(tmp_path, arm="sdar", steps=1, tracking=False))
    trajs = trainer.collect(1)
    trainer.teacher.engine = MustNotScore()
    trainer.teacher.scorer = dataclasses.replace(trainer.teacher.scorer, temperature=0.5)
    got = trainer.teacher.score(trainer.model, trajs)
    want = response_logprobs(trainer.model, trainer.teacher.prompts(trajs),
                             [t.response_ids for tr in trajs for t in tr.turns], pad_id=trainer.pad_id,
                             allowed=[t.allowed for tr in trajs for t in tr.turns], temperature=0.5)
    torch.testing.assert_close(got.logp, want.logp)
    assert trainer.teacher.fallback_frac == 1.0 and trainer.teacher.engine_turns == got.logp.shape[0]
