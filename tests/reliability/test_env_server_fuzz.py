"""Malformed requests and frames, generated from a fixed seed, against a real environment server on
127.0.0.1: every request gets an answer below 500, and a normal session plays afterwards."""

from __future__ import annotations

import collections
import json
import random
import socket
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.envs.test_server import GUESS_FACTORY, OPERATOR
from tests.reliability.openapi_fuzz import RESERVED
from tests.envs.test_server_limits import read_response, rss_mb

SEED = 20261123
N_REQUESTS = 400
N_FRAMES = 200

TEMPLATES = [
    {"task_id": "test-3"},
    {"task_id": "test-3", "seed": 4},
    {"seed": 7},
    {"action": {"message": "guess 3"}},
    {"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1},
    {"jsonrpc": "2.0", "method": "openenv/session/close", "id": 2, "params": {"session_id": "x", "session_token": "y"}},
    {"jsonrpc": "2.0", "method": "tools/call", "id": 3, "params": {"name": "x", "arguments": {}}},
    {},
]
WS_TEMPLATES = [
    {"type": "reset", "data": {"task_id": "test-3"}},
    {"type": "reset", "data": {"seed": 1}},
    {"type": "step", "data": {"message": "guess 3"}},
    {"type": "state"},
    {"type": "session"},
    {"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/list", "id": 1}},
]
ODD_STRINGS = ["\\ud800", "\\udfff\\ud800", "\u202e", "\x00", "é" * 3, "🙂", "\\u0000", "'", '\\"', "%00"]


def _mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        i = rng.randrange(len(text) + 1)
        if op == 0 and text:  # drop a span
            text = text[:i] + text[i + rng.randint(1, 5):]
        elif op == 1:  # insert JSON punctuation
            text = text[:i] + rng.choice(['"', "{", "}", "[", "]", ",", ":", "\\", "-", "e", "0"]) * rng.randint(1, 3) + text[i:]
        elif op == 2:  # an odd string
            text = text[:i] + rng.choice(ODD_STRINGS) + text[i:]
        elif op == 3:  # a long number
            text = text[:i] + str(rng.randint(1, 9)) * rng.choice([5, 70, 300, 4400, 6000]) + text[i:]
        elif op == 4:  # truncate
            text = text[:i]
        else:  # replace a value with a NaN, a deep nest or a big string
            nest = rng.choice([10, 33, 100, 5000, 40_000])
            value = rng.choice(["NaN", "-Infinity", "[" * nest + "]" * nest, '"' + "x" * rng.choice([10, 5000, 200_000]) + '"'])
            text = text[:i] + value + text[i:]
    return text


