"""Bounds on what an environment server holds and reads before it answers: open connections per client
address and in all, body size and time, header time, and JSON that stays cheap to parse (UTF-8, nesting
depth, integer digits, no lone surrogates).

Used by the app and the process (`sdar_envs.server.app`, `sdar_envs.server.process`): `RequestGuard` wraps the
ASGI app; `guarded_protocols` gives uvicorn's HTTP and WebSocket protocols with a deadline on request heads and every connection counted against
`ConnectionLimits` (a WebSocket stays counted from its upgrade to its close); `ProbeListener` answers
GET /health on a port of its own, outside those limits; `loads_guarded` parses every JSON body and frame.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
import socket
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

log = logging.getLogger(__name__)

MAX_JSON_DEPTH = 32  # our bodies nest 2-4 deep; json.loads recurses in C and fails near 1,000-40,000
MAX_INT_DIGITS = 64  # seeds fit in 20; int() itself refuses 4,300+ digits with a ValueError
MAX_TASK_ID_CHARS = 1024


class BadJSON(ValueError):
    """A JSON body or frame this server will not parse; the message says what to send instead."""


# one pass over the text: strings (skipped) or brackets (counted)
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise BadJSON(f"an integer of {len(digits.lstrip('-'))} digits is over this server's limit of {MAX_INT_DIGITS}")
    return int(digits)


def _no_constant(name: str) -> Any:
    raise BadJSON(f"{name} is not JSON; send numbers as finite values")


def json_depth(text: str, limit: int = MAX_JSON_DEPTH) -> int:
    """Deepest bracket nesting of `text` outside strings, counting only up to limit + 1."""
    depth = deepest = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif token in "]}":
            depth -= 1
    return deepest


def _check_strings(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise BadJSON("a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff); send valid Unicode") from None
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def loads_guarded(raw: bytes | str) -> Any:
    """json.loads for untrusted input: every way it can fail is a `BadJSON` naming the problem."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadJSON(f"the body is not UTF-8 (byte {exc.start}: {exc.reason}); send UTF-8 JSON") from None
    else:
        text = raw
    if json_depth(text) > MAX_JSON_DEPTH:
        raise BadJSON(f"JSON nested deeper than this server's limit of {MAX_JSON_DEPTH} levels")
    try:
        data = json.loads(text, parse_int=_parse_int, parse_constant=_no_constant)
    except BadJSON:
        raise
    except json.JSONDecodeError as exc:
        raise BadJSON(f"malformed JSON ({exc})") from None
    except (ValueError, RecursionError) as exc:
        raise BadJSON(f"malformed JSON ({exc})") from None
    if _SURROGATE_ESCAPE.search(text):
        _check_strings(data)
    return data


def error_body(status: int, kind: str, message: str) -> bytes:
    return json.dumps({"detail": message, "error": kind}).encode()


