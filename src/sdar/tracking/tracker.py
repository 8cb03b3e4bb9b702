"""`Tracker`: one MLflow run as a context manager (nested arm runs, resume, outages waited out, a full local disk stopped at)."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sdar.retry import Outage
from sdar.storage import DiskFull, free_bytes, is_disk_full
from sdar.tags import PIPELINE_JOB_TAG
from sdar.tracking.params import flatten_params, metric_value
from sdar.tracking.store import (
    ARTIFACTS_DIR,
    NONFINITE_METRIC,
    PARENT_TAG,
    RESUME_TAG,
    bridge_s3_endpoint,
    get_or_create_experiment,
    mlflow_client,
    resolve_tracking_uri,
    safe_name,
    sqlite_path,
)

log = logging.getLogger(__name__)
_MAX_METRICS_PER_BATCH = 1000
_MAX_PARAMS_PER_BATCH = 100


class Tracker:
    """One MLflow run, as a context manager; a no-op when `enabled` is False.

    experiment: experiment name, created if missing. run_name: shown in the UI.
    parent_run_id: make this a nested child run (one child per arm under a pipeline's parent run).
    tags: extra run tags. tracking_uri: default `default_tracking_uri(output_dir)`.
    output_dir: where the default SQLite store and its artifacts go (default: cwd).
    artifact_location: for a newly created experiment only; default `<db dir>/mlartifacts/<experiment>`
      for a SQLite store, the server's choice otherwise (e.g. s3://bucket/mlflow).
    resume_run_id: continue this existing run (status back to RUNNING; params must keep their values).
    resume_step: with resume_run_id, the step training resumes at: (key, step) rows the run already holds
      from this step on (logged after the checkpoint it resumes from, before a kill) are not logged again,
      so an exactly resumed run has one row per key and step.
    enabled: False makes every method a no-op and never imports MLflow; None reads SDAR_TRACKING
      ('0', 'false', 'off' disable). max_param_chars: longer param values are cut.
    """

    def __init__(
        self,
        experiment: str,
        run_name: str | None = None,
        *,
        parent_run_id: str | None = None,
        tags: Mapping[str, Any] | None = None,
        tracking_uri: str | None = None,
        output_dir: str | os.PathLike | None = None,
        artifact_location: str | None = None,
        resume_run_id: str | None = None,
        resume_step: int | None = None,
        enabled: bool | None = None,
        max_param_chars: int = 500,
    ):
        if not experiment:
            raise ValueError("Tracker needs an experiment name, e.g. Tracker('sdar-household', run_name='sdar')")
        if enabled is None:
            enabled = os.environ.get("SDAR_TRACKING", "1").strip().lower() not in ("0", "false", "off", "no")
        self.experiment = experiment
        self.run_name = run_name
        self.parent_run_id = parent_run_id
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.output_dir = output_dir
        self.artifact_location = artifact_location
        self.resume_run_id = resume_run_id
        self.resume_step = resume_step
        self._logged: set[tuple[str, int]] = set()  # (key, step) rows a resumed run already holds
        self.enabled = enabled
        self.max_param_chars = max_param_chars
        self.tracking_uri: str | None = tracking_uri
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.nonfinite_total = 0
        self.nonfinite_keys: set[str] = set()
        self._params: dict[str, str] = {}
        self._client = None
        # calls that failed (MLflow down past its own retries): replayed in order once it answers again
        self._deferred: list[tuple[str, Any, tuple, dict]] = []
        # while the server is down, a new call tries to flush the backlog every 30 s (its interval_s)
        self.outage = Outage(log.warning, interval_s=30.0, max_delay_s=15.0)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Tracker:
        """Create (or resume) the run; returns self. Called by `with`."""
        if not self.enabled or self.run_id is not None:
            return self
        from mlflow.exceptions import MlflowException

        self.tracking_uri = resolve_tracking_uri(self.tracking_uri, self.output_dir)
        bridge_s3_endpoint()
        logging.getLogger("mlflow.store.db.utils").addFilter(_quiet_when_disk_full)  # we say it in one line
        client = mlflow_client(self.tracking_uri)
        if self.resume_run_id:
            try:
                run = client.get_run(self.resume_run_id)
            except MlflowException as exc:
                raise LookupError(
                    f"cannot resume run {self.resume_run_id}: not found in {self.tracking_uri}; "
                    "point MLFLOW_TRACKING_URI/output_dir at the store the run was logged to, or start a new run"
                ) from exc
            exp = client.get_experiment(run.info.experiment_id)
            if exp.name != self.experiment:
                raise ValueError(
                    f"run {self.resume_run_id} belongs to experiment {exp.name!r}, not {self.experiment!r}; "
                    "resume it with its own experiment name"
                )
            if run.info.lifecycle_stage == "deleted":
                raise ValueError(f"run {self.resume_run_id} was deleted; restore it (`mlflow runs restore`) or start a new run")
            count = int(run.data.tags.get(RESUME_TAG, "0")) + 1
            client.update_run(run.info.run_id, status="RUNNING")
            client.set_tag(run.info.run_id, RESUME_TAG, str(count))
            for k, v in self.tags.items():
                client.set_tag(run.info.run_id, k, v)
            self._params = dict(run.data.params)
            if self.resume_step is not None:
                self._logged = {(key, m.step) for key in run.data.metrics
                                for m in client.get_metric_history(run.info.run_id, key) if m.step >= self.resume_step}
            self.nonfinite_total = int(run.data.metrics.get(NONFINITE_METRIC, 0))
            self.experiment_id = run.info.experiment_id
            self.run_name = run.info.run_name
            self.parent_run_id = run.data.tags.get(PARENT_TAG)
        else:
            location = self.artifact_location
            db = sqlite_path(self.tracking_uri)
            if location is None and db is not None:
                location = (db.resolve().parent / ARTIFACTS_DIR / safe_name(self.experiment)).as_uri()
            self.experiment_id = get_or_create_experiment(client, self.experiment, location)
            tags = dict(self.tags)
            if self.parent_run_id:
                try:
                    parent = client.get_run(self.parent_run_id)
                except MlflowException as exc:
                    raise LookupError(
                        f"parent run {self.parent_run_id} not found in {self.tracking_uri}; "
                        "create the parent with Tracker(...) first and pass its run_id"
                    ) from exc
                tags[PARENT_TAG] = self.parent_run_id
                # the pipeline job's id goes down to every run of the job: the comparison's view selects them by it
                if parent.data.tags.get(PIPELINE_JOB_TAG):
                    tags.setdefault(PIPELINE_JOB_TAG, parent.data.tags[PIPELINE_JOB_TAG])
            if tags.get("arm"):  # an arm's run has the arm's colour in MLflow, the colour of the report's plot
                from sdar.tracking.view import RUN_COLOR_TAG, arm_color

                tags.setdefault(RUN_COLOR_TAG, arm_color(tags["arm"]))
            run = client.create_run(self.experiment_id, tags=tags, run_name=self.run_name)
            self.run_name = run.info.run_name
        self.run_id = run.info.run_id
        self._client = client
        return self

    def end(self, status: str = "FINISHED", flush_timeout_s: float = 120.0) -> None:
        """Mark the run FINISHED (or FAILED / KILLED), after replaying calls deferred by an outage (for up
        to `flush_timeout_s`; what still cannot be sent is reported, never raised)."""
        if self._client is None or self.run_id is None:
            return
        deadline = time.monotonic() + flush_timeout_s
        while not self._flush(force=True) and time.monotonic() < deadline:
            time.sleep(self.outage.delay(deadline - time.monotonic()))
        if self._deferred:
            log.error("MLflow at %s is still unreachable: %d call(s) of run %s were not recorded (%s)",
                      self.tracking_uri, len(self._deferred), self.run_id,
                      ", ".join(sorted({what for what, *_ in self._deferred})))
        self._send("end", self._client.set_terminated, self.run_id, status=status)
        self._deferred.clear()
        self._client = None

    # -- outages -----------------------------------------------------------------------------
    def _send(self, what: str, fn, *args, **kwargs) -> None:
        """Call the MLflow client; if it fails (after MLflow's own retries), keep the call to replay it
        in order later. A tracking outage never ends a training run."""
        if self._deferred and not self._flush():
            self._deferred.append((what, fn, args, kwargs))
            return
        try:
            fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any failure of the tracking server: defer, never raise ...
            full = self._local_disk_full(exc)  # ... but a full disk of a local store: stop, as a checkpoint would
            if full is not None and what == "end":
                return  # the run stays RUNNING: the rerun resumes it
            if full is not None:
                raise full from exc
            self.outage.failed(f"MLflow call {what} failed ({type(exc).__name__}: {str(exc)[:200]}); buffering calls "
                               f"until {self.tracking_uri} answers again")
            self._deferred.append((what, fn, args, kwargs))

    def _local_disk_full(self, exc: Exception):
        """A DiskFull naming this run's local store (its SQLite file, or the local file a write failed on) when `exc`
        says its disk is full; None otherwise (a tracking server's failure is an outage: deferred)."""
        db = sqlite_path(self.tracking_uri or "")
        where = db or next((e.filename for e in (exc, exc.__cause__, exc.__context__) if isinstance(e, OSError)), None)
        if where is None or not is_disk_full(exc):
            return None
        return DiskFull(where, None, free_bytes(where), what="the MLflow store" if db else "an MLflow artifact")

    def _flush(self, force: bool = False) -> bool:
        """Replay deferred calls in order; True when none is left. Unless forced, tries at most every
        `outage.interval_s` (each try may wait out MLflow's own retries)."""
        if not self._deferred:
            return True
        if not force and not self.outage.due():
            return False
        self.outage.tried()
        while self._deferred:
            what, fn, args, kwargs = self._deferred[0]
            try:
                fn(*args, **kwargs)
            except Exception:  # noqa: BLE001
                return False
            self._deferred.pop(0)
        self.outage.recovered(lambda lasted: f"MLflow at {self.tracking_uri} answers again after {lasted:.0f} s; "
                                             "buffered calls replayed")
        return True

    @property
    def outages(self) -> list[float]:
        """Seconds each MLflow outage lasted."""
        return self.outage.durations

    @property
    def pending_calls(self) -> int:
        """Calls waiting for the tracking server to come back."""
        return len(self._deferred)

    def __enter__(self):  # returns self, started
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            status = "FINISHED"
        else:
            status = "KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED"
        try:
            self.end(status)
        except Exception:
            if exc_type is None:
                raise
            log.exception("could not mark run %s %s", self.run_id, status)  # keep the original error

    def _live(self):
        if not self.enabled:
            return None
        if self._client is None:
            raise RuntimeError("the tracker has no open run; use `with Tracker(...) as t:` or call start() first")
        return self._client

    @property
    def artifact_uri(self) -> str | None:
        """Where this run's artifacts go (None when disabled or not started)."""
        if self._client is None:
            return None
        return self._client.get_run(self.run_id).info.artifact_uri

    # -- logging -----------------------------------------------------------------------------
    def log_params(self, params: Any, prefix: str = "") -> dict[str, str]:
        """Log a (nested) mapping or dataclass as flat 'a.b' params; returns what was logged.

        Re-logging a param with the same value is a no-op (so a resumed run may log its config again);
        a different value raises, because a run's config must not change under it.
        """
        client = self._live()
        if client is None:
            return {}
        from mlflow.entities import Param

        flat = flatten_params(params, self.max_param_chars, prefix)
        changed = {k: (self._params[k], v) for k, v in flat.items() if k in self._params and self._params[k] != v}
        if changed:
            k, (old, new) = next(iter(changed.items()))
            raise ValueError(
                f"param {k!r} is {old!r} in run {self.run_id} but now {new!r} ({len(changed)} changed); "
                "a run's config is fixed: start a new run for a new config, or log it under another prefix"
            )
        new = [Param(k, v) for k, v in flat.items() if k not in self._params]
        for i in range(0, len(new), _MAX_PARAMS_PER_BATCH):
            self._send("log_params", client.log_batch, self.run_id, params=new[i : i + _MAX_PARAMS_PER_BATCH])
        self._params.update(flat)
        return flat

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> int:
        """Log numeric metrics at `step`; returns how many were logged.

        NaN/inf values are skipped (MLflow charts break on them); the run's running count of skipped
        values is logged as `tracking/nonfinite_metrics` at the same step, and `nonfinite_keys` names them.
        """
        client = self._live()
        if client is None:
            return 0
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        step = int(step) if step is not None else 0
        batch, skipped = [], 0
        for key, value in metrics.items():
            if (str(key), step) in self._logged:  # a resumed run replays this step exactly: logged already
                continue
            v = metric_value(key, value)
            if math.isfinite(v):
                batch.append(Metric(str(key), v, ts, step))
            else:
                skipped += 1
                if key not in self.nonfinite_keys:
                    log.warning("metric %r is %s at step %d; skipped (counted in %s)", key, v, step, NONFINITE_METRIC)
                self.nonfinite_keys.add(str(key))
        if skipped:
            self.nonfinite_total += skipped
            batch.append(Metric(NONFINITE_METRIC, float(self.nonfinite_total), ts, step))
        for i in range(0, len(batch), _MAX_METRICS_PER_BATCH):
            self._send("log_metrics", client.log_batch, self.run_id, metrics=batch[i : i + _MAX_METRICS_PER_BATCH])
        return len(batch) - (1 if skipped else 0)

    def log_metric(self, key: str, value: Any, step: int | None = None) -> int:
        return self.log_metrics({key: value}, step)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        client = self._live()
        if client is None:
            return
        from mlflow.entities import RunTag

        self._send("set_tags", client.log_batch, self.run_id, tags=[RunTag(str(k), str(v)) for k, v in tags.items()])

    def log_text(self, text: str, artifact_file: str) -> None:
        """Save `text` as the artifact `artifact_file` (e.g. 'samples/step-10.txt')."""
        client = self._live()
        if client is not None:
            self._send("log_text", client.log_text, self.run_id, text, artifact_file)

    def log_dict(self, dictionary: Mapping[str, Any], artifact_file: str) -> None:
        """Save a dict as a JSON (or .yaml/.yml) artifact."""
        client = self._live()
        if client is not None:
            self._send("log_dict", client.log_dict, self.run_id, json.loads(json.dumps(dict(dictionary), default=str)),
                       artifact_file)

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Copy one local file into the run's artifacts (under `artifact_path`)."""
        client = self._live()
        if client is None:
            return
        if not Path(path).is_file():
            raise FileNotFoundError(f"cannot log artifact {path}: not a file (use log_artifacts for a directory)")
        self._send("log_artifact", client.log_artifact, self.run_id, str(path), artifact_path)

    def log_artifacts(self, local_dir: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Copy a local directory's contents into the run's artifacts (under `artifact_path`)."""
        client = self._live()
        if client is None:
            return
        if not Path(local_dir).is_dir():
            raise NotADirectoryError(f"cannot log artifacts from {local_dir}: not a directory")
        self._send("log_artifacts", client.log_artifacts, self.run_id, str(local_dir), artifact_path)


def _quiet_when_disk_full(record: logging.LogRecord) -> bool:
    """Drop MLflow's SQLAlchemy-store traceback of a full disk: the Tracker ends the run with one line naming it."""
    return not (record.exc_info and record.exc_info[1] is not None and is_disk_full(record.exc_info[1]))
