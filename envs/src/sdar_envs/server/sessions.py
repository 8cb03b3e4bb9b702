"""The session table: `SdarEnvServer` (OpenEnv's HTTPEnvServer with sessions owned by whoever opened them, their
tokens, a tunable reaper that remembers what it reclaimed, and the session calls the routes make) and
`SessionOwner`. The routes (sdar_envs.server.routes) reach it only through their `SessionTable` protocol."""

from __future__ import annotations

import asyncio
import collections
import functools
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# first, so that openenv is imported without its Gradio web UI (see openenv_models)
from sdar_envs.openenv_models import (
    SdarAction,
    SdarObservation,
    SdarResetRequest,
    SdarState,
    SdarStepRequest,
)

# isort: split
from fastapi import HTTPException
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import ConcurrencyConfig
from pydantic import BaseModel, ValidationError

from sdar_envs import __version__
from sdar_envs.server.config import OPERATOR_TOKEN_ENV, ServerOptions
from sdar_envs.server.environment import SdarEnvironment, build_text_env
from sdar_envs.server.errors import (
    EnvRequestError,
    RequestValidationFailed,
    SessionAuthError,
    SessionForbiddenError,
    SessionGoneError,
    TooManySessionsError,
)
from sdar_envs.server.limits import ConnectionLimits
from sdar_envs.server.routes import RESET_EXAMPLE, STEP_EXAMPLE

log = logging.getLogger("sdar_envs.server")


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

    # -- the session calls the routes make (sdar_envs.server.routes) --------------------------------
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
