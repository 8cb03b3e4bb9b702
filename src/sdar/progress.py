"""Progress of the long loops (warm-start SFT, expert episodes, evaluations): a bar on a terminal, and in a log a
line every tenth of the way (and at least once a minute, and at the end) with the rate and the time left.

The lines read `<label>: <done>/<total> <unit> (<rate>/s, <left> left)`; the pipeline's live table
(`sdar.runlog`) shows the newest one of each task as its phase.
"""

from __future__ import annotations

import re
import time
from typing import Any

# what sdar.runlog reads back from a task's log: the label (the phase) and how far it is
LINE = re.compile(r"^(?P<label>[A-Za-z][\w .:'-]*?): (?P<done>\d+)/(?P<total>\d+) (?P<unit>[\w-]+) \(")


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """`with Progress("evaluating", 134, "episodes") as p: ... p.advance(64)`.

    console: where it writes (default: a rich Console on stderr); a terminal gets a transient bar, anything else
    gets lines. every: items between lines (default: a tenth of the total); every_s: at most this long without one.
    """

    def __init__(self, label: str, total: int, unit: str = "items", *, console: Any = None, every: int | None = None,
                 every_s: float = 60.0) -> None:
        from sdar.console import make_console

        self.label, self.total, self.unit = label, max(int(total), 0), unit
        self.console = console if console is not None else make_console(stderr=True)
        self.every = every or max(1, self.total // 10)
        self.every_s = every_s
        self.done = 0
        self._t0 = self._last_t = 0.0
        self._last_done = 0
        self._bar = None
        self._task = None

    def __enter__(self) -> Progress:
        self._t0 = self._last_t = time.monotonic()
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

    def _line(self, now: float) -> None:
        spent = now - self._t0
        rate = self.done / spent if spent > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else float("nan")
        eta = _clock(left) if left == left else "?"
        self.console.print(f"{self.label}: {self.done}/{self.total} {self.unit} ({rate:.2f}/s, {eta} left)",
                           markup=False, highlight=False)
        self._last_t, self._last_done = now, self.done

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self.done != self._last_done:
            self._line(time.monotonic())
