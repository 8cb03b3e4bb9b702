"""The comparison pipeline run end to end through the KFP local runner (SubprocessRunner): the
quick settings produce the comparison and the MLflow runs; a failing branch still tears down."""

from __future__ import annotations

import builtins
import json
import re
from pathlib import Path

import pytest

from sdar.pipeline.runner import run_local
from sdar.pipeline.settings import RunSettings
from tests.comparison_store import check_view
from tests.deprecations import sitecustomize_dir, watched
from tests.train.conftest import SMALL


def _pid_alive(pid: int) -> bool:
    try:
        return b"sdar_envs.server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _registries(root: Path) -> list[Path]:
    return sorted((root / "outputs" / "envs").glob("*.json"))


@pytest.mark.slow
def test_a_failing_step_still_runs_the_exit_handler(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = tmp_path / "kfp"
    # the model path does not exist: the baseline evaluation fails after the env server started
    s = RunSettings.quick(arms=["grpo"], model=str(tmp_path / "no-such-model"), experiment="e2e-fail")
    res = run_local(s, quick=True, root=root, quiet=True)
    assert res["status"] == "FAILED"
    assert "evaluate" in res["error"]
    # the failed task's own log holds its traceback (its path is printed with it)
    failed = [k for k in res["task_logs"] if k.startswith("evaluate")]
    assert failed and "no-such-model" in Path(res["task_logs"][failed[0]]).read_text()
    assert res["table"] is None and res["child_runs"] == {}
    # teardown ran: the server launch_envs started is stopped and its registry closed
    regs = _registries(root)
    assert len(regs) == 1 and regs[0].name.endswith(".stopped.json")
    pid = json.loads(regs[0].read_text())["pids"][0]
    assert not _pid_alive(pid)
    parent = MlflowClient(tracking_uri=res["tracking_uri"]).get_run(res["parent_run_id"])
    assert parent.info.status == "FAILED"
    assert parent.data.tags["sdar.pipeline_state"] == "FAILED"


@pytest.mark.slow
def test_quick_pipeline_produces_the_comparison_and_mlflow_runs(tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = tmp_path / "kfp"
    arms = ["grpo", "sdar"]  # one wave of the local runner's 2 parallel branches (3 arms took a second wave)
    # the quick settings, cut further (1 step, 2 rollouts per task, 6 held-out tasks, the training tests' smaller
    # model and warm start, tests/train/conftest.py's SMALL) to keep CI short
    small = {k: SMALL[k] for k in ("model.tiny_overrides", "warmstart.tokenizer_episodes", "rollout.max_response_tokens")}
    small["report_to"] = ["mlflow", "jsonl"]  # the training and evaluation steps also write JSON lines
    s = RunSettings.quick(arms=arms, steps=1, group_size=2, eval_tasks=6, experiment="e2e", overrides=small)
    print_before = builtins.print
    # every process the run starts (the KFP tasks, the env server) watched for deprecation warnings of our own calls
    deprecations = tmp_path / "deprecations.log"
    for key, value in sitecustomize_dir(tmp_path / "site", deprecations).items():
        monkeypatch.setenv(key, value)
    res = run_local(s, quick=True, root=root, quiet=True)
    assert res["status"] == "SUCCEEDED", res["error"]
    # the runner's two parallel branches swapped builtins.print (KFP indents a task's prints so): the same one is back
    assert builtins.print is print_before
    # issue 44.4: printed to a non-terminal (pytest's capture, as `make demo > demo.log`), no line is wrapped: the
    # task-log path (over 100 columns under pytest's tmp_path) and each training task's closing line are whole
    lines = capsys.readouterr().out.splitlines()
    logs = [ln for ln in lines if ln.startswith("task logs: ")]
    assert len(logs) == 1 and logs[0].rstrip().endswith(f"/logs/{res['job_id']}/"), logs  # > 80 columns under pytest
    for arm in arms:
        assert any(re.fullmatch(rf"  gated-train(-\d+)?: success in \d+s \({arm}: step 1/1, train success [\d.]+.*\)", ln)
                   for ln in lines), "\n".join(lines)
    assert not deprecations.exists(), deprecations.read_text()  # issue 44: a demo run causes none of its own
    # ...and the watch was on: every task process (plan, launch, evaluations, trainings, compare, teardown) had it
    assert len(watched(deprecations).read_text().splitlines()) >= 6, watched(deprecations).read_text()

    # the comparison: a row per arm plus the warm start, the plot, the pooled numbers
    table, computed = res["table"].split("\n## What each arm computed per step")
    assert table.count("\n| ") == 1 + 1 + len(arms)  # header (after the title), baseline, arms
    assert computed.count("\n| ") == 1 + len(arms) * s.steps  # header, a row per arm and step
    assert "| warm start (no RL) |" in table and all(f"| {a} | 0 |" in table for a in arms)
    assert Path(res["plot"]).read_bytes()[:4] == b"\x89PNG"
    summaries = {a["arm"]: a for a in res["summaries"]}
    assert set(summaries) == set(arms)
    assert all(a["n"] == s.eval_tasks and a["steps"] == s.steps for a in summaries.values())
    comparison = json.loads((Path(res["report_dir"]) / "comparison.json").read_text())
    # every arm and the baseline were evaluated on the same held-out task ids
    task_sets = {tuple(r["evaluation"]["task_ids"]) for r in comparison["runs"]}
    assert task_sets == {tuple(comparison["baseline"]["task_ids"])} and len(next(iter(task_sets))) == s.eval_tasks

    # MLflow: one parent for the pipeline run, one child per arm, each with its final evaluation
    client = MlflowClient(tracking_uri=res["tracking_uri"])
    parent = client.get_run(res["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["sdar.pipeline_state"] == "SUCCEEDED"
    assert parent.data.metrics["baseline/success"] == pytest.approx(comparison["baseline"]["success"])
    assert {f.path for f in client.list_artifacts(parent.info.run_id, "comparison")} == {
        "comparison/comparison.md", "comparison/comparison.png", "comparison/comparison.json"}
    assert sorted(res["child_runs"]) == sorted([f"{a}-seed0" for a in arms] + ["warm-start-seed0"])
    # the comparison's MLflow view: the shape the browser test (tests/integration/test_mlflow_ui.py) opens
    check_view(res["tracking_uri"], res["job_id"], arms, [0])
    assert res["view_url"].endswith("compareRunsMode=CHART") and "workflowType=machine_learning" in res["view_url"]
    for arm in arms:
        child = client.get_run(res["child_runs"][f"{arm}-seed0"])
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.info.status == "FINISHED" and child.data.params["arm"] == arm
        assert child.data.metrics["final/success"] == pytest.approx(summaries[arm]["success"])
        assert parent.data.metrics[f"compare/{arm}/success"] == pytest.approx(summaries[arm]["success"])
        assert len(client.get_metric_history(child.info.run_id, "reward")) == s.steps
    # report_to's JSON lines: a row per step in each training output, each evaluation's numbers in its own
    trained = sorted(root.glob("outputs/**/metrics.jsonl"))
    rows = {f.parent.name: [json.loads(ln) for ln in f.read_text().splitlines()] for f in trained}
    finals = {k: r[0] for k, r in rows.items() if k.startswith("eval-") and "final/success" in r[0]}
    assert sorted(finals) == sorted(f"eval-{a}-seed0-seed0" for a in arms), sorted(rows)
    for arm in arms:
        assert finals[f"eval-{arm}-seed0-seed0"]["final/success"] == pytest.approx(summaries[arm]["success"])
    assert rows["eval-baseline-seed0"][0]["baseline/success"] == pytest.approx(comparison["baseline"]["success"])
    assert sorted(k for k, r in rows.items() if len(r) == s.steps and "reward" in r[0]) == [f"{a}-seed0" for a in arms]

    # the env server is gone
    regs = _registries(root)
    assert len(regs) == 1 and regs[0].name.endswith(".stopped.json")
    assert not _pid_alive(json.loads(regs[0].read_text())["pids"][0])

    # one log file per task; each training task's holds its own arm's step lines
    logs = res["task_logs"]
    trains = [k for k in logs if k.startswith("gated-train")]
    assert len(trains) == len(arms)
    seen = set()
    for k in trains:
        text = Path(logs[k]).read_text()
        mine = {a for a in arms if f"[{a}] step 1/1" in text}
        assert len(mine) == 1, k
        seen |= mine
    assert seen == set(arms) and Path(res["log"]).name == "pipeline.log"
