"""The run view of `sdar run --local` / `make demo`: one line per task, each task's log in its own file,
tasks told apart by the thread that writes them (the KFP local runner runs the arms in threads)."""

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
    view = TaskLog(tmp_path / "logs", console, live=False)
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
    # the console: a start and an end line per task, training progress every tenth of the steps, no streamed logs
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


def test_a_running_tasks_progress_reaches_its_log_and_the_console_before_it_ends(tmp_path):
    """Through the real KFP local runner: a task prints a warm-start progress line (sdar.progress, as the warm start
    does) and a training step line (print, as the steps do), then waits for a file that this test writes only once it
    has seen both lines in the task's log and its phase on the plain console."""
    import time
    from pathlib import Path

    from kfp import dsl, local

    from sdar.pipeline.runner import _run_logged

    @dsl.component(base_image="python:3.11", install_kfp_package=False)
    def slow_task(gate: str):
        import pathlib
        import time

        from sdar.progress import Progress

        with Progress("warm start: SFT", 10, "updates") as bar:
            bar.advance(1)
            print("[sdar] step 1/2: success 0.50 reward 5.00")
            deadline = time.time() + 60
            while not pathlib.Path(gate).exists() and time.time() < deadline:
                time.sleep(0.1)
            bar.advance(9)

    @dsl.pipeline(name="progress-probe")
    def probe(gate: str):
        slow_task(gate=gate)

    gate, logs = tmp_path / "gate", tmp_path / "logs"
    term = io.StringIO()
    console = Console(file=term, force_terminal=False, width=200)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"), raise_on_error=True)
    done: list = []
    worker = threading.Thread(target=lambda: done.append(_run_logged(probe, {"gate": str(gate)}, logs, console,
                                                                      quiet=False, verbose=False)))
    worker.start()
    log, seen = logs / "slow-task.log", ""
    try:
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            seen = log.read_text() if log.is_file() else ""
            if ("warm start: SFT: 1/10 updates" in seen and "step 1/2" in seen
                    and "slow-task: warm start: SFT 1/10 updates" in term.getvalue()):
                break
            time.sleep(0.2)
        running = worker.is_alive() and not gate.exists()
    finally:
        gate.touch()
        worker.join(90)
    assert running, "the task ended before its progress was checked"
    assert "warm start: SFT: 1/10 updates" in seen and "step 1/2" in seen, f"the task's log while it ran:\n{seen}"
    assert "slow-task: warm start: SFT 1/10 updates" in term.getvalue(), term.getvalue()
    error, view = done[0]
    assert error is None and [t.status for t in view.tasks.values()] == ["SUCCESS"]
    assert "warm start: SFT: 10/10 updates" in Path(view.tasks["slow-task"].log_path).read_text()
