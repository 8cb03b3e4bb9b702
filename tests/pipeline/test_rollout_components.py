"""rollout and teacher_replay called directly with a small fresh tiny policy: trajectories in the
shared JSONL format that round-trip, and teacher scores that match the trainer's own gap."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from kfp.dsl import Dataset, Metrics

from components.rollout import rollout
from components.teacher_replay import teacher_replay

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "household-tiny.yaml")


def _overrides(tiny_dir: Path) -> dict:
    return {"model.name_or_path": f"tiny:{tiny_dir}", "rollout.max_turns": 3, "rollout.max_response_tokens": 8,
            "teacher.max_prompt_tokens": 2000, "rollout.max_prompt_tokens": 1024}


def test_rollout_writes_trajectories_that_teacher_replay_scores(tiny_dir, tmp_path):
    from sdar.config import load_config
    from sdar_envs.expert import read_expert_trajectories
    from sdar.eval.report import read_trajectories
    from sdar.train.trainer import Trainer

    ov = _overrides(tiny_dir)
    traj = Dataset(name="trajectories", uri=str(tmp_path / "trajectories.jsonl"))
    out = rollout.python_func(config_path=CONFIG, overrides=json.dumps(ov), trajectories=traj, episodes=3, split="train",
                              seed=1, output_root=str(tmp_path))
    assert out.episodes == 3
    records = read_expert_trajectories(traj.path)  # the shared trajectory format, validated
    assert len(records) == 3
    assert all(r["family"] == "household" and r["backend"] == f"policy:tiny:{tiny_dir}" for r in records)
    assert all(1 <= len(r["steps"]) <= 3 for r in records)
    assert out.success == pytest.approx(sum(r["won"] for r in records) / 3)
    trajs = read_trajectories(traj.path)
    for rec, t in zip(records, trajs):
        assert [s["action"] for s in rec["steps"]] == [turn.action for turn in t.turns]
        assert all(turn.response_ids and turn.prompt_ids for turn in t.turns)
        assert t.skills  # the privileged text travels with the trajectory

    scores = Dataset(name="scores", uri=str(tmp_path / "scores.json"))
    metrics = Metrics(name="metrics", uri=str(tmp_path / "metrics"))
    pairs = Dataset(name="pairs", uri=str(tmp_path / "pairs.jsonl"))
    rep = teacher_replay.python_func(trajectories=traj, config_path=CONFIG, overrides=json.dumps(ov), scores=scores,
                                     pairs=pairs, metrics=metrics, output_root=str(tmp_path))
    # the sdar arm has no replay weight: the pool is not asked and the pairs file is empty
    assert rep.pairs == 0 and Path(pairs.path).read_text() == "" and pairs.metadata["pairs"] == 0
    data = json.loads(Path(scores.path).read_text())
    assert data["turns"] == sum(len(r["steps"]) for r in records)
    assert [t["turns"] for t in data["trajectories"]] == [len(r["steps"]) for r in records]
    assert 0.0 < data["gate_mean"] < 1.0 and 0.0 <= data["pos_gap_frac"] <= 1.0
    assert rep.gap_mean == pytest.approx(data["gap_mean"]) and metrics.metadata["turns"] == data["turns"]
    # the same number the trainer computes for the same trajectories and policy
    cfg = load_config(CONFIG, {**ov, "arm": "sdar", "tracking": False, "output_dir": str(tmp_path / "check")})
    expected = Trainer(cfg).teacher_gap(trajs)
    assert math.isfinite(expected) and data["gap_mean"] == pytest.approx(expected, abs=1e-5)
    # the privileged prompt differs from the student's, so the gap is not identically zero
    assert abs(data["gap_mean"]) > 1e-6


def test_sessions_of_an_env_server_carry_the_in_process_privileged_text():
    from sdar.config import load_config
    from sdar_envs import make_env
    from sdar_envs.base import privileged_skills_for
    from sdar_envs.client import RemoteEnv
    from sdar_envs.launcher import serve_in_background

    cfg = load_config(CONFIG)
    url, handle = serve_in_background("household", in_process=True, **cfg.env.kwargs)
    try:
        local = make_env("household", **cfg.env.kwargs)
        for tid in local.task_ids("test")[:4]:
            want = local.reset(task_id=tid)
            with RemoteEnv(url, family="household") as env:
                got = env.reset(task_id=tid)
                assert got.observation == want.observation
                # the server sends the episode's privileged text (compact, target-only here) with the reset
                assert privileged_skills_for(env, "household", got.metadata) == local.privileged_skills()
    finally:
        handle.stop()


@pytest.mark.skipif(not __import__("os").environ.get("SDAR_ALFWORLD_DATA"),
                    reason="SDAR_ALFWORLD_DATA is not set (the Makefile sets it to ../shared/data/alfworld)")
def test_evaluate_plays_the_official_valid_seen_games_on_the_real_engine(tiny_dir, tmp_path):
    """With the alfworld backend the evaluate component plays the official valid_seen games
    (the paper's evaluation set) through the real engine, in a fixed order, the same for every arm."""
    from kfp.dsl import Artifact

    from components.evaluate import evaluate
    from sdar_envs.household import alfworld_backend as ab

    ov = {**_overrides(tiny_dir), "env.kwargs": {"backend": "alfworld"}, "rollout.max_turns": 2}
    results = []
    for arm in ("grpo", "sdar"):
        res = Artifact(name="result", uri=str(tmp_path / f"{arm}.json"))
        met = Metrics(name="metrics", uri=str(tmp_path / f"{arm}-metrics"))
        out = evaluate.python_func(config_path=CONFIG, overrides=json.dumps(ov), result=res, metrics=met, arm=arm, job_id="t",
                                   eval_tasks=2, tracking=False, output_root=str(tmp_path))
        results.append(json.loads(Path(res.path).read_text()))
        assert 0.0 <= out.success <= 1.0 and out.ci_low <= out.success <= out.ci_high
    root = ab.resolve_data_root(None)
    official = ab.list_games(root, "valid_seen")
    a, b = results
    # the same games for every arm, stratified over task types (the first two sorted games are one type)
    second = next(g for g in official if ab.task_type_of(g) != ab.task_type_of(official[0]))
    assert a["task_ids"] == b["task_ids"] == [official[0], second]
    assert all(t.startswith("valid_seen/") and (Path(root) / t).is_file() for t in a["task_ids"])
    assert a["n"] == 2 and set(a["per_type"]) <= {"look_at_obj_in_light", "pick_and_place_simple",
                                                   "pick_clean_then_place_in_recep", "pick_cool_then_place_in_recep",
                                                   "pick_heat_then_place_in_recep", "pick_two_obj_and_place"}


def test_teacher_replay_pairs_feed_gated_training(tiny_dir, tmp_path, monkeypatch):
    """Issue 13.4: rollout -> teacher_replay (the local pool over HTTP: DPO pairs + accounting) -> gated_train,
    whose first step's loss holds exactly those pairs and whose MLflow run gets the replay's accounting."""
    from kfp.dsl import Artifact, Model
    from mlflow.tracking import MlflowClient

    from components.gated_train import gated_train
    from sdar.train.replay import read_pair_set

    ov = {**_overrides(tiny_dir), "rollout.max_turns": 4, "replay.lag": 1, "eval.every": 0, "eval.tasks": 2,
          "tasks_per_step": 1, "group_size": 2, "checkpoint.every": 1}
    traj = Dataset(name="trajectories", uri=str(tmp_path / "trajectories.jsonl"))
    rollout.python_func(config_path=CONFIG, overrides=json.dumps(ov), trajectories=traj, episodes=4, split="train",
                        seed=2, output_root=str(tmp_path), arm="grpo_replay")
    pairs = Dataset(name="pairs", uri=str(tmp_path / "pairs.jsonl"))
    rep = teacher_replay.python_func(trajectories=traj, config_path=CONFIG, overrides=json.dumps(ov),
                                     scores=Dataset(uri=str(tmp_path / "scores.json")), pairs=pairs,
                                     metrics=Metrics(uri=str(tmp_path / "m")), arm="grpo_replay",
                                     output_root=str(tmp_path))
    found = read_pair_set(pairs.path)
    assert rep.pairs == len(found) == pairs.metadata["pairs"] > 0  # a fresh tiny model: the experts overrule it
    assert pairs.metadata["replay/calls"] > 0 and pairs.metadata["replay/cost_usd"] == 0.0
    assert 0.0 < pairs.metadata["replay/agreement_rate"] <= 1.0

    ck, hist = Model(uri=str(tmp_path / "ck")), Artifact(uri=str(tmp_path / "history.json"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the component sets it for its process; restored after
    out = gated_train.python_func(arm="grpo_replay", seed=0, config_path=CONFIG, overrides=json.dumps(ov),
                                  job_id="j", checkpoint=ck, history=hist, pairs=pairs, steps=1,
                                  output_root=str(tmp_path / "runs"), tracking=True, tracking_uri=uri)
    h = json.loads(Path(hist.path).read_text())["history"]
    assert h[0]["replay/pairs_in_loss"] == len(found)  # lag 1: step 0's pairs are exactly the handed-in ones
    run = MlflowClient(tracking_uri=uri).get_run(out.run_id)
    assert run.data.metrics["dag_pairs"] == len(found) and run.data.metrics["dag_replay/calls"] > 0
