"""Reliability figures, each measured against real servers and processes on 127.0.0.1.

  fuzz      per family (household sim, shop, searchqa): requests generated with hypothesis from the served
            OpenAPI schema (request bodies included), malformed raw-socket requests and WebSocket frames
            (tests/reliability/test_env_server_fuzz.py's generators), reset and step bodies with reserved keys
            and wrongly typed ids over HTTP and WebSocket -> requests sent, 5xx, unanswered
  sessions  reads, steps and closes of other clients' sessions (HTTP, /mcp, another WebSocket) -> allowed;
            N concurrent WebSocket sessions (benchmarks/bench_env_load.py) -> sessions lost or mixed
  flood     N slow connections (silent, trickled heads, trickled bodies) from one address at R per second,
            /health probed throughout on the probe port (from that address, as a kubelet would) and on the
            clients' port (from another), another client playing meanwhile -> failed probes, failed episodes
  reclaim   N WebSocket sessions left idle until the server reclaims them -> WebSockets left open, connections
            the server still counts
  kill      `sdar train` of the small household config killed with SIGKILL at seeded random points and rerun,
            against an uninterrupted run -> MLflow rows duplicated or missing, curve difference, checkpoints lost
  damage    a finished run's newest checkpoint damaged in each way (a file cut short, scrambled or missing, its
            manifest or latest.json garbage), then `sdar train` rerun -> failed resumes, damaged checkpoints deleted
  outage    the S3 server (moto) and the MLflow server stopped for D s mid-run -> checkpoints and rows lost
  pipeline  `sdar run --local` killed outright mid-training, then `--resume <job>` -> tasks redone, rows duplicated
  diskfull  a tmpfs (root only) filled under `sdar train`'s checkpoints, then its MLflow store -> tracebacks, rows
            lost, half-written files (both: benchmarks/reliability_faults.py)

    .venv/bin/python benchmarks/bench_reliability.py [--quick] [--only fuzz,sessions,flood,reclaim,kill,damage,outage,
        pipeline,diskfull]
        [--json PATH]

Prints one table; every figure in the "must be" column must read 0 (exit status 1 otherwise). The details go
to a JSON file whose path is printed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import random
import re
import secrets
import signal
import socket
import sys
import tempfile
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "benchmarks"):  # the tests' generators and bench_env_load are reused, not copied
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

SECTIONS = ("fuzz", "sessions", "flood", "reclaim", "kill", "damage", "outage", "pipeline", "diskfull")
FAMILIES = {"household": {"backend": "sim"}, "shop": {}, "searchqa": {}}


@dataclass
class Figure:
    """One printed figure; `target` 0 means it must be zero, None that it is information."""

    section: str
    name: str
    value: Any
    target: int | None = None

    @property
    def ok(self) -> bool:
        return self.target is None or self.value == self.target


# ---- fuzz ---------------------------------------------------------------------------------------------
@dataclass
class FuzzResult:
    family: str
    schema_requests: int = 0
    raw_requests: int = 0
    ws_frames: int = 0
    server_errors: int = 0  # HTTP 5xx, and WebSocket replies from the catch-all (an unexpected exception)
    unanswered: int = 0  # no response at all, or a WebSocket frame without a reply
    statuses: dict[str, int] = field(default_factory=dict)
    ws_replies: dict[str, int] = field(default_factory=dict)
    ws_session_kept: bool = False
    reserved_bodies: int = 0  # reset/step bodies with reserved keys or wrongly typed ids, over HTTP and WebSocket
    plays_after: bool = False
    rss_mb: tuple[float, float] = (0.0, 0.0)
    wall_s: float = 0.0
    examples: list[str] = field(default_factory=list)  # the first failing requests, cut

    def record(self, kind: str, status: int | None, what: bytes) -> None:
        key = f"{kind} {status}"
        self.statuses[key] = self.statuses.get(key, 0) + 1
        if status is None or status >= 500:
            self.server_errors += status is not None
            self.unanswered += status is None
            self.examples.append(f"{key}: {what[:160]!r}")


def schema_fuzz(url: str, port: int, live: Any, n: int, seed: int, res: FuzzResult) -> None:
    """`n` requests generated with hypothesis from the served OpenAPI schema, one at a time on fresh
    connections; a pool session that a request closed is replaced."""
    from tests.reliability.openapi_fuzz import for_each, requests
    from tests.reliability.test_env_server_fuzz import _send

    from sdar_envs.client import EnvServerError, http_json

    def send(request: Any) -> None:
        status = _send(port, request.wire())
        res.record("schema", status, request.wire())
        res.schema_requests += 1
        if status == 200 and request.closes_a_session:
            with contextlib.suppress(EnvServerError):
                live.pool[request.slot] = _open_played(url, live)
        if res.schema_requests % 100 == 0:  # the fuzz opens sessions too: stay under the per-client limit
            _close_all_but(url, {s for s, _ in live.pool}, live.operator)

    for_each(requests(http_json("GET", f"{url}/openapi.json"), live), n, seed, send)


def _open_played(url: str, live: Any) -> tuple[str, str]:
    """A new HTTP session with an episode started and one step taken: (id, token)."""
    from sdar_envs.client import http_json

    created = http_json("POST", f"{url}/sessions")
    sid, token = created["session_id"], created["session_token"]
    http_json("POST", f"{url}/sessions/{sid}/reset", {"task_id": random.Random(sid).choice(live.tasks)}, token=token)
    http_json("POST", f"{url}/sessions/{sid}/step", {"action": {"message": live.actions[0]}}, token=token)
    return sid, token


def _close_all_but(url: str, keep: set[str], operator: str) -> None:
    from sdar_envs.client import EnvServerError, http_json

    for s in http_json("GET", f"{url}/sessions", token=operator)["sessions"]:
        if s["session_id"] not in keep and s["kind"] == "http":
            with contextlib.suppress(EnvServerError):  # closed meanwhile
                http_json("DELETE", f"{url}/sessions/{s['session_id']}", token=operator)


def raw_fuzz(port: int, pool: list[tuple[str, str]], n: int, seed: int, res: FuzzResult) -> None:
    """Malformed requests on the wire (test_env_server_fuzz's generator), 8 connections at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.reliability.test_env_server_fuzz import _request, _send

    rng = random.Random(seed)
    wires = [_request(rng, pool) for _ in range(n)]
    with ThreadPoolExecutor(8) as ex:
        for wire, status in zip(wires, ex.map(lambda w: _send(port, w), wires), strict=True):
            res.record("raw", status, wire)
    res.raw_requests += len(wires)


def ws_fuzz(url: str, task: str, n: int, seed: int, res: FuzzResult) -> None:
    """Malformed frames on one WebSocket session (test_env_server_fuzz's mutations); every frame must get
    exactly one reply, none from the catch-all, and the session must go on."""
    from tests.reliability.test_env_server_fuzz import WS_TEMPLATES, _mutate
    from websockets.sync.client import connect

    rng = random.Random(seed)
    frames: list[str | bytes] = []
    while len(frames) < n:
        if rng.random() < 0.15:
            frames.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 200))))
            continue
        text = _mutate(rng, json.dumps(rng.choice(WS_TEMPLATES)))
        if '"close"' not in text:  # a real close message ends the session, as it should
            frames.append(text.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
    kinds: collections.Counter[str] = collections.Counter()
    with connect(url.replace("http://", "ws://") + "/ws", open_timeout=10, max_size=None) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"task_id": task}}))
        sid = json.loads(ws.recv(timeout=30))["data"]["observation"]["session_id"]
        for frame in frames:
            ws.send(frame)
            try:
                reply = json.loads(ws.recv(timeout=30))
            except Exception as exc:  # noqa: BLE001 - a timeout or a close: the frame went unanswered
                res.unanswered += 1
                res.examples.append(f"ws frame {str(frame)[:80]!r}: {type(exc).__name__}")
                break
            data = reply.get("data", {})
            kinds[reply["type"] if reply["type"] != "error" else data.get("code", "?")] += 1
            if reply["type"] == "error" and data.get("code") == "EXECUTION_ERROR" and "error" not in data:
                res.server_errors += 1  # the server's catch-all: an exception nobody expected
                res.examples.append(f"ws frame {str(frame)[:80]!r}: {data.get('message', '')[:120]}")
            res.ws_frames += 1
        ws.send(json.dumps({"type": "reset", "data": {"task_id": task}}))
        again = json.loads(ws.recv(timeout=30))["data"]["observation"]
        res.ws_session_kept = again["session_id"] == sid and again["step"] == 0
    res.ws_replies = dict(kinds)


