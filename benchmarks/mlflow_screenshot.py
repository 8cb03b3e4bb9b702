"""Screenshot of the MLflow UI comparing the arms of a comparison run, for the docs.

Starts `mlflow server` on 127.0.0.1 over the demo's store (runs/kfp-local/mlflow.db by default),
opens the run comparison of the latest pipeline run's arm runs in headless Chromium and saves
docs/images/mlflow-compare.png. Usage:
    python benchmarks/mlflow_screenshot.py [--store runs/kfp-local/mlflow.db] [--out docs/images/mlflow-compare.png]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]


def _store_uri(store: str) -> str:
    if "://" in store:
        return store
    path = Path(store).expanduser().resolve()
    if not path.is_file():
        raise SystemExit(f"no MLflow store at {path}; run `sdar run --local --quick` first or pass --store")
    return f"sqlite:///{path}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_runs(uri: str, experiment: str, parent: str | None) -> tuple[str, str, list[str]]:
    """(experiment id, parent run id, arm run ids) of `parent`, or of the newest pipeline run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise SystemExit(f"experiment {experiment!r} not found in {uri}; pass --experiment")
    if parent is None:
        parents = client.search_runs([exp.experiment_id], "tags.`sdar.kind` = 'pipeline'", order_by=["start_time DESC"])
        parents = [p for p in parents if client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{p.info.run_id}'")]
        if not parents:
            raise SystemExit(f"no pipeline run with arm runs in {experiment!r}; run the comparison first")
        parent = parents[0].info.run_id
    children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'",
                                  order_by=["attributes.run_name ASC"])
    return exp.experiment_id, parent, [c.info.run_id for c in children]


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"mlflow server exited with code {proc.returncode}; see its log above")
        try:
            with opener.open(url, timeout=3) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"mlflow server did not answer {url} within {timeout_s:g} s")


def screenshot(chromium: str, url: str, out: Path, window: str, budget_ms: int) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={window}",
               f"--virtual-time-budget={budget_ms}", f"--screenshot={out}", url]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=180)
    if not out.is_file() or out.stat().st_size < 5000:
        raise SystemExit(f"chromium wrote no usable screenshot to {out}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--store", default="runs/kfp-local/mlflow.db", help="MLflow store: a SQLite file or a URI")
    p.add_argument("--experiment", default="sdar-comparison")
    p.add_argument("--parent", default=None, help="parent (pipeline) run id; default: the newest with arm runs")
    p.add_argument("--out", default="docs/images/mlflow-compare.png")
    p.add_argument("--view", choices=("compare", "charts"), default="compare",
                   help="compare: the run comparison page; charts: the experiment's chart view")
    p.add_argument("--window", default="1600,1100", help="browser window WIDTH,HEIGHT")
    p.add_argument("--budget-ms", type=int, default=20000, help="virtual time the page gets to render")
    p.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = p.parse_args(argv)
    if not Path(args.chromium).is_file():
        raise SystemExit(f"chromium not found at {args.chromium}; apt-get install -y chromium or pass --chromium")

    uri = _store_uri(args.store)
    exp_id, parent, children = pick_runs(uri, args.experiment, args.parent)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              env=env, start_new_session=True)
    try:
        wait_http(f"{base}/health", server, 120)
        if args.view == "compare":
            q = urllib.parse.urlencode({"runs": json.dumps(children), "experiments": json.dumps([exp_id])})
            url = f"{base}/#/compare-runs?{q}"
        else:
            # the runs tab of the training UI (MLflow 3 opens experiments on its GenAI overview)
            url = f"{base}/#/experiments/{exp_id}/runs?compareRunsMode=CHART"
        t0 = time.perf_counter()
        screenshot(args.chromium, url, Path(args.out), args.window, args.budget_ms)
        print(f"saved {args.out} ({Path(args.out).stat().st_size / 1024:.0f} KiB) of {len(children)} arm runs of "
              f"parent {parent} in {time.perf_counter() - t0:.1f} s; page: {url}")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
