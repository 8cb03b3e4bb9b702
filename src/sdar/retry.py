"""Work that must reach a service that may be down for a while (the checkpoint store, the MLflow server): when an
outage began, said once; how long each lasted; how long to wait before the next try. Checkpoint uploads
(`sdar.checkpoint`) and deferred MLflow calls (`sdar.tracking`) keep their work pending through one of these."""

from __future__ import annotations

import time
from typing import Callable


class Outage:
    """The state of one service's availability, as its callers see it.

    `failed(...)` on a failed call: the first starts an outage (its message told through `report`); it returns how long the
    outage has lasted. `recovered(...)` on a call that went through: an outage in progress ends, its length is kept
    in `durations` and told. `delay()` is the next wait of a retry loop (doubling from `first_delay_s` up to
    `max_delay_s`, reset by a recovery); `due()` says whether `interval_s` has passed since the last try.
    """

    def __init__(self, report: Callable[[str], None], *, first_delay_s: float = 1.0, max_delay_s: float = 30.0,
                 interval_s: float = 0.0) -> None:
        self.report = report
        self.first_delay_s, self.max_delay_s, self.interval_s = first_delay_s, max_delay_s, interval_s
        self.since: float | None = None  # monotonic time the current outage began; None while the service answers
        self.durations: list[float] = []  # seconds each ended outage lasted
        self._delay = first_delay_s
        self._last_try = float("-inf")

    def tried(self) -> None:
        """A call is being tried now (for `due`)."""
        self._last_try = time.monotonic()

    def due(self) -> bool:
        """Whether a retry is due: no outage, or `interval_s` passed since the last try."""
        return self.since is None or time.monotonic() - self._last_try >= self.interval_s

    def failed(self, message: str) -> float:
        """A call failed: start the outage (report `message` once); the seconds it has lasted so far."""
        now = time.monotonic()
        self._last_try = now
        if self.since is None:
            self.since = now
            self.report(message)
        return now - self.since

    def recovered(self, message: Callable[[float], str] | None = None) -> None:
        """A call went through: end an outage in progress (its length to `durations`, `message(seconds)` told)."""
        self._delay = self.first_delay_s
        if self.since is None:
            return
        lasted = time.monotonic() - self.since
        self.durations.append(lasted)
        self.since = None
        if message is not None:
            self.report(message(lasted))

    def delay(self, limit_s: float | None = None) -> float:
        """The wait before the next try (then doubled, up to max_delay_s), at most `limit_s`."""
        wait = self._delay if limit_s is None else min(self._delay, max(0.0, limit_s))
        self._delay = min(self._delay * 2, self.max_delay_s)
        return wait