def reserved_bodies(url: str, task: str, res: FuzzResult) -> None:
    """Reset and step bodies whose keys were once the server's own argument names, or whose ids have the wrong
    type (tests/envs/test_server_connections.py's lists), over HTTP and over a WebSocket; each must be refused
    below 500, and the session's state must read back after each."""
    from tests.envs.test_server import _http
    from tests.envs.test_server_connections import RESERVED, WRONG_IDS
    from websockets.sync.client import connect

    from sdar_envs.client import http_json

    created = http_json("POST", f"{url}/sessions")
    sid, token = created["session_id"], created["session_token"]
    base = f"{url}/sessions/{sid}"
    _http("POST", f"{base}/reset", {"task_id": task}, token=token)
    for body in RESERVED + WRONG_IDS:
        for method, target, payload in (("POST", f"{base}/reset", body), ("POST", f"{base}/step", {"action": {"message": "look"}, **body}),
                                        ("GET", f"{base}/state", None)):  # fmt: skip
            status, _ = _http(method, target, payload, token=token)
            res.record("bodies", status, json.dumps(payload).encode())
            res.reserved_bodies += 1
    with connect(url.replace("http://", "ws://") + "/ws", open_timeout=10) as ws:
        for body in RESERVED + WRONG_IDS:
            for message in ({"type": "reset", "data": body}, {"type": "step", "data": {"message": "look", **body}}, {"type": "state"}):
                ws.send(json.dumps(message))
                reply = json.loads(ws.recv(timeout=30))
                data = reply.get("data", {})
                res.reserved_bodies += 1
                if reply["type"] == "error" and data.get("code") == "EXECUTION_ERROR" and "error" not in data:
                    res.server_errors += 1  # the catch-all: an exception nobody expected
                    res.examples.append(f"ws {json.dumps(message)[:80]}: {data.get('message', '')[:120]}")
    http_json("DELETE", base, token=token)


def plays_normally(url: str, task: str) -> bool:
    """An episode starts, steps, and reads back as usual."""
    from bench_env_load import sample_action

    from sdar_envs.client import RemoteEnv

    with RemoteEnv(url) as env:
        first = env.reset(task_id=task)
        out = env.step(sample_action(random.Random(0), first))
        return first.metadata["step"] == 0 and out.metadata["step"] == 1 and env.observation_at(1) == out


def fuzz_family(family: str, n_schema: int, n_raw: int, n_frames: int, seed: int) -> FuzzResult:
    from bench_env_load import sample_action
    from tests.envs.test_server import OPERATOR
    from tests.envs.test_server_limits import rss_mb
    from tests.reliability.openapi_fuzz import Live

    from sdar_envs.client import RemoteEnv, http_json
    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server.config import ServerOptions

    res = FuzzResult(family)
    t0 = time.monotonic()
    opts = ServerOptions(header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=1)  # as the fuzz tests run it
    url, handle = serve_in_background(family, options=opts, operator_token=OPERATOR, **FAMILIES[family])
    with handle:
        port = urllib.parse.urlsplit(url).port
        tasks = http_json("GET", f"{url}/tasks?split=test")["task_ids"][:20]
        with RemoteEnv(url) as env:
            first = env.reset(task_id=tasks[0])
        live = Live(tasks, [sample_action(random.Random(i), first) for i in range(8)], OPERATOR, [])
        live.pool = [_open_played(url, live) for _ in range(12)]
        before = rss_mb(handle.pid)
        schema_fuzz(url, port, live, n_schema, seed, res)
        _close_all_but(url, {s for s, _ in live.pool}, OPERATOR)
        raw_fuzz(port, live.pool, n_raw, seed, res)
        ws_fuzz(url, tasks[0], n_frames, seed + 1, res)
        reserved_bodies(url, tasks[0], res)
        res.plays_after = handle.alive() and plays_normally(url, tasks[1])
        res.rss_mb = (round(before, 1), round(rss_mb(handle.pid), 1))
    res.wall_s = time.monotonic() - t0
    res.examples = res.examples[:10]
    return res


# ---- sessions -----------------------------------------------------------------------------------------
@dataclass
class CrossResult:
    attempts: int = 0
    allowed: int = 0  # an attempt not refused with 401 / 403 (over HTTP) or an error (over a WebSocket)
    refused: dict[str, int] = field(default_factory=dict)  # by status
    victims: int = 0
    victims_disturbed: int = 0  # a victim whose state changed or that could not go on
    problems: list[str] = field(default_factory=list)