async def send_error(send: Any, status: int, kind: str, message: str, close: bool) -> None:
    """A JSON error response; `close` when the request body was not read to its end (the
    connection cannot carry another request, and a slow sender must not keep it)."""
    body = error_body(status, kind, message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """ASGI middleware: reads every HTTP request body itself, within `max_body_bytes` (checked on
    Content-Length before reading, and while reading chunked bodies) and `body_timeout_s`, refuses
    bodies of POST/PUT/PATCH that `loads_guarded` refuses, then replays the body to the app."""

    JSON_METHODS = frozenset({"POST", "PUT", "PATCH"})

    def __init__(self, app: Any, max_body_bytes: int, body_timeout_s: float) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length: int | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = int(value)  # h11 has checked it is one decimal number
            elif name == b"transfer-encoding":
                chunked = True
        limit = self.max_body_bytes
        if length is not None and length > limit:
            return await send_error(
                send, 413, "body_too_large",
                f"request body of {length} bytes is over this server's limit of {limit} bytes; send a shorter "
                "request (actions are limited by --max-action-chars)",
                close=True,
            )  # fmt: skip
        if not chunked and not length:
            return await self.app(scope, receive, send)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_s
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except asyncio.TimeoutError:
                return await send_error(
                    send, 408, "body_timeout",
                    f"the request body did not arrive within {self.body_timeout_s:g} s ({size} bytes read); send it at once",
                    close=True,
                )  # fmt: skip
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await send_error(
                    send, 413, "body_too_large",
                    f"request body is over this server's limit of {limit} bytes (read {size} before stopping)",
                    close=True,
                )  # fmt: skip
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(parts)
        if scope["method"] in self.JSON_METHODS and body.strip():
            try:
                loads_guarded(body)
            except BadJSON as exc:
                return await send_error(send, 400, "bad_json", str(exc), close=False)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _raw_error(status: int, reason: str, kind: str, message: str) -> bytes:
    body = error_body(status, kind, message)
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


class ConnectionLimits:
    """Open connections of one server, per client address and in all. HTTP and WebSocket connections count
    alike: a connection is admitted when it is accepted and released when it closes, whatever protocol
    carries it by then (an upgraded WebSocket keeps its place). `per_client` 0: no per-address limit."""

    def __init__(self, per_client: int, total: int) -> None:
        self.per_client = per_client
        self.total = total
        self._open: dict[Any, str] = {}  # transport -> client address
        self._by_client: collections.Counter[str] = collections.Counter()
        self.refused_per_client = 0
        self.refused_total = 0

    def admit(self, transport: Any, client: str) -> tuple[int, str] | None:
        """None when `transport` may stay open (it is then counted), else (status, why) to answer it with."""
        if self.per_client and self._by_client[client] >= self.per_client:
            self.refused_per_client += 1
            return 429, (
                f"this client ({client}) already holds {self._by_client[client]} open connections, this server's limit "
                "per client address (--max-connections-per-client); close some before opening more"
            )
        if len(self._open) >= self.total:
            self.refused_total += 1
            return 503, f"this server holds {len(self._open)} open connections, its limit (--max-connections); retry later"
        self._open[transport] = client
        self._by_client[client] += 1
        return None

    def release(self, transport: Any) -> None:
        client = self._open.pop(transport, None)
        if client is None:
            return
        self._by_client[client] -= 1
        if self._by_client[client] <= 0:
            del self._by_client[client]

    @property
    def open(self) -> int:
        return len(self._open)

    def held_by(self, client: str) -> int:
        return self._by_client[client]

    def figures(self) -> dict[str, int]:
        return {
            "open": self.open,
            "max": self.total,
            "max_per_client": self.per_client,
            "refused_per_client": self.refused_per_client,
            "refused_total": self.refused_total,
        }


def _peer(transport: Any) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, (tuple, list)) and peer else "unknown"


REFUSED_ANSWER_WAIT_S = 0.25  # a refused connection is answered on its first bytes, a silent one after this long
REFUSED_LINGER_S = 2.0  # a refused connection gets its answer, then this long to read it before it is closed


