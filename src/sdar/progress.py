"""Progress of the long loops (warm-start SFT, expert episodes, evaluations, training steps): a bar on a terminal,
and in a log a line every tenth of the way, at the end, and whenever HEARTBEAT_S seconds pass without one (a
heartbeat thread: one item may take minutes, a SmolLM2 training step on 2 cores about 100 s), with the rate, the
time left and what the loop is doing now.

The lines read `<label>: <done>/<total> <unit> (<rate>/s, <left> left[, <now>])`; the pipeline's live table
(`sdar.runlog`) shows the newest one of each task as its phase.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

from sdar.console import make_console

HEARTBEAT_S = 30.0  # the longest a log goes without a progress line while a long loop runs

# what sdar.runlog reads back from a task's log: the label (the phase) and how far it is
LINE = re.compile(r"^(?P<label>[A-Za-z][\w .:'-]*?): (?P<done>\d+)/(?P<total>\d+) (?P<unit>[\w-]+) \(")


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class Heartbeat:
    """A line on `console` whenever `every_s` seconds pass without one: `line(seconds since the last)` says what a
    long phase is doing now. `beat()` when the owner printed a line itself. A daemon thread, stopped on exit."""

    def __init__(self, console: Any, line: Callable[[float], str], every_s: float | None = None) -> None:
        self.console, self.line = console, line
        self.every_s = HEARTBEAT_S if every_s is None else every_s
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        self._last = time.monotonic()

    def __enter__(self) -> Heartbeat:
        self._last = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="sdar-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.every_s / 4)):
            now = time.monotonic()
            if now - self._last >= self.every_s:
                try:
                    text = self.line(now - self._last)
                except Exception:  # noqa: BLE001 - a progress line must never break the loop it reports on
                    continue
                self._last = now
                self.console.print(text, markup=False, highlight=False)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class Progress:
    """`with Progress("evaluating", 134, "episodes") as p: ... p.advance(64)`.

    console: where it writes (default: a rich Console on stderr); a terminal gets a transient bar, anything else
    gets lines. every: items between lines (default: a tenth of the total); every_s: at most this long without one
    (a heartbeat line names `now`, what the loop does at the moment, when the caller sets it).
    """

    def __init__(self, label: str, total: int, unit: str = "items", *, console: Any = None, every: int | None = None,
                 every_s: float | None = None) -> None:
        self.label, self.total, self.unit = label, max(int(total), 0), unit
        self.console = console if console is not None else make_console(stderr=True)
        self.every = every or max(1, self.total // 10)
        self.every_s = HEARTBEAT_S if every_s is None else every_s
        self.done = 0
        self._t0 = self._last_t = 0.0
        self._last_done = 0
        self._bar = None
        self._task = None
        self._heartbeat: Heartbeat | None = None
        self.now = ""  # what the loop is doing at the moment (a heartbeat line names it)

    def __enter__(self) -> Progress:
        self._t0 = self._last_t = time.monotonic()
        if not self.console.is_terminal:
            self._heartbeat = Heartbeat(self.console, lambda _s: self._text(time.monotonic()), self.every_s).__enter__()
        if self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn(self.unit), TimeElapsedColumn(), TimeRemainingColumn(), console=self.console,
                            transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total)
        return self

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.advance(self._task, n)
            return
        now = time.monotonic()
        if self.done - self._last_done >= self.every or now - self._last_t >= self.every_s or self.done >= self.total:
            self._line(now)

    def _text(self, now: float) -> str:
        spent = now - self._t0
        rate = self.done / spent if spent > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else float("nan")
        eta = _clock(left) if left == left else "?"
        doing = f", {self.now}" if self.now and self.done < self.total else ""
        self._last_t, self._last_done = now, self.done
        return f"{self.label}: {self.done}/{self.total} {self.unit} ({rate:.2f}/s, {eta} left{doing})"

    def _line(self, now: float) -> None:
        self.console.print(self._text(now), markup=False, highlight=False)
        if self._heartbeat is not None:
            self._heartbeat.beat()

    def __exit__(self, *exc: Any) -> None:
        if self._heartbeat is not None:
            self._heartbeat.__exit__(*exc)
        if self._bar is not None:
            self._bar.stop()
        elif self.done != self._last_done:
            self._line(time.monotonic())