def cross_session(family: str, n_victims: int) -> CrossResult:
    """Every session route, and OpenEnv's /mcp close (over HTTP and over another WebSocket), tried on other
    clients' sessions with no token, another session's token (from 127.0.0.1 and 127.0.0.2), a forged one,
    a near miss and, to play, the operator's; then each victim must be as it was and play on."""
    from bench_env_load import sample_action
    from tests.envs.test_server import OPERATOR, _http, _ws_ask, _ws_connect

    from sdar_envs.client import RemoteEnv, http_json
    from sdar_envs.launcher import serve_in_background
    from sdar_envs.openenv_models import step_from_payload

    res = CrossResult()
    url, handle = serve_in_background(family, operator_token=OPERATOR, **FAMILIES[family])
    with handle, contextlib.ExitStack() as stack:
        tasks = http_json("GET", f"{url}/tasks?split=test")["task_ids"]
        victims = []  # (kind, sid, token, remote env or None)
        for i in range(n_victims):
            if i % 2 == 0:
                created = http_json("POST", f"{url}/sessions")
                sid, token = created["session_id"], created["session_token"]
                first = step_from_payload(http_json("POST", f"{url}/sessions/{sid}/reset", {"task_id": tasks[i]}, token=token))
                action = sample_action(random.Random(i), first)
                http_json("POST", f"{url}/sessions/{sid}/step", {"action": {"message": action}}, token=token)
                victims.append(("http", sid, token, None))
            else:
                env = stack.enter_context(RemoteEnv(url))
                env.step(sample_action(random.Random(i), env.reset(task_id=tasks[i])))
                victims.append(("ws", *env.credentials(), env))
        res.victims = len(victims)
        before = {sid: _http("GET", f"{url}/sessions/{sid}/state", token=token)[1] for _, sid, token, _ in victims}
        attacker = http_json("POST", f"{url}/sessions")["session_token"]
        attacker2 = _http("POST", f"{url}/sessions", source="127.0.0.2")[1]["session_token"]
        for kind, sid, token, _ in victims:
            near = token[:-1] + ("A" if token[-1] != "A" else "B")
            # (token, client address): none, another session's (from this address and another), forged, a near miss
            creds = [(None, None), (attacker, None), (attacker2, "127.0.0.2"), (secrets.token_urlsafe(32), None), (near, None)]
            base = f"{url}/sessions/{sid}"
            routes = [("POST", f"{base}/reset", {"task_id": tasks[-1]}), ("POST", f"{base}/step", {"action": {"message": "look"}}),
                      ("GET", f"{base}/state", None), ("GET", f"{base}/state?t=0", None), ("DELETE", base, None)]  # fmt: skip
            tries = [(m, u, b, t, src) for m, u, b in routes for t, src in creds]
            # to play: the operator's token, and a WebSocket session's own (reader's) token over HTTP
            tries += [(m, u, b, tok, None) for m, u, b in routes[:2] for tok in [OPERATOR] + ([token] if kind == "ws" else [])]
            for t, src in creds:  # OpenEnv's session close, the token in params and as a Bearer token
                rpc = {"jsonrpc": "2.0", "method": "openenv/session/close", "id": 1, "params": {"session_id": sid}}
                tries.append(("POST", f"{url}/mcp", {**rpc, "params": {**rpc["params"], "session_token": t}} if t else rpc, None, src))
                tries.append(("POST", f"{url}/mcp", rpc, t, src))
            for method, target, body, tok, src in tries:
                status, reply = _http(method, target, body, token=tok, source=src)
                _count(res, status, f"{method} {target.replace(url, '')} token={'set' if tok else 'none'}: {reply}")
            with _ws_connect(url) as intruder:  # another connection, even holding the right token
                rpc = {"jsonrpc": "2.0", "method": "openenv/session/close", "id": 2, "params": {"session_id": sid, "session_token": token}}
                reply = _ws_ask(intruder, {"type": "mcp", "data": rpc})
                _count(res, "ws error" if reply["type"] == "error" else "ws " + reply["type"], f"ws mcp close: {reply}")
        for kind, sid, token, env in victims:  # as they were, and they play on
            status, now = _http("GET", f"{url}/sessions/{sid}/state", token=token)
            if status != 200 or now != before[sid]:
                res.victims_disturbed += 1
                res.problems.append(f"{kind} victim {sid}: state changed ({status})")
                continue
            if env is not None:
                ok = env.step("look").metadata["step"] == 2
            else:
                status, out = _http("POST", f"{url}/sessions/{sid}/step", {"action": {"message": "look"}}, token=token)
                ok = status == 200 and out["observation"]["step"] == 2
            if not ok:
                res.victims_disturbed += 1
                res.problems.append(f"{kind} victim {sid}: could not step on")
    res.problems = res.problems[:10]
    return res


def _count(res: CrossResult, status: int | str, what: str) -> None:
    res.attempts += 1
    if status in (401, 403, "ws error"):
        res.refused[str(status)] = res.refused.get(str(status), 0) + 1
    else:
        res.allowed += 1
        res.problems.append(f"{status}: {what[:200]}")


# ---- flood ----------------------------------------------------------------------------------------------
@dataclass
class FloodResult:
    connections: int
    rate_per_s: float
    opened_s: float = 0.0
    refused_at_once: int = 0  # answered 429 within a second of connecting
    answered_later: dict[str, int] = field(default_factory=dict)  # status (or "closed") of the held ones
    held_at_most: int = 0  # connections of the flooding address the server held at once (its /sessions count)
    probes: dict[str, list[int]] = field(default_factory=dict)  # where -> [answered 200, failed]
    episodes: list[int] = field(default_factory=lambda: [0, 0])  # another client's episodes: [played, failed]
    open_after: int = 0  # connections the server still holds once the flood's deadlines passed
    rss_mb: tuple[float, float] = (0.0, 0.0)
    problems: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def flood_section(n: int, rate: float, header_timeout_s: float = 10.0) -> FloodResult:
    """`n` slow connections from 127.0.0.1 at `rate` per second against a household server at its default limits
    (a probe port added, as the chart runs it): a third say nothing, a third trickle a request head a byte every
    2 s, a third send a head and trickle its body. /health is probed every 0.2 s on the probe port from 127.0.0.1
    and on the clients' port from 127.0.0.2, and a client on 127.0.0.3 plays episodes over HTTP throughout."""
    import selectors
    import threading

    from tests.envs.test_server import _http
    from tests.envs.test_server_limits import rss_mb

    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server.config import ServerOptions

    res = FloodResult(n, rate)
    t0 = time.monotonic()
    opts = ServerOptions(probe_port=0, header_timeout_s=header_timeout_s)
    url, handle = serve_in_background("household", options=opts, backend="sim")
    port = urllib.parse.urlsplit(url).port
    tasks = _http("GET", f"{url}/tasks?split=test")[1]["task_ids"][:20]
    stop = threading.Event()
    lock = threading.Lock()

    def probe(where: str, target: str, source: str | None) -> None:
        counts = res.probes.setdefault(where, [0, 0])
        while not stop.is_set():
            try:
                status = _http("GET", f"{target}/health", source=source)[0]
            except OSError as exc:
                status = f"{type(exc).__name__}"
            with lock:
                counts[0 if status == 200 else 1] += 1
                if status != 200 and len(res.problems) < 10:
                    res.problems.append(f"{where}: /health gave {status}")
            stop.wait(0.2)

    def play() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                status, created = _http("POST", f"{url}/sessions", source="127.0.0.3")
                sid, token = created["session_id"], created["session_token"]
                base = f"{url}/sessions/{sid}"
                status, out = _http("POST", f"{base}/reset", {"task_id": tasks[i % len(tasks)]}, token=token, source="127.0.0.3")
                ok = status == 200 and out["observation"]["step"] == 0
                if not ok:
                    raise RuntimeError(f"reset gave {status}: {str(out)[:120]}")
                for action in ("look", "inventory"):
                    status, out = _http("POST", f"{base}/step", {"action": {"message": action}}, token=token, source="127.0.0.3")
                    ok = ok and status == 200
                ok = ok and _http("DELETE", base, token=token, source="127.0.0.3")[0] == 200
            except Exception as exc:  # noqa: BLE001 - counted as a failed episode
                ok = False
                with lock:
                    res.problems.append(f"episode {i}: {type(exc).__name__}: {exc}"[:200])
            with lock:
                res.episodes[0 if ok else 1] += 1
            stop.wait(0.1)

    with handle:
        before = rss_mb(handle.pid)
        threads = [threading.Thread(target=probe, args=("probe port (the flooding address)", handle.probe_url, None)),
                   threading.Thread(target=probe, args=("clients' port (another address)", url, "127.0.0.2")),
                   threading.Thread(target=play)]  # fmt: skip
        for t in threads:
            t.start()
        time.sleep(1.0)
        sel = selectors.DefaultSelector()
        conns: dict[socket.socket, dict[str, Any]] = {}
        heads = [b"", b"GET /info HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                 b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{"]

        def pump(timeout: float) -> None:
            for key, _ in sel.select(timeout):
                sock = key.fileobj
                info = conns[sock]
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if data and info["status"] is None:
                    info["status"] = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/1.1 ") else "?"
                    info["after_s"] = time.monotonic() - info["t"]
                if not data:
                    sel.unregister(sock)
                    sock.close()
                    info["closed"] = True

        t_start = time.monotonic()
        last_trickle = t_start
        for i in range(n):
            due = t_start + i / rate
            while (now := time.monotonic()) < due:
                pump(max(0.0, min(0.05, due - now)))
            sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=("127.0.0.1", 0))
            sock.setblocking(False)
            kind = i % 3
            if heads[kind]:
                with contextlib.suppress(OSError):
                    sock.send(heads[kind])
            conns[sock] = {"kind": kind, "t": time.monotonic(), "status": None, "closed": False}
            sel.register(sock, selectors.EVENT_READ)
            if time.monotonic() - last_trickle > 2.0:  # one more byte on every slow one still open
                last_trickle = time.monotonic()
                for s2, info in conns.items():
                    if not info["closed"] and info["kind"] and info["status"] is None:
                        with contextlib.suppress(OSError):
                            s2.send(b"X" if info["kind"] == 1 else b" ")
                status, counts = _http("GET", f"{url}/sessions", source="127.0.0.2")
                res.held_at_most = max(res.held_at_most, counts.get("connections", {}).get("open", 0))
        res.opened_s = time.monotonic() - t_start
        deadline = time.monotonic() + header_timeout_s + 5
        while any(not c["closed"] for c in conns.values()) and time.monotonic() < deadline:
            pump(0.1)
        for sock, info in conns.items():
            if info["status"] == "429" and info.get("after_s", 99) < 1.0:
                res.refused_at_once += 1
            else:
                key = info["status"] or ("closed" if info["closed"] else "still open")
                res.answered_later[key] = res.answered_later.get(key, 0) + 1
            if not info["closed"]:
                with contextlib.suppress(OSError):
                    sel.unregister(sock)
                sock.close()
        stop.set()
        for t in threads:
            t.join(30)
        time.sleep(0.5)
        res.open_after = max(0, _http("GET", f"{url}/info", source="127.0.0.2")[1]["open_connections"] - 1)  # less this request
        res.rss_mb = (round(before, 1), round(rss_mb(handle.pid), 1))
    res.wall_s = time.monotonic() - t0
    return res


