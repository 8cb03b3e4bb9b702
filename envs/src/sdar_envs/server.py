"""Serve any sdar TextEnv over HTTP and WebSocket with OpenEnv's server, one environment per session.

Any OpenEnv client (ours in `sdar_envs.client`, TRL's, `GenericEnvClient`) drives it over `/ws`.

How sessions work in OpenEnv (`openenv` 0.10, the successor of `openenv-core`) and what this module adds
------------------------------------------------------------------------------------------------------
OpenEnv's `HTTPEnvServer` gives every WebSocket connection to `/ws` its own environment instance
(made by a factory) and its own one-thread executor; messages are {"type": "reset"|"step"|"state"|
"close", "data": {...}} and replies {"type": "observation"|"state"|"error", "data": {...}}. The
session id stays inside the server, the idle reaper checks only every max(TTL/4, 5 s), the "state"
message takes no argument, the HTTP `/reset` and `/step` routes build a fresh environment per
request (no multi-turn episode over plain HTTP). So `SdarEnvServer` subclasses `HTTPEnvServer` (its session table, capacity check, executors and
reaper are reused, not copied) and adds:
  * every observation carries the step metadata as typed fields (published in /schema), plus `step` and
    `session_id`, and /schema publishes `SdarState` as the state model;
  * a reaper with a configurable interval that remembers reclaimed sessions (410 to their owner, not
    404); a reclaimed WebSocket is told why (an error message) and closed (code 1001, the reason);
  * stateful HTTP sessions over the same session table (routes below), so curl, probes and
    teachers without a WebSocket can play and read back;
  * state(t): `GET /sessions/{id}/state?t=T` returns the exact observation of step T (the wire
    payload reset/step returned), for WebSocket and HTTP sessions alike; without `t` it returns the
    session state, which is also what the WebSocket "state" message returns (ids, step count,
    and the observation text of every step);
  * limits with clear errors: action length (413 / error message), session capacity (503), unknown
    or reclaimed session (404 / 410), unknown task id at reset (404), malformed JSON (400), a reset or
    step body that does not fit its model (400 for an unknown key, 422 for a wrong type; the models are
    published as request bodies in /openapi.json), stepping before reset or after the end (409).

Sessions belong to whoever opened them. POST /sessions answers with a `session_token` (from
`secrets.token_urlsafe`) that every /sessions/{id}/... route requires as `Authorization: Bearer
<token>`; a WebSocket session is driven only by its connection, which can ask for its token
({"type": "session"}) to let someone else (a teacher) read its state over HTTP. GET /sessions shows
counts; with the operator token (env SDAR_ENV_OPERATOR_TOKEN, from a Secret) it lists every session,
and DELETE /sessions/{id} with it closes any. One client address holds at most
`max_sessions_per_client` sessions (429 beyond). Tokens are compared in constant time, never logged.
Without a token a session route says nothing about the id (401 for live, reclaimed and unknown ids alike).

Connections are bounded before they reach any route (`sdar_envs.server_limits.ConnectionLimits`): one client
address holds at most `connections_per_client_limit` open connections, HTTP and WebSocket alike (one more is
answered 429 at once and closed), the server `connections_limit` in all (503). uvicorn's own
limit_concurrency is off: it counts no WebSocket upgrade and answers /health 503 like everything else. With
--probe-port a second port answers GET /health only, outside these limits, for the kubelet.

Every bad input is a 4xx with a message, read within bounds (`sdar_envs.server_limits`): bodies over
`max_body_bytes` are refused on Content-Length before reading and while reading chunked ones (413),
slow request heads and bodies get 408 and lose their connection, JSON that is not UTF-8, nested
deeper than 32 or holding integers of more than 64 digits is a 400, and a binary or non-object
WebSocket frame gets an error message while the session goes on.

OpenEnv's routes are registered in its "production" mode (no stateless `/reset` and `/step`, which
fail on multi-turn environments); `/health` and `/schema` are OpenEnv's own, while `/ws`, `/mcp` and
`/metadata` are replaced: OpenEnv's `/ws` ends a session on a binary frame and lets its "mcp"
messages close any session, its `/mcp` reads any body and closes any session by id, and its
`/metadata` builds a whole environment per request. OpenEnv 0.10's task API (`/list_environments`,
`/{env_name}/splits|tasks|num_tasks|task|task_range`) is not served: each of its requests builds a whole
environment, and ours have no task provider (GET /tasks?split= lists task ids instead). Our routes: POST /sessions, GET /sessions,
POST /sessions/{id}/reset {"task_id", "seed"}, POST /sessions/{id}/step {"action": {"message"}},
GET /sessions/{id}/state [?t=], DELETE /sessions/{id}, GET /info, GET /tasks?split=, POST /mcp
(openenv/session/create and openenv/session/close only: these environments have no MCP tools).

This module holds each session's environment (`SdarEnvironment`), the session table (`SdarEnvServer`: sessions,
owners, tokens, the reaper) and the app around them; what a client speaks to it (the routes, /mcp and the WebSocket
protocol) is `sdar_envs.server_routes`, the errors it answers `sdar_envs.server_errors`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import errno
import functools
import hashlib
import hmac
import importlib
import json
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

# first, so that openenv is imported without its Gradio web UI (see openenv_models)
from sdar_envs.openenv_models import (
    SdarAction,
    SdarObservation,
    SdarResetRequest,
    SdarState,
    SdarStepRequest,
    family_metadata,
    observation_from_step,
)

# isort: split
from fastapi import FastAPI, HTTPException, WebSocketDisconnect
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import JsonRpcRequest
from openenv.core.env_server.types import ConcurrencyConfig, EnvironmentMetadata, ServerMode
from pydantic import BaseModel, ValidationError

from sdar_envs import __version__
from sdar_envs.base import TextEnv, make_env
from sdar_envs.server_config import (
    MIN_OPERATOR_TOKEN_CHARS,
    OPERATOR_TOKEN_ENV,
    ServerOptions,
    add_serve_arguments,
    options_from_args,
)
from sdar_envs.server_errors import (
    ActionTooLongError,
    EnvRequestError,
    EpisodeStateError,
    RequestValidationFailed,
    ResetError,
    SessionAuthError,
    SessionForbiddenError,
    SessionGoneError,
    StepNotFoundError,
    TooManySessionsError,
    UnknownTaskError,
)
from sdar_envs.server_limits import (
    MAX_TASK_ID_CHARS,
    ConnectionLimits,
    ProbeListener,
    RequestGuard,
    guarded_protocols,
)
from sdar_envs.server_routes import RESET_EXAMPLE, STEP_EXAMPLE, add_session_routes

log = logging.getLogger(__name__)


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
            raise ResetError(f"task_id must be a string, got {type(task_id).__name__}")
        # a reset that fails leaves no episode behind: nothing to step in, no task in the state
        self._records, self._task_id, self._task, self._episode_id = [], None, None, None
        if task_id is not None and len(task_id) > MAX_TASK_ID_CHARS:
            raise UnknownTaskError(
                f"family {self.family!r} has no task id of {len(task_id)} characters (ids are at most {MAX_TASK_ID_CHARS}); "
                "list task ids with GET /tasks?split=train|test"
            )
        try:
            out = self.env.reset(task_id=task_id, seed=seed)
        except (LookupError, ValueError, FileNotFoundError, OSError) as exc:
            if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError) and exc.errno != errno.ENAMETOOLONG:
                raise  # the engine's own I/O failed: a server error, not the client's
            reason = exc.args[0] if exc.args else repr(exc)
            if isinstance(exc, OSError):
                reason = exc.strerror or reason
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
        return family_metadata(self.family)

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


@dataclass
class SessionOwner:
    """Who may use a session: its kind ("http" or "ws"), the client address that opened it, its token."""

    kind: str
    client: str
    token: str


def same_token(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("utf-8"))


# ---- the server -----------------------------------------------------------------------------
_MISSING = object()


class SdarEnvServer(HTTPEnvServer):
    """OpenEnv's HTTPEnvServer with session ids in observations, a tunable reaper, HTTP sessions,
    and sessions owned by whoever opened them."""

    def __init__(self, options: ServerOptions, operator_token: str | None = None):
        self.options = options
        self._operator_token = operator_token
        # built once up front: a bad family or kwargs fails here, before the port is served
        self.probe = build_text_env(options.family, options.env_kwargs)
        factory = functools.partial(
            SdarEnvironment, family=options.family, env_kwargs=dict(options.env_kwargs), max_action_chars=options.max_action_chars
        )
        # openenv/core/env_server/http_server.py (0.10), HTTPEnvServer.__init__: state_cls is what /schema
        # publishes as the state model; env_name names the environment in OpenEnv's listings
        super().__init__(
            factory,
            SdarAction,
            SdarObservation,
            concurrency_config=ConcurrencyConfig(
                max_concurrent_envs=options.max_sessions, session_timeout=options.session_ttl_s
            ),
            env_name=f"sdar-{options.family}",
            state_cls=SdarState,
        )
        # reclaimed session ids, remembered so that their owner learns 410 "reclaimed" instead of 404:
        # sid -> (why, SHA-256 of the session's token)
        self._expired: collections.OrderedDict[str, tuple[str, bytes]] = collections.OrderedDict()
        self._owners: dict[str, SessionOwner] = {}
        self._per_client: collections.Counter[str] = collections.Counter()
        # a WebSocket session's connection waits on this as well as on its client: set when it is reclaimed
        self._ws_reclaimed: dict[str, asyncio.Event] = {}
        # every open connection, counted per client address and in all (the uvicorn protocols admit them)
        self.connections = ConnectionLimits(options.connections_per_client_limit, options.connections_limit)
        self.sessions_created = 0

    # -- OpenEnv hooks ---------------------------------------------------------------------------
    def _factory_produces_harness_env(self) -> bool:
        # openenv 0.10 asks this in production mode (a yes adds its /harness route): its answer imports the harness
        # stack (openai, fastmcp: ~2 s of start-up) and, for a factory that is not a class, builds (and closes) a
        # whole environment to find out; a SdarEnvironment is never a HarnessEnvironment
        return False

    async def _create_session(self) -> tuple[str, Environment]:
        session_id, env = await super()._create_session()
        env.session_id = session_id  # type: ignore[attr-defined]
        self.sessions_created += 1
        return session_id, env

    async def _destroy_session(self, session_id: str) -> None:
        owner = self._owners.pop(session_id, None)
        if owner is not None:
            self._per_client[owner.client] -= 1
            if self._per_client[owner.client] <= 0:
                del self._per_client[owner.client]
        await super()._destroy_session(session_id)

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
                    owner = self._owners.get(sid)
                    self._remember_expired(sid, reason, owner.token if owner is not None else "")
                    await self._destroy_session(sid)
                    if (reclaimed := self._ws_reclaimed.get(sid)) is not None:
                        reclaimed.set()  # its connection closes with the reason
            except asyncio.CancelledError:
                break
            except Exception as exc:  # keep reaping whatever one bad session does
                log.warning("idle-session reaper error (will retry): %s", exc)

    def _remember_expired(self, sid: str, reason: str, token: str) -> None:
        self._expired[sid] = (reason, hashlib.sha256(token.encode()).digest())
        while len(self._expired) > 10_000:
            self._expired.popitem(last=False)

    def expired_reason(self, sid: str) -> str | None:
        """Why the reaper reclaimed `sid` (None if it did not, or has forgotten)."""
        return self._expired[sid][0] if sid in self._expired else None

    def reclaim_signal(self, sid: str) -> asyncio.Event:
        """An event the reaper sets when it reclaims `sid`: a WebSocket's connection waits on it beside its client
        (until drop_reclaim_signal)."""
        self._ws_reclaimed[sid] = event = asyncio.Event()
        return event

    def drop_reclaim_signal(self, sid: str) -> None:
        self._ws_reclaimed.pop(sid, None)

    async def close_session(self, sid: str) -> None:
        await self._destroy_session(sid)

    # -- ownership -------------------------------------------------------------------------------
    async def open_session(self, client: str, kind: str) -> tuple[str, SdarEnvironment, str]:
        """A new session owned by `client` (an address) over `kind` ("http" or "ws"), and its token."""
        cap = self.options.max_sessions_per_client
        held = self._per_client[client]
        if cap and held >= cap:
            raise TooManySessionsError(
                f"this client ({client}) already holds {held} open sessions, this server's limit per client "
                "(--max-sessions-per-client); close some (DELETE /sessions/{id}, or close WebSockets) first"
            )
        self._per_client[client] += 1  # counted before the first await, so parallel opens see it
        try:
            sid, env = await self._create_session()
        except BaseException:
            self._per_client[client] -= 1
            if self._per_client[client] <= 0:
                del self._per_client[client]
            raise
        token = secrets.token_urlsafe(32)
        self._owners[sid] = SessionOwner(kind=kind, client=client, token=token)
        return sid, env, token  # type: ignore[return-value]

    def is_operator(self, token: str | None) -> bool:
        return bool(token and self._operator_token and same_token(token, self._operator_token))

    def authorize(self, token: str | None, sid: str, action: str) -> SdarEnvironment:
        """The session's env if `token` may `action` ("read", "play" or "close") on it.

        Without a token nothing is said about the id (401 whether it is live, reclaimed or unknown). A
        reclaimed session is 410 to its own token and the operator's, 403 to any other (as a live one is);
        an unknown id is 404. Session ids are uuid4s (122 random bits): a status tells a token holder only
        about an id it already has."""
        if token is None:
            raise SessionAuthError(
                "session routes need the session's token: send 'Authorization: Bearer <session_token>' with the "
                "token POST /sessions returned (a WebSocket gets its own with {\"type\": \"session\"})"
            )
        if sid in self._expired and sid not in self._sessions:
            reason, digest = self._expired[sid]
            if hmac.compare_digest(hashlib.sha256(token.encode("utf-8", "replace")).digest(), digest) or self.is_operator(token):
                raise SessionGoneError(reason)
            raise SessionForbiddenError(f"that token does not open session {sid}")
        env = self._session_env(sid)
        owner = self._owners.get(sid)
        if owner is not None and same_token(token, owner.token):
            if action != "read" and owner.kind == "ws":
                raise SessionForbiddenError(
                    f"session {sid} belongs to its WebSocket connection; {action} it over that connection"
                )
            return env
        if action in ("read", "close") and self.is_operator(token):
            return env
        raise SessionForbiddenError(f"that token does not open session {sid}")

    def every_session(self, token: str) -> list[dict[str, Any]]:
        """Every session with its kind and client, for the operator's token (403 to any other)."""
        if not self.is_operator(token):
            raise SessionForbiddenError(
                "that is not this server's operator token"
                + ("" if self._operator_token else f" (none is set: start the server with {OPERATOR_TOKEN_ENV})")
            )
        return [
            {**info.model_dump(), "kind": self._owners[sid].kind, "client": self._owners[sid].client}
            for sid, info in list(self._session_info.items())
            if sid in self._owners
        ]

    # -- the session calls the routes make (sdar_envs.server_routes) --------------------------------
    def _session_env(self, sid: str) -> SdarEnvironment:
        env = self._sessions.get(sid, _MISSING)
        if env is _MISSING:
            raise HTTPException(
                404, f"unknown session {sid[:100]!r}; create one with POST /sessions (or open a WebSocket at /ws)"
            )
        if env is None:
            raise HTTPException(409, f"session {sid!r} is still starting; retry in a moment")
        return env  # type: ignore[return-value]

    async def _call(self, sid: str, call: Callable[[], Any], *, step: bool = False) -> Any:
        """`call()` (no arguments: what a client sent never meets this signature) in the session's executor."""
        out = await self._run_in_session_executor(sid, call)
        self._update_session_activity(sid, increment_step=step)
        return out

    @staticmethod
    def _validated(model: type[BaseModel], data: Any, what: str, example: str) -> Any:
        """`data` as `model`: a key the model lacks is an EnvRequestError naming it (400), a value of the wrong
        type or range a 422 with the errors; nothing a client sends reaches a call before this."""
        if not isinstance(data, dict):
            raise EnvRequestError(f"{what} data must be a JSON object like {example}, got {type(data).__name__}")
        unknown = sorted(str(k)[:40] for k in data if k not in model.model_fields)
        if unknown:
            raise EnvRequestError(
                f"unknown {what} parameter(s) {unknown[:10]}; {what} accepts {', '.join(model.model_fields)}, e.g. {example}"
            )
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise RequestValidationFailed(what, exc) from None

    async def reset_session(self, sid: str, env: SdarEnvironment, data: Any) -> SdarObservation:
        req = self._validated(SdarResetRequest, data, "reset", RESET_EXAMPLE)
        return await self._call(sid, functools.partial(env.reset, task_id=req.task_id, seed=req.seed, episode_id=req.episode_id))

    async def step_session(self, sid: str, env: SdarEnvironment, body: Any) -> SdarObservation:
        req = self._validated(SdarStepRequest, body, "step", STEP_EXAMPLE)
        return await self._call(sid, functools.partial(env.step, req.action), step=True)

    def info(self) -> dict[str, Any]:
        o = self.options
        return {
            "family": o.family,
            "env_kwargs": o.env_kwargs,
            "active_sessions": self.active_sessions,
            "max_sessions": o.max_sessions,
            "max_sessions_per_client": o.max_sessions_per_client,
            "sessions_created": self.sessions_created,
            "sessions_expired": len(self._expired),
            "session_ttl_s": o.session_ttl_s,
            "reap_interval_s": o.reap_every_s,
            "max_action_chars": o.max_action_chars,
            "max_body_bytes": o.max_body_bytes,
            "header_timeout_s": o.header_timeout_s,
            "body_timeout_s": o.body_timeout_s,
            "max_connections": self.connections.total,
            "max_connections_per_client": self.connections.per_client,
            "open_connections": self.connections.open,
            "operator_token": self._operator_token is not None,
            "sdar_version": __version__,
        }

    def session_counts(self, client: str) -> dict[str, Any]:
        kinds = collections.Counter(o.kind for o in self._owners.values())
        return {
            "active": len(self._sessions),
            "max": self.options.max_sessions,
            "http": kinds["http"],
            "websocket": kinds["ws"],
            "yours": self._per_client[client],
            "max_per_client": self.options.max_sessions_per_client,
            "connections": {**self.connections.figures(), "yours": self.connections.held_by(client)},
        }

    async def task_ids(self, split: str) -> list[str]:
        """The task ids of `split`, listed by the probe environment in the server's executor."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.probe.task_ids, split)

    async def close_all(self) -> None:
        for sid in list(self._sessions):
            await self._destroy_session(sid)
        try:
            self.probe.close()
        except Exception as exc:
            log.warning("closing the probe env failed: %s", exc)


class _QuietWebSocketClose:
    """ASGI middleware: a WebSocketDisconnect raised after the client left is noise, not an error,
    so it ends here."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            pass


