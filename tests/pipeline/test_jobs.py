"""A local pipeline job's records (sdar.pipeline.jobs): a finished task is answered from its record with its outputs
restored at the new paths; an interrupted one left nothing that passes for finished; one runner per job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sdar.pipeline.jobs import JOB_ENV, DONE, JobError, job_lock, job_of, once_per_job, read_job, record_dir, write_job


def _step(calls: list):
    @once_per_job("train", key=("arm", "seed"), outputs=("model_dir", "history_path"))
    def train(arm: str, job_id: str, model_dir: str, history_path: str, *, seed: int = 0, output_root: str = "",
              fail: bool = False) -> dict:
        calls.append((arm, seed, job_id))
        os.makedirs(model_dir, exist_ok=True)
        with open(os.path.join(model_dir, "weights.bin"), "w") as fh:
            fh.write(f"{arm}-{seed}")
        if fail:  # killed half-way: outputs written, the step never returned
            raise RuntimeError("killed")
        with open(history_path, "w") as fh:
            json.dump([1, 2, 3], fh)
        return {"final_dir": model_dir, "steps": 3, "nested": [model_dir, "other"]}

    return train


@pytest.fixture(autouse=True)
def _local_runner(monkeypatch):
    """Records are the local runner's: it names the job (JOB_ENV); the tests pass KFP's id, which it overrides."""
    monkeypatch.setenv(JOB_ENV, "")


def _as_runner(monkeypatch, job: str) -> None:
    monkeypatch.setenv(JOB_ENV, job)


def test_a_finished_task_is_answered_from_its_record_at_the_new_paths(tmp_path, monkeypatch):
    _as_runner(monkeypatch, "job1")
    calls: list = []
    train = _step(calls)
    root = str(tmp_path / "outputs")
    first = train("grpo", "job1", str(tmp_path / "a" / "model"), str(tmp_path / "a" / "h.json"), output_root=root)
    assert calls == [("grpo", 0, "job1")]
    where = record_dir(root, "job1", "train-grpo-0")
    assert (where / DONE).is_file() and (where / "model_dir" / "weights.bin").read_text() == "grpo-0"
    # a rerun of the job (new artifact paths, as the KFP local runner gives them): not run again
    again = train("grpo", "job1", str(tmp_path / "b" / "model"), str(tmp_path / "b" / "h.json"), output_root=root)
    assert calls == [("grpo", 0, "job1")]
    assert (tmp_path / "b" / "model" / "weights.bin").read_text() == "grpo-0"
    assert json.loads((tmp_path / "b" / "h.json").read_text()) == [1, 2, 3]
    assert again == {"final_dir": str(tmp_path / "b" / "model"), "steps": 3,
                     "nested": [str(tmp_path / "b" / "model"), "other"]} != first
    # another key, another job: each runs
    train("grpo", "job1", str(tmp_path / "c" / "m"), str(tmp_path / "c" / "h.json"), seed=1, output_root=root)
    _as_runner(monkeypatch, "job2")
    train("grpo", "job2", str(tmp_path / "d" / "m"), str(tmp_path / "d" / "h.json"), output_root=root)
    assert calls[1:] == [("grpo", 1, "job1"), ("grpo", 0, "job2")]


def test_off_the_local_runner_nothing_is_recorded(tmp_path):
    """On a cluster (JOB_ENV unset) KFP's retries and caching apply: the step runs each time and writes no record."""
    calls: list = []
    train = _step(calls)
    for _ in range(2):
        train("grpo", "kfp-uuid", str(tmp_path / "m"), str(tmp_path / "h.json"), output_root=str(tmp_path / "out"))
    assert calls == [("grpo", 0, "kfp-uuid")] * 2 and not (tmp_path / "out").exists()