# ---- reclaim --------------------------------------------------------------------------------------------
@dataclass
class ReclaimResult:
    sessions: int
    ttl_s: float
    told_why: int = 0  # got the SESSION_EXPIRED message before the close
    closed_by_server: int = 0  # got a close frame (code 1001)
    left_open: int = 0  # neither within ttl + 15 s
    server_connections_after: int = 0
    server_sessions_after: int = 0
    rss_mb: tuple[float, float] = (0.0, 0.0)
    wall_s: float = 0.0


def reclaim_section(n: int, ttl_s: float | None = None) -> ReclaimResult:
    """`n` WebSocket sessions opened (an episode reset each) and left idle; the server must tell each why and close
    it once reclaimed, and hold none of their connections afterwards."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.envs.test_server_limits import rss_mb
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from sdar_envs.client import http_json
    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server.config import ServerOptions

    ttl_s = ttl_s if ttl_s is not None else max(3.0, 0.05 * n)  # longer than opening them all takes
    res = ReclaimResult(n, ttl_s)
    t0 = time.monotonic()
    opts = ServerOptions(session_ttl_s=ttl_s, reap_interval_s=0.25, max_sessions=max(1024, n), max_sessions_per_client=n)
    url, handle = serve_in_background("household", options=opts, backend="sim")
    ws_url = url.replace("http://", "ws://") + "/ws"
    tasks = http_json("GET", f"{url}/tasks?split=test")["task_ids"]
    with handle, contextlib.ExitStack() as stack:
        before = rss_mb(handle.pid)
        conns = []
        for i in range(n):  # each session's idle clock starts at its reset
            conns.append(ws := stack.enter_context(connect(ws_url, open_timeout=30)))
            ws.send(json.dumps({"type": "reset", "data": {"task_id": tasks[i % len(tasks)]}}))
            json.loads(ws.recv(timeout=30))

        def wait_out(ws: Any) -> tuple[bool, bool]:
            told = closed = False
            end = time.monotonic() + ttl_s + 15
            try:
                while time.monotonic() < end:
                    reply = json.loads(ws.recv(timeout=max(0.1, end - time.monotonic())))
                    told = told or reply.get("data", {}).get("code") == "SESSION_EXPIRED"
            except ConnectionClosed as exc:
                closed = exc.rcvd is not None and exc.rcvd.code == 1001
            except TimeoutError:
                pass
            return told, closed

        with ThreadPoolExecutor(32) as pool:
            outcomes = list(pool.map(wait_out, conns))
        res.told_why = sum(t for t, _ in outcomes)
        res.closed_by_server = sum(c for _, c in outcomes)
        res.left_open = sum(not c for _, c in outcomes)
        time.sleep(0.5)
        info = http_json("GET", f"{url}/info")
        res.server_connections_after = max(0, info["open_connections"] - 1)  # less this request
        res.server_sessions_after = info["active_sessions"]
        res.rss_mb = (round(before, 1), round(rss_mb(handle.pid), 1))
    res.wall_s = time.monotonic() - t0
    return res


# ---- kill ---------------------------------------------------------------------------------------------
@dataclass
class KillResult:
    steps: int
    checkpoint_every: int
    kills_planned: int
    kills_delivered: int = 0
    kill_points: list[dict] = field(default_factory=list)  # per kill: where it landed, checkpoints before and after
    steps_redone: int = 0  # steps a killed attempt had finished (and logged) past its last checkpoint
    attempts: int = 0
    finished: bool = False
    mlflow_duplicates: int = 0
    mlflow_missing: int = 0
    mlflow_extra: int = 0
    runs_left_running: int = 0
    runs_closed_as_killed: int = 0
    curve_max_abs_diff: float = 0.0
    curve_worst: str = ""
    mlflow_vs_reference_max_abs_diff: float = 0.0
    mlflow_vs_curve_max_abs_diff: float = 0.0
    final_weights_max_abs_diff: float = 0.0
    checkpoints_reference: list[int] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    checkpoints_lost: int = 0
    incomplete_checkpoints: int = 0
    temp_files_left: int = 0
    reference_s: float = 0.0
    wall_s: float = 0.0


def kill_section(steps: int, kills: int, checkpoint_every: int, seed: int, work: Path, timeout_s: float) -> KillResult:
    """A reference run, then the same run killed -9 `kills` times at seeded random points and rerun to
    completion each time. A point is a step and a fraction of it, found from the steps the run prints, so the
    machine's load does not move it."""
    import torch
    from mlflow.tracking import MlflowClient
    from tests.reliability.train_runs import (
        CONFIG,
        TrainProcess,
        checkpoint_file,
        history_rows,
        latest_step,
        max_diff,
        metric_rows,
        small_overrides,
    )

    from sdar.config import load_config
    from sdar.storage import open_store
    from sdar.train.checkpoint import list_checkpoints
    from sdar.tracking import prepare_sqlite_store
    from sdar.train.strategy import WEIGHTS_FILE
    from sdar.train.warmstart import tiny_checkpoint

    res = KillResult(steps=steps, checkpoint_every=checkpoint_every, kills_planned=kills)
    t_start = time.monotonic()
    overrides = small_overrides(steps, **{"checkpoint.every": checkpoint_every})
    tiny_checkpoint(load_config(CONFIG, overrides))  # built (or found) once, outside every timed run
    ref_out, out = work / "kill-reference", work / "kill-run"
    ref_uri = prepare_sqlite_store(work / "kill-reference.db")
    uri = prepare_sqlite_store(work / "kill-run.db")
    ref = TrainProcess(ref_out, overrides, {"MLFLOW_TRACKING_URI": ref_uri})
    if ref.wait(timeout_s) != 0 or ref.summary is None:
        raise RuntimeError(f"the reference run failed:\n{ref.log_tail()}")
    res.reference_s = time.monotonic() - ref.t0
    (t_first, _), (t_last, _) = ref.steps[0], ref.steps[-1]
    step_s = (t_last - t_first) / max(1, len(ref.steps) - 1)
    startup_s = max(1.0, t_first - step_s)
    # kill points on the run's own timeline: p = j + f is a fraction f into step j (j = steps: the run's end);
    # sorted, so each lies ahead of the checkpoint the previous kill left; one whose step the rerun starts
    # at (or before) lands in its start-up
    rng = random.Random(seed)
    for p in sorted(rng.uniform(0, steps + 1) for _ in range(kills)):
        done = latest_step(str(out))
        j, frac = int(p), p - int(p)
        run = TrainProcess(out, overrides, {"MLFLOW_TRACKING_URI": uri})
        res.attempts += 1
        if j <= done:
            where, killed = "start-up", run.kill_after(0, frac * startup_s)
        else:
            where, killed = f"step {j} + {frac:.2f}", run.kill_after(j - done, frac * step_s)
        if not killed:
            res.kill_points.append({"at": where, "finished_first": True})
            break
        res.kills_delivered += 1
        after = latest_step(str(out))
        res.steps_redone += done + len(run.steps) - after
        res.kill_points.append({"at": where, "resumed_from": done, "steps_printed": len(run.steps), "checkpoint_after": after})
    final = TrainProcess(out, overrides, {"MLFLOW_TRACKING_URI": uri})
    res.attempts += 1
    rc = final.wait(timeout_s)
    res.finished = rc == 0 and final.summary is not None
    if not res.finished:
        raise RuntimeError(f"the rerun after {res.kills_delivered} kills failed (rc {rc}):\n{final.log_tail()}")
    # MLflow: one row per (key, step), the reference's rows and no others
    ref_rows, rows = metric_rows(ref_uri, ref.summary["run_id"]), metric_rows(uri, final.summary["run_id"])
    res.mlflow_duplicates = sum(len(v) - 1 for v in rows.values())
    res.mlflow_missing = len(ref_rows.keys() - rows.keys())
    res.mlflow_extra = len(rows.keys() - ref_rows.keys())
    first = lambda r: {k: v[0] for k, v in r.items()}  # noqa: E731
    res.mlflow_vs_reference_max_abs_diff = max_diff(first(rows), first(ref_rows))[0]
    res.mlflow_vs_curve_max_abs_diff = max_diff(first(rows), history_rows(out))[0]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("household-tiny").experiment_id])
    res.runs_left_running = sum(r.info.status == "RUNNING" for r in runs)
    res.runs_closed_as_killed = sum(r.info.status == "KILLED" for r in runs)
    # the curve, and the checkpoints
    res.curve_max_abs_diff, res.curve_worst = max_diff(history_rows(out), history_rows(ref_out))
    ref_store, store = open_store(str(ref_out)), open_store(str(out))
    res.checkpoints_reference = [s for s, _ in list_checkpoints(ref_store)]
    res.checkpoints = [s for s, _ in list_checkpoints(store)]
    res.checkpoints_lost = len(set(res.checkpoints_reference) - set(res.checkpoints))
    res.incomplete_checkpoints = len(list_checkpoints(store, complete_only=False)) - len(res.checkpoints)
    res.temp_files_left = sum(1 for _ in out.rglob("*sdar-tmp*"))
    a, b = (torch.load(checkpoint_file(str(o), steps, WEIGHTS_FILE, work), weights_only=True)
            for o in (out, ref_out))
    res.final_weights_max_abs_diff = max(float((a[k] - b[k]).abs().max()) for k in b)
    res.wall_s = time.monotonic() - t_start
    return res


