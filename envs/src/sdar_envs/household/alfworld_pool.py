"""ALFWorld engines in worker processes: sessions pinned to one worker each, calls with a
timeout, and one shared pool per (data root, workers) in a process."""

from __future__ import annotations

import atexit
import itertools
import multiprocessing as mp
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from sdar_envs.household.alfworld_data import task_type_of
from sdar_envs.household.alfworld_engine import AlfworldEngine, GoldEpisode, forbid_network


def _import_function(target: str) -> Callable[..., Any]:
    import importlib

    module, _, attr = target.partition(":")
    if not module or not attr:
        raise ValueError(f"expected 'module:function', got {target!r}")
    return getattr(importlib.import_module(module), attr)


def _worker_main(conn: Any, root: str | None, no_network: bool) -> None:
    """Serve engine sessions over `conn`: (request id, session id, method, args) -> result."""
    if no_network:
        forbid_network()
    sessions: dict[int, AlfworldEngine] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        rid, sid, method, args = msg
        try:
            if method == "open":
                sessions[sid] = AlfworldEngine(root, max_steps=args[0], planner=args[1])
                result: Any = sid
            elif method == "close":
                engine = sessions.pop(sid, None)
                if engine is not None:
                    engine.close()
                result = None
            elif method == "ping":
                result = os.getpid()
            elif method == "call_with_engine":
                # ("module:function", *args): run a whole job next to the engine, one round trip
                if sid not in sessions:
                    raise KeyError(f"session {sid} is not open in this worker")
                result = _import_function(args[0])(sessions[sid], *args[1:])
            else:
                if sid not in sessions:
                    raise KeyError(f"session {sid} is not open in this worker")
                result = getattr(sessions[sid], method)(*args)
            reply = (rid, True, result)
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller
            reply = (rid, False, (type(exc).__name__, str(exc), traceback.format_exc()))
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            break


class AlfworldWorkerError(RuntimeError):
    """An engine call failed inside a worker process (the message carries its traceback)."""


class _Worker:
    def __init__(self, index: int, ctx: Any, root: str | None, no_network: bool) -> None:
        self.index = index
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_worker_main,
            args=(child, root, no_network),
            name=f"alfworld-worker-{index}",
            daemon=True,
        )
        self.proc.start()
        child.close()
        self.conn = parent
        self.send_lock = threading.Lock()
        self.pending: dict[int, Future] = {}
        self.sessions: set[int] = set()
        self.dead: str | None = None
        # guards `pending` and `dead` between callers and the reader thread
        self.state_lock = threading.Lock()
        self.reader = threading.Thread(
            target=self._read, name=f"alfworld-reader-{index}", daemon=True
        )
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                rid, ok, payload = self.conn.recv()
            except (EOFError, OSError):
                self.proc.join(timeout=1.0)
                with self.state_lock:
                    self.dead = f"ALFWorld worker {self.index} (pid {self.proc.pid}) exited with code {self.proc.exitcode}"
                    lost = list(self.pending.values())
                    self.pending.clear()
                for fut in lost:
                    if not fut.done():
                        fut.set_exception(
                            AlfworldWorkerError(
                                self.dead + "; the sessions it held are lost, open new ones"
                            )
                        )
                return
            with self.state_lock:
                fut = self.pending.pop(rid, None)
            if fut is None or fut.done():
                continue
            if ok:
                fut.set_result(payload)
            else:
                name, message, tb = payload
                fut.set_exception(
                    AlfworldWorkerError(
                        f"{name}: {message} (in ALFWorld worker {self.index})\n{tb}"
                    )
                )

    def submit(self, rid: int, sid: int, method: str, args: tuple) -> Future:
        fut: Future = Future()
        with self.state_lock:
            if self.dead:
                fut.set_exception(AlfworldWorkerError(self.dead))
                return fut
            self.pending[rid] = fut
        with self.send_lock:
            try:
                self.conn.send((rid, sid, method, args))
            except (BrokenPipeError, OSError) as exc:
                with self.state_lock:
                    self.pending.pop(rid, None)
                if not fut.done():
                    fut.set_exception(
                        AlfworldWorkerError(f"ALFWorld worker {self.index} is gone ({exc})")
                    )
        return fut

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(timeout=5.0)
        self.conn.close()

    def stop(self, timeout: float = 5.0) -> None:
        with self.send_lock:
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self.proc.join(timeout=timeout)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=timeout)
        self.conn.close()


