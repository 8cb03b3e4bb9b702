"""Serve any sdar TextEnv over HTTP and WebSocket with OpenEnv's server, one environment per session.

Any OpenEnv client (ours in `sdar.envs.client`, TRL's, `GenericEnvClient`) drives it over `/ws`.

How sessions work in openenv-core 0.3.0 and what this module adds
-------------------------------------------------------------------
OpenEnv's `HTTPEnvServer` gives every WebSocket connection to `/ws` its own environment instance
(made by a factory) and its own one-thread executor; messages are {"type": "reset"|"step"|"state"|
"close", "data": {...}} and replies {"type": "observation"|"state"|"error", "data": {...}}. The
session id stays inside the server, the idle reaper checks only every max(TTL/4, 5 s), the "state"
message takes no argument, the HTTP `/reset` and `/step` routes build a fresh environment per
request (no multi-turn episode over plain HTTP), and the serializer drops `Observation.metadata`.
So `SdarEnvServer` subclasses `HTTPEnvServer` (its session table, capacity check, executors and
reaper are reused, not copied) and adds:
  * every observation carries the step metadata as fields, plus `step` and `session_id`;
  * a reaper with a configurable interval that remembers reclaimed sessions (410, not 404); a
    reclaimed WebSocket stays open (OpenEnv cannot close it from the reaper) and its next message
    gets an error saying the session was reclaimed and to reconnect;
  * stateful HTTP sessions over the same session table (routes below), so curl, probes and
    teachers without a WebSocket can play and read back;
  * state(t): `GET /sessions/{id}/state?t=T` returns the exact observation of step T (the wire
    payload reset/step returned), for WebSocket and HTTP sessions alike; without `t` it returns the
    session state, which is also what the WebSocket "state" message returns (ids, step count,
    and the observation text of every step);
  * limits with clear errors: action length (413 / error message), session capacity (503), unknown
    or reclaimed session (404 / 410), unknown task id at reset (404), malformed JSON (400), stepping
    before reset or after the end (409).
Routes are registered in OpenEnv's "production" mode so its stateless `/reset` and `/step` (which
fail on multi-turn environments) are not exposed; `/ws`, `/health`, `/schema`, `/metadata` are
OpenEnv's own. Our routes: POST /sessions, GET /sessions, POST /sessions/{id}/reset
{"task_id", "seed"}, POST /sessions/{id}/step {"action": {"message"}}, GET /sessions/{id}/state
[?t=], DELETE /sessions/{id}, GET /info, GET /tasks?split=.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import importlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

# first, so that openenv is imported without its Gradio web UI (see openenv_models)
from sdar.envs.openenv_models import SdarAction, SdarObservation, SdarState, observation_from_step

# isort: split
from fastapi import FastAPI, HTTPException, Request, WebSocketDisconnect
from fastapi.responses import JSONResponse
from openenv.core.env_server.exceptions import EnvironmentFactoryError, SessionCapacityError
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.serialization import deserialize_action, serialize_observation
from openenv.core.env_server.types import ConcurrencyConfig, EnvironmentMetadata, ServerMode
from pydantic import ValidationError

from sdar.envs.base import TextEnv, make_env
from sdar.envs.server_config import ServerOptions, add_serve_arguments, options_from_args

log = logging.getLogger(__name__)


# ---- errors a client can cause; each maps to one HTTP status --------------------------------
class EnvRequestError(Exception):
    """A request the environment refused; `status` is its HTTP status, `kind` a short name."""

    status = 400
    kind = "bad_request"


class UnknownTaskError(EnvRequestError):
    status = 404
    kind = "unknown_task"


class ResetError(EnvRequestError):
    status = 400
    kind = "bad_reset"


class ActionTooLongError(EnvRequestError):
    status = 413
    kind = "action_too_long"


class EpisodeStateError(EnvRequestError):
    status = 409
    kind = "episode_state"


class StepNotFoundError(EnvRequestError):
    status = 404
    kind = "unknown_step"


class SessionGoneError(EnvRequestError):
    status = 410
    kind = "session_gone"


def build_text_env(family: str, env_kwargs: dict[str, Any] | None = None) -> TextEnv:
    """A registered family by name, or any TextEnv factory given as 'module:attr'."""
    kwargs = dict(env_kwargs or {})
    if ":" not in family:
        return make_env(family, **kwargs)
    module_name, _, attr = family.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load environment factory {family!r}: {exc}; give 'package.module:ClassName'") from exc
    env = factory(**kwargs)
    if not isinstance(env, TextEnv):
        raise TypeError(f"{family!r} built a {type(env).__name__}, not a sdar TextEnv")
    return env


# ---- the OpenEnv environment around a TextEnv -----------------------------------------------
class SdarEnvironment(Environment[SdarAction, SdarObservation, SdarState]):
    """One session's environment: a TextEnv plus the record of what each step returned."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session builds its own TextEnv; nothing is shared

    def __init__(self, family: str, env_kwargs: dict[str, Any] | None = None, max_action_chars: int = 4096):
        super().__init__()
        self.family = family
        self.max_action_chars = max_action_chars
        self.env = build_text_env(family, env_kwargs)
        self.session_id: str | None = None  # set by the server once the session exists
        self._records: list[SdarObservation] = []
        self._episode_id: str | None = None
        self._task: str | None = None
        self._task_id: str | None = None
        self._gone: str | None = None  # why the session can no longer be used

    # -- OpenEnv API ----------------------------------------------------------------------------
    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None, **kwargs: Any) -> SdarObservation:
        self._check_usable()
        if kwargs:
            raise ResetError(f"unknown reset parameter(s) {sorted(kwargs)}; reset accepts task_id, seed, episode_id")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ResetError(f"seed must be an integer, got {seed!r}")
        if task_id is not None and not isinstance(task_id, str):
            raise ResetError(f"task_id must be a string, got {task_id!r}")
        self._records = []  # a failed reset leaves no episode to step in
        try:
            out = self.env.reset(task_id=task_id, seed=seed)
        except (KeyError, ValueError) as exc:
            reason = exc.args[0] if exc.args else repr(exc)
            if task_id is not None:
                raise UnknownTaskError(
                    f"family {self.family!r} has no task {task_id!r} ({reason}); list task ids with GET /tasks?split=train|test"
                ) from exc
            raise ResetError(f"reset(seed={seed!r}) refused by family {self.family!r}: {reason}") from exc
        md = out.metadata
        self._task_id = str(md.get("task_id", task_id)) if md.get("task_id", task_id) is not None else None
        self._task = md.get("task")
        if self._task is None:
            try:
                self._task = self.env.task_text
            except NotImplementedError:
                self._task = None
        self._episode_id = episode_id or f"{self.session_id}:{self._task_id}"
        obs = observation_from_step(
            out, step=0, session_id=self.session_id, family=self.family, task=self._task, task_id=self._task_id
        )
        self._records = [obs]
        return obs

    def step(self, action: SdarAction, timeout_s: float | None = None, **kwargs: Any) -> SdarObservation:
        self._check_usable()
        if not self._records:
            raise EpisodeStateError("step before reset: this session has no episode; send a reset first")
        if self._records[-1].done:
            raise EpisodeStateError(
                f"the episode on task {self._task_id!r} ended at step {len(self._records) - 1}; reset to start a new one"
            )
        message = action.message
        if len(message) > self.max_action_chars:
            raise ActionTooLongError(
                f"action has {len(message)} characters, over this server's limit of {self.max_action_chars}; "
                "send a shorter action or start the server with a larger --max-action-chars"
            )
        out = self.env.step(message)
        obs = observation_from_step(
            out, step=len(self._records), session_id=self.session_id, family=self.family, task=self._task, task_id=self._task_id
        )
        self._records.append(obs)
        return obs

    @property
    def state(self) -> SdarState:
        return SdarState(
            episode_id=self._episode_id,
            step_count=max(len(self._records) - 1, 0),
            session_id=self.session_id,
            family=self.family,
            task_id=self._task_id,
            task=self._task,
            done=bool(self._records and self._records[-1].done),
            observations=[r.text for r in self._records],
        )

    def observation_at(self, t: int) -> SdarObservation:
        """Exactly what reset (t = 0) or the t-th step returned."""
        if not self._records:
            raise StepNotFoundError("this session has no episode yet; reset first")
        if not 0 <= t < len(self._records):
            raise StepNotFoundError(f"step {t} does not exist; this episode has steps 0..{len(self._records) - 1}")
        return self._records[t]

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=f"sdar-{self.family}",
            description=f"sdar {self.family} text environment (actions: {{'message': str}}; reset: task_id, seed)",
            version=_sdar_version(),
        )

    def expire(self, reason: str) -> None:
        """Mark the session unusable (the reaper reclaimed it) before it is closed."""
        self._gone = reason

    def close(self) -> None:
        if self._gone is None:
            self._gone = "this session was closed; open a new session"
        try:
            self.env.close()
        except Exception as exc:  # a failing engine close must not take the server down
            log.warning("closing %s env failed: %s", self.family, exc)

    def _check_usable(self) -> None:
        if self._gone is not None:
            raise SessionGoneError(self._gone)


