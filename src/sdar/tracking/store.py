"""Where runs are kept: the default SQLite store (from a cached schema template), URIs, the client, experiments."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from sdar_envs.base import cache_root

log = logging.getLogger(__name__)

DB_NAME = "mlflow.db"
# artifacts of the default SQLite store live in <db dir>/mlartifacts/<experiment>/<run_id>/artifacts
ARTIFACTS_DIR = "mlartifacts"
NONFINITE_METRIC = "tracking/nonfinite_metrics"
PARENT_TAG = "mlflow.parentRunId"
RESUME_TAG = "sdar.resume_count"
# MLflow's limits (mlflow.utils.validation): per log_batch call and per param value / key


def cache_dir() -> Path:
    """sdar's cache directory (sdar_envs.base.cache_root: the one definition)."""
    return cache_root()


def default_tracking_uri(output_dir: str | os.PathLike | None = None) -> str:
    """MLFLOW_TRACKING_URI when set, else `sqlite:///<output_dir or cwd>/mlflow.db` (absolute)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    root = Path(output_dir if output_dir is not None else os.getcwd()).expanduser().resolve()
    return f"sqlite:///{root / DB_NAME}"


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a `sqlite:///...` URI, or None for any other URI."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    return Path(tracking_uri[len("sqlite:///"):].split("?", 1)[0])


def _schema_template() -> Path:
    """An empty MLflow SQLite database at the current schema, built once per mlflow version.

    Building runs all of MLflow's alembic migrations (5-10 s on a busy 2-core machine); copying the
    template takes milliseconds, which matters for tests and for each fresh `output_dir`.
    """
    import mlflow
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    cache = cache_dir()
    template = cache / f"mlflow-{mlflow.__version__}-empty.db"
    if template.is_file():
        return template
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".mlflow-template-", suffix=".db", dir=cache)
    os.close(fd)
    os.unlink(tmp)  # SQLAlchemy creates the file itself
    try:
        store = SqlAlchemyStore(f"sqlite:///{tmp}", default_artifact_root=str(cache / "unused-artifacts"))
        store.engine.dispose()
        os.replace(tmp, template)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return template


def prepare_sqlite_store(db_path: str | os.PathLike) -> str:
    """Create the SQLite MLflow database `db_path` if missing (from the schema template); returns its URI.

    The 'Default' experiment of a new database stores artifacts in `<db dir>/mlartifacts/0`.
    An existing database is left as it is (MLflow checks its schema when opened).
    """
    db_path = Path(db_path).expanduser().resolve()
    uri = f"sqlite:///{db_path}"
    if db_path.exists():
        return uri
    db_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        template = _schema_template()
    except OSError as exc:  # an unwritable cache: MLflow builds the schema in place instead
        log.warning("no MLflow schema template (%s); MLflow will create %s itself", exc, db_path)
        return uri
    fd, tmp = tempfile.mkstemp(prefix=f".{db_path.name}.", dir=db_path.parent)
    os.close(fd)
    try:
        shutil.copyfile(template, tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp made it 0600; a shared store must be readable by `mlflow ui`
        default_artifacts = (db_path.parent / ARTIFACTS_DIR / "0").as_uri()
        with contextlib.closing(sqlite3.connect(tmp)) as con, con:
            con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0", (default_artifacts,))
        with contextlib.suppress(FileExistsError):  # another process created it first: keep theirs
            os.link(tmp, db_path)
    finally:
        os.unlink(tmp)
    return uri


def resolve_tracking_uri(tracking_uri: str | None = None, output_dir: str | os.PathLike | None = None) -> str:
    """The tracking URI to use (argument, else `default_tracking_uri`), with a SQLite file made ready."""
    uri = tracking_uri or default_tracking_uri(output_dir)
    path = sqlite_path(uri)
    if path is not None:
        prepare_sqlite_store(path)
    return uri


def mlflow_client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def reader(tracking_uri: str | None, output_dir: str | os.PathLike | None) -> tuple[str, Any]:
    """(uri, client) for reading; a SQLite file that does not exist is an error, never created."""
    uri = tracking_uri or default_tracking_uri(output_dir)
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        raise LookupError(
            f"no MLflow database at {db.resolve()}; runs are logged there by Tracker(output_dir=...) "
            "(check MLFLOW_TRACKING_URI / output_dir)"
        )
    return uri, mlflow_client(uri)


def bridge_s3_endpoint() -> None:
    # MLflow's S3 artifact store reads only MLFLOW_S3_ENDPOINT_URL; sdar's storage reads
    # SDAR_S3_ENDPOINT_URL, so MinIO set up for one works for both
    if os.environ.get("SDAR_S3_ENDPOINT_URL") and not os.environ.get("MLFLOW_S3_ENDPOINT_URL"):
        os.environ["MLFLOW_S3_ENDPOINT_URL"] = os.environ["SDAR_S3_ENDPOINT_URL"]


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "experiment"


def get_or_create_experiment(client, name: str, artifact_location: str | None) -> str:
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException:  # a parallel arm created it between our two calls
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        log.warning("experiment %r was deleted; restoring it to log into it", name)
        client.restore_experiment(exp.experiment_id)
    return exp.experiment_id


