"""The run of one arm: resume from the newest good checkpoint, then step to cfg.steps, each step followed by what a
run does beside the step (held-out evaluation every eval.every steps, MLflow, a checkpoint every checkpoint.every
steps, a progress line), and at the end the last checkpoint in the store, the final policy and the history. The
step itself is the Trainer's (`sdar.train.trainer`)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from sdar.progress import Heartbeat
from sdar.tracking import Tracker, close_crashed_runs
from sdar.tracking.loggers import RunLoggers, make_loggers
from sdar.train import distributed

LOCK_FILE = ".sdar-train.lock"


def run(trainer) -> dict[str, Any]:
    """Train `trainer`'s arm to cfg.steps, resuming from the newest good checkpoint; holds the output directory's lock.
    Returns the summary (arm, steps, run_id, output and final directories, history)."""
    with contextlib.ExitStack() as stack:
        if trainer.dist.is_main:  # one run per output directory at a time: the replicas of a torchrun job share it
            stack.enter_context(output_dir_lock(trainer.out))
        if trainer.replay is not None:  # the teacher pool (and a local pool's server) ends with the run
            stack.callback(trainer.replay.close)
        trainer.resume()
        distributed.assert_same(trainer.step, "the step to resume at", trainer.dist)
        with _tracker(trainer) as tracker:
            return _steps(trainer, tracker)


def _tracker(trainer):
    """The arm's loggers (`report_to`; rank 0's, the other ranks' are off): its MLflow run, the resumed run's own when
    the checkpoint names one, after marking runs of this output directory that died before their first checkpoint as
    KILLED; and the JSON-lines and TensorBoard loggers when asked for."""
    cfg, main = trainer.cfg, trainer.dist.is_main
    tracking = None if cfg.tracking and "mlflow" in cfg.report_to and main else False
    tags = {"arm": trainer.arm.name, "family": cfg.env.family, "sdar.output_dir": str(trainer.out.resolve())}
    if trainer.run_id is None and main and Tracker(cfg.experiment, enabled=tracking).enabled:
        # a run killed before its first checkpoint left its MLflow run RUNNING: nothing resumes it
        crashed = close_crashed_runs(cfg.experiment, {"sdar.output_dir": tags["sdar.output_dir"]},
                                     tracking_uri=None, output_dir=str(trainer.out))
        if crashed:
            trainer.console.print(f"marked {len(crashed)} earlier run(s) in {trainer.out} that died before their "
                                  f"first checkpoint as KILLED: {', '.join(crashed)}")

    mlflow = Tracker(cfg.experiment, run_name=f"{trainer.arm.name}-seed{cfg.seed}", parent_run_id=cfg.parent_run_id,
                     tags=tags, resume_run_id=trainer.run_id, resume_step=trainer.step,
                     enabled=tracking, output_dir=str(trainer.out))
    # the others of report_to (rank 0's alone), each dropping what it holds from the step this run resumes at
    return RunLoggers(mlflow, make_loggers(cfg.report_to, trainer.out, trainer.step) if main else [])


def _steps(trainer, tracker) -> dict[str, Any]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    cfg, main = trainer.cfg, trainer.dist.is_main
    trainer.run_id = tracker.run_id
    if trainer.step == 0:
        tracker.log_params({"arm": trainer.arm.name, **cfg.to_dict(), "arm_settings": vars(trainer.arm)})
        tracker.log_text(json.dumps(cfg.to_dict(), indent=2), "config.json")
    # a log (not a terminal) gets the step's line after each step and, while a step runs, a heartbeat line at least
    # every HEARTBEAT_S seconds naming the step and its phase (a SmolLM2 step on 2 cores takes about 100 s)
    plain = main and not trainer.console.is_terminal
    now = {"step": trainer.step, "t0": time.monotonic()}  # the step under way and when it began

    def beat(_since: float) -> str:
        doing = f"{trainer.phase} phase" if trainer.phase else "between phases"
        return (f"[{trainer.arm.name}] step {now['step'] + 1}/{cfg.steps} running: {doing}, "
                f"{time.monotonic() - now['t0']:.0f}s into the step")

    heartbeat = Heartbeat(trainer.console, beat) if plain else contextlib.nullcontext()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=trainer.console,
                  disable=not main) as progress, heartbeat:
        bar = progress.add_task(f"train {trainer.arm.name}", total=cfg.steps, completed=trainer.step, info="")
        while trainer.step < cfg.steps:
            if trainer.checkpoints.pending is not None:  # a storage outage: try the upload again
                trainer.checkpoints.flush(wait=False)
            step = trainer.step
            now.update(step=step, t0=time.monotonic())
            m = trainer.train_step(step).metrics
            if cfg.eval.every and (step + 1) % cfg.eval.every == 0:
                trainer.phase = "held-out evaluation"
                m.update(_evaluate(trainer))
            trainer.history.append({"step": step, **m})
            tracker.log_metrics(tracked(m), step=step)
            trainer.step = step + 1
            if trainer.step % cfg.checkpoint.every == 0 or trainer.step == cfg.steps:
                trainer.phase = "checkpoint"
                trainer.save_checkpoint(trainer.step)
                # the exact privileged texts the teacher saw so far, per task type and task
                tracker.log_dict(trainer.teacher.skills_seen, "privileged_skills.json")
            info = (f"success {m['success']:.2f} reward {m['reward']:.2f} "
                    f"gap {m.get('sdar/gap_mean', float('nan')):+.3f} {m['time/step_s']:.1f}s/step")
            trainer.phase = ""
            progress.update(bar, completed=trainer.step, info=info)
            if plain:  # logs get one line per step
                extra = f" eval {m['eval/success']:.2f}" if "eval/success" in m else ""
                # markup=False: rich would read "[grpo]" as a style tag and drop the arm's name
                trainer.console.print(f"[{trainer.arm.name}] step {trainer.step}/{cfg.steps}: {info}{extra}",
                                      markup=False, highlight=False)
                heartbeat.beat()
    return _finish(trainer, tracker)


def _evaluate(trainer) -> dict[str, float]:
    """Held-out success with the current weights: rank 0 evaluates (fsdp: every rank gathers the weights for it)."""
    with trainer.strategy.gathered(trainer.policy):
        return trainer.evaluate().metrics() if trainer.dist.is_main else {}


def _finish(trainer, tracker) -> dict[str, Any]:
    """The last checkpoint in the store, the final policy, the history; the summary. A run that skipped too many
    updates fails here, inside the tracker (its MLflow run is marked FAILED)."""
    trainer.checkpoints.flush(wait=True)
    final = trainer.out / "final"
    trainer.strategy.save_final(trainer.policy, final, trainer.cfg)
    if trainer.dist.is_main:
        tracker.log_artifacts(str(final), "final_adapter")
        (trainer.out / "history.json").write_text(json.dumps(trainer.history, indent=1))
        tracker.log_artifact(str(trainer.out / "history.json"))
    summary = {"arm": trainer.arm.name, "steps": trainer.step, "run_id": trainer.run_id,
               "output_dir": str(trainer.out), "final_dir": str(final), "history": trainer.history}
    trainer.guard.check(trainer.checkpoints.where())
    return summary


def tracked(metrics: dict[str, float]) -> dict[str, float]:
    """The finite numbers of `metrics` (what MLflow takes)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}


@contextlib.contextmanager
def output_dir_lock(out: Path):
    """An exclusive lock on the output directory for the life of a run (released when the process dies):
    two runs writing one directory's checkpoints and MLflow run would corrupt each other's resume."""
    path = Path(out) / LOCK_FILE
    fh = open(path, "a+")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise RuntimeError(f"{out} is in use by another training run ({holder}); wait for it to finish, "
                               "or give this run another output directory (--output / output_dir)") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        yield
    finally:
        fh.close()