def _value(rng: random.Random, depth: int = 0) -> object:
    """A random, valid JSON value (odd numbers and strings included)."""
    roll = rng.randrange(9 if depth < 3 else 7)
    if roll == 0:
        return rng.choice([0, -1, 2**63, -(2**70), 10**60])
    if roll == 1:
        return rng.choice([0.5, -1e308, 1e-300, 3.0])
    if roll == 2:
        return rng.choice([True, False, None])
    if roll in (3, 4):
        return "".join(rng.choice(["a", "é", "🙂", "\u202e", " ", "-", "test-", "3", "\n", "/"]) for _ in range(rng.randint(0, 12)))
    if roll == 5:
        return "z" * rng.choice([100, 1025, 5000])
    if roll == 6:
        return "test-" + str(rng.randrange(40))
    if roll == 7:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["task_id", "seed", "message", "action", "episode_id", "x", "params", "id", *RESERVED[:4]]): _value(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


POISONS = [  # each alone in otherwise valid JSON: what used to be a 500
    lambda rng: b'"' + bytes(rng.randrange(128, 256) for _ in range(3)) + b'"',  # not UTF-8
    lambda rng: str(rng.randint(1, 9)).encode() * rng.choice([4301, 5000, 20_000]),  # int() refuses 4,300+ digits
    lambda rng: b"[" * (n := rng.choice([1000, 5000, 40_000])) + b"]" * n,  # recursion
    lambda rng: b'"\\ud800"',  # a lone surrogate, echoed back in a message
    lambda rng: rng.choice([b"NaN", b"Infinity", b"-Infinity"]),
]


def _poisoned(rng: random.Random) -> bytes:
    """A valid request body with one value replaced by a poison."""
    template = dict(rng.choice(TEMPLATES[:4]))
    key = rng.choice([*template, "task_id", "seed", "action"])
    if key == "action":
        template["action"] = {"message": "__POISON__"}
    else:
        template[key] = "__POISON__"
    return json.dumps(template).encode().replace(b'"__POISON__"', rng.choice(POISONS)(rng))


def _body(rng: random.Random) -> bytes:
    kind = rng.randrange(12)
    if kind >= 10:
        return _poisoned(rng)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
    if kind == 1:
        return json.dumps(rng.choice([[1, 2], "x", 3, None, True, [{"a": 1}]])).encode()
    if kind == 2:
        return b""
    if kind in (3, 4, 5):  # valid JSON that reaches the handlers: a template with a field swapped
        template = dict(rng.choice(TEMPLATES))
        key = rng.choice([*template, "action", "task_id", "seed", "episode_id", "extra", *RESERVED])
        template[key] = _value(rng)
        return json.dumps(template, ensure_ascii=rng.random() < 0.5).encode()
    text = _mutate(rng, json.dumps(rng.choice(TEMPLATES)))
    encoded = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.15:  # another encoding
        encoded = text.encode(rng.choice(["utf-16", "utf-32", "latin-1"]), "replace")
    return encoded


def _path(rng: random.Random, sid: str) -> str:
    """A path: mostly the session routes, of `sid` or of something that is not a session."""
    target = rng.choice([sid, sid, sid, "nope", "x" * 300, "%ff%fe", "..%2f..%2fetc", "%00", str(rng.random())])
    if rng.random() < 0.5:  # half at the session routes
        return rng.choice([f"/sessions/{sid}/reset", f"/sessions/{sid}/step", f"/sessions/{target}/reset", f"/sessions/{target}", "/sessions", "/mcp"])
    return rng.choice([
        "/health", "/info", "/metadata", "/schema", "/mcp", "/sessions", "/ws", "/docs", "/",
        f"/tasks?split={rng.choice(['test', 'train', 'dev', '%ff', 'x' * 500])}",
        f"/sessions/{target}", f"/sessions/{target}/reset", f"/sessions/{target}/step",
        f"/sessions/{target}/state", f"/sessions/{target}/state?t={rng.choice(['0', '-1', '1e3', 'x', '9' * 5000, '1'])}",
        "/" + "a" * rng.choice([10, 5000]), "/sessions/%2e%2e/reset",
    ])  # fmt: skip


def _request(rng: random.Random, sessions: list[tuple[str, str]]) -> bytes:
    """One malformed (or sometimes well-formed) HTTP/1.1 request, complete on the wire, aimed at one
    of `sessions` ((id, token) pairs) with its token, another's, the operator's or a made-up one."""
    sid, token = rng.choice(sessions)
    if rng.random() < 0.2:
        token = rng.choice(sessions)[1]
    path = _path(rng, sid)
    right = "DELETE" if path.count("/") == 2 and path.startswith("/sessions/") else "GET" if "/state" in path else "POST"
    method = right if rng.random() < 0.6 else rng.choice(["GET", "POST", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
    headers = [("Host", "127.0.0.1"), ("Connection", "close")]
    auth = rng.choice([None, token, token, OPERATOR, "x" * 43, token + "=", "", "é"])
    if auth is not None:
        headers.append(("Authorization", rng.choice(["Bearer ", "bearer ", "Basic ", ""]) + auth))
    body = _body(rng) if method in ("POST", "PUT", "PATCH") or rng.random() < 0.1 else b""
    framing = rng.random()
    if framing < 0.1 and body:
        chunk = rng.randint(1, max(1, len(body)))
        pieces = [body[i:i + chunk] for i in range(0, len(body), chunk)]
        wire_body = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces) + b"0\r\n\r\n"
        headers.append(("Transfer-Encoding", "chunked"))
    else:
        wire_body = body
        headers.append(("Content-Length", str(len(body))))
    if rng.random() < 0.15:  # odd headers: a bad content type, a long value, repeated ones
        headers.append(rng.choice([
            ("Content-Type", "text/plain; charset=utf-16"), ("X-Pad", "p" * rng.choice([100, 8000])),
            ("Content-Length", str(len(body))), ("Expect", "100-continue"), ("Upgrade", "websocket"),
        ]))  # fmt: skip
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return head.encode("utf-8") + wire_body


def _send(port: int, wire: bytes) -> int | None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(wire)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered (413) and closed before the whole body was sent
        return read_response(sock, timeout_s=10)[0]


@pytest.fixture(scope="module")
def served():
    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server.config import ServerOptions

    opts = ServerOptions(header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=1)
    url, handle = serve_in_background(GUESS_FACTORY, options=opts, operator_token=OPERATOR)
    yield url, urllib.parse.urlsplit(url).port, handle
    handle.stop()


def _play_normally(url: str) -> None:
    from sdar_envs.client import RemoteEnv, http_json

    with RemoteEnv(url) as env:
        assert env.reset(task_id="test-5").metadata["step"] == 0
        assert env.step("guess 5").metadata["won"] is True
        assert env.observation_at(1).metadata["won"] is True
    created = http_json("POST", f"{url}/sessions")
    sid, token = created["session_id"], created["session_token"]
    assert http_json("POST", f"{url}/sessions/{sid}/reset", {"task_id": "test-2"}, token=token)["observation"]["step"] == 0
    assert http_json("POST", f"{url}/sessions/{sid}/step", {"action": {"message": "guess 2"}}, token=token)["done"] is True
    http_json("DELETE", f"{url}/sessions/{sid}", token=token)


def test_malformed_http_requests_never_get_a_5xx(served):
    from sdar_envs.client import http_json

    url, port, handle = served
    sessions = []
    for i in range(24):  # some get closed by a well-formed DELETE along the way, as they should
        created = http_json("POST", f"{url}/sessions")
        sessions.append((created["session_id"], created["session_token"]))
        http_json("POST", f"{url}/sessions/{sessions[-1][0]}/reset", {"task_id": f"test-{i}"}, token=sessions[-1][1])
    rng = random.Random(SEED)
    wires = [_request(rng, sessions) for _ in range(N_REQUESTS)]
    before = rss_mb(handle.pid)
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda w: _send(port, w), wires))
    took = time.monotonic() - t0
    counts = collections.Counter(statuses)
    print(f"{len(wires)} requests in {took:.1f} s, statuses {sorted(counts.items(), key=str)}; "
          f"server RSS {before:.1f} -> {rss_mb(handle.pid):.1f} MB")  # fmt: skip
    server_errors = [(s, w[:120]) for s, w in zip(statuses, wires, strict=True) if s is None or s >= 500]
    assert server_errors == []
    assert sum(1 for s in statuses if 400 <= s < 500) > len(wires) // 2  # the fuzz did reach the refusals
    assert handle.alive()
    # tidy up what the fuzz opened (the operator may close any session), then play as usual
    listed = http_json("GET", f"{url}/sessions", token=OPERATOR)["sessions"]
    for s in listed:
        http_json("DELETE", f"{url}/sessions/{s['session_id']}", token=OPERATOR)
    _play_normally(url)
    assert rss_mb(handle.pid) - before < 40