def operator_token_from_env() -> str | None:
    """The operator token from SDAR_ENV_OPERATOR_TOKEN (None when unset or empty)."""
    token = os.environ.get(OPERATOR_TOKEN_ENV, "").strip()
    if not token:
        return None
    if len(token) < MIN_OPERATOR_TOKEN_CHARS:
        raise ValueError(
            f"{OPERATOR_TOKEN_ENV} has {len(token)} characters; use at least {MIN_OPERATOR_TOKEN_CHARS}, "
            "e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return token


# OpenEnv routes this module serves itself, and OpenEnv 0.10's task API, which it does not serve (see the module
# docstring); paths as openenv/core/env_server/http_server.py (0.10) registers them
_REPLACED_ROUTES = frozenset({"/ws", "/mcp", "/metadata"})
_UNSERVED_ROUTES = frozenset({"/list_environments", "/{env_name}/splits", "/{env_name}/tasks", "/{env_name}/num_tasks",
                              "/{env_name}/task", "/{env_name}/task_range"})


def create_env_app(options: ServerOptions, operator_token: str | None = None) -> FastAPI:
    """The FastAPI app serving `options.family`: OpenEnv's routes plus sdar's session routes.

    operator_token: the token that lists and closes every session (default: $SDAR_ENV_OPERATOR_TOKEN).
    """
    if operator_token is None:
        operator_token = operator_token_from_env()
    elif len(operator_token) < MIN_OPERATOR_TOKEN_CHARS:
        raise ValueError(f"the operator token needs at least {MIN_OPERATOR_TOKEN_CHARS} characters")
    server = SdarEnvServer(options, operator_token=operator_token)
    app = FastAPI(
        title=f"sdar environment server: {options.family}",
        version=__version__,
        description=__doc__,
    )
    server.register_routes(app, mode=ServerMode.PRODUCTION)
    dropped = _REPLACED_ROUTES | _UNSERVED_ROUTES
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in dropped]
    add_session_routes(app, server)
    publish_request_bodies(app, {("/sessions/{sid}/reset", "post"): (SdarResetRequest, False),
                                 ("/sessions/{sid}/step", "post"): (SdarStepRequest, True),
                                 ("/mcp", "post"): (JsonRpcRequest, True)})  # fmt: skip
    app.add_middleware(_QuietWebSocketClose)
    app.add_middleware(RequestGuard, max_body_bytes=options.max_body_bytes, body_timeout_s=options.body_timeout_s)
    app.state.sdar_server = server
    return app


