"""What a person sees while the KFP local runner works: one line per pipeline task (name, state,
seconds; training tasks with their step and success), while every task's full log goes to its own file.

The runner writes everything to `sys.stdout`: its own log lines ("Executing task 'x'", "Task 'x' finished
with status SUCCESS") and, from the thread that runs each task, the task's subprocess output. `TaskLog`
stands in for `sys.stdout` (`contextlib.redirect_stdout`) and tells the tasks apart by that writing
thread, so tasks that run in parallel (the arms) still get separate logs. Every line reaches its log file
as it arrives (a person tails a task's log while the task runs), and the tasks' own Python output is
unbuffered (`UNBUFFERED`, set for the tasks the runner starts), so a warm start's progress is seen while it
is built, not when its task ends.
"""

from __future__ import annotations

import contextlib
import io
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sdar.progress import LINE as PROGRESS_LINE

# what the runner's task subprocesses need in their environment for their output to arrive line by line:
# Python block-buffers stdout into a pipe, so without it a task's prints arrive when the task ends
UNBUFFERED = {"PYTHONUNBUFFERED": "1"}

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXECUTING = re.compile(r"Executing task '([^']+)'")
_FINISHED = re.compile(r"Task '([^']+)' finished with status (\w+)")
# the trainer's per-step line (sdar.train.trainer)
_STEP = re.compile(r"\[([\w.-]+)\] step (\d+)/(\d+): success ([\d.]+)")
# its heartbeat while a step runs (sdar.train.loop)
_RUNNING = re.compile(r"\[([\w.-]+)\] step (\d+)/(\d+) running: (.+?), (\d+)s into the step")
_EVAL = re.compile(r"eval ([\d.]+)\s*$")
# a task a resumed job had finished before (sdar.pipeline.jobs.once_per_job): answered from its record
_REUSED = re.compile(r": finished before in job \S+; its outputs are taken from")
# the progress lines of the long loops (sdar.progress): warm start, evaluation
_PHASE = PROGRESS_LINE


@dataclass
class TaskState:
    """One task of the run as the view shows it."""

    name: str  # the runner's task name
    key: str  # unique per run: name, name-2, ... for tasks of a ParallelFor
    log_path: Path
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    status: str = "RUNNING"
    info: str = ""
    lines: int = 0

    @property
    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def row(self) -> tuple[str, str, str, str]:
        return self.key, self.status.lower(), f"{self.seconds:.0f}s", self.info