def test_malformed_websocket_frames_never_end_the_session(served):
    from websockets.sync.client import connect

    url, _, handle = served
    rng = random.Random(SEED + 1)
    frames: list[str | bytes] = []
    while len(frames) < N_FRAMES:
        roll = rng.random()
        if roll < 0.15:
            frames.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 200))))
            continue
        text = _mutate(rng, json.dumps(rng.choice(WS_TEMPLATES)))
        if '"close"' in text:
            continue  # a real close message ends the session, as it should
        frames.append(text.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
    kinds = collections.Counter()
    with connect(url.replace("http://", "ws://") + "/ws", open_timeout=10, max_size=None) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"task_id": "test-8"}}))
        sid = json.loads(ws.recv(timeout=10))["data"]["observation"]["session_id"]
        for frame in frames:
            ws.send(frame)
            reply = json.loads(ws.recv(timeout=10))  # exactly one reply per frame, never a close
            kinds[reply["type"] if reply["type"] != "error" else reply["data"]["code"]] += 1
        print(f"{len(frames)} frames: replies {dict(kinds)}")
        ws.send(json.dumps({"type": "reset", "data": {"task_id": "test-8"}}))
        again = json.loads(ws.recv(timeout=10))["data"]["observation"]
        assert again["session_id"] == sid and again["step"] == 0
        ws.send(json.dumps({"type": "step", "data": {"message": "guess 8"}}))
        assert json.loads(ws.recv(timeout=10))["data"]["done"] is True
    assert sum(v for k, v in kinds.items() if k not in ("observation", "state", "session")) > N_FRAMES // 2
    assert handle.alive()
    _play_normally(url)


