"""Long loops show progress: a bar on a terminal, a line every tenth of the way in a log (with the rate and the
time left), and the pipeline's live table shows a task's newest phase from those lines."""

from __future__ import annotations

import contextlib
import io

from rich.console import Console

from sdar.progress import LINE, Progress
from sdar.runlog import TaskLog


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=200), out


def test_a_log_gets_a_line_every_tenth_and_at_the_end():
    console, out = _console(False)
    with Progress("evaluating", 134, "episodes", console=console, every=64) as p:
        for n in (64, 64, 6):
            p.advance(n)
    lines = out.getvalue().splitlines()
    assert [LINE.search(x)["done"] for x in lines] == ["64", "128", "134"]
    assert all(LINE.search(x)["total"] == "134" and x.endswith(" left)") and "/s, " in x for x in lines)


def test_a_terminal_gets_a_bar_and_no_lines():
    console, out = _console(True)
    with Progress("warm start: SFT", 10, "updates", console=console) as p:
        for _ in range(10):
            p.advance()
    assert not any(LINE.search(x) for x in out.getvalue().splitlines())


def test_the_pipeline_table_shows_a_tasks_phase(tmp_path):
    console, _ = _console(False)
    view = TaskLog(tmp_path, console, live=False)
    with view, contextlib.redirect_stdout(view):
        import sys

        print("22:05:14.742 - INFO - Executing task \x1b[96m'evaluate'\x1b[0m", file=sys.stdout)
        print("    warm start: SFT: 250/626 updates (3.10/s, 2:01 left)", file=sys.stdout)
        assert view.tasks["evaluate"].info == "warm start: SFT 250/626 updates"
        print("    evaluating: 64/134 episodes (0.52/s, 2:14 left)", file=sys.stdout)
        assert view.tasks["evaluate"].info == "evaluating 64/134 episodes"
        print("22:05:26.168 - INFO - Task \x1b[96m'evaluate'\x1b[0m finished with status SUCCESS", file=sys.stdout)


def test_a_slow_item_gets_a_heartbeat_line_naming_what_runs_now():
    """One item may take minutes (a SmolLM2 step, an episode on a big model): the log still gets a line every
    every_s seconds, in the format the pipeline's table reads, naming what the loop does now."""
    import time

    console, out = _console(False)
    with Progress("evaluating", 4, "episodes", console=console, every_s=0.3) as p:
        p.now = "episode 1 of task pick_and_place-17"
        time.sleep(1.2)
        p.advance(4)
    lines = out.getvalue().splitlines()
    beats = [x for x in lines if "episode 1 of task" in x]
    assert len(beats) >= 2, lines  # at least one every 0.3 s of the 1.2 s item (the thread wakes every 75 ms)
    assert all(LINE.search(x)["done"] == "0" for x in beats)
    assert LINE.search(lines[-1])["done"] == "4" and "episode 1" not in lines[-1]  # done: the end line, no "now"
    n = len(lines)
    time.sleep(0.5)
    assert len(out.getvalue().splitlines()) == n  # the heartbeat ended with the loop

