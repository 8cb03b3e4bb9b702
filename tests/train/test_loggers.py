"""report_to's loggers besides MLflow (sdar.tracking.loggers): a JSON-lines file and TensorBoard, each holding one row
per metric and step after a resume, and a real training run whose every step reaches both with the numbers of its
history."""

from __future__ import annotations

import json

import pytest


def _scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_the_jsonl_logger_keeps_the_steps_before_a_resume_and_rewrites_the_rest(tmp_path):
    from sdar.tracking.loggers import METRICS_FILE, JsonlLogger

    log = JsonlLogger(tmp_path)
    log.log_params({"optim.lr": "1e-05"})
    for step in range(4):
        log.log_metrics({"success": step / 10, "nan": float("nan"), "flag": True}, step)
    log.close()
    again = JsonlLogger(tmp_path, resume_step=2)  # killed after step 3's rows, resumed from step 2's checkpoint
    for step in (2, 3):
        again.log_metrics({"success": 1.0 + step}, step)
    again.close()
    rows = [json.loads(ln) for ln in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [(r["step"], r["success"]) for r in rows] == [(0, 0.0), (1, 0.1), (2, 3.0), (3, 4.0)]
    assert all("nan" not in r and "flag" not in r for r in rows)  # finite numbers only, as MLflow takes them
    assert json.loads((tmp_path / "params.json").read_text()) == {"optim.lr": "1e-05"}


def test_the_tensorboard_logger_purges_the_steps_a_resume_replays(tmp_path):
    from sdar.tracking.loggers import TENSORBOARD_DIR, TensorBoardLogger

    log = TensorBoardLogger(tmp_path)
    for step in range(4):
        log.log_metrics({"success": step / 10}, step)
    log.close()
    again = TensorBoardLogger(tmp_path, resume_step=2)
    for step in (2, 3):
        again.log_metrics({"success": 1.0 + step}, step)
    again.close()
    assert _scalars(tmp_path / TENSORBOARD_DIR)["success"] == [(0, 0.0), (1, pytest.approx(0.1)), (2, 3.0), (3, 4.0)]


def test_report_to_names_only_what_exists(tmp_path):
    from sdar.config import ConfigError, load_config

    assert load_config("configs/household-tiny.yaml", {"report_to": "jsonl"}).report_to == ["jsonl"]
    with pytest.raises(ConfigError, match=r"'wandb' is not one of mlflow, jsonl, tensorboard"):
        load_config("configs/household-tiny.yaml", {"report_to": ["mlflow", "wandb"]})


def test_a_training_run_reports_every_step_to_jsonl_and_tensorboard(tiny_ckpt, tmp_path):
    from sdar.config import load_config
    from sdar.tracking.loggers import METRICS_FILE, TENSORBOARD_DIR
    from .conftest import SMALL, make_trainer

    out = tmp_path / "run"
    cfg = load_config("configs/household-tiny.yaml", {**SMALL, "tracking": False, "output_dir": str(out),
                                                      "report_to": ["jsonl", "tensorboard"]})
    make_trainer(cfg).run()
    history = json.loads((out / "history.json").read_text())
    rows = [json.loads(ln) for ln in (out / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [h["step"] for h in history] == [0, 1]
    for r, h in zip(rows, history):
        assert r["loss/total"] == h["loss/total"] and r["success"] == h["success"]
    scalars = _scalars(out / TENSORBOARD_DIR)
    assert [(s, pytest.approx(v)) for s, v in scalars["loss/total"]] == [(h["step"], h["loss/total"]) for h in history]
    assert json.loads((out / "params.json").read_text())["arm"] == cfg.arm
    assert not (out / "mlflow.db").exists()  # tracking off: MLflow never opened


def test_a_logger_that_fails_to_close_still_ends_the_mlflow_run(mlflow_uri):
    from mlflow.tracking import MlflowClient

    from sdar.tracking import Tracker
    from sdar.tracking.loggers import RunLoggers

    class Broken:
        def log_params(self, params):
            pass

        def log_metrics(self, metrics, step):
            pass

        def close(self):
            raise OSError("cannot close")

    tracker = Tracker("loggers-close", run_name="r", tracking_uri=mlflow_uri)
    with pytest.raises(OSError, match="cannot close"), RunLoggers(tracker, [Broken()]) as loggers:
        loggers.log_metrics({"loss": 1.0}, step=1)
    run = MlflowClient(tracking_uri=mlflow_uri).get_run(tracker.run_id)
    assert run.info.status == "FINISHED"  # not left RUNNING
    assert run.data.metrics == {"loss": 1.0}
