"""Progress lines of a training run in a log: after each step, and a heartbeat naming the step and its phase while
a step runs (sdar.train.loop, sdar.progress.Heartbeat), read by the pipeline's plain view (sdar.runlog)."""

from __future__ import annotations

import contextlib
import io

from rich.console import Console

from sdar.runlog import TaskLog

from .conftest import make_trainer, small_config


def test_the_training_loop_logs_a_step_and_its_phase_while_it_runs(tmp_path, monkeypatch, tiny_ckpt):
    """A training step longer than the heartbeat gets `[arm] step k/N running: <phase> phase` lines in a log, and the
    pipeline's plain view shows them (at most every phase_every_s) between the step lines."""
    import time

    from sdar import progress
    from sdar.train import Trainer
    from sdar.train.loop import run

    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.2)
    cfg = small_config(tmp_path / "out", arm="sdar", steps=2, seed=7, tracking=False, **{"checkpoint.every": 1000})
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    real = Trainer.score_phase

    def slow_score(self, step, rollouts):  # hold the score phase long enough for heartbeats
        time.sleep(0.7)
        return real(self, step, rollouts)

    monkeypatch.setattr(Trainer, "score_phase", slow_score)
    run(make_trainer(cfg, console=console))
    lines = out.getvalue().splitlines()
    running = [x for x in lines if " running: " in x]
    scoring = [x for x in running if x.startswith("[sdar] step 1/2 running: score phase, ")]
    assert scoring, lines
    assert any(x.startswith("[sdar] step 2/2 running: ") for x in running), lines
    assert [x for x in lines if x.startswith("[sdar] step ") and ": success " in x][-1].startswith("[sdar] step 2/2: ")
    # the plain pipeline view reads them
    view_out = io.StringIO()
    view_console = Console(file=view_out, force_terminal=False, width=200)
    view = TaskLog(tmp_path / "logs", view_console, live=False, phase_every_s=0.0)
    with view, contextlib.redirect_stdout(view):
        import sys

        print("22:05:14.742 - INFO - Executing task \x1b[96m'gated-train'\x1b[0m", file=sys.stdout)
        print("    " + scoring[0], file=sys.stdout)  # (a slow rollout may have had a heartbeat of its own before)
        assert view.tasks["gated-train"].info.startswith("sdar: step 1/2 running, score phase (")
        print("22:05:26.168 - INFO - Task \x1b[96m'gated-train'\x1b[0m finished with status SUCCESS", file=sys.stdout)
    assert "gated-train: sdar: step 1/2 running, score phase" in view_out.getvalue()
