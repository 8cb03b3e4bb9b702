"""Every bad input to an environment server is a 4xx with a message, read within bounds: a real
server on 127.0.0.1, spoken to over raw sockets (partial and slow requests) and WebSockets."""

from __future__ import annotations

import json
import select
import socket
import time
import urllib.parse

import pytest

from tests.envs.test_server import GUESS_FACTORY

HEAD_S = BODY_S = 1.0  # the test server's header and body timeouts
MB = 1 << 20
LIMIT = 6 * 4096 + 64 * 1024  # the body limit at the default --max-action-chars (90,112 bytes)


@pytest.fixture(scope="module")
def served():
    """(url, port, pid) of the guessing game served from a child process with short timeouts."""
    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server.config import ServerOptions

    opts = ServerOptions(header_timeout_s=HEAD_S, body_timeout_s=BODY_S, keep_alive_s=1)
    assert opts.max_body_bytes == LIMIT
    url, handle = serve_in_background(GUESS_FACTORY, options=opts)
    yield url, urllib.parse.urlsplit(url).port, handle.pid
    handle.stop()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def read_response(sock: socket.socket, timeout_s: float = 5.0) -> tuple[int | None, dict, bytes]:
    """(status, headers, body) of one HTTP response; status None when the server closed without one."""
    sock.settimeout(timeout_s)
    data = b""
    try:
        while True:
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    return None, {}, data
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 1"):
                break
            data = body  # an interim 100 Continue: the answer follows
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", 0))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return int(lines[0].split()[1]), headers, body
    except ConnectionResetError:
        return None, {}, data


