"""Tests of sdar.tracking against a real SQLite MLflow store in tmp_path, read back with MlflowClient.

Covers params/metrics round trip, parent/child runs, resume, non-finite metrics, artifacts and no-op mode.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import pytest
import torch

from sdar.tracking import (
    NONFINITE_METRIC,
    PARENT_TAG,
    RESUME_TAG,
    Tracker,
    default_tracking_uri,
    find_runs,
    flatten_params,
    metric_history,
    prepare_sqlite_store,
    sqlite_path,
)


@dataclass
class Optim:
    lr: float = 1e-5
    betas: tuple = (0.9, 0.999)


@dataclass
class Cfg:
    arm: str = "sdar"
    optim: Optim = field(default_factory=Optim)
    extra: dict = field(default_factory=lambda: {"gate": {"tau": 0.5}, "notes": "x" * 900})


def client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def history(uri, run_id, key):
    return [(m.step, m.value) for m in sorted(client(uri).get_metric_history(run_id, key), key=lambda m: m.step)]


def test_flatten_params():
    flat = flatten_params({"cfg": Cfg(), "seed": 3, "empty": {}, "tags": {"b", "a"}}, max_chars=100)
    assert flat["cfg.arm"] == "sdar"
    assert flat["cfg.optim.lr"] == "1e-05"
    assert flat["cfg.optim.betas"] == "[0.9, 0.999]"
    assert flat["cfg.extra.gate.tau"] == "0.5"
    assert flat["cfg.extra.notes"] == "x" * 97 + "..." and len(flat["cfg.extra.notes"]) == 100
    assert flat["seed"] == "3" and flat["empty"] == "{}" and flat["tags"] == '["a", "b"]'
    assert flatten_params(Optim(), prefix="opt") == {"opt.lr": "1e-05", "opt.betas": "[0.9, 0.999]"}
    with pytest.raises(TypeError, match="mapping or a dataclass"):
        flatten_params([1, 2])
    with pytest.raises(ValueError, match="MLflow's limit"):
        flatten_params({}, max_chars=7000)


def test_default_uri_and_store_preparation(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert default_tracking_uri(tmp_path / "out") == f"sqlite:///{(tmp_path / 'out').resolve()}/mlflow.db"
    monkeypatch.chdir(tmp_path)
    assert default_tracking_uri() == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    with Tracker("rel", "r", tracking_uri="sqlite:///rel/mlflow.db") as t:  # relative to cwd
        t.log_text("x", "x.txt")
    assert (tmp_path / "rel" / "mlartifacts" / "rel" / t.run_id / "artifacts" / "x.txt").read_text() == "x"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.sdar:5000")
    assert default_tracking_uri(tmp_path / "out") == "http://mlflow.sdar:5000"
    assert sqlite_path("http://mlflow.sdar:5000") is None

    uri = prepare_sqlite_store(tmp_path / "new" / "mlflow.db")
    assert uri == f"sqlite:///{(tmp_path / 'new' / 'mlflow.db').resolve()}"
    default = client(uri).get_experiment("0")  # opening it also checks the schema is current
    assert default.artifact_location == (tmp_path / "new" / "mlartifacts" / "0").resolve().as_uri()


def test_params_and_metrics_round_trip(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with Tracker("sdar-test", "arm-sdar", output_dir=tmp_path, tags={"arm": "sdar"}) as t:
        assert t.tracking_uri == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
        logged = t.log_params(Cfg())
        for step in range(5):
            n = t.log_metrics({"loss": 1.0 / (step + 1), "reward/mean": torch.tensor(0.1 * step),
                               "tokens": step * 100, "gate/open": step % 2 == 0}, step=step)
            assert n == 4
        t.log_metric("eval/success", 0.75, step=4)
        t.log_params({"seed": 7})
        t.log_params({"seed": 7})  # same value again: fine
        with pytest.raises(ValueError, match="param 'seed' is '7' .* now '8'"):
            t.log_params({"seed": 8})
        run_id = t.run_id

    run = client(t.tracking_uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "arm-sdar"
    assert run.data.tags["arm"] == "sdar"
    assert run.data.params == {**logged, "seed": "7"}
    assert run.data.params["extra.notes"] == "x" * 497 + "..." and run.data.params["optim.lr"] == "1e-05"
    assert history(t.tracking_uri, run_id, "loss") == [(s, pytest.approx(1.0 / (s + 1))) for s in range(5)]
    assert history(t.tracking_uri, run_id, "reward/mean") == [(s, pytest.approx(0.1 * s)) for s in range(5)]
    assert history(t.tracking_uri, run_id, "gate/open") == [(0, 1.0), (1, 0.0), (2, 1.0), (3, 0.0), (4, 1.0)]
    assert run.data.metrics["eval/success"] == 0.75
    assert metric_history(run_id, "tokens", tracking_uri=t.tracking_uri) == [(s, s * 100.0) for s in range(5)]
    t2 = Tracker("sdar-test", "bad", output_dir=tmp_path)
    with pytest.raises(TypeError, match="metric 'name' has a non-numeric value"), t2:
        t2.log_metrics({"name": "sdar"}, step=0)
    assert client(t.tracking_uri).get_run(t2.run_id).info.status == "FAILED"


def test_parent_and_child_runs(mlflow_uri):
    with Tracker("pipeline", "compare-1") as parent:
        kids = {}
        for arm in ("grpo", "sdar"):
            with Tracker("pipeline", arm, parent_run_id=parent.run_id, tags={"arm": arm}) as child:
                child.log_metrics({"eval/success": 0.5 if arm == "grpo" else 0.625}, step=10)
                kids[arm] = child.run_id
    assert parent.tracking_uri == mlflow_uri
    c = client(mlflow_uri)
    for arm, run_id in kids.items():
        assert c.get_run(run_id).data.tags[PARENT_TAG] == parent.run_id
    assert PARENT_TAG not in c.get_run(parent.run_id).data.tags

    children = find_runs("pipeline", f"tags.`{PARENT_TAG}` = '{parent.run_id}'", order_by=["metrics.`eval/success` DESC"])
    assert [(r.run_name, r.metrics["eval/success"], r.parent_run_id) for r in children] == [
        ("sdar", 0.625, parent.run_id), ("grpo", 0.5, parent.run_id)]
    assert {r.run_id for r in find_runs("pipeline")} == {parent.run_id, *kids.values()}
    assert [r.run_id for r in find_runs("pipeline", "tags.arm = 'grpo'")] == [kids["grpo"]]
    with pytest.raises(LookupError, match="experiment 'nope' not found"):
        find_runs("nope")
    with pytest.raises(LookupError, match="no MLflow database at"):
        find_runs("pipeline", tracking_uri=mlflow_uri.replace("mlflow.db", "other.db"))
    with pytest.raises(LookupError, match="parent run deadbeef not found"):
        Tracker("pipeline", "orphan", parent_run_id="deadbeef").start()


def test_resume_continues_the_same_run(mlflow_uri):
    first = Tracker("train", "sdar", tags={"attempt": "1"}).start()
    first.log_params({"lr": 1e-5, "arm": "sdar"})
    for step in range(3):
        first.log_metrics({"loss": 3.0 - step, "bad": float("nan")}, step=step)
    run_id = first.run_id
    del first  # the process dies here: the run is never ended
    assert client(mlflow_uri).get_run(run_id).info.status == "RUNNING"

    with Tracker("train", resume_run_id=run_id, tags={"attempt": "2"}) as again:
        assert again.run_id == run_id and again.run_name == "sdar"
        assert again.nonfinite_total == 3  # carried over from the run
        again.log_params({"lr": 1e-5, "arm": "sdar"})  # the same config again is accepted
        with pytest.raises(ValueError, match="param 'lr'"):
            again.log_params({"lr": 2e-5})
        for step in range(3, 6):
            again.log_metrics({"loss": 3.0 - step, "bad": float("inf")}, step=step)

    run = client(mlflow_uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags[RESUME_TAG] == "1" and run.data.tags["attempt"] == "2"
    assert history(mlflow_uri, run_id, "loss") == [(s, 3.0 - s) for s in range(6)]
    assert history(mlflow_uri, run_id, NONFINITE_METRIC) == [(s, float(s + 1)) for s in range(6)]
    assert len(find_runs("train")) == 1

    with pytest.raises(LookupError, match="cannot resume run 0123abc"):
        Tracker("train", resume_run_id="0123abc").start()
    with pytest.raises(ValueError, match="belongs to experiment 'train'"):
        Tracker("other", resume_run_id=run_id).start()


def test_nonfinite_metrics_skipped_and_counted(mlflow_uri):
    with Tracker("nf", "r") as t:
        assert t.log_metrics({"a": float("nan"), "b": math.inf, "c": 1.5, "d": torch.tensor(float("-inf"))}, step=0) == 1
        assert t.log_metrics({"a": 2.0, "c": 2.5}, step=1) == 2
        assert t.log_metrics({"a": float("nan")}, step=2) == 0
    assert t.nonfinite_total == 4 and t.nonfinite_keys == {"a", "b", "d"}
    run = client(mlflow_uri).get_run(t.run_id)
    assert set(run.data.metrics) == {"a", "c", NONFINITE_METRIC}
    assert history(mlflow_uri, t.run_id, "a") == [(1, 2.0)]
    assert history(mlflow_uri, t.run_id, NONFINITE_METRIC) == [(0, 3.0), (2, 4.0)]


def test_artifacts_are_stored_beside_the_database(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "table.md").write_text("| arm | success |\n")
    (tmp_path / "report" / "plots").mkdir()
    (tmp_path / "report" / "plots" / "curve.png").write_bytes(b"\x89PNG fake")
    (tmp_path / "cfg.yaml").write_text("arm: sdar\n")
    out = tmp_path / "out"
    with Tracker("arts", "r", output_dir=out) as t:
        t.log_text("step 3: go to desk 1", "samples/step-3.txt")
        t.log_dict({"success": 0.5, "arm": "sdar"}, "eval/summary.json")
        t.log_artifact(tmp_path / "cfg.yaml")
        t.log_artifacts(tmp_path / "report", "report")
        with pytest.raises(FileNotFoundError, match="not a file"):
            t.log_artifact(tmp_path / "report")
        artifact_uri = t.artifact_uri

    root = out.resolve() / "mlartifacts" / "arts" / t.run_id / "artifacts"
    assert artifact_uri == root.as_uri()
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert files == ["cfg.yaml", "eval/summary.json", "report/plots/curve.png", "report/table.md", "samples/step-3.txt"]
    assert json.loads((root / "eval/summary.json").read_text()) == {"success": 0.5, "arm": "sdar"}
    assert (root / "samples/step-3.txt").read_text() == "step 3: go to desk 1"
    listed = {a.path for a in client(t.tracking_uri).list_artifacts(t.run_id)}
    assert listed == {"cfg.yaml", "eval", "report", "samples"}


def test_artifacts_to_s3_through_mlflow(s3_server, mlflow_uri):
    bucket = s3_server.make_bucket()
    with Tracker("s3-arts", "r", artifact_location=f"s3://{bucket}/mlflow") as t:
        t.log_text("hello", "notes/hello.txt")
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == [f"mlflow/{t.run_id}/artifacts/notes/hello.txt"]


def test_disabled_tracker_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for t in (Tracker("x", "r", output_dir=tmp_path, enabled=False),
              (monkeypatch.setenv("SDAR_TRACKING", "off"), Tracker("x", "r", output_dir=tmp_path))[1]):
        with t:
            assert t.log_params({"a": 1}) == {} and t.log_metrics({"m": 1.0}, step=0) == 0
            t.log_text("x", "x.txt")
            t.log_artifact(tmp_path / "missing")
            assert t.run_id is None and t.artifact_uri is None
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError, match="no open run"):
        Tracker("x", "r", output_dir=tmp_path, enabled=True).log_metrics({"m": 1.0})


def _mlflow_server(db, port, art):
    import subprocess
    import sys
    import time
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
                             "--default-artifact-root", str(art), "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its workers die with the group (see _stop)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("mlflow server did not start")


def _stop(proc) -> None:
    """Stop the server and every process it started (uvicorn workers, job consumers)."""
    import os
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except (ProcessLookupError, OSError):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, OSError):
        pass


@pytest.mark.slow
def test_an_mlflow_outage_is_buffered_and_flushed_never_fatal(tmp_path, monkeypatch):
    """A real MLflow tracking server on loopback, stopped mid-run and started again: nothing raised,
    nothing lost, nothing logged twice."""
    import socket

    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail fast: the outage path, not MLflow's retries
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db, art = tmp_path / "mlflow.db", tmp_path / "art"
    uri = f"http://127.0.0.1:{port}"
    server = _mlflow_server(db, port, art)
    try:
        t = Tracker("outage", run_name="r", tracking_uri=uri).start()
        t.outage.interval_s = 0.0
        t.log_metrics({"loss": 1.0}, step=0)
        _stop(server)
        t.log_metrics({"loss": 2.0}, step=1)  # down: buffered, not raised
        t.log_params({"lr": 0.1})
        t.log_dict({"a": 1}, "x.json")
        assert t.pending_calls == 3
        server = _mlflow_server(db, port, art)
        t.log_metrics({"loss": 3.0}, step=2)  # back: the backlog goes first, in order
        assert t.pending_calls == 0 and len(t.outages) == 1
        t.end()
        client = MlflowClient(uri)
        assert sorted((m.step, m.value) for m in client.get_metric_history(t.run_id, "loss")) == [
            (0, 1.0), (1, 2.0), (2, 3.0)]
        run = client.get_run(t.run_id)
        assert run.data.params == {"lr": "0.1"} and run.info.status == "FINISHED"
    finally:
        _stop(server)


def test_models_tracking_and_alfworld_share_one_cache_root(monkeypatch, tmp_path):
    from sdar_envs.household.alfworld_backend import default_cache_dir
    from sdar.models.cache import cache_root
    from sdar.tracking import cache_dir

    monkeypatch.setenv("SDAR_CACHE_DIR", str(tmp_path / "c"))
    assert cache_root() == cache_dir() == default_cache_dir().parent == tmp_path / "c"
    monkeypatch.delenv("SDAR_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == cache_dir() == default_cache_dir().parent == tmp_path / "xdg" / "sdar"
