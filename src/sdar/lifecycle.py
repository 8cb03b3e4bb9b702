"""How a command that starts processes ends: SIGTERM (what `kill`, systemd and Kubernetes send) and SIGHUP (a closing
terminal) end it as Ctrl-C does, as an exception in the main thread, so every `finally` that stops a child process
group runs before it exits. Without this, Python dies at once on either signal and its children (an `mlflow server`
with its uvicorn and huey workers, an env server) are left running, orphaned, holding their ports.

And how quickly it exits: `skip_the_final_collection`."""

from __future__ import annotations

import atexit
import contextlib
import gc
import signal
from collections.abc import Iterator

ENDING = (signal.SIGTERM, signal.SIGHUP)
_FROZEN_AT_EXIT = False


def skip_the_final_collection() -> None:
    """At this process's exit, skip the interpreter's last full garbage collections: after the exit handlers
    registered later (registered as a command starts, that is nearly all of them; the few registered before it run
    after it, unaffected), every object is moved to the permanent generation (gc.freeze), which the collections of
    interpreter shutdown do not traverse. With torch and transformers loaded those
    collections take 1.2-1.5 s of CPU after a command has finished, on a 2-core machine (benchmarks/bench_exit.py);
    each `sdar` command, torchrun rank and pipeline task paid them. Nothing an exit needs is skipped: the other exit
    handlers and `weakref.finalize` callbacks run as before, the standard streams are flushed, and objects outside
    reference cycles are freed as the modules are torn down; only garbage in cycles is left to the operating system,
    as at any process's end. Idempotent."""
    global _FROZEN_AT_EXIT
    if not _FROZEN_AT_EXIT:
        atexit.register(gc.freeze)
        _FROZEN_AT_EXIT = True


class Terminated(SystemExit):
    """Raised in the main thread by SIGTERM or SIGHUP inside `ending_on_signals`; exits with 128 + the signal's
    number, the status a shell reports for a process the signal ended."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"ended by {signal.Signals(self.signum).name}"


@contextlib.contextmanager
def ending_on_signals(signals: tuple[int, ...] = ENDING, on_signal=None) -> Iterator[None]:
    """Within the block, `signals` raise `Terminated` in the main thread (the previous handlers are restored after).
    on_signal: called first, in the handler, before the exception unwinds anything: what must stop at once, because
    the code the exception unwinds may wait for it (a thread pool's `shutdown(wait=True)` in a `finally` waits for
    the worker threads, which wait for the child processes they started). Outside the main thread it does nothing
    (Python delivers signals to the main thread only)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, _frame):
        for s in signals:  # once: a second signal must not interrupt the cleanup the first one started
            signal.signal(s, signal.SIG_IGN)
        if on_signal is not None:
            on_signal()
        raise Terminated(signum)

    previous = {s: signal.signal(s, raise_terminated) for s in signals}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def handlers_kept(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """After the block, `signals` have the handlers they had before it, whatever a library inside set: TorchX's local
    scheduler sets SIGINT and SIGTERM to raise its own SignalException when it is created (a dry run too) and never
    puts them back, which would leave the caller's Ctrl-C changed for the rest of its process. Outside the main thread
    it does nothing (no handler can be set there)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in signals}
    try:
        yield
    finally:
        for s, h in previous.items():
            if h is not None:  # None: set outside Python, cannot be put back
                signal.signal(s, h)


def group_members(pgid: int) -> list[int]:
    """The live processes (zombies left out) of process group `pgid`: read from /proc where there is one, else whether
    the group takes a signal ([pgid] or [])."""
    import os
    from pathlib import Path

    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    return [pid for pid, _ppid, pgrp in _live_processes() if pgrp == pgid]


def _live_processes():
    """(pid, parent pid, process group) of every live process (zombies left out), read from /proc/<pid>/stat."""
    from pathlib import Path

    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if state != "Z":
            yield int(stat.parent.name), int(ppid), int(pgrp)


def descendants(pid: int) -> list[int]:
    """The live processes whose parent chain leads to `pid` (children first), read from /proc; [] without /proc."""
    children: dict[int, list[int]] = {}
    for child, ppid, _pgrp in _live_processes():
        children.setdefault(ppid, []).append(child)
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def stop_processes(pids: list[int], grace_s: float = 10.0) -> list[int]:
    """SIGTERM each of `pids`, wait up to `grace_s` for them all to end, then SIGKILL what is left; returns the pids
    that had to be killed. Our own children are reaped; a pid already gone is skipped."""
    import os
    import time

    def alive(p: int) -> bool:
        try:
            if os.waitpid(p, os.WNOHANG)[0] == p:  # our child, now reaped
                return False
        except ChildProcessError:
            pass
        try:
            with open(f"/proc/{p}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    killed = [p for p in pids if alive(p)]
    for p in killed:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return killed
