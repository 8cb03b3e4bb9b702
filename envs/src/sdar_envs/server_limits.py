"""Bounds on what an environment server reads before it answers: body size and time, header time,
and JSON that stays cheap to parse (UTF-8, nesting depth, integer digits, no lone surrogates).

Used by `sdar_envs.server`: `RequestGuard` wraps the ASGI app, `guarded_h11_protocol` is uvicorn's
HTTP protocol with a deadline on request heads, `loads_guarded` parses every JSON body and frame.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

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


class _GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head.

    uvicorn arms its keep-alive timer only after a response and cancels it on any byte, so a
    connection that never finishes its request line and headers is otherwise held forever.
    """

    header_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

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
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
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

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)


def guarded_h11_protocol(header_timeout_s: float) -> type[H11Protocol]:
    """The HTTP protocol class to give uvicorn.Config(http=...), closing connections whose request
    head takes longer than `header_timeout_s` (with a 408)."""
    return type("GuardedH11Protocol", (_GuardedH11Protocol,), {"header_timeout_s": float(header_timeout_s)})