# ---- damage -------------------------------------------------------------------------------------------
DAMAGES = ("weights truncated", "state truncated", "state scrambled", "weights missing", "manifest garbage",
           "marker garbage")  # fmt: skip


@dataclass
class DamageResult:
    kinds: list[str]
    resumed: dict[str, int] = field(default_factory=dict)  # kind -> the step the rerun resumed from (-1: failed)
    finished: dict[str, bool] = field(default_factory=dict)
    failed_resumes: int = 0
    damaged_deleted: int = 0  # a damaged checkpoint that is gone instead of moved aside (marker garbage: the marker)
    told: int = 0  # reruns whose log named what was skipped and why
    problems: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def damage_section(kinds: list[str], work: Path, timeout_s: float) -> DamageResult:
    """One 2-step run (a checkpoint after each step); for each kind of damage a copy of it, its newest checkpoint
    (or latest.json) damaged that way, then `sdar train` to 3 steps on the copy: it must resume from the newest
    checkpoint that loads (step 1; step 2 for a garbage marker), say what it skipped, finish, and keep the damaged
    files (moved to checkpoints/damaged/)."""
    import shutil

    from tests.reliability.train_runs import TrainProcess, small_overrides

    from sdar.config import load_config
    from sdar.train.checkpoint import COMPLETE_FILE, DAMAGED_DIR, LATEST_MARKER, STATE_FILE, checkpoint_path
    from sdar.train.strategy import WEIGHTS_FILE
    from sdar.train.warmstart import tiny_checkpoint

    res = DamageResult(list(kinds))
    t0 = time.monotonic()
    tiny_checkpoint(load_config("configs/household-tiny.yaml", small_overrides(2)))
    base = work / "damage-base"
    run = TrainProcess(base, small_overrides(2, tracking=False, **{"checkpoint.every": 1, "checkpoint.keep": 3}))
    if run.wait(timeout_s) != 0:
        raise RuntimeError(f"the base run failed:\n{run.log_tail()}")
    halve = lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])  # noqa: E731
    scramble = lambda p: p.write_bytes(bytes(b ^ 0x5A for b in p.read_bytes()))  # noqa: E731
    damage = {
        "weights truncated": (checkpoint_path(2), WEIGHTS_FILE, halve), "state truncated": (checkpoint_path(2), STATE_FILE, halve),
        "state scrambled": (checkpoint_path(2), STATE_FILE, scramble),
        "weights missing": (checkpoint_path(2), WEIGHTS_FILE, lambda p: p.unlink()),
        "manifest garbage": (checkpoint_path(2), COMPLETE_FILE, lambda p: p.write_text("{not json")),
        "marker garbage": ("", LATEST_MARKER, lambda p: p.write_bytes(b"\x00 not a marker")),
    }  # fmt: skip
    for kind in kinds:
        out = work / f"damage-{kind.replace(' ', '-')}"
        shutil.copytree(base / "checkpoints", out / "checkpoints")
        rel, name, how = damage[kind]
        how(out / rel / name if rel else out / name)  # the run's store is its output directory
        rerun = TrainProcess(out, small_overrides(3, tracking=False, **{"checkpoint.every": 1, "checkpoint.keep": 3}))
        rc = rerun.wait(timeout_s)
        log = " ".join(rerun.log_path.read_text(errors="replace").split())  # rich wraps long lines
        m = re.search(r"resumed from .*step-(\d+) at step (\d+)", log)
        want = 2 if kind == "marker garbage" else 1
        res.resumed[kind] = int(m.group(2)) if m else -1
        res.finished[kind] = rc == 0 and rerun.summary is not None and rerun.summary.get("steps") == 3
        if not res.finished[kind] or res.resumed[kind] != want:
            res.failed_resumes += 1
            res.problems.append(f"{kind}: rc {rc}, resumed at {res.resumed[kind]} (want {want})\n{log[-1500:]}")
        said = "latest.json" in log if kind == "marker garbage" else "step-000002 cannot be loaded" in log and "kept, not deleted" in log
        res.told += said
        if kind == "marker garbage":
            res.damaged_deleted += 0  # the marker is rewritten by the next checkpoint, by design (the log says so)
        else:
            moved = list((out / DAMAGED_DIR).glob("step-000002-*"))
            res.damaged_deleted += not (moved and (moved[0] / name).exists() or kind == "weights missing" and moved)
    res.problems = res.problems[:6]
    res.wall_s = time.monotonic() - t0
    return res