def _sdar_version() -> str:
    from sdar import __version__

    return __version__


# ---- the server -----------------------------------------------------------------------------
_MISSING = object()


class SdarEnvServer(HTTPEnvServer):
    """OpenEnv's HTTPEnvServer with session ids in observations, a tunable reaper and HTTP sessions."""

    def __init__(self, options: ServerOptions):
        self.options = options
        # built once up front: a bad family or kwargs fails here, before the port is served
        self.probe = build_text_env(options.family, options.env_kwargs)
        factory = functools.partial(
            SdarEnvironment, family=options.family, env_kwargs=dict(options.env_kwargs), max_action_chars=options.max_action_chars
        )
        super().__init__(
            factory,
            SdarAction,
            SdarObservation,
            concurrency_config=ConcurrencyConfig(
                max_concurrent_envs=options.max_sessions, session_timeout=options.session_ttl_s
            ),
        )
        # reclaimed session ids, remembered so a late request gets 410 "expired" instead of 404
        self._expired: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.sessions_created = 0

    # -- OpenEnv hooks ---------------------------------------------------------------------------
    async def _create_session(self) -> tuple[str, Environment]:
        session_id, env = await super()._create_session()
        env.session_id = session_id  # type: ignore[attr-defined]
        self.sessions_created += 1
        return session_id, env

    async def _reap_idle_sessions(self) -> None:
        # OpenEnv's reaper, with our interval and a memory of what it reclaimed
        ttl = self._session_idle_timeout_s
        if ttl is None:
            return
        while True:
            try:
                await asyncio.sleep(self.options.reap_every_s)
                now = time.time()
                async with self._session_lock:
                    stale = [sid for sid, info in self._session_info.items() if now - info.last_activity_at > ttl]
                for sid in stale:
                    async with self._session_lock:
                        info = self._session_info.get(sid)
                        if info is None or time.time() - info.last_activity_at <= ttl:
                            continue
                        env = self._sessions.get(sid)
                    reason = (
                        f"session {sid} was idle for more than {ttl:g} s and the server reclaimed it; "
                        "open a new session (reconnect, or POST /sessions) and reset"
                    )
                    if isinstance(env, SdarEnvironment):
                        env.expire(reason)
                    self._remember_expired(sid, reason)
                    await self._destroy_session(sid)
            except asyncio.CancelledError:
                break
            except Exception as exc:  # keep reaping whatever one bad session does
                log.warning("idle-session reaper error (will retry): %s", exc)

    def _remember_expired(self, sid: str, reason: str) -> None:
        self._expired[sid] = reason
        while len(self._expired) > 10_000:
            self._expired.popitem(last=False)

    # -- helpers for our routes ------------------------------------------------------------------
    def _session_env(self, sid: str) -> SdarEnvironment:
        env = self._sessions.get(sid, _MISSING)
        if env is _MISSING:
            if sid in self._expired:
                raise SessionGoneError(self._expired[sid])
            raise HTTPException(
                404,
                f"unknown session {sid!r}; create one with POST /sessions (or open a WebSocket at /ws); "
                "GET /sessions lists the live ones",
            )
        if env is None:
            raise HTTPException(409, f"session {sid!r} is still starting; retry in a moment")
        return env  # type: ignore[return-value]

    async def _call(self, sid: str, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        out = await self._run_in_session_executor(sid, func, *args, **kwargs)
        self._update_session_activity(sid, increment_step=func.__name__ == "step")
        return out

    async def _json_body(self, request: Request, limit: int, example: str) -> dict[str, Any]:
        body = await request.body()
        if len(body) > limit:
            raise ActionTooLongError(f"request body has {len(body)} bytes, over this server's limit of {limit}")
        if not body.strip():
            return {}
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            raise EnvRequestError(f"malformed JSON body ({exc}); send a JSON object like {example}") from exc
        if not isinstance(data, dict):
            raise EnvRequestError(f"the body must be a JSON object like {example}, got {type(data).__name__}")
        return data

    def info(self) -> dict[str, Any]:
        o = self.options
        return {
            "family": o.family,
            "env_kwargs": o.env_kwargs,
            "active_sessions": self.active_sessions,
            "max_sessions": o.max_sessions,
            "sessions_created": self.sessions_created,
            "sessions_expired": len(self._expired),
            "session_ttl_s": o.session_ttl_s,
            "reap_interval_s": o.reap_every_s,
            "max_action_chars": o.max_action_chars,
            "sdar_version": _sdar_version(),
        }

    async def close_all(self) -> None:
        for sid in list(self._sessions):
            await self._destroy_session(sid)
        try:
            self.probe.close()
        except Exception as exc:
            log.warning("closing the probe env failed: %s", exc)

    # -- routes ------------------------------------------------------------------------------------
    def add_session_routes(self, app: FastAPI) -> None:
        """Stateful HTTP sessions, state(t), /info and /tasks on top of OpenEnv's routes."""
        body_limit = 6 * self.options.max_action_chars + 64 * 1024  # JSON may escape a char to 6 bytes

        @app.exception_handler(EnvRequestError)
        async def _env_error(_request: Request, exc: EnvRequestError) -> JSONResponse:
            return JSONResponse({"detail": str(exc), "error": exc.kind}, status_code=exc.status)

        @app.get("/info", tags=["Environment Info"], summary="Family, limits and session counts")
        async def info() -> dict[str, Any]:
            return self.info()

        @app.get("/tasks", tags=["Environment Info"], summary="Task ids of a split")
        async def tasks(split: str = "test") -> dict[str, Any]:
            try:
                ids = await asyncio.get_running_loop().run_in_executor(self._executor, self.probe.task_ids, split)
            except NotImplementedError as exc:
                raise HTTPException(404, f"family {self.options.family!r} has no fixed task list ({exc}); reset with a seed instead") from None
            except (KeyError, ValueError) as exc:
                raise HTTPException(400, f"cannot list split {split!r}: {exc.args[0] if exc.args else exc}") from None
            return {"family": self.options.family, "split": split, "task_ids": list(ids)}

        @app.get("/sessions", tags=["Sessions"], summary="Live sessions")
        async def list_sessions() -> dict[str, Any]:
            infos = [i.model_dump() for i in self._session_info.values()]
            return {"active": len(self._sessions), "max": self.options.max_sessions, "sessions": infos}

        @app.post("/sessions", status_code=201, tags=["Sessions"], summary="Open a session")
        async def create_session() -> dict[str, Any]:
            try:
                sid, _env = await self._create_session()
            except SessionCapacityError as exc:
                raise HTTPException(
                    503,
                    f"server is at capacity ({exc.active_sessions}/{exc.max_sessions} sessions); close sessions "
                    "(DELETE /sessions/{id}, or close WebSockets) or restart with a larger --max-sessions",
                ) from None
            except EnvironmentFactoryError as exc:
                raise HTTPException(500, f"could not build a {self.options.family} environment: {exc.__cause__ or exc}") from None
            return {"session_id": sid, "family": self.options.family}

        @app.post("/sessions/{sid}/reset", tags=["Sessions"], summary="Start an episode: {task_id, seed}")
        async def reset(sid: str, request: Request) -> dict[str, Any]:
            env = self._session_env(sid)
            data = await self._json_body(request, body_limit, '{"task_id": "...", "seed": 0}')
            obs = await self._call(sid, env.reset, **data)
            return serialize_observation(obs)

        @app.post("/sessions/{sid}/step", tags=["Sessions"], summary='Act: {"action": {"message": str}}')
        async def step(sid: str, request: Request) -> dict[str, Any]:
            env = self._session_env(sid)
            example = '{"action": {"message": "look"}}'
            data = await self._json_body(request, body_limit, example)
            if set(data) != {"action"} or not isinstance(data["action"], dict):
                raise EnvRequestError(f"the body must be {example}, got keys {sorted(data)}")
            try:
                action = deserialize_action(data["action"], SdarAction)
            except ValidationError as exc:
                raise HTTPException(422, exc.errors(include_url=False, include_context=False, include_input=False)) from None
            obs = await self._call(sid, env.step, action)
            return serialize_observation(obs)

        @app.get("/sessions/{sid}/state", tags=["Sessions"], summary="State, or the exact observation of step t")
        async def state(sid: str, t: int | None = None) -> dict[str, Any]:
            env = self._session_env(sid)
            if t is None:
                return env.state.model_dump()
            return serialize_observation(env.observation_at(t))

        @app.delete("/sessions/{sid}", tags=["Sessions"], summary="Close a session and its environment")
        async def close(sid: str) -> dict[str, Any]:
            self._session_env(sid)
            await self._destroy_session(sid)
            return {"session_id": sid, "closed": True}

        async def _shutdown() -> None:
            await self.close_all()

        app.router.on_shutdown.append(_shutdown)


class _QuietWebSocketClose:
    """ASGI middleware: openenv 0.3.0 closes a WebSocket the client already closed and only expects
    RuntimeError; the resulting WebSocketDisconnect is noise, not an error, so it ends here."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            pass


def create_env_app(options: ServerOptions) -> FastAPI:
    """The FastAPI app serving `options.family`: OpenEnv's routes plus sdar's session routes."""
    server = SdarEnvServer(options)
    app = FastAPI(
        title=f"sdar environment server: {options.family}",
        version=_sdar_version(),
        description=__doc__,
    )
    server.register_routes(app, mode=ServerMode.PRODUCTION)
    server.add_session_routes(app)
    app.add_middleware(_QuietWebSocketClose)
    app.state.sdar_server = server
    return app


def uvicorn_config(app: FastAPI, options: ServerOptions) -> Any:
    import uvicorn

    return uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        log_level=options.log_level,
        # the transport limit only stops absurd frames; the action limit gives the clear error
        ws_max_size=max(1 << 20, 6 * options.max_action_chars + 64 * 1024),
        ws_per_message_deflate=False,  # loopback and cluster-local traffic: CPU matters more than bytes
        timeout_graceful_shutdown=3,
        access_log=options.log_level == "debug",
    )


def run_server(options: ServerOptions, sock: socket.socket | None = None) -> None:
    """Serve until interrupted; `sock` is an already bound socket (background servers pass one)."""
    import uvicorn

    app = create_env_app(options)
    server = uvicorn.Server(uvicorn_config(app, options))
    server.run(sockets=[sock] if sock is not None else None)


# ---- command line (also what background servers run) -----------------------------------------
def _exit_with_parent(parent_pid: int, every_s: float = 0.5) -> None:
    """Stop gracefully once `parent_pid` is no longer our parent, so no server outlives its starter.

    A polling thread, not prctl(PR_SET_PDEATHSIG): that fires when the starting *thread* ends and
    needs a preexec_fn, which is unsafe in a parent that runs threads.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(every_s)
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown closes every session

    threading.Thread(target=watch, name="sdar-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sdar.envs.server", description="Serve one sdar environment family.")
    add_serve_arguments(parser)
    parser.add_argument("--fd", type=int, default=None, help="serve on this already bound socket (used by serve_in_background)")
    parser.add_argument("--parent-pid", type=int, default=None, help="stop when this process is gone (used by serve_in_background)")
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        _exit_with_parent(args.parent_pid)
    options = options_from_args(args)
    sock = socket.socket(fileno=args.fd) if args.fd is not None else None
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"serving {options.family} with {json.dumps(asdict(options))}", file=sys.stderr, flush=True)
    run_server(options, sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