@pytest.mark.parametrize("family", ["household", "shop", "searchqa"])
def test_reserved_keys_and_wrongly_typed_ids_never_get_a_5xx(family):
    """Reset and step bodies with keys that were the server's own argument names, or ids of the wrong type, in
    every family: refused (400 / 422, or a WebSocket error) before anything is called, and the episode goes on."""
    from websockets.sync.client import connect

    from sdar_envs.client import http_json
    from sdar_envs.launcher import serve_in_background
    from tests.envs.test_server import _http
    from tests.envs.test_server_connections import RESERVED as BODIES_RESERVED
    from tests.envs.test_server_connections import WRONG_IDS

    url, handle = serve_in_background(family, **({"backend": "sim"} if family == "household" else {}))
    with handle:
        task = http_json("GET", f"{url}/tasks?split=test")["task_ids"][0]
        created = http_json("POST", f"{url}/sessions")
        sid, token = created["session_id"], created["session_token"]
        base = f"{url}/sessions/{sid}"
        assert _http("POST", f"{base}/reset", {"task_id": task, "episode_id": "e1"}, token=token)[0] == 200
        for body in BODIES_RESERVED + WRONG_IDS:
            assert _http("POST", f"{base}/reset", body, token=token)[0] in (400, 422), body
            assert _http("POST", f"{base}/step", {"action": {"message": "look"}, **body}, token=token)[0] in (400, 422)
            status, state = _http("GET", f"{base}/state", token=token)
            assert status == 200 and state["task_id"] == task and state["step_count"] == 0, (body, state)
        with connect(url.replace("http://", "ws://") + "/ws", open_timeout=10) as ws:
            for body in BODIES_RESERVED + WRONG_IDS:
                ws.send(json.dumps({"type": "reset", "data": body}))
                reply = json.loads(ws.recv(timeout=10))
                assert reply["type"] == "error" and reply["data"]["code"] == "VALIDATION_ERROR", (body, reply)
            ws.send(json.dumps({"type": "reset", "data": {"task_id": task}}))
            assert json.loads(ws.recv(timeout=30))["data"]["observation"]["task_id"] == task
            ws.send(json.dumps({"type": "state"}))
            assert json.loads(ws.recv(timeout=10))["data"]["task_id"] == task
