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

Connections are bounded before they reach any route (`sdar_envs.server.limits.ConnectionLimits`): one client
address holds at most `connections_per_client_limit` open connections, HTTP and WebSocket alike (one more is
answered 429 at once and closed), the server `connections_limit` in all (503). uvicorn's own
limit_concurrency is off: it counts no WebSocket upgrade and answers /health 503 like everything else. With
--probe-port a second port answers GET /health only, outside these limits, for the kubelet.

Every bad input is a 4xx with a message, read within bounds (`sdar_envs.server.limits`): bodies over
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

This module builds the app (`create_env_app`) around the session table (`SdarEnvServer`, sdar_envs.server.sessions:
sessions, owners, tokens, the reaper), which holds each session's environment (`SdarEnvironment`,
sdar_envs.server.environment); what a client speaks to it (the routes, /mcp and the WebSocket protocol) is
`sdar_envs.server.routes`, the errors it answers `sdar_envs.server.errors`; the process that serves it (uvicorn, the
command line) is `sdar_envs.server.process`.
"""

from __future__ import annotations

import os
from typing import Any

# first, so that openenv is imported without its Gradio web UI (see openenv_models)
from sdar_envs.openenv_models import SdarResetRequest, SdarStepRequest

# isort: split
from fastapi import FastAPI, WebSocketDisconnect
from openenv.core.env_server.mcp_types import JsonRpcRequest
from openenv.core.env_server.types import ServerMode
from pydantic import BaseModel

from sdar_envs import __version__
from sdar_envs.server.config import MIN_OPERATOR_TOKEN_CHARS, OPERATOR_TOKEN_ENV, ServerOptions
from sdar_envs.server.limits import RequestGuard
from sdar_envs.server.routes import add_session_routes
from sdar_envs.server.sessions import SdarEnvServer


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