def test_an_interrupted_task_leaves_no_record_and_runs_again(tmp_path, monkeypatch):
    _as_runner(monkeypatch, "job")
    calls: list = []
    train = _step(calls)
    root = str(tmp_path / "outputs")
    with pytest.raises(RuntimeError, match="killed"):
        train("sdar", "job", str(tmp_path / "a"), str(tmp_path / "a.json"), output_root=root, fail=True)
    assert not record_dir(root, "job", "train-sdar-0").exists()
    train("sdar", "job", str(tmp_path / "b"), str(tmp_path / "b.json"), output_root=root)
    assert len(calls) == 2 and (record_dir(root, "job", "train-sdar-0") / DONE).is_file()
    # a record folder without its DONE file (a rename never happens half-way; a hand-made one, say) is not taken
    (record_dir(root, "job", "train-sdar-0") / DONE).unlink()
    train("sdar", "job", str(tmp_path / "c"), str(tmp_path / "c.json"), output_root=root)
    assert len(calls) == 3


def test_the_local_runners_job_id_wins_over_kfps(tmp_path, monkeypatch):
    calls: list = []
    train = _step(calls)
    monkeypatch.delenv(JOB_ENV, raising=False)
    assert job_of("kfp-uuid") == "kfp-uuid"
    monkeypatch.setenv(JOB_ENV, "20261129-001500-abcdef")
    assert job_of("kfp-uuid") == "20261129-001500-abcdef"
    train("grpo", "kfp-uuid", str(tmp_path / "m"), str(tmp_path / "h.json"), output_root=str(tmp_path))
    assert calls == [("grpo", 0, "20261129-001500-abcdef")]


def test_one_runner_per_job_and_unknown_jobs_are_named(tmp_path):
    root = tmp_path / "outputs"
    write_job(root, "job-a", {"settings": {}, "parent_run_id": "p"})
    assert read_job(root, "job-a")["parent_run_id"] == "p"
    with pytest.raises(JobError, match=r"no job 'job-b' under .*the jobs there: job-a"):
        read_job(root, "job-b")
    with job_lock(root, "job-a"):
        code = (f"from sdar.pipeline.jobs import job_lock\nwith job_lock({str(root)!r}, 'job-a'):\n    pass")
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert other.returncode != 0 and f"job job-a is being run by another process (pid {os.getpid()})" in other.stderr
    with job_lock(root, "job-a"):  # released with the run: the next one takes it
        pass


def test_one_checkpoint_uri_for_a_run_gives_each_job_and_arm_its_own_prefix(tmp_path, monkeypatch):
    """`--set checkpoint.uri=s3://bucket/prefix` (or the pipeline's checkpoint_root) is a root: two jobs of two arms
    each checkpoint under <root>/<job>/<arm>-seed<s>, never into one another's (issue 43.4)."""
    from sdar.pipeline import steps

    seen = []

    def fake_train(config_path, ov, labels):  # what the arm would train with; no training here
        seen.append(ov["checkpoint.uri"])
        final = tmp_path / "final" / str(len(seen))
        final.mkdir(parents=True)
        (final / "adapter.bin").write_text("w")
        return {"final_dir": str(final), "steps": 1, "history": [], "run_id": "", "output_dir": str(final.parent)}

    monkeypatch.setattr(steps, "_train", fake_train)
    monkeypatch.delenv(JOB_ENV, raising=False)
    for job in ("job-a", "job-b"):
        for arm in ("grpo", "sdar"):
            steps.train_arm(arm, 0, "configs/household-tiny.yaml", json.dumps({"checkpoint.uri": "s3://b/runs/"}), job,
                            str(tmp_path / job / arm / "ck"), str(tmp_path / job / arm / "h.json"), tracking=False,
                            output_root=str(tmp_path / "out"))
    assert seen == ["s3://b/runs/job-a/grpo-seed0", "s3://b/runs/job-a/sdar-seed0", "s3://b/runs/job-b/grpo-seed0",
                    "s3://b/runs/job-b/sdar-seed0"]