class _GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head, and every connection admitted by the
    server's `ConnectionLimits` (a refused one gets a 429 or 503 on its first bytes, or within REFUSED_ANSWER_WAIT_S, and is closed).

    uvicorn arms its keep-alive timer only after a response and cancels it on any byte, so a
    connection that never finishes its request line and headers is otherwise held forever.
    """

    header_timeout_s = 10.0
    limits: ConnectionLimits | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._refusal: tuple[int, str] | None = None

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return
        self.transport.write(
            _raw_error(408, "Request Timeout", "header_timeout", f"no complete request head within {self.header_timeout_s:g} s")
        )
        self.transport.close()

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        refusal = self.limits.admit(transport, _peer(transport)) if self.limits is not None else None
        if refusal is None:
            self._arm_head_timer()
            return
        # refused before its request is parsed: the answer goes out when the request's first bytes arrive (a
        # client that writes its request after connecting, as a WebSocket client's handshake does, would
        # otherwise find the connection closed before it could send, and never read the status) or after
        # REFUSED_ANSWER_WAIT_S for a silent one; then end of stream, and what the client sends meanwhile is
        # read and dropped (closing with unread data would reset the connection and could discard the answer
        # on the client's side); the connection is closed REFUSED_LINGER_S later either way
        self._refused = True
        self._refusal = refusal
        self.loop.call_later(REFUSED_ANSWER_WAIT_S, self._answer_refusal)

    def _answer_refusal(self) -> None:
        if self._refusal is None or self.transport.is_closing():
            return
        (status, why), self._refusal = self._refusal, None
        reason = "Too Many Requests" if status == 429 else "Service Unavailable"
        self.transport.write(_raw_error(status, reason, "too_many_connections" if status == 429 else "server_full", why))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(REFUSED_LINGER_S, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            self._answer_refusal()
            return
        try:
            super().data_received(data)
        except Exception as exc:  # e.g. a request target that is not ASCII: answer, do not reset
            self.logger.debug("refused a request uvicorn could not parse: %r", exc)
            if not self.transport.is_closing():
                self.transport.write(_raw_error(400, "Bad Request", "bad_request", "the request line or headers are not valid HTTP/1.1"))
                self.transport.close()
            return
        if self.conn.their_state is not h11.IDLE:
            self._cancel_head_timer()

    def eof_received(self) -> bool | None:
        if self._refused:
            self._answer_refusal()  # the client has sent all it will: the answer is flushed, then the close
            self.transport.close()
            return None
        return super().eof_received()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_head_timer()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._cancel_head_timer()
        super().handle_websocket_upgrade(event)  # the WebSocket protocol takes over this transport, still counted

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self.limits is not None:
            self.limits.release(self.transport)
        if self._refused:
            self.connections.discard(self)
            return
        super().connection_lost(exc)


def _release_on_close(base: type) -> type:
    """uvicorn's WebSocket protocol `base`, releasing its connection's place in the limits when it closes."""

    def connection_lost(self: Any, exc: Exception | None) -> None:
        if self.limits is not None:
            self.limits.release(self.transport)
        base.connection_lost(self, exc)

    return type(f"Guarded{base.__name__}", (base,), {"limits": None, "connection_lost": connection_lost})


def guarded_protocols(header_timeout_s: float, limits: ConnectionLimits | None = None) -> tuple[type, type]:
    """(http, ws) protocol classes to give uvicorn.Config(http=..., ws=...): request heads taking longer than
    `header_timeout_s` get a 408 and lose their connection; with `limits`, every connection (WebSockets from
    their upgrade to their close included) is counted against them. Use uvicorn's own limit_concurrency=None:
    it does not count WebSocket upgrades and answers /health with 503 like any other request."""
    http = type("GuardedH11Protocol", (_GuardedH11Protocol,), {"header_timeout_s": float(header_timeout_s), "limits": limits})
    if AutoWebSocketsProtocol is None:
        raise RuntimeError("no WebSocket implementation: pip install websockets")
    ws = _release_on_close(AutoWebSocketsProtocol)  # type: ignore[arg-type]
    ws.limits = limits
    return http, ws


def guarded_h11_protocol(header_timeout_s: float) -> type[H11Protocol]:
    """The HTTP protocol class alone (no connection limits); see `guarded_protocols`."""
    return guarded_protocols(header_timeout_s)[0]


# ---- the probe port ----------------------------------------------------------------------------------
class ProbeListener:
    """GET /health (and HEAD) on a socket of its own, in the server's event loop: it answers while that loop
    runs, whatever the main port's clients hold. Each connection gets one answer within `timeout_s` and is
    closed; at most `max_connections` at once and `per_address` from one address (it is meant for the
    kubelet, which probes a container a few at a time: a client that reaches this port anyway cannot fill it)."""

    def __init__(self, sock: socket.socket, timeout_s: float = 2.0, max_connections: int = 32, per_address: int = 4) -> None:
        self.sock = sock
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.per_address = per_address
        self.answered = 0
        self._active: collections.Counter[str] = collections.Counter()
        self._server: asyncio.base_events.Server | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, sock=self.sock, limit=4096)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = _peer(writer.transport)
        if sum(self._active.values()) >= self.max_connections or self._active[client] >= self.per_address:
            writer.close()
            return
        self._active[client] += 1
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout_s)
            except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0].split("?", 1)[0]
            if method in ("GET", "HEAD") and path in ("/health", "/healthz", "/livez", "/readyz"):
                status, reason, body = 200, "OK", b'{"status": "healthy"}'
            else:
                status, reason, body = 404, "Not Found", error_body(404, "not_found", "this port answers GET /health only")
            head_out = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
            writer.write(head_out.encode() + (b"" if method == "HEAD" else body))
            self.answered += status == 200
            await asyncio.wait_for(writer.drain(), self.timeout_s)
        except (asyncio.TimeoutError, ConnectionError) as exc:
            log.debug("probe connection dropped: %r", exc)
        finally:
            self._active[client] -= 1
            if self._active[client] <= 0:
                del self._active[client]
            writer.close()