def publish_request_bodies(app: FastAPI, bodies: dict[tuple[str, str], tuple[type[BaseModel], bool]]) -> None:
    """Declare the JSON body model of each (path, method) in the served OpenAPI document (components/schemas,
    referenced from the operation), so schema-driven clients and fuzzers see them. The routes read their
    bodies themselves (bounded by RequestGuard, with errors naming the problem) and validate them against
    these same models."""
    from pydantic.json_schema import models_json_schema

    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema and app.openapi_schema.get("x-sdar-bodies"):
            return app.openapi_schema
        schema = build()
        refs, defs = models_json_schema(
            [(model, "validation") for model, _ in bodies.values()], ref_template="#/components/schemas/{model}"
        )
        schema.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
        for (path, method), (model, required) in bodies.items():
            operation = schema["paths"][path][method]
            operation["requestBody"] = {
                "required": required,
                "content": {"application/json": {"schema": refs[(model, "validation")]}},
            }
        schema["x-sdar-bodies"] = True
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


WS_PING_TIMEOUT_S = 300.0  # seconds a WebSocket client may leave a keepalive ping unanswered before it is dropped


def uvicorn_config(app: FastAPI, options: ServerOptions) -> Any:
    import uvicorn

    limits = app.state.sdar_server.connections if hasattr(app.state, "sdar_server") else None
    http, ws = guarded_protocols(options.header_timeout_s, limits)
    return uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        log_level=options.log_level,
        # h11 with a deadline on request heads (uvicorn has none) and every connection, WebSockets included,
        # counted per client address and in all (ConnectionLimits); bodies are bounded by RequestGuard
        http=http,
        ws=ws,
        h11_max_incomplete_event_size=16 * 1024,  # request line + headers
        timeout_keep_alive=options.keep_alive_s,
        # ours instead: uvicorn's counts no WebSocket upgrade and answers every request 503, /health included
        limit_concurrency=None,
        # the per-client limits count the peer address; a forwarded header must not move it
        proxy_headers=False,
        # the transport limit only stops absurd frames; the action limit gives the clear error
        ws_max_size=max(1 << 20, options.max_body_bytes),
        ws_per_message_deflate=False,  # loopback and cluster-local traffic: CPU matters more than bytes
        # keepalive: a client that answers no ping for 5 minutes is gone (uvicorn's 20 s closed the sessions of
        # live trainers whose event-loop thread a loaded CPU starved for longer: SmolLM2 pipeline runs on 2 cores
        # lost an arm's rollout so); idle sessions are reclaimed by --session-ttl all the same
        ws_ping_interval=30.0,
        ws_ping_timeout=WS_PING_TIMEOUT_S,
        timeout_graceful_shutdown=3,
        access_log=options.log_level == "debug",
    )


