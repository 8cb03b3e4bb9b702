"""Where a training run's numbers go besides the console (`report_to`, TRL's word for it): MLflow (`Tracker`, on by
default), a plain JSON-lines file, and TensorBoard. The training loop writes through `RunLoggers`, one object with the
Tracker's calls, which passes params and per-step metrics to each logger asked for; files and artifacts stay
MLflow's (the others have them in the output directory already).

A resumed run drops what each logger holds from its resume step on (rows a killed run logged after the checkpoint
it resumes from), so every (metric, step) is written once: the Tracker reads its run's rows, `JsonlLogger` rewrites
its file, `TensorBoardLogger` purges its events (SummaryWriter's purge_step)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

REPORT_TO = ("mlflow", "jsonl", "tensorboard")  # the names `report_to` accepts
METRICS_FILE = "metrics.jsonl"
PARAMS_FILE = "params.json"
TENSORBOARD_DIR = "tensorboard"


class RunLogger(Protocol):
    """What a logger of a training run does: its params once, its metrics per step, and an end."""

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def _finite(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}


class JsonlLogger:
    """<output_dir>/metrics.jsonl: one line per step, {"step": s, "time": unix seconds, metric: value, ...}; the params
    in <output_dir>/params.json. Read it with pandas.read_json(path, lines=True)."""

    def __init__(self, output_dir: str | os.PathLike, resume_step: int | None = None) -> None:
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / METRICS_FILE
        if resume_step is not None and self.path.is_file():  # keep the steps before the checkpoint resumed from
            kept = [ln for ln in self.path.read_text().splitlines() if ln.strip()
                    and json.loads(ln).get("step", -1) < resume_step]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(f"{ln}\n" for ln in kept))
            os.replace(tmp, self.path)
        self._fh = self.path.open("a")

    def log_params(self, params: dict[str, Any]) -> None:
        (self.dir / PARAMS_FILE).write_text(json.dumps(params, indent=1, default=str))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._fh.write(json.dumps({"step": int(step), "time": round(time.time(), 3), **_finite(metrics)}) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class TensorBoardLogger:
    """<output_dir>/tensorboard: a scalar per metric and step, the params as a text summary (`tensorboard --logdir`)."""

    def __init__(self, output_dir: str | os.PathLike, resume_step: int | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch's writer needs the tensorboard package
            raise RuntimeError("report_to names tensorboard, which needs the tensorboard package: "
                               "pip install 'sdar[tensorboard]' (or drop it from report_to)") from exc
        self.dir = Path(output_dir) / TENSORBOARD_DIR
        self._writer = SummaryWriter(str(self.dir), purge_step=resume_step or None)

    def log_params(self, params: dict[str, Any]) -> None:
        rows = "\n".join(f"| {k} | {str(v)[:200]} |" for k, v in sorted(params.items()))
        self._writer.add_text("params", f"| param | value |\n|---|---|\n{rows}", 0)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for key, value in _finite(metrics).items():
            self._writer.add_scalar(key, value, int(step))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def make_loggers(report_to: list[str], output_dir: str | os.PathLike, resume_step: int | None) -> list[RunLogger]:
    """The loggers `report_to` asks for besides MLflow (the Tracker is made by the caller)."""
    kinds = {"jsonl": JsonlLogger, "tensorboard": TensorBoardLogger}
    return [kinds[name](output_dir, resume_step) for name in report_to if name in kinds]


def log_once(report_to: list[str], output_dir: str | os.PathLike, metrics: dict[str, float], step: int = 0) -> int:
    """Metrics of a step that is not a training run (a pipeline evaluation, a comparison) to the loggers of
    `report_to` besides MLflow, in `output_dir`, appended to what they hold; MLflow's copy is the caller's (it goes
    into an existing run: sdar.tracking.comparison.log_to_run). Returns the loggers written."""
    loggers = make_loggers(report_to, output_dir, None)
    try:
        for logger in loggers:
            logger.log_metrics(metrics, step)
    finally:
        for logger in loggers:
            logger.close()
    return len(loggers)


class RunLoggers:
    """The Tracker (MLflow, or a disabled one) and the other loggers of `report_to` as one: params and metrics go to
    each, files and artifacts to MLflow. A context manager, as the Tracker is."""

    def __init__(self, tracker, others: list[RunLogger]) -> None:
        self.tracker, self.others = tracker, others

    @property
    def run_id(self) -> str | None:
        return self.tracker.run_id

    def __enter__(self) -> RunLoggers:
        self.tracker.__enter__()
        return self

    def __exit__(self, *exc) -> Any:
        try:  # a logger that fails to close must not leave the MLflow run RUNNING
            for logger in self.others:
                logger.close()
        finally:
            result = self.tracker.__exit__(*exc)
        return result

    def log_params(self, params: Any) -> None:
        self.tracker.log_params(params)
        if self.others:
            from sdar.tracking.params import flatten_params

            flat = flatten_params(params)
            for logger in self.others:
                logger.log_params(flat)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.tracker.log_metrics(metrics, step=step)
        for logger in self.others:
            logger.log_metrics(metrics, step)

    # files and artifacts: MLflow's alone
    def log_text(self, text: str, artifact_file: str) -> None:
        self.tracker.log_text(text, artifact_file)

    def log_dict(self, dictionary: dict[str, Any], artifact_file: str) -> None:
        self.tracker.log_dict(dictionary, artifact_file)

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        self.tracker.log_artifact(path, artifact_path)

    def log_artifacts(self, local_dir: str | os.PathLike, artifact_path: str | None = None) -> None:
        self.tracker.log_artifacts(local_dir, artifact_path)
