"""The URL that `sdar run`, `sdar demo` and `sdar ui` print, opened in a real browser (issue 38, point 4): `mlflow
server` on 127.0.0.1 over a comparison's store, Debian's headless Chromium with a fresh profile (a browser that has
never seen MLflow: no localStorage, so MLflow's own default would be its GenAI view). Never skipped: a machine
without chromium fails here with the command that installs it (the Makefile's install does)."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.comparison_store import build_comparison_store

ARMS = ["grpo", "grpo_opsd", "sdar"]
GENAI_ONLY = ("Token Usage", "Detect Issues", "Tool calls")  # the GenAI overview's panels


@pytest.mark.slow
def test_the_printed_url_opens_the_arms_side_by_side_in_a_fresh_browser(tmp_path, mlflow_uri):
    from sdar.tracking.ui import comparison_url, render, serve

    build_comparison_store(mlflow_uri, "job-ui", ARMS, [0])
    names = [f"{a}-seed0" for a in ARMS] + ["warm-start-seed0"]
    with serve(mlflow_uri) as base:
        url = comparison_url(mlflow_uri, base)  # the newest comparison in the store, as `sdar ui` opens it
        page = render(url, lambda text: all(n in text for n in names) and "held-out success" in text
                      or any(m in text for m in GENAI_ONLY), timeout_s=120)
    (tmp_path / "mlflow-comparison.png").write_bytes(page.png)
    if os.environ.get("SDAR_UI_SCREENSHOT"):  # where to keep it (docs/images/ takes the demo's, see tools/mlflow_screenshot.py)
        shutil.copyfile(tmp_path / "mlflow-comparison.png", os.environ["SDAR_UI_SCREENSHOT"])
    shown = page.text
    assert not any(m in shown for m in GENAI_ONLY), f"the GenAI view opened:\n{shown[:1500]}"
    assert "workflowType=machine_learning" in page.url and "Model training" in shown
    # every arm and the warm start listed, none folded under its parent run (no "expand" needed: 4 rows)
    assert all(n in shown for n in names) and "4 matching runs" in shown, shown[:3000]
    # the saved view's charts: held-out success per run (the warm start its reference), the paired difference,
    # and the per-step curves
    for chart in ("held-out success", "held-out success - own warm start", "training success", "teacher-student gap",
                  "gate", "distillation weight"):
        assert f"\n{chart}\n" in shown, chart
    assert len(page.png) > 20_000 and page.png[:4] == b"\x89PNG"


@pytest.mark.slow
def test_a_tracking_servers_comparison_url_is_on_that_server(tmp_path, mlflow_uri):
    """With MLFLOW_TRACKING_URI an `mlflow server`, the pipeline's summary sends the user to that server's own UI (the
    URL opens the job's view there) rather than to a `sdar ui` on port 5000, where nothing listens."""
    import urllib.request

    from rich.console import Console

    from sdar.tracking.ui import serve
    from sdar.pipeline.runner import _print_summary, _view

    info = build_comparison_store(mlflow_uri, "job-remote", ARMS, [0])
    with serve(mlflow_uri) as base:
        view = _view(base, info["parent_run_id"], tmp_path / "root")
        assert view["ui_command"] == "" and view["job_id"] == "job-remote"
        assert view["view_url"].startswith(f"{base}/#/experiments/") and "viewStateShareKey=" in view["view_url"]
        with urllib.request.urlopen(view["view_url"].split("#")[0], timeout=30) as r:  # the server serves the UI
            assert r.status == 200 and b"<html" in r.read(2048).lower()
    console = Console(width=300, record=True)
    _print_summary(console, {**view, "summaries": [], "error": None, "seconds": 1.0, "parent_run_id": "p",
                             "child_runs": [], "experiment": "sdar-comparison"}, base)
    text = console.export_text()
    assert "open the tracking server's own UI at" in text and "sdar ui" not in text and view["view_url"] in text