# ---- outage -------------------------------------------------------------------------------------------
@dataclass
class OutageResult:
    what: str
    down_s: float
    steps: int
    down_measured_s: float = 0.0  # from the stop until the server answers again (MLflow takes a while to start)
    finished: bool = False
    down_at_step: int = 0  # steps the run had done when the server went down
    steps_during_outage: int = 0
    trainer_saw_outage_s: float | None = None
    checkpoints_lost: int = 0
    store_checkpoints: list[int] = field(default_factory=list)
    metric_rows_lost: int = 0
    metric_rows_duplicated: int = 0
    artifacts_lost: int = 0
    run_status: str = ""
    wall_s: float = 0.0


@contextlib.contextmanager
def s3_environment(endpoint: str, work: Path):
    """Dummy credentials and the moto endpoint in this process's environment (children inherit it), as the
    tests' `s3_server` fixture sets them; restored afterwards."""
    from tests.conftest import _AWS_VARS

    saved = dict(os.environ)
    for var in _AWS_VARS:
        os.environ.pop(var, None)
    os.environ.update({
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": str(work / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(work / "no-aws-credentials"), "AWS_EC2_METADATA_DISABLED": "true",
        "SDAR_S3_ENDPOINT_URL": endpoint,
    })  # fmt: skip
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _rows_lost(res: OutageResult, tracking_uri: str, out: Path, run_id: str) -> None:
    """Every logged (key, step) of history.json must be in MLflow once, with its value; the run's artifacts too."""
    from mlflow.tracking import MlflowClient
    from tests.reliability.train_runs import history_rows, metric_rows

    rows, want = metric_rows(tracking_uri, run_id), history_rows(out)
    res.metric_rows_lost = sum(1 for k, v in want.items() if k not in rows or rows[k][0] != v)
    res.metric_rows_duplicated = sum(len(v) - 1 for v in rows.values())
    client = MlflowClient(tracking_uri)
    res.run_status = client.get_run(run_id).info.status
    have = {a.path for a in client.list_artifacts(run_id)}
    res.artifacts_lost = len({"config.json", "history.json", "privileged_skills.json", "final_adapter"} - have)


def s3_outage(down_s: float, steps: int, work: Path, timeout_s: float) -> OutageResult:
    """Checkpoints to s3:// on a moto server that is stopped after the first checkpoint and started again
    `down_s` later; the run must finish with its last checkpoint in the bucket, byte for byte the spooled one."""
    import boto3
    from tests.reliability.train_runs import TrainProcess, checkpoint_file, small_overrides
    from tests.train.test_outages import Outage

    from sdar.storage import open_store
    from sdar.train.checkpoint import list_checkpoints
    from sdar.tracking import prepare_sqlite_store
    from sdar.train.strategy import WEIGHTS_FILE

    res = OutageResult("S3 (moto server)", down_s, steps)
    t0 = time.monotonic()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log
    server = Outage()
    try:
        with s3_environment(server.url, work):
            boto3.client("s3", endpoint_url=server.url, region_name="us-east-1").create_bucket(Bucket="reliability")
            uri = "s3://reliability/household-tiny"
            tracking = prepare_sqlite_store(work / "s3-outage.db")
            out = work / "s3-outage"
            run = TrainProcess(out, small_overrides(steps, **{"checkpoint.every": 1, "checkpoint.uri": uri,
                                                              "checkpoint.retry_s": max(600.0, 4 * down_s)}),
                               {"MLFLOW_TRACKING_URI": tracking})
            run.wait_for_step(1, timeout_s)
            server.down()
            t_down = time.monotonic()
            res.down_at_step = run.steps[-1][1]
            time.sleep(down_s)
            server.up()
            res.down_measured_s = time.monotonic() - t_down
            res.steps_during_outage = run.steps[-1][1] - res.down_at_step
            res.finished = run.wait(timeout_s) == 0 and run.summary is not None
            if not res.finished:
                raise RuntimeError(f"the run failed after the S3 outage:\n{run.log_tail()}")
            if m := re.findall(r"reachable again after (\d+) s", run.log_path.read_text(errors="replace")):
                res.trainer_saw_outage_s = float(m[-1])
            res.store_checkpoints = [s for s, _ in list_checkpoints(open_store(uri))]
            spooled = checkpoint_file(str(out / "checkpoint-spool"), steps, WEIGHTS_FILE, work)
            same = steps in res.store_checkpoints and checkpoint_file(uri, steps, WEIGHTS_FILE, work).read_bytes() == spooled.read_bytes()
            res.checkpoints_lost = 0 if same else 1  # the newest one; older ones are superseded by design
            _rows_lost(res, tracking, out, run.summary["run_id"])
    finally:
        with contextlib.suppress(Exception):
            server.down()
    res.wall_s = time.monotonic() - t0
    return res


def mlflow_outage(down_s: float, steps: int, work: Path, timeout_s: float) -> OutageResult:
    """Tracking to an `mlflow server` on loopback that is stopped after the first step and started again
    `down_s` later (MLflow's own retries off, as in tests/test_tracking.py, so sdar's buffer is what is
    measured); every row and artifact must reach it, once."""
    from tests.reliability.train_runs import TrainProcess, small_overrides
    from tests.test_tracking import _mlflow_server, _stop

    res = OutageResult("MLflow (mlflow server)", down_s, steps)
    t0 = time.monotonic()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db, art = work / "mlflow-outage.db", work / "mlflow-outage-artifacts"
    server = _mlflow_server(db, port, art)
    uri = f"http://127.0.0.1:{port}"
    try:
        out = work / "mlflow-outage"
        run = TrainProcess(out, small_overrides(steps, **{"checkpoint.every": 2}),
                           {"MLFLOW_TRACKING_URI": uri, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
                            "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"})
        run.wait_for_step(1, timeout_s)
        os.killpg(server.pid, signal.SIGKILL)  # at once, like a crash (a graceful stop takes seconds)
        server.wait()
        t_down = time.monotonic()
        res.down_at_step = run.steps[-1][1]
        time.sleep(down_s)
        server = _mlflow_server(db, port, art)
        res.down_measured_s = time.monotonic() - t_down
        res.steps_during_outage = run.steps[-1][1] - res.down_at_step
        res.finished = run.wait(timeout_s) == 0 and run.summary is not None
        if not res.finished:
            raise RuntimeError(f"the run failed after the MLflow outage:\n{run.log_tail()}")
        if m := re.findall(r"answers again after (\d+) s", run.log_path.read_text(errors="replace")):
            res.trainer_saw_outage_s = float(m[-1])
        _rows_lost(res, uri, out, run.summary["run_id"])
    finally:
        _stop(server)
    res.wall_s = time.monotonic() - t0
    return res


