"""Expert trajectories in the shared JSONL format, written from a family's gold policy."""

from __future__ import annotations

import json

import pytest

from sdar_envs.base import register_env
from sdar_envs.expert import (
    RECORD_KEYS,
    STEP_KEYS,
    read_expert_trajectories,
    write_expert_trajectories,
)
from tests.envs.test_server import GuessEnv


class SlowExpertGuess(GuessEnv):
    """An expert that walks up from 0, so episodes take secret + 1 steps (some hit the cap)."""

    def expert_action(self) -> str:
        return f"guess {self.t}"


register_env("guess_expert", GuessEnv)
register_env("guess_slow", SlowExpertGuess)


def test_writes_the_shared_format_and_counts(tmp_path):
    out = tmp_path / "deep" / "guess.jsonl"
    summary = write_expert_trajectories("guess_expert", 45, out, seed=3, split="train")
    records = read_expert_trajectories(out)
    assert summary.episodes == len(records) == 45 and summary.won == 45 and summary.steps == 45
    assert summary.traj_per_s > 0 and f"{summary.traj_per_s:.1f} trajectories/s" in summary.line()
    # 30 train tasks in a seeded order, cycled: every task appears, none more than twice
    ids = [r["task_id"] for r in records]
    assert set(ids) == set(GuessEnv().task_ids("train")) and max(ids.count(i) for i in ids) == 2
    assert ids != sorted(ids, key=lambda s: int(s.split("-")[1]))
    rec = records[0]
    assert list(rec) == list(RECORD_KEYS)
    assert rec["family"] == "guess_expert" and rec["backend"] == "default"
    assert rec["task"] == f"find the digit of {rec['task_id']}" and rec["skills_key"] == rec["task_type"]
    step = rec["steps"][0]
    assert list(step) == list(STEP_KEYS)
    assert step["observation"] == f"[{rec['task_id']}] step 0: guess my digit" and step["action"] == f"guess {int(rec['task_id'][6:]) % 10}"
    assert step["admissible_actions"][0] == "guess 0" and step["done"] is True and step["reward"] == 1.0
    assert rec["won"] is True and rec["reward"] == 1.0 and rec["final_observation"].endswith("correct")
    # same seed, same file
    again = write_expert_trajectories("guess_expert", 45, tmp_path / "again.jsonl", seed=3, split="train")
    assert (tmp_path / "again.jsonl").read_text() == out.read_text() and again.won == 45


def test_episodes_that_run_out_are_recorded_as_lost(tmp_path):
    out = tmp_path / "slow.jsonl"
    summary = write_expert_trajectories("guess_slow", 30, out, split="test", max_steps=5)
    records = read_expert_trajectories(out)
    for rec in records:
        secret = int(rec["task_id"].split("-")[1]) % 10
        if secret < 5:  # reaches the secret within 5 guesses
            assert rec["won"] and len(rec["steps"]) == secret + 1 and rec["reward"] == 1.0
        else:
            assert not rec["won"] and len(rec["steps"]) == 5 and rec["reward"] == 0.0
            assert rec["steps"][-1]["observation"].endswith("step 4: higher")
            assert rec["final_observation"].endswith("step 5: higher")
    assert summary.won == sum(r["won"] for r in records) == 15
    assert summary.steps == sum(len(r["steps"]) for r in records)


def test_bad_input_is_named(tmp_path):
    with pytest.raises(ValueError, match="n must be >= 1"):
        write_expert_trajectories("guess_expert", 0, tmp_path / "x.jsonl")
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        write_expert_trajectories("guess_expert", 2, tmp_path / "x.jsonl", split="dev")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"family": "x"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1 lacks \\['backend'"):
        read_expert_trajectories(bad)
    bad.write_text("{oops\n")
    with pytest.raises(ValueError, match="is not JSON"):
        read_expert_trajectories(bad)
