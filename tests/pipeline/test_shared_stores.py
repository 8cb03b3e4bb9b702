"""Two pipeline runs at once sharing one root, one MLflow store and one S3 prefix (issue 43.4), on the store our k8s
manifests deploy: `mlflow server` started with k8s/base/mlflow.yaml's own command and arguments, its runs in
PostgreSQL (Debian's, started here as CI starts its other servers) and its artifacts proxied to S3 (moto). Neither
run's checkpoints, metrics, reports, logs or plots touch the other's; each run's printed URL is on that server and
shows its own job. Skipped, saying how to run it, where PostgreSQL is not installed: `make test-postgres` installs
it (apt, as root) and runs this file."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from sdar.ports import free_port as _free_port

REPO = Path(__file__).resolve().parents[2]


def _wait(url: str, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited {proc.returncode}: {proc.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer in {timeout_s:.0f} s")


@pytest.fixture
def postgres():
    """A PostgreSQL server of its own on 127.0.0.1 (trust auth, a database `mlflow`); yields its SQLAlchemy URI."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql); `make test-postgres` installs "
                    "it and runs this test")
    bindir = Path(bins[-1]).parent
    work = Path(tempfile.mkdtemp(prefix="sdar-pg-"))  # not under pytest's 0700 tmp: the postgres user must reach it
    work.chmod(0o755)
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: as the postgres user
        shutil.chown(work, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port, data = _free_port(), work / "data"
    subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres"], check=True,
                   capture_output=True, text=True, timeout=120)
    subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(work / "log"), "-w", "-o",
                    f"-p {port} -k {work} -c listen_addresses=127.0.0.1", "start"], check=True, capture_output=True,
                   text=True, timeout=120)
    try:
        subprocess.run([*as_user, str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                        "mlflow"], check=True, capture_output=True, text=True, timeout=60)
        yield f"postgresql://postgres@127.0.0.1:{port}/mlflow"
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def mlflow_server(postgres, s3_server):
    """`mlflow server` as k8s/base/mlflow.yaml runs it (its command and arguments, host and port moved to a free
    127.0.0.1 port), over `postgres`, with artifacts proxied to a moto bucket; yields (URL, bucket)."""
    manifest = next(d for d in yaml.safe_load_all((REPO / "k8s/base/mlflow.yaml").read_text())
                    if d and d.get("kind") == "Deployment")
    (container,) = [c for c in manifest["spec"]["template"]["spec"]["containers"] if c["name"] == "mlflow"]
    port, bucket = _free_port(), s3_server.make_bucket()
    argv = [*container["command"], *container["args"]]
    argv[argv.index("--host") + 1], argv[argv.index("--port") + 1] = "127.0.0.1", str(port)
    argv[0] = str(Path(sys.executable).parent / "mlflow")
    env = {**os.environ, "MLFLOW_BACKEND_STORE_URI": postgres, "MLFLOW_ARTIFACTS_DESTINATION": f"s3://{bucket}/mlflow",
           "MLFLOW_S3_ENDPOINT_URL": s3_server.endpoint_url}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        _wait(f"http://127.0.0.1:{port}/health", 180, proc)
        yield f"http://127.0.0.1:{port}", bucket
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            proc.wait(30)


def test_two_runs_at_once_on_one_root_and_the_clusters_store_keep_apart(mlflow_server, s3_server, tmp_path):
    from mlflow.tracking import MlflowClient

    from sdar.storage import open_store
    from sdar.train.checkpoint import list_checkpoints

    url, bucket = mlflow_server
    root = tmp_path / "root"
    env = {**os.environ, "MLFLOW_TRACKING_URI": url, "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "sdar.cli", "run", "--local", "--quick", "--arms", "grpo", "--eval-tasks", "4",
           "--set", f"checkpoint.uri=s3://{bucket}/ckpt", "--root", str(root), "--quiet"]
    runs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(2)]
    outs = [p.communicate(timeout=900)[0] for p in runs]
    for p, out in zip(runs, outs):
        assert p.returncode == 0, out[-4000:]
    jobs = [re.search(r"^job (\S+) \(new\)", out, re.M).group(1) for out in outs]
    assert jobs[0] != jobs[1]

    client = MlflowClient(url)
    exp = client.get_experiment_by_name("sdar-comparison")
    for job, out in zip(jobs, outs):
        # the printed URL is the tracking server's own UI, filtered to this job
        assert re.search(rf"^  {re.escape(url)}/#/experiments/{exp.experiment_id}/runs\?.*viewStateShareKey=sdar-{job}",
                         out, re.M), out[-2000:]
        mine = client.search_runs([exp.experiment_id], f"tags.`sdar.pipeline_job_id` = '{job}'")
        parents = [r for r in mine if r.data.tags.get("sdar.kind") == "pipeline"]
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'")
        assert sorted(r.info.run_name for r in children) == ["grpo-seed0", "warm-start-seed0"]
        assert all(r.data.tags["sdar.pipeline_job_id"] == job for r in children)
        arm = next(r for r in children if r.info.run_name == "grpo-seed0")
        assert [m.step for m in client.get_metric_history(arm.info.run_id, "success")] == [0, 1]
        arts = {a.path for a in client.list_artifacts(parents[0].info.run_id, "comparison")}
        assert any(p.endswith("comparison.md") for p in arts), arts  # through the server, into S3
        # checkpoints: under the shared prefix, one folder per job and arm, complete
        store = open_store(f"s3://{bucket}/ckpt/{job}/grpo-seed0")
        assert [s for s, _ in list_checkpoints(store)] == [2]
    assert len(client.search_runs([exp.experiment_id], "tags.`sdar.kind` = 'pipeline'")) == 2
    # nothing on disk is shared: outputs, records, logs and reports are per job
    logs = sorted(p.name for p in (root / "logs").iterdir())
    reports = sorted(p.name for p in (root / "reports").iterdir())
    assert len(logs) == len(reports) == 2 and all(any(n.endswith(j.rsplit("-", 1)[-1]) for n in logs) for j in jobs)
    assert all((root / "outputs" / j / "job.json").is_file() for j in jobs)
    # `sdar ui` without --job says which job it opened (the newest)
    ui = subprocess.run([sys.executable, "-m", "sdar.cli", "ui", "--tracking-uri", url, "--no-serve"], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=120)
    assert ui.returncode == 0 and any(j in ui.stdout for j in jobs), ui.stdout + ui.stderr