# ---- the report -----------------------------------------------------------------------------------------
def figures(results: dict[str, Any]) -> list[Figure]:
    out: list[Figure] = []
    for r in results.get("fuzz", []):
        sent = f"{r.schema_requests} schema + {r.raw_requests} raw + {r.ws_frames} ws"
        out += [Figure(f"fuzz {r.family}", "requests sent", sent),
                Figure(f"fuzz {r.family}", "5xx (ws: internal errors)", r.server_errors, 0),
                Figure(f"fuzz {r.family}", "unanswered", r.unanswered, 0),
                Figure(f"fuzz {r.family}", "reserved keys / wrongly typed ids sent (http + ws)", r.reserved_bodies),
                Figure(f"fuzz {r.family}", "normal play failed after / ws session ended",
                       int(not r.plays_after) + int(not r.ws_session_kept), 0)]
    if "sessions" in results:
        c, load = results["sessions"]["cross"], results["sessions"]["load"]
        out += [Figure("sessions", "cross-session attempts", f"{c.attempts} on {c.victims} sessions"),
                Figure("sessions", "cross-session attempts allowed", c.allowed, 0),
                Figure("sessions", "refused (401 / 403 / ws error)",
                       f"{c.refused.get('401', 0)} / {c.refused.get('403', 0)} / {c.refused.get('ws error', 0)}"),
                Figure("sessions", "victim sessions disturbed", c.victims_disturbed, 0),
                Figure("sessions", f"{load.sessions} concurrent sessions: steps played", f"{load.steps} ({load.steps_per_s:.0f}/s)"),
                Figure("sessions", f"{load.sessions} concurrent sessions: lost", load.lost, 0),
                Figure("sessions", f"{load.sessions} concurrent sessions: mixed (cross-talk, read-back)",
                       load.cross_talk + load.readback_mismatches, 0)]
    if "flood" in results:
        f = results["flood"]
        later = ", ".join(f"{v} got {k}" for k, v in sorted(f.answered_later.items()))
        out += [Figure("flood", "slow connections from one address",
                       f"{f.connections} in {f.opened_s:.0f} s ({f.rate_per_s:g}/s)"),
                Figure("flood", "answered 429 at once / the rest", f"{f.refused_at_once} / {later or 0}"),
                Figure("flood", "connections the server held at most (all addresses)", f.held_at_most)]
        for where, (ok, failed) in sorted(f.probes.items()):
            out.append(Figure("flood", f"/health failed, {where} (of {ok + failed})", failed, 0))
        out += [Figure("flood", f"another client's episodes failed (of {sum(f.episodes)})", f.episodes[1], 0),
                Figure("flood", "connections left open after their deadlines", f.open_after, 0),
                Figure("flood", "server RSS MB", f"{f.rss_mb[0]} -> {f.rss_mb[1]}")]
    if "reclaim" in results:
        r = results["reclaim"]
        out += [Figure("reclaim", "idle WebSocket sessions", f"{r.sessions} (TTL {r.ttl_s:g} s)"),
                Figure("reclaim", "told why, then closed (1001)", f"{r.told_why}, {r.closed_by_server}"),
                Figure("reclaim", "WebSockets left open after reclaim", r.left_open, 0),
                Figure("reclaim", "connections / sessions the server still holds",
                       r.server_connections_after + r.server_sessions_after, 0),
                Figure("reclaim", "server RSS MB", f"{r.rss_mb[0]} -> {r.rss_mb[1]}")]
    if "kill" in results:
        k = results["kill"]
        starts = sum(p.get("steps_printed") == 0 for p in k.kill_points)  # killed before printing a step
        out += [Figure("kill", "kill -9 delivered", f"{k.kills_delivered} of {k.kills_planned} ({starts} in start-up), {k.steps} steps"),
                Figure("kill", "steps logged, then redone after a kill", k.steps_redone),
                Figure("kill", "run finished after the kills", int(not k.finished), 0),
                Figure("kill", "MLflow rows duplicated", k.mlflow_duplicates, 0),
                Figure("kill", "MLflow rows missing / extra", k.mlflow_missing + k.mlflow_extra, 0),
                Figure("kill", "MLflow runs left RUNNING", k.runs_left_running, 0),
                Figure("kill", "runs closed as KILLED (killed before 1st checkpoint)", k.runs_closed_as_killed),
                Figure("kill", "checkpoints lost (vs the reference)", k.checkpoints_lost, 0),
                Figure("kill", "incomplete checkpoints / temp files left", k.incomplete_checkpoints + k.temp_files_left, 0),
                Figure("kill", "curve max |diff| vs reference", f"{k.curve_max_abs_diff:.3g}"),
                Figure("kill", "MLflow rows max |diff| vs reference", f"{k.mlflow_vs_reference_max_abs_diff:.3g}"),
                Figure("kill", "final weights max |diff| vs reference", f"{k.final_weights_max_abs_diff:.3g}")]
    if "damage" in results:
        d = results["damage"]
        out += [Figure("damage", "kinds of damage (each on the newest checkpoint)", f"{len(d.kinds)}: {', '.join(d.kinds)}"),
                Figure("damage", "failed resumes", d.failed_resumes, 0),
                Figure("damage", "damaged checkpoints deleted (not moved aside)", d.damaged_deleted, 0),
                Figure("damage", "reruns that did not say what they skipped", len(d.kinds) - d.told, 0)]
    for o in results.get("outage", []):
        name = f"outage {o.what.split()[0]}"
        out += [Figure(name, "down", f"{o.down_measured_s:.0f} s from step {o.down_at_step}; {o.steps_during_outage} steps meanwhile"),
                Figure(name, "run did not finish", int(not o.finished), 0)]
        if o.what.startswith("S3"):
            out.append(Figure(name, "checkpoints lost", o.checkpoints_lost, 0))
        out += [Figure(name, "metric rows lost / duplicated", o.metric_rows_lost + o.metric_rows_duplicated, 0),
                Figure(name, "artifacts lost", o.artifacts_lost, 0)]
    return out