class AlfworldPool:
    """ALFWorld engines spread over worker processes; each session is pinned to one worker.

    workers: number of processes (each hosts any number of sessions, one game each).
    root: the json_2.1.1 directory (None: only absolute game paths work).
    call_timeout: seconds a single engine call may take before `call` gives up (fast-downward
        needs minutes on the hardest official kitchens; a stuck worker should not hang a run).
    no_network: workers refuse outbound connections (see `forbid_network`).
    start_method: multiprocessing start method; "spawn" is safe with threads in the parent.
    """

    def __init__(
        self,
        workers: int = 2,
        root: str | os.PathLike | None = None,
        call_timeout: float = 600.0,
        no_network: bool = True,
        start_method: str = "spawn",
    ) -> None:
        if workers < 1:
            raise ValueError(f"an ALFWorld pool needs workers >= 1, got {workers}")
        self._ctx = mp.get_context(start_method)
        self._no_network = no_network
        self.root = str(root) if root is not None else None
        self.call_timeout = call_timeout
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._owner: dict[int, _Worker] = {}
        self._workers = [_Worker(i, self._ctx, self.root, no_network) for i in range(workers)]
        self._closed = False

    @property
    def workers(self) -> int:
        return len(self._workers)

    def worker_pids(self) -> list[int | None]:
        return [w.proc.pid for w in self._workers]

    def open_session(
        self, max_steps: int | None = None, worker: int | None = None, planner: str = "auto"
    ) -> int:
        """A new engine session on the least-loaded live worker (or on `worker`); returns its id.

        max_steps, planner: the session engine's settings (see `AlfworldEngine`).
        """
        if planner not in ("auto", "fd"):
            raise ValueError(f"unknown planner {planner!r}; choose 'auto' or 'fd'")
        self._check_open()
        with self._lock:
            live = [w for w in self._workers if not w.dead]
            if not live:
                raise AlfworldWorkerError(
                    "every ALFWorld worker has died; close this pool and start a new one"
                )
            target = (
                self._workers[worker]
                if worker is not None
                else min(live, key=lambda w: len(w.sessions))
            )
            sid = next(self._ids)
            target.sessions.add(sid)
            self._owner[sid] = target
        self._result(
            target.submit(next(self._ids), sid, "open", (max_steps, planner)), self.call_timeout
        )
        return sid

    def worker_of(self, session: int) -> int:
        return self._session_worker(session).index

    def submit(self, session: int, method: str, *args: Any) -> Future:
        """Call `method(*args)` of the session's engine without waiting; returns a Future."""
        self._check_open()
        return self._session_worker(session).submit(next(self._ids), session, method, args)

    def call(self, session: int, method: str, *args: Any, timeout: float | None = None) -> Any:
        """Call `method(*args)` of the session's engine and wait for the result."""
        return self._result(self.submit(session, method, *args), timeout or self.call_timeout)

    def close_session(self, session: int) -> None:
        with self._lock:
            worker = self._owner.pop(session, None)
        if worker is None:
            return
        worker.sessions.discard(session)
        if not worker.dead and not self._closed:
            # fire and forget: a busy worker frees the engine after its current call
            worker.submit(next(self._ids), session, "close", ())

    def imap_unordered(
        self,
        method: str,
        args_list: Iterable[tuple],
        max_steps: int | None = None,
        job_timeout: float | None = None,
        on_timeout: Callable[[tuple, float], Any] | None = None,
        planner: str = "auto",
    ) -> Iterator[Any]:
        """Run `method(*args)` for every args tuple, one in flight per worker, yielding as done.

        Jobs go to whichever worker frees up first, so slow games (long plans) do not queue
        behind each other. Each worker gets one dedicated session for the whole map.
        job_timeout: a job running longer is abandoned: its worker process is killed and
            replaced, and `on_timeout(args, seconds)` is yielded in its place (without
            `on_timeout`, TimeoutError is raised). Default: `call_timeout`.
        """
        self._check_open()
        limit = job_timeout if job_timeout is not None else self.call_timeout
        todo = list(args_list)
        sessions = {
            w.index: self.open_session(max_steps=max_steps, worker=w.index, planner=planner)
            for w in self._workers
            if not w.dead
        }
        inflight: dict[
            Future, tuple[int, tuple, float]
        ] = {}  # future -> (worker index, args, start)

        def launch(index: int) -> None:
            if todo:
                args = todo.pop(0)
                inflight[self.submit(sessions[index], method, *args)] = (
                    index,
                    args,
                    time.monotonic(),
                )

        try:
            for index in list(sessions):
                launch(index)
            while inflight:
                now = time.monotonic()
                next_deadline = min(start + limit for _, _, start in inflight.values())
                done, _ = wait(
                    list(inflight),
                    timeout=max(next_deadline - now, 0.0),
                    return_when=FIRST_COMPLETED,
                )
                for fut in done:
                    index, _, _ = inflight.pop(fut)
                    result = fut.result()
                    launch(index)
                    yield result
                now = time.monotonic()
                for fut, (index, args, start) in list(inflight.items()):
                    if fut.done() or now - start < limit:
                        continue
                    inflight.pop(fut)
                    if on_timeout is None:
                        raise TimeoutError(
                            f"an ALFWorld job ran longer than {limit} s ({method}{args}); raise job_timeout"
                        )
                    self._replace_worker(index)
                    sessions[index] = self.open_session(
                        max_steps=max_steps, worker=index, planner=planner
                    )
                    launch(index)
                    yield on_timeout(args, now - start)
        finally:
            for fut in inflight:
                fut.cancel()
            for sid in sessions.values():
                self.close_session(sid)

    def gold_episodes(
        self,
        task_ids: list[str],
        max_steps: int = 50,
        progress: Callable[[GoldEpisode], None] | None = None,
        job_timeout: float | None = None,
        planner: str = "auto",
    ) -> list[GoldEpisode]:
        """Play every task along the gold path, spread over the workers (results in input order).

        A game whose episode outlasts `job_timeout` (default `call_timeout`) counts as not won,
        with the timeout as its error, and its worker is replaced.
        """

        def timed_out(args: tuple, seconds: float) -> GoldEpisode:
            task_id = args[0]
            return GoldEpisode(
                task_id,
                task_type_of(task_id),
                False,
                0,
                0.0,
                0.0,
                0.0,
                seconds,
                error=f"timeout after {seconds:.0f} s",
            )

        by_id: dict[str, GoldEpisode] = {}
        jobs = [(t, max_steps) for t in task_ids]
        for episode in self.imap_unordered(
            "gold_episode", jobs, job_timeout=job_timeout, on_timeout=timed_out, planner=planner
        ):
            by_id[episode.task_id] = episode
            if progress is not None:
                progress(episode)
        return [by_id[t] for t in task_ids]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            worker.stop()

    def __enter__(self) -> AlfworldPool:  # noqa: PYI034 - Self needs python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- helpers ----------------------------------------------------------------------
    def _replace_worker(self, index: int) -> None:
        """Kill worker `index` (e.g. stuck in a planner search) and start a fresh one in its place."""
        old = self._workers[index]
        old.kill()
        with self._lock:
            self._workers[index] = _Worker(index, self._ctx, self.root, self._no_network)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this AlfworldPool is closed; create a new one")

    def _session_worker(self, session: int) -> _Worker:
        worker = self._owner.get(session)
        if worker is None:
            raise KeyError(
                f"ALFWorld session {session} is not open in this pool (closed, or from another pool)"
            )
        return worker

    @staticmethod
    def _result(fut: Future, timeout: float) -> Any:
        try:
            return fut.result(timeout=timeout)
        except TimeoutError as exc:
            raise TimeoutError(
                f"an ALFWorld engine call took longer than {timeout} s; raise call_timeout if the planner needs more"
            ) from exc


_SHARED_POOLS: dict[tuple[str | None, int], AlfworldPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(workers: int, root: str | os.PathLike | None) -> AlfworldPool:
    """The process-wide pool for (root, workers), started on first use.

    Many `AlfworldHousehold(workers=k)` in one process (e.g. an env server with one env per
    rollout) share these k engine processes instead of each starting its own.
    """
    key = (str(root) if root is not None else None, workers)
    with _SHARED_LOCK:
        pool = _SHARED_POOLS.get(key)
        if pool is None or pool._closed:
            pool = AlfworldPool(workers=workers, root=root)
            _SHARED_POOLS[key] = pool
        return pool


@atexit.register
def _close_shared_pools() -> None:
    for pool in list(_SHARED_POOLS.values()):
        pool.close()
    _SHARED_POOLS.clear()