def request(port: int, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> tuple[int | None, dict]:
    """(status, parsed JSON body) of one complete request on a fresh connection."""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        status, _, raw = read_response(sock)
    return status, (json.loads(raw) if raw else None)


def closed_within(sock: socket.socket, limit_s: float) -> tuple[bool, float, bytes]:
    """Wait until the server closes `sock` (or `limit_s` passes): (closed, seconds, bytes it sent)."""
    t0 = time.monotonic()
    got = b""
    sock.settimeout(0.2)
    while time.monotonic() - t0 < limit_s:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True, time.monotonic() - t0, got
        if not chunk:
            return True, time.monotonic() - t0, got
        got += chunk
    return False, time.monotonic() - t0, got


def new_session(url: str) -> tuple[str, str]:
    from sdar_envs.client import http_json

    created = http_json("POST", f"{url}/sessions")
    return created["session_id"], created["session_token"]


# ---- bad JSON: 400 with a message, and the session goes on -------------------------------------
BAD_BODIES = [
    (b'{"task_id": "\xff\xfe"}', "not UTF-8"),
    (b'{"seed": ' + b"9" * 5000 + b"}", "integer of 5000 digits"),
    (b"[" * 40_000 + b"]" * 40_000, "nested deeper than this server's limit of 32"),
    (b'{"a": ' * 33 + b"1" + b"}" * 33, "nested deeper"),
    (b'{"task_id": "\\ud800"}', "lone UTF-16 surrogate"),
    (b'{"seed": NaN}', "NaN is not JSON"),
    (b'{"task_id": ', "malformed JSON"),
    (b"\xef\xbb\xbf{}", "malformed JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'"test-1"', "must be a JSON object"),
]


@pytest.mark.parametrize(("body", "expected"), BAD_BODIES, ids=[e for _, e in BAD_BODIES])
def test_bad_json_bodies_get_400_and_a_message(served, body, expected):
    url, port, _ = served
    sid, token = new_session(url)
    auth = {"Authorization": f"Bearer {token}"}
    for path in (f"/sessions/{sid}/reset", f"/sessions/{sid}/step", "/mcp", "/sessions"):
        status, reply = request(port, "POST", path, body, auth)
        assert status == 400, (path, status, reply)
        if "JSON object" not in expected or path.endswith("reset"):
            assert expected in reply["detail"], (path, reply)
    status, reply = request(port, "POST", f"/sessions/{sid}/reset", b'{"task_id": "test-3"}', auth)
    assert status == 200 and reply["observation"]["task_id"] == "test-3"
    assert request(port, "DELETE", f"/sessions/{sid}", headers=auth)[0] == 200


# ---- bodies: limited before reading, and while reading -------------------------------------------
def test_big_bodies_are_refused_on_content_length_before_reading(served):
    url, port, _ = served
    sid, token = new_session(url)
    for path in ("/mcp", "/sessions", f"/sessions/{sid}/reset", f"/sessions/{sid}/step"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: {50 * MB}\r\n\r\n".encode()
            )
            t0 = time.monotonic()
            status, headers, body = read_response(sock, timeout_s=3)  # not one byte of the body sent
            assert status == 413, (path, status)
            assert time.monotonic() - t0 < 1.0
            assert headers["connection"] == "close" and f"over this server's limit of {LIMIT} bytes" in json.loads(body)["detail"]
            assert closed_within(sock, 2)[0]


def _stream_chunked(port: int, path: str, total: int, chunk: int = 16 * 1024) -> tuple[int | None, int]:
    """Send a chunked body of up to `total` bytes, stopping once the server answers: (status, bytes sent)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        sent = 0
        piece = f"{chunk:x}\r\n".encode() + b"7" * chunk + b"\r\n"
        try:
            while sent < total:
                if select.select([sock], [], [], 0)[0]:
                    break  # the server answered
                sock.sendall(piece)
                sent += chunk
        except (BrokenPipeError, ConnectionResetError):
            pass
        return read_response(sock)[0], sent


def test_chunked_bodies_are_cut_at_the_limit(served):
    _, port, _ = served
    status, sent = _stream_chunked(port, "/mcp", 32 * MB)
    assert status == 413
    # answered long before the end: the server read ~90 KB, the kernel's socket buffers took the rest
    assert sent < 16 * MB
    # and a chunked body just under the limit is read and parsed (as JSON: this one is not)
    chunked = b"POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"[" + b" " * (LIMIT - 10) + b"]"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(chunked + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
        status, _, reply = read_response(sock)
    assert status == 400 and "must be a JSON object" in json.loads(reply)["detail"]


def test_memory_stays_flat_under_eight_50mb_bodies(served):
    """The issue's case: eight 50 MB /mcp bodies took a server from 90 to 581 MB."""
    url, port, pid = served
    before = rss_mb(pid)
    statuses = []
    for i in range(8):
        if i % 2:
            statuses.append(_stream_chunked(port, "/mcp", 50 * MB)[0])
            continue
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: {50 * MB}\r\n\r\n".encode())
            try:
                for _ in range(50):
                    if select.select([sock], [], [], 0)[0]:
                        break
                    sock.sendall(b"x" * MB)
            except (BrokenPipeError, ConnectionResetError):
                pass
            statuses.append(read_response(sock)[0])
    after = rss_mb(pid)
    print(f"server RSS {before:.1f} MB before, {after:.1f} MB after eight 50 MB bodies; statuses {statuses}")
    assert statuses == [413] * 8
    assert after - before < 10
    from sdar_envs.client import http_json

    assert http_json("GET", f"{url}/health") == {"status": "healthy"}


# ---- time: slow heads, slow bodies and idle connections are cut ------------------------------------
@pytest.mark.parametrize("sent", [b"", b"GET /health HTTP/1.1\r\nHo", b"POST /sessions HTTP/1.1\r\n"], ids=["idle", "partial", "no-end"])
def test_slow_request_heads_get_408_and_lose_the_connection(served, sent):
    _, port, _ = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(sent)
        closed, took, got = closed_within(sock, HEAD_S + 3)
    assert closed and took < HEAD_S + 1.5, took
    assert got.startswith(b"HTTP/1.1 408 ") and b"no complete request head within 1 s" in got


def test_a_trickled_head_does_not_extend_its_deadline(served):
    _, port, _ = served
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        t0 = time.monotonic()
        closed = False
        for byte in head:  # one byte every 0.1 s: 10 s for the whole head if allowed
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if select.select([sock], [], [], 0.1)[0]:
                break
        took = time.monotonic() - t0
        got = closed_within(sock, 2)[2] if not closed else b""
    assert took < HEAD_S + 1.5, took
    assert closed or got.startswith(b"HTTP/1.1 408 ")


@pytest.mark.parametrize("trickle", [False, True], ids=["stalled", "trickled"])
def test_slow_bodies_get_408_and_lose_the_connection(served, trickle):
    _, port, _ = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        t0 = time.monotonic()
        if trickle:
            while not select.select([sock], [], [], 0.1)[0] and time.monotonic() - t0 < BODY_S + 3:
                sock.sendall(b" ")
        status, _, body = read_response(sock, timeout_s=BODY_S + 3)
        took = time.monotonic() - t0
        assert status == 408 and "did not arrive within 1 s" in json.loads(body)["detail"]
        assert took < BODY_S + 1.5
        assert closed_within(sock, 2)[0]


def test_idle_keep_alive_connections_are_closed(served):
    _, port, _ = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock)[0] == 200
        closed, took, _ = closed_within(sock, 5)
    assert closed and took < 2.5


def test_a_request_uvicorn_cannot_parse_is_a_400(served):
    _, port, _ = served
    for raw in (b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n", b"BLAH\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(raw)
            assert read_response(sock)[0] == 400, raw


# ---- WebSocket frames: an error message, and the session goes on -------------------------------------
BAD_FRAMES = [
    (b"\x00\x01binary", "INVALID_JSON", "binary frames are not understood"),
    ("[1, 2]", "VALIDATION_ERROR", "a message is a JSON object"),
    ('"reset"', "VALIDATION_ERROR", "got str"),
    ("42", "VALIDATION_ERROR", "got int"),
    ("null", "VALIDATION_ERROR", "got NoneType"),
    ("{not json", "INVALID_JSON", "malformed JSON"),
    ("[" * 40_000 + "]" * 40_000, "INVALID_JSON", "nested deeper"),
    ('{"type": "reset", "data": {"seed": ' + "7" * 5000 + "}}", "INVALID_JSON", "integer of 5000 digits"),
    ('{"type": "step", "data": {"message": "\\udfff"}}', "INVALID_JSON", "lone UTF-16 surrogate"),
    ('{"type": 5}', "UNKNOWN_TYPE", "Unknown message type: 'int'"),
    ('{"type": "launch"}', "UNKNOWN_TYPE", "Unknown message type: 'launch'"),
    ('{"type": "reset", "data": [1]}', "VALIDATION_ERROR", "Invalid message"),
    ('{"type": "step"}', "VALIDATION_ERROR", "Invalid message"),
    ('{"type": "state", "extra": 1}', "VALIDATION_ERROR", "Invalid message"),
    ('{"type": "reset", "data": {"task_id": ["a"]}}', "VALIDATION_ERROR", "task_id: Input should be a valid string"),
    # keys that were the server's own argument names, and ids of the wrong type: refused before any call
    ('{"type": "reset", "data": {"self": 1}}', "VALIDATION_ERROR", "unknown reset parameter(s) ['self']"),
    ('{"type": "reset", "data": {"sid": "x", "func": 1}}', "VALIDATION_ERROR", "unknown reset parameter(s) ['func', 'sid']"),
    ('{"type": "reset", "data": {"episode_id": 5}}', "VALIDATION_ERROR", "episode_id: Input should be a valid string"),
    ('{"type": "reset", "data": {"seed": true}}', "VALIDATION_ERROR", "seed: Input should be a valid integer"),
    ('{"type": "step", "data": {"message": "guess 1", "self": 1}}', "VALIDATION_ERROR", "Extra inputs are not permitted"),
    ('{"type": "mcp", "data": {"jsonrpc": "2.0", "method": "openenv/session/close", "params": {"session_id": "x"}}}', "UNKNOWN_TYPE", "no MCP tools"),
]


def test_bad_websocket_frames_get_an_error_and_the_session_goes_on(served):
    from websockets.sync.client import connect

    url, _, _ = served
    with connect(url.replace("http://", "ws://") + "/ws", open_timeout=10) as ws:

        def ask(frame):
            ws.send(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))
            return json.loads(ws.recv(timeout=10))

        first = ask({"type": "reset", "data": {"task_id": "test-6"}})
        sid = first["data"]["observation"]["session_id"]
        assert ask({"type": "step", "data": {"message": "guess 1"}})["data"]["observation"]["step"] == 1
        for frame, code, text in BAD_FRAMES:
            reply = ask(frame)
            assert reply["type"] == "error" and reply["data"]["code"] == code, (frame[:40], reply)
            assert text in reply["data"]["message"] + json.dumps(reply["data"].get("errors", "")), (frame[:40], reply)
        # the same session and episode: step 2 of task test-6, won
        out = ask({"type": "step", "data": {"message": "guess 6"}})["data"]
        assert out["observation"]["session_id"] == sid and out["observation"]["step"] == 2 and out["done"] is True
        state = ask({"type": "state"})["data"]
        assert state["step_count"] == 2 and len(state["observations"]) == 3