def print_table(figs: list[Figure], console: Any) -> None:
    from rich.table import Table

    table = Table(title="reliability (127.0.0.1)")
    for col, justify in (("section", "left"), ("figure", "left"), ("value", "right"), ("must be", "right")):
        table.add_column(col, justify=justify)
    for f in figs:
        value = str(f.value) if f.ok else f"[red]{f.value}[/red]"
        table.add_row(f.section, f.name, value, "" if f.target is None else str(f.target))
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"sections to run, comma-separated ({', '.join(SECTIONS)})")
    ap.add_argument("--quick", action="store_true", help="small counts (a few minutes on 2 cores)")
    ap.add_argument("--families", default=",".join(FAMILIES), help="families to fuzz (default: all)")
    ap.add_argument("--fuzz-requests", type=int, default=None, help="schema requests per family (default 2000; quick 300)")
    ap.add_argument("--raw-requests", type=int, default=None, help="raw-socket requests per family (default 400; quick 100)")
    ap.add_argument("--ws-frames", type=int, default=None, help="malformed WebSocket frames per family (default 200; quick 50)")
    ap.add_argument("--sessions", type=int, default=256, help="concurrent sessions (default 256, the server's default capacity)")
    ap.add_argument("--session-steps", type=int, default=None, help="steps per concurrent session (default 40; quick 12)")
    ap.add_argument("--victims", type=int, default=8, help="sessions attacked in the cross-session part (default 8)")
    ap.add_argument("--flood", type=int, default=None, help="slow connections of the flood (default 2000; quick 600)")
    ap.add_argument("--flood-rate", type=float, default=128.0, help="flood connections per second (default 128)")
    ap.add_argument("--reclaim", type=int, default=None, help="idle WebSocket sessions to reclaim (default 256; quick 64)")
    ap.add_argument("--damages", default=",".join(DAMAGES), help=f"kinds of checkpoint damage (default all: {', '.join(DAMAGES)})")
    ap.add_argument("--kills", type=int, default=None, help="kill -9 points (default 5; quick 2)")
    ap.add_argument("--train-steps", type=int, default=None, help="steps of the killed run (default 12; quick 6)")
    ap.add_argument("--outage-s", type=float, default=None, help="seconds each server stays down (default 60; quick 10)")
    ap.add_argument("--outage-steps", type=int, default=None, help="steps of each outage run (default 30; quick 10)")
    ap.add_argument("--seed", type=int, default=20261124)
    ap.add_argument("--json", default=None, help="write the details here (default: a new file in the temp directory)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (runs, logs, databases)")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if unknown := [s for s in only if s not in SECTIONS]:
        ap.error(f"unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    if unknown := [f for f in families if f not in FAMILIES]:
        ap.error(f"unknown family {unknown}; choose from {', '.join(FAMILIES)}")
    q = args.quick
    pick = lambda value, full, quick: value if value is not None else (quick if q else full)  # noqa: E731
    n_schema, n_raw, n_frames = pick(args.fuzz_requests, 2000, 300), pick(args.raw_requests, 400, 100), pick(args.ws_frames, 200, 50)
    kills, train_steps = pick(args.kills, 5, 2), pick(args.train_steps, 12, 6)
    down_s, outage_steps = pick(args.outage_s, 60.0, 10.0), pick(args.outage_steps, 30, 10)
    session_steps = pick(args.session_steps, 40, 12)
    n_flood, n_reclaim = pick(args.flood, 2000, 600), pick(args.reclaim, 256, 64)
    damages = [d.strip() for d in args.damages.split(",") if d.strip()]
    if unknown := [d for d in damages if d not in DAMAGES]:
        ap.error(f"unknown damage {unknown}; choose from {', '.join(DAMAGES)}")
    counts = {"--fuzz-requests": n_schema, "--raw-requests": n_raw, "--ws-frames": n_frames, "--sessions": args.sessions,
              "--session-steps": session_steps, "--victims": args.victims, "--kills": kills, "--outage-steps": outage_steps}
    if low := [flag for flag, n in counts.items() if n < 1]:
        ap.error(f"{', '.join(low)} must be at least 1")
    if train_steps < 2 or down_s <= 0:
        ap.error("--train-steps must be at least 2 and --outage-s above 0")
    if "fuzz" in only:
        try:
            import hypothesis  # noqa: F401
        except ImportError:
            ap.error("the fuzz section needs hypothesis: pip install 'hypothesis>=6.100,<7' (or --only without fuzz)")

    from sdar.console import make_console

    console = make_console(min_width=120)
    work = Path(tempfile.mkdtemp(prefix="sdar-reliability-"))
    timeout_s = 900.0  # per training run

    def fuzz() -> list[FuzzResult]:
        out = []
        for i, family in enumerate(families):
            console.print(f"fuzz {family}: {n_schema} schema requests, {n_raw} raw requests, {n_frames} WebSocket frames ...")
            out.append(r := fuzz_family(family, n_schema, n_raw, n_frames, args.seed + i))
            console.print(f"  {r.server_errors} 5xx, {r.unanswered} unanswered in {r.wall_s:.0f} s; "
                          f"server RSS {r.rss_mb[0]} -> {r.rss_mb[1]} MB")
        return out

    def sessions() -> dict[str, Any]:
        from bench_env_load import bench_family

        console.print(f"sessions: cross-session attempts on {args.victims} household sessions ...")
        cross = cross_session("household", args.victims)
        console.print(f"sessions: {args.sessions} concurrent WebSocket sessions x {session_steps} steps (household) ...")
        return {"cross": cross, "load": bench_family("household", args.sessions, session_steps, duration_s=300.0)}

    def flood() -> FloodResult:
        console.print(f"flood: {n_flood} slow connections from one address at {args.flood_rate:g}/s, /health probed throughout ...")
        return flood_section(n_flood, args.flood_rate)

    def reclaim() -> ReclaimResult:
        console.print(f"reclaim: {n_reclaim} idle WebSocket sessions ...")
        return reclaim_section(n_reclaim)

    def damage() -> DamageResult:
        console.print(f"damage: a 2-step run's newest checkpoint damaged {len(damages)} ways, each rerun ...")
        return damage_section(damages, work, timeout_s)

    def kill() -> KillResult:
        console.print(f"kill: {train_steps}-step training runs, {kills} x kill -9 at random points ...")
        return kill_section(train_steps, kills, 3 if train_steps >= 9 else 2, args.seed, work, timeout_s)

    def pipeline():
        from reliability_faults import pipeline_section

        console.print("pipeline: a quick local run killed with SIGKILL mid-training, then resumed ...")
        return pipeline_section(work, timeout_s=timeout_s)

    def diskfull():
        from reliability_faults import diskfull_section

        console.print("diskfull: sdar train on a small tmpfs filled under its checkpoints, then its MLflow store ...")
        return diskfull_section(work, timeout_s=timeout_s)

    def outage() -> list[OutageResult]:
        console.print(f"outage: S3 down {down_s:g} s during a {outage_steps}-step run ...")
        s3 = s3_outage(down_s, outage_steps, work, timeout_s)
        console.print(f"outage: MLflow down {down_s:g} s during a {outage_steps}-step run ...")
        return [s3, mlflow_outage(down_s, outage_steps, work, timeout_s)]

    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    wall: dict[str, float] = {}
    t_all = time.monotonic()
    try:
        for name, section in (("fuzz", fuzz), ("sessions", sessions), ("flood", flood), ("reclaim", reclaim), ("kill", kill),
                              ("damage", damage), ("outage", outage), ("pipeline", pipeline), ("diskfull", diskfull)):
            if name not in only:
                continue
            t0 = time.monotonic()
            try:
                results[name] = section()
            except Exception as exc:  # noqa: BLE001 - reported as a failed figure; the other sections still run
                errors[name] = f"{type(exc).__name__}: {exc}"
                console.print(f"[red]{name} failed:[/red] {errors[name][-2000:]}", markup=True, highlight=False)
            wall[name] = time.monotonic() - t0
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    from reliability_faults import figures as fault_figures

    figs = (figures(results) + fault_figures(results, Figure)
            + [Figure(name, "section failed (see above)", 1, 0) for name in errors])
    print_table(figs, console)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    console.print(f"host: {os.cpu_count()} CPUs, load average {load:.1f}; {time.monotonic() - t_all:.0f} s in all "
                  f"({', '.join(f'{k} {v:.0f} s' for k, v in wall.items())})" + (f"; work kept in {work}" if args.keep else ""))
    path = Path(args.json or Path(tempfile.gettempdir()) / f"sdar-reliability-{time.strftime('%Y%m%d-%H%M%S')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {"args": vars(args), "figures": [{**asdict(f), "ok": f.ok} for f in figs], "sections": _plain(results),
              "errors": errors, "wall_s": wall, "host": {"cpus": os.cpu_count(), "load_average": load}}
    path.write_text(json.dumps(report, indent=1, default=str))
    failed = [f for f in figs if not f.ok]
    console.print(f"details: {path}")
    console.print("OK: every figure that must be 0 is 0" if not failed else
                  f"FAILED: {', '.join(f'{f.section} {f.name} = {f.value}' for f in failed)}")
    return 1 if failed else 0


def _plain(value: Any) -> Any:
    """Dataclasses (in lists and dicts) as dicts, for the JSON report."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):  # a run's whole output is for the tests, not the report
        return {k: v for k, v in asdict(value).items() if not k.endswith("_output")}
    return value


if __name__ == "__main__":
    sys.exit(main())
