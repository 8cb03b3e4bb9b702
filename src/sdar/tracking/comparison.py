"""The comparison's writes to MLflow: metrics and files added to runs that exist (the pipeline's parent run, the arm
and warm-start runs), the comparison's table, plot and JSON on the parent, and the view's metrics in each run it
shows. What is written is computed by sdar.eval.compare (statistics, table, plot), which writes nothing itself."""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path

from sdar.tags import PIPELINE_JOB_TAG
from sdar.tracking.store import mlflow_client, resolve_tracking_uri
from sdar.tracking.view import ViewRows, publish_view


def log_to_run(run_id: str, metrics: dict[str, float], *, files: dict[str, Path] | None = None,
               artifact_path: str | None = None, tracking_uri: str | None = None, step: int = 0) -> None:
    """Add metrics (and files, as artifacts named by the dict keys) to an existing MLflow run
    without touching its status, so a parent run stays RUNNING until the pipeline ends."""
    from mlflow.entities import Metric

    client = mlflow_client(resolve_tracking_uri(tracking_uri))
    ts = int(time.time() * 1000)
    batch = [Metric(k, float(v), ts, step) for k, v in metrics.items() if v is not None and math.isfinite(float(v))]
    for i in range(0, len(batch), 1000):
        client.log_batch(run_id, metrics=batch[i : i + 1000])
    for name, src in (files or {}).items():
        src = Path(src)
        if not src.is_file():
            raise FileNotFoundError(f"cannot log {src} to run {run_id}: not a file")
        if src.name == name:
            client.log_artifact(run_id, str(src), artifact_path)
            continue
        with tempfile.TemporaryDirectory() as tmp:  # MLflow names an artifact after its file
            dst = Path(tmp) / name
            shutil.copyfile(src, dst)
            client.log_artifact(run_id, str(dst), artifact_path)


def log_comparison(metrics: dict[str, float], files: list[Path], *, parent_run_id: str,
                   tracking_uri: str | None = None, rows: list[ViewRows] | None = None) -> None:
    """Attach the comparison's files (its table, plot and JSON) to the pipeline's MLflow parent run (under
    comparison/), with its per-arm metrics as `compare/<arm>/success`, ... (sdar.eval.compare.Comparison's `metrics()`
    and files); with the view's rows (sdar.eval.compare.view_rows), log them into every run the
    comparison's MLflow view shows (`log_view_metrics`) and save the view on the parent's experiment again
    (sdar.tracking.view.publish_view: the same view, whoever wrote it first)."""
    log_to_run(parent_run_id, {f"compare/{k}": v for k, v in metrics.items()}, files={Path(p).name: p for p in files},
               artifact_path="comparison", tracking_uri=tracking_uri)
    if rows is not None:
        log_view_metrics(rows, tracking_uri=tracking_uri)
    uri = resolve_tracking_uri(tracking_uri)
    parent = mlflow_client(uri).get_run(parent_run_id)
    if parent.data.tags.get(PIPELINE_JOB_TAG):
        publish_view(uri, parent.info.experiment_id, parent.data.tags[PIPELINE_JOB_TAG])


def log_view_metrics(rows: list[ViewRows], *, tracking_uri: str | None = None) -> int:
    """Write the comparison view's metrics (sdar.eval.compare.view_rows) into their runs; a run that is not in the
    store is named once and skipped. Returns the runs written."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client(resolve_tracking_uri(tracking_uri))
    present: dict[str, bool] = {}
    for row in rows:
        if row.run_id not in present:
            try:
                client.get_run(row.run_id)
                present[row.run_id] = True
            except MlflowException:
                print(f"note: run {row.run_id} is not in {client.tracking_uri}; the comparison's view will not show it")
                present[row.run_id] = False
        if present[row.run_id]:
            log_to_run(row.run_id, row.metrics, tracking_uri=tracking_uri, step=row.step)
    return sum(present.values())
