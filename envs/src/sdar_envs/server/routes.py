"""What a client speaks to a SdarEnvServer (sdar_envs.server.sessions): the WebSocket message protocol at /ws, the stateful
HTTP session routes (/sessions...), POST /mcp's JSON-RPC session methods, /info, /tasks and /metadata. Each reads and
checks what the client sent, calls the server's session table, and answers with a status and a message."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, Protocol

from fastapi import FastAPI, HTTPException, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from openenv.core.env_server.exceptions import EnvironmentFactoryError, SessionCapacityError
from openenv.core.env_server.mcp_types import JsonRpcErrorCode, JsonRpcRequest, JsonRpcResponse
from openenv.core.env_server.serialization import serialize_observation
from openenv.core.env_server.types import (
    EnvironmentMetadata,
    WSErrorCode,
    WSErrorResponse,
    WSObservationResponse,
    WSResetMessage,
    WSStateMessage,
    WSStateResponse,
    WSStepMessage,
)
from pydantic import ValidationError

from sdar_envs.openenv_models import family_metadata
from sdar_envs.server.config import ServerOptions
from sdar_envs.server.errors import (
    ActionTooLongError,
    EnvRequestError,
    RequestValidationFailed,
    SessionGoneError,
    TooManySessionsError,
)
from sdar_envs.server.limits import BadJSON, loads_guarded


class SessionEnv(Protocol):
    """One session's environment as the routes read it (sdar_envs.server.environment.SdarEnvironment)."""

    @property
    def state(self) -> Any: ...

    def observation_at(self, t: int) -> Any: ...


class SessionTable(Protocol):
    """What the routes call on the server: the session table and its limits, and nothing else. The server
    (sdar_envs.server.sessions.SdarEnvServer) implements it; the routes know it only through this interface."""

    options: ServerOptions

    def authorize(self, token: str | None, sid: str, action: str) -> SessionEnv: ...
    async def open_session(self, client: str, kind: str) -> tuple[str, SessionEnv, str]: ...
    async def close_session(self, sid: str) -> None: ...
    async def close_all(self) -> None: ...
    async def reset_session(self, sid: str, env: SessionEnv, data: Any) -> Any: ...
    async def step_session(self, sid: str, env: SessionEnv, body: Any) -> Any: ...
    def every_session(self, token: str) -> list[dict[str, Any]]: ...
    def expired_reason(self, sid: str) -> str | None: ...
    def reclaim_signal(self, sid: str) -> asyncio.Event: ...
    def drop_reclaim_signal(self, sid: str) -> None: ...
    def info(self) -> dict[str, Any]: ...
    def session_counts(self, client: str) -> dict[str, Any]: ...
    async def task_ids(self, split: str) -> list[str]: ...


log = logging.getLogger("sdar_envs.server")

_WS_EXAMPLE = '{"type": "step", "data": {"message": "look"}}'
RESET_EXAMPLE = '{"task_id": "...", "seed": 0}'
STEP_EXAMPLE = '{"action": {"message": "look"}}'
# a reclaimed WebSocket session's connection is closed with this code ("going away") and the reason
WS_RECLAIMED_CLOSE_CODE = 1001


