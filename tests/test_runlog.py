"""The run view of `sdar run --local` / `make demo`: one line per task, each task's log in its own file,
tasks told apart by the thread that writes them (the KFP local runner runs the arms in threads)."""

from __future__ import annotations

import contextlib
import io
import threading

from rich.console import Console

from sdar.runlog import TaskLog

C, E = "\x1b[96m", "\x1b[0m"  # the runner colours task names


def _task(out, name: str, body: list[str], status: str = "SUCCESS", gate: threading.Event | None = None) -> None:
    print(f"22:05:14.742 - INFO - Executing task {C}'{name}'{E}", file=out)
    print("22:05:14.742 - INFO - Streamed logs:\n", file=out)
    for k, line in enumerate(body):
        out.write("    " + line[:5])  # partial writes: lines are assembled per thread
        out.write(line[5:] + "\n")
        if gate is not None and k == 0:
            gate.wait(5)
    print(f"22:05:26.168 - INFO - Task {C}'{name}'{E} finished with status \x1b[92m{status}{E}", file=out)


def test_parallel_tasks_get_their_own_logs_and_one_line_each(tmp_path):
    term = io.StringIO()
    console = Console(file=term, force_terminal=False, width=200)
    view = TaskLog(tmp_path / "logs", console, live=False, progress_every=2)
    with view, contextlib.redirect_stdout(view):
        import sys

        _task(sys.stdout, "plan-runs", ["planned 2 runs: grpo/seed0, sdar/seed0"])
        both = threading.Barrier(2)
        go = threading.Event()

        def arm(name, steps):
            both.wait(5)
            lines = [f"[{name}] step {k}/2: success 0.{k}5 reward 1.00 gap -0.100 3.0s/step" for k in steps]
            _task(sys.stdout, "gated-train", lines, gate=go if name == "grpo" else None)
            if name == "sdar":
                go.set()

        threads = [threading.Thread(target=arm, args=(a, (1, 2))) for a in ("grpo", "sdar")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _task(sys.stdout, "evaluate", ["Traceback (most recent call last):", "ValueError: no such model"], "FAILURE")
    assert list(view.tasks) == ["plan-runs", "gated-train", "gated-train-2", "evaluate"]
    # each train task's file holds exactly its own arm's lines
    for key in ("gated-train", "gated-train-2"):
        text = (tmp_path / "logs" / f"{key}.log").read_text()
        arms = {a for a in ("grpo", "sdar") if f"[{a}] step" in text}
        assert len(arms) == 1, (key, text)
        assert text.count("step ") == 2
    assert "planned 2 runs" in (tmp_path / "logs" / "plan-runs.log").read_text()
    assert "Executing task" in (tmp_path / "logs" / "pipeline.log").read_text()
    # the console: a start and an end line per task, training progress every 2 steps, no streamed logs
    shown = term.getvalue()
    assert "Streamed logs" not in shown and "planned 2 runs" not in shown
    assert shown.count("started") == 4
    assert "gated-train: success in" in shown and "train success 0.25" in shown
    assert "evaluate: failure in" in shown
    assert [t.key for t in view.failed()] == ["evaluate"]
    view.report_failures()
    tail = term.getvalue()[len(shown):]
    assert str(tmp_path / "logs" / "evaluate.log") in tail and "ValueError: no such model" in tail


def test_the_live_table_goes_to_the_terminal_not_into_the_logs(tmp_path):
    term = io.StringIO()
    console = Console(file=term, force_terminal=True, width=120)
    view = TaskLog(tmp_path, console)
    assert view.live_view
    with view, contextlib.redirect_stdout(view):
        import sys

        _task(sys.stdout, "compare", ["| arm | success |"])
    assert "compare" in term.getvalue() and "success" in term.getvalue()
    assert "\x1b[" not in (tmp_path / "compare.log").read_text().replace(C, "").replace(E, "").replace("\x1b[92m", "")
    assert console.file is not view  # restored after the run