class TaskLog(io.TextIOBase):
    """A `sys.stdout` for the runner: the whole stream to `<log_dir>/pipeline.log`, each task's lines to
    `<log_dir>/<task>.log`, and a view of the tasks on `console` (a live table on a terminal; otherwise
    a line when a task starts, when a training task has done another tenth of its steps, when a long task enters a
    phase (the progress lines of sdar.progress: the warm start's phases, an evaluation's episodes, a training step's
    phase) and then every `phase_every_s` seconds of it at least, and when it ends).

    Use as a context manager around the pipeline call; `failed()` lists the tasks that did not succeed.
    """

    def __init__(self, log_dir: str | Path, console, live: bool | None = None, phase_every_s: float = 30.0,
                 on_disk_full=None) -> None:
        super().__init__()
        # a log that finds its disk full: `disk_full` says where (sdar.storage.DiskFull), the console says it once,
        # nothing more is written to files, and `on_disk_full()` is called (the runner stops the run)
        self.disk_full = None
        self.on_disk_full = on_disk_full
        self.dir = Path(log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.console = console
        # the view must reach the real output, never this stream: pin the console's file now, before
        # the caller redirects sys.stdout here (a Console without a file writes to sys.stdout of the moment)
        self._console_file = getattr(console, "_file", None)
        console.file = console.file
        self.live_view = console.is_terminal if live is None else live
        self.phase_every_s = phase_every_s
        self._phase_shown: dict[str, tuple[str, float]] = {}  # task key -> (phase label, when last printed)
        self.tasks: dict[str, TaskState] = {}
        self._by_thread: dict[int, TaskState] = {}
        self._partial: dict[int, str] = {}
        self._files: dict[str, io.TextIOBase] = {}
        self._lock = threading.RLock()
        self._all = (self.dir / "pipeline.log").open("w")
        self._live = None

    # ---- the stream ---------------------------------------------------------------------------------
    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        with self._lock:
            self._to_file(self._all, self.path, text, flush="\n" in text)
            tid = threading.get_ident()
            buf = self._partial.get(tid, "") + text
            *lines, rest = buf.split("\n")
            self._partial[tid] = rest
            for line in lines:
                self._line(tid, line + "\n")
        return len(text)

    def flush(self) -> None:
        with self._lock:
            self._to_file(self._all, self.path, "", flush=True)
            for key, f in self._files.items():
                self._to_file(f, self.tasks[key].log_path, "", flush=True)

    def _to_file(self, f, path: Path, text: str, flush: bool) -> None:
        """Write (and flush) a log file; a full disk is said once and ends file writing, never raised into the
        runner's threads."""
        if self.disk_full is not None:
            return
        try:
            if text:
                f.write(text)
            if flush:
                f.flush()
        except OSError as exc:
            from sdar.storage import DiskFull, free_bytes, is_disk_full

            if not is_disk_full(exc):
                raise
            self.disk_full = DiskFull(path, len(text.encode()) or None, free_bytes(path), what="the task log")
            self.console.print(f"[red]error:[/red] {self.disk_full}", soft_wrap=True, highlight=False)
            if self.on_disk_full is not None:
                self.on_disk_full()

    # ---- parsing ------------------------------------------------------------------------------------
    def _line(self, tid: int, line: str) -> None:
        plain = _ANSI.sub("", line)
        started = _EXECUTING.search(plain)
        if started:
            self._start(tid, started.group(1), line)
            return
        task = self._by_thread.get(tid)
        finished = _FINISHED.search(plain)
        if finished:
            name, status = finished.groups()
            if task is None or task.name != name:
                task = next((t for t in reversed(self.tasks.values()) if t.name == name and t.ended is None), None)
            if task is not None:
                self._write_task(task, line)
                self._finish(task, status)
            return
        if task is None:
            return
        self._write_task(task, line)
        self._progress(task, plain)

    def _start(self, tid: int, name: str, line: str) -> None:
        key, n = name, 1
        while key in self.tasks:
            n += 1
            key = f"{name}-{n}"
        task = TaskState(name, key, self.dir / f"{key}.log")
        self.tasks[key] = task
        self._files[key] = task.log_path.open("w")
        self._by_thread[tid] = task
        self._write_task(task, line)
        if not self.live_view:
            self.console.print(f"  {key}: started", highlight=False)
        self._refresh()

    def _finish(self, task: TaskState, status: str) -> None:
        task.status, task.ended = status, time.monotonic()
        self._to_file(self._files[task.key], task.log_path, "", flush=True)
        if not self.live_view:
            extra = f" ({task.info})" if task.info else ""
            self.console.print(f"  {task.key}: {status.lower()} in {task.seconds:.0f}s{extra}", highlight=False)
        self._refresh()

    def _write_task(self, task: TaskState, line: str) -> None:
        self._to_file(self._files[task.key], task.log_path, line, flush=True)  # the log is read while the task runs
        task.lines += 1

    def _progress(self, task: TaskState, plain: str) -> None:
        if _REUSED.search(plain):
            task.info = "finished before in this job: not redone"
            self._refresh()
            return
        step = _STEP.search(plain)
        if step:
            arm, k, n, success = step.groups()
            ev = _EVAL.search(plain)
            task.info = f"{arm}: step {k}/{n}, train success {float(success):.2f}" + (
                f", held-out {float(ev.group(1)):.2f}" if ev else "")
            tenth = max(1, int(n) // 10)
            if not self.live_view and (int(k) % tenth == 0 or k == n):
                self.console.print(f"  {task.key}: {task.info}", highlight=False)
                self._phase_shown[task.key] = ("step", time.monotonic())
            elif not self.live_view:
                self._show_phase(task, "step")
            self._refresh()
            return
        running = _RUNNING.search(plain)
        if running:
            arm, k, n, doing, seconds = running.groups()
            task.info = f"{arm}: step {k}/{n} running, {doing} ({seconds}s)"
            if not self.live_view:
                self._show_phase(task, "step")
            self._refresh()
            return
        phase = _PHASE.search(plain.strip())
        if phase:
            task.info = f"{phase['label']} {phase['done']}/{phase['total']} {phase['unit']}"
            if not self.live_view:
                self._show_phase(task, phase["label"])
            self._refresh()

    def _show_phase(self, task: TaskState, label: str) -> None:
        """The plain view's phase line: at once when a task enters a phase, then at most every phase_every_s."""
        now = time.monotonic()
        last = self._phase_shown.get(task.key)
        if last is None or last[0] != label or now - last[1] >= self.phase_every_s:
            self._phase_shown[task.key] = (label, now)
            self.console.print(f"  {task.key}: {task.info}", highlight=False)

    # ---- the view -----------------------------------------------------------------------------------
    def _table(self):
        from rich.table import Table

        table = Table(box=None, show_header=False, pad_edge=False)
        for col in ("task", "state", "time", "progress"):
            table.add_column(col, no_wrap=True)
        for t in self.tasks.values():
            style = {"RUNNING": "yellow", "SUCCESS": "green"}.get(t.status, "red")
            key, state, secs, info = t.row()
            table.add_row(key, f"[{style}]{state}[/{style}]", secs, info)
        return table

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._table())

    def __enter__(self) -> "TaskLog":
        if self.live_view:
            from rich.live import Live

            # the Live view draws on the console's own file (the real terminal), never on this stream
            self._live = Live(self._table(), console=self.console, refresh_per_second=2, transient=False,
                              redirect_stdout=False, redirect_stderr=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            for tid, rest in self._partial.items():
                if rest:
                    self._line(tid, rest)
            self._partial.clear()
            if self._live is not None:
                self._live.update(self._table())
                self._live.__exit__(*exc)
                self._live = None
            for f in (*self._files.values(), self._all):
                with contextlib.suppress(OSError):  # a full disk: said already
                    f.close()
            self.console.file = self._console_file

    # ---- after the run --------------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self.dir / "pipeline.log"

    def failed(self) -> list[TaskState]:
        """Tasks that ended in another status than SUCCESS, or never ended."""
        return [t for t in self.tasks.values() if t.status != "SUCCESS"]

    def report_failures(self, tail: int = 30) -> None:
        """Each failed task's log path and its last `tail` lines, on the console."""
        for t in self.failed():
            lines = t.log_path.read_text(errors="replace").splitlines() if t.log_path.is_file() else []
            self.console.print(f"[red]task {t.key} {t.status.lower()}[/red]; its log: {t.log_path}", soft_wrap=True)
            for line in lines[-tail:]:
                self.console.print("    " + _ANSI.sub("", line), highlight=False, markup=False, soft_wrap=True)
