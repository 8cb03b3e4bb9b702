"""A thin layer over MLflow for the trainer and the pipeline: runs, nested arm runs, resume, params, metrics.

Default store: `sqlite:///<output_dir or cwd>/mlflow.db` (artifacts beside it) when MLFLOW_TRACKING_URI is unset.
The package, by concept: `store` (where runs are kept: URIs, the SQLite store, the one client, experiments),
`params` (settings and numbers as MLflow takes them), `tracker` (`Tracker`, one run), `loggers` (`report_to`: the
JSON-lines and TensorBoard loggers beside MLflow), `runs` (reading runs back), `comparison` (the comparison's
writes into existing runs), `view` (the comparison's saved MLflow view and its URL) and `ui` (`sdar ui`: the MLflow
server over a store). Import the first four's names from here.
"""

from sdar.tags import PIPELINE_JOB_TAG
from sdar.tracking.params import flatten_params
from sdar.tracking.runs import RunRecord, close_crashed_runs, find_runs, metric_history
from sdar.tracking.store import (
                                 ARTIFACTS_DIR,
                                 DB_NAME,
                                 NONFINITE_METRIC,
                                 PARENT_TAG,
                                 RESUME_TAG,
                                 cache_dir,
                                 default_tracking_uri,
                                 mlflow_client,
                                 prepare_sqlite_store,
                                 resolve_tracking_uri,
                                 sqlite_path,
)
from sdar.tracking.tracker import Tracker

__all__ = [
    "ARTIFACTS_DIR", "DB_NAME", "NONFINITE_METRIC", "PARENT_TAG", "PIPELINE_JOB_TAG", "RESUME_TAG", "RunRecord",
    "Tracker", "cache_dir", "close_crashed_runs", "default_tracking_uri", "find_runs", "flatten_params",
    "metric_history", "mlflow_client", "prepare_sqlite_store", "resolve_tracking_uri", "sqlite_path",
]