def env_server(app: FastAPI, options: ServerOptions, probe_sock: socket.socket | None = None) -> Any:
    """The uvicorn.Server serving `app`, and with `probe_sock` the probe listener (GET /health) beside it."""
    import uvicorn

    class EnvServer(uvicorn.Server):
        probe = ProbeListener(probe_sock) if probe_sock is not None else None

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.probe is not None and not self.should_exit:
                await self.probe.start()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if self.probe is not None:
                await self.probe.close()
            await super().shutdown(sockets)

    return EnvServer(uvicorn_config(app, options))


def bound_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def _raise_open_file_limit(wanted: int) -> None:
    """Every connection is a file descriptor: lift the soft limit toward `wanted` (up to the hard limit)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def run_server(options: ServerOptions, sock: socket.socket | None = None, probe_sock: socket.socket | None = None) -> None:
    """Serve until interrupted; `sock` (and `probe_sock`) are already bound sockets (background servers pass
    them); without `probe_sock`, options.probe_port is bound here when set."""
    if probe_sock is None and options.probe_port is not None:
        probe_sock = bound_socket(options.host, options.probe_port)
    _raise_open_file_limit(options.connections_limit + 1024)
    app = create_env_app(options)
    server = env_server(app, options, probe_sock)
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
    parser = argparse.ArgumentParser(prog="python -m sdar_envs.server", description="Serve one sdar environment family.")
    add_serve_arguments(parser)
    parser.add_argument("--fd", type=int, default=None, help="serve on this already bound socket (used by serve_in_background)")
    parser.add_argument("--probe-fd", type=int, default=None, help="answer probes on this already bound socket (used by serve_in_background)")
    parser.add_argument("--parent-pid", type=int, default=None, help="stop when this process is gone (used by serve_in_background)")
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        _exit_with_parent(args.parent_pid)
    options = options_from_args(args)
    sock = socket.socket(fileno=args.fd) if args.fd is not None else None
    probe_sock = socket.socket(fileno=args.probe_fd) if args.probe_fd is not None else None
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"serving {options.family} with {json.dumps(asdict(options))}", file=sys.stderr, flush=True)
    run_server(options, sock, probe_sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