def client_address(scope: Any) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def bearer_token(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


async def json_body(server: SessionTable, request: Request, example: str) -> dict[str, Any]:
    """The request's body as a JSON object ({} when empty); anything else is an EnvRequestError naming `example`."""
    body = await request.body()  # RequestGuard has read it within max_body_bytes and body_timeout_s
    if len(body) > server.options.max_body_bytes:
        raise ActionTooLongError(
            f"request body has {len(body)} bytes, over this server's limit of {server.options.max_body_bytes}")
    if not body.strip():
        return {}
    try:
        data = loads_guarded(body)
    except BadJSON as exc:
        raise EnvRequestError(f"{exc}; send a JSON object like {example}") from None
    if not isinstance(data, dict):
        raise EnvRequestError(f"the body must be a JSON object like {example}, got {type(data).__name__}")
    return data


def capacity_error(exc: SessionCapacityError) -> HTTPException:
    return HTTPException(
        503,
        f"server is at capacity ({exc.active_sessions}/{exc.max_sessions} sessions); close sessions "
        "(DELETE /sessions/{id}, or close WebSockets) or restart with a larger --max-sessions",
    )


# ---- the WebSocket session -----------------------------------------------------------------------
def ws_error(message: str, code: str, **extra: Any) -> str:
    return WSErrorResponse(data={"message": message, "code": code, **extra}).model_dump_json()


async def serve_websocket(server: SessionTable, websocket: WebSocket) -> None:
    """One session per connection, in OpenEnv's message protocol, plus {"type": "session"} (its
    id and token). A frame the server cannot use gets an error message; the session goes on."""
    await websocket.accept()
    try:
        sid, env, token = await server.open_session(client_address(websocket.scope), "ws")
    except (SessionCapacityError, TooManySessionsError, EnvironmentFactoryError) as exc:
        if isinstance(exc, SessionCapacityError):
            reply = ws_error(
                str(exc), WSErrorCode.CAPACITY_REACHED, active_sessions=exc.active_sessions, max_sessions=exc.max_sessions
            )
        elif isinstance(exc, TooManySessionsError):
            reply = ws_error(str(exc), "TOO_MANY_SESSIONS")
        else:
            reply = ws_error(f"could not build a {server.options.family} environment: {exc.__cause__ or exc}", WSErrorCode.FACTORY_ERROR)
        with contextlib.suppress(Exception):
            await websocket.send_text(reply)
            await websocket.close()
        return
    disconnected = reclaimed = False
    gone = server.reclaim_signal(sid)
    gone_wait = asyncio.ensure_future(gone.wait())
    try:
        while True:
            receive = asyncio.ensure_future(websocket.receive())
            await asyncio.wait({receive, gone_wait}, return_when=asyncio.FIRST_COMPLETED)
            if not receive.done():  # reclaimed while waiting for the client
                receive.cancel()
                with contextlib.suppress(BaseException):
                    await receive
                reclaimed = True
                break
            message = receive.result()
            if message["type"] == "websocket.disconnect":
                disconnected = True
                break
            reply = await _ws_reply(server, sid, env, token, message)
            if reply is None:
                break
            await websocket.send_text(reply)
    except WebSocketDisconnect:
        disconnected = True
    finally:
        gone_wait.cancel()
        server.drop_reclaim_signal(sid)
        await server.close_session(sid)
        if reclaimed:  # say why (a client reads it as the answer to its next message), then close
            why = server.expired_reason(sid) or "this session was reclaimed; reconnect"
            with contextlib.suppress(Exception):
                await websocket.send_text(ws_error(why, "SESSION_EXPIRED", error=SessionGoneError.kind))
                await websocket.close(WS_RECLAIMED_CLOSE_CODE, f"session idle over {server.options.session_ttl_s:g} s, reclaimed; reconnect")
        elif not disconnected:
            with contextlib.suppress(Exception):
                await websocket.close()


async def _ws_reply(server: SessionTable, sid: str, env: SessionEnv, token: str, message: dict[str, Any]) -> str | None:
    text = message.get("text")
    if text is None:
        return ws_error(f"binary frames are not understood; send JSON text like {_WS_EXAMPLE}", WSErrorCode.INVALID_JSON)
    try:
        data = loads_guarded(text)
    except BadJSON as exc:
        return ws_error(f"Invalid JSON: {exc}; send a message like {_WS_EXAMPLE}", WSErrorCode.INVALID_JSON)
    if not isinstance(data, dict):
        return ws_error(
            f"a message is a JSON object like {_WS_EXAMPLE}, got {type(data).__name__}", WSErrorCode.VALIDATION_ERROR
        )
    kind = data.get("type")
    try:
        if kind == "reset":
            obs = await server.reset_session(sid, env, WSResetMessage.model_validate(data).data)
            return WSObservationResponse(data=serialize_observation(obs)).model_dump_json()
        if kind == "step":
            obs = await server.step_session(sid, env, {"action": WSStepMessage.model_validate(data).data})
            return WSObservationResponse(data=serialize_observation(obs)).model_dump_json()
        if kind == "state":
            WSStateMessage.model_validate(data)
            return WSStateResponse(data=env.state.model_dump()).model_dump_json()
        if kind == "close":
            return None
        if kind == "session":
            return json.dumps({"type": "session", "data": {"session_id": sid, "session_token": token}})
        if kind == "mcp":
            return ws_error("this environment has no MCP tools; send reset, step and state messages", WSErrorCode.UNKNOWN_TYPE)
        shown = kind if isinstance(kind, str) and len(kind) <= 40 else type(kind).__name__
        return ws_error(
            f"Unknown message type: {shown!r}; send reset, step, state, session or close", WSErrorCode.UNKNOWN_TYPE
        )
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        return ws_error("Invalid message", WSErrorCode.VALIDATION_ERROR, errors=errors)
    except RequestValidationFailed as exc:
        return ws_error(str(exc), WSErrorCode.VALIDATION_ERROR, errors=exc.errors)
    except EnvRequestError as exc:
        code = WSErrorCode.VALIDATION_ERROR if type(exc) is EnvRequestError else WSErrorCode.EXECUTION_ERROR
        return ws_error(str(exc), code, error=exc.kind)
    except Exception as exc:
        log.warning("session %s: %s failed: %r", sid, kind, exc)
        return ws_error(str(exc), WSErrorCode.EXECUTION_ERROR)


# ---- POST /mcp: OpenEnv's session lifecycle methods, with tokens ---------------------------------
async def json_rpc(server: SessionTable, request: Request) -> JSONResponse:
    """POST /mcp: OpenEnv's session lifecycle over JSON-RPC (openenv/session/create and close, with tokens); these
    environments have no MCP tools."""
    def answer(status: int, rpc: JsonRpcResponse) -> JSONResponse:
        return JSONResponse(rpc.model_dump(), status_code=status)

    data = await json_body(server, request, '{"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1}')
    try:
        rpc = JsonRpcRequest.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        return answer(400, JsonRpcResponse.error_response(JsonRpcErrorCode.INVALID_REQUEST, f"Invalid request: {errors}"))
    rid, params = rpc.id, rpc.params
    if rpc.method == "openenv/session/create":
        try:
            sid, _env, token = await server.open_session(client_address(request.scope), "http")
        except TooManySessionsError as exc:
            return answer(429, JsonRpcResponse.error_response(JsonRpcErrorCode.SERVER_ERROR, str(exc), request_id=rid))
        except SessionCapacityError as exc:
            return answer(503, JsonRpcResponse.error_response(JsonRpcErrorCode.SERVER_ERROR, str(exc), request_id=rid))
        return answer(200, JsonRpcResponse.success({"session_id": sid, "session_token": token}, request_id=rid))
    if rpc.method == "openenv/session/close":
        sid = params.get("session_id")
        if not isinstance(sid, str) or not sid:
            return answer(400, JsonRpcResponse.error_response(JsonRpcErrorCode.INVALID_PARAMS, "params need 'session_id'", request_id=rid))
        given = params.get("session_token")
        token = given if isinstance(given, str) and given else bearer_token(request)
        try:
            server.authorize(token, sid, "close")
        except (EnvRequestError, HTTPException) as exc:
            status = exc.status if isinstance(exc, EnvRequestError) else exc.status_code
            detail = str(exc) if isinstance(exc, EnvRequestError) else str(exc.detail)
            return answer(status, JsonRpcResponse.error_response(JsonRpcErrorCode.INVALID_PARAMS, detail, request_id=rid))
        await server.close_session(sid)
        return answer(200, JsonRpcResponse.success({"session_id": sid, "closed": True}, request_id=rid))
    if rpc.method in ("tools/list", "tools/call"):
        message = f"the {server.options.family} environment has no MCP tools; play it over /ws or /sessions"
        return answer(404, JsonRpcResponse.error_response(JsonRpcErrorCode.METHOD_NOT_FOUND, message, request_id=rid))
    return answer(
        404,
        JsonRpcResponse.error_response(
            JsonRpcErrorCode.METHOD_NOT_FOUND,
            f"Method not found: {rpc.method[:80]!r}; this server has openenv/session/create and openenv/session/close",
            request_id=rid,
        ),
    )


# ---- routes ------------------------------------------------------------------------------------
def add_session_routes(app: FastAPI, server: SessionTable) -> None:
    """Stateful HTTP sessions, state(t), /info, /tasks, and our /ws, /mcp and /metadata."""

    @app.exception_handler(EnvRequestError)
    async def _env_error(_request: Request, exc: EnvRequestError) -> JSONResponse:
        if isinstance(exc, RequestValidationFailed):  # FastAPI's shape: the errors, each with its loc
            return JSONResponse({"detail": exc.errors, "error": exc.kind, "message": str(exc)}, status_code=exc.status)
        return JSONResponse({"detail": str(exc), "error": exc.kind}, status_code=exc.status, headers=getattr(exc, "headers", None))

    @app.websocket("/ws")
    async def websocket_session(websocket: WebSocket) -> None:
        await serve_websocket(server, websocket)

    @app.post("/mcp", tags=["Sessions"], summary="JSON-RPC: openenv/session/create, openenv/session/close")
    async def mcp(request: Request) -> JSONResponse:
        return await json_rpc(server, request)

    @app.get("/metadata", response_model=EnvironmentMetadata, tags=["Environment Info"], summary="Environment metadata")
    async def metadata() -> EnvironmentMetadata:
        return family_metadata(server.options.family)

    @app.get("/info", tags=["Environment Info"], summary="Family, limits and session counts")
    async def info() -> dict[str, Any]:
        return server.info()

    @app.get("/tasks", tags=["Environment Info"], summary="Task ids of a split")
    async def tasks(split: str = "test") -> dict[str, Any]:
        try:
            ids = await server.task_ids(split)
        except NotImplementedError as exc:
            raise HTTPException(404, f"family {server.options.family!r} has no fixed task list ({exc}); reset with a seed instead") from None
        except (KeyError, ValueError) as exc:
            raise HTTPException(400, f"cannot list split {split[:100]!r}: {exc.args[0] if exc.args else exc}") from None
        return {"family": server.options.family, "split": split, "task_ids": list(ids)}

    _add_session_table_routes(app, server)


def _add_session_table_routes(app: FastAPI, server: SessionTable) -> None:
    """GET and POST /sessions, and the routes of one session: reset, step, state(t), close."""

    @app.get("/sessions", tags=["Sessions"], summary="Session counts; every session with the operator token")
    async def list_sessions(request: Request) -> dict[str, Any]:
        out = server.session_counts(client_address(request.scope))
        token = bearer_token(request)
        if token is not None:
            out["sessions"] = server.every_session(token)  # the operator's token only
        return out

    @app.post("/sessions", status_code=201, tags=["Sessions"], summary="Open a session; keep its session_token")
    async def create_session(request: Request) -> dict[str, Any]:
        await json_body(server, request, "{}")  # nothing to configure yet; a bad body is still refused
        try:
            sid, _env, token = await server.open_session(client_address(request.scope), "http")
        except SessionCapacityError as exc:
            raise capacity_error(exc) from None
        except EnvironmentFactoryError as exc:
            raise HTTPException(500, f"could not build a {server.options.family} environment: {exc.__cause__ or exc}") from None
        return {"session_id": sid, "session_token": token, "family": server.options.family}

    @app.post("/sessions/{sid}/reset", tags=["Sessions"], summary="Start an episode: {task_id, seed}")
    async def reset(sid: str, request: Request) -> dict[str, Any]:
        env = server.authorize(bearer_token(request), sid, "play")
        return serialize_observation(await server.reset_session(sid, env, await json_body(server, request, RESET_EXAMPLE)))

    @app.post("/sessions/{sid}/step", tags=["Sessions"], summary='Act: {"action": {"message": str}}')
    async def step(sid: str, request: Request) -> dict[str, Any]:
        env = server.authorize(bearer_token(request), sid, "play")
        return serialize_observation(await server.step_session(sid, env, await json_body(server, request, STEP_EXAMPLE)))

    @app.get("/sessions/{sid}/state", tags=["Sessions"], summary="State, or the exact observation of step t")
    async def state(sid: str, request: Request, t: int | None = None) -> dict[str, Any]:
        env = server.authorize(bearer_token(request), sid, "read")
        if t is None:
            return env.state.model_dump()
        return serialize_observation(env.observation_at(t))

    @app.delete("/sessions/{sid}", tags=["Sessions"], summary="Close a session and its environment")
    async def close(sid: str, request: Request) -> dict[str, Any]:
        server.authorize(bearer_token(request), sid, "close")
        await server.close_session(sid)
        return {"session_id": sid, "closed": True}

    async def _shutdown() -> None:
        await server.close_all()

    app.router.on_shutdown.append(_shutdown)
