"""Requests generated with hypothesis from an environment server's served OpenAPI schema: every operation,
its path and query parameters and its request body from the schema, values mostly of the documented type and
sometimes of another, of an odd size, under a reserved key, or with someone else's token. Used by
benchmarks/bench_reliability.py and tests/reliability/test_env_server_fuzz.py."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Request bodies come from the served schema (each operation's requestBody, $refs resolved). Properties whose
# values must be live to reach the handlers are drawn from what the server holds ({"x": ...}: task ids,
# actions, session ids, tokens, the JSON-RPC methods there are); RESERVED are keys that were once the
# server's own argument names (a body with one of them gave a 500), added beside the documented ones.
LIVE = {"task_id": "task", "message": "action", "session_id": "sid", "session_token": "token", "method": "method"}
HINTS = {("POST", "/mcp"): {"params": {"type": "object", "properties": {"session_id": {}, "session_token": {}}}}}
RESERVED = ["self", "sid", "func", "call", "step", "kwargs", "args", "request", "env", "session_id", "timeout_s"]
RPC_METHODS = ["openenv/session/create", "openenv/session/close", "tools/list", "tools/call"]


def _resolve(spec: dict, schema: dict) -> dict:
    """`schema` with every $ref into components/schemas replaced by its target (recursively)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return _resolve(spec, {**spec["components"]["schemas"][name], **{k: v for k, v in schema.items() if k != "$ref"}})
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {k: ({"x": LIVE[k]} if k in LIVE else _resolve(spec, v)) for k, v in out["properties"].items()}
    if "anyOf" in out:
        out["anyOf"] = [_resolve(spec, s) for s in out["anyOf"]]
    return out


def request_bodies(spec: dict) -> dict[tuple[str, str], dict]:
    """(METHOD, path) -> the JSON schema of its request body, as served (plus HINTS), for every operation with one."""
    bodies = {}
    for path, item in spec["paths"].items():
        for method, op in item.items():
            content = (op.get("requestBody") or {}).get("content", {}).get("application/json")
            if content is None:
                continue
            schema = _resolve(spec, content["schema"])
            for name, hint in HINTS.get((method.upper(), path), {}).items():
                schema.setdefault("properties", {})[name] = _resolve(spec, {**hint, "properties": {
                    k: ({"x": LIVE[k]} if k in LIVE else v) for k, v in hint.get("properties", {}).items()}})
            bodies[(method.upper(), path)] = schema
    return bodies


METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]


@dataclass
class Live:
    """What the server holds now: task ids, plausible actions, the operator token, and a pool of
    (session id, token) of open sessions (the caller replaces those a request closed)."""

    tasks: list[str]
    actions: list[str]
    operator: str
    pool: list[tuple[str, str]]


@dataclass
class Request:
    method: str
    path: str  # with its query
    headers: dict[str, str]
    body: bytes
    slot: int  # the pool session the request is aimed at

    def wire(self) -> bytes:
        """The request as bytes on a fresh connection that closes after the answer."""
        head = f"{self.method} {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {len(self.body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
        return head.encode("utf-8", "surrogatepass") + b"\r\n" + self.body

    @property
    def closes_a_session(self) -> bool:
        return self.method == "DELETE" or b"session/close" in self.body


def requests(spec: dict, live: Live) -> Any:
    """A hypothesis strategy of `Request`s against the operations of `spec` (an OpenAPI document)."""
    from hypothesis import strategies as st

    any_json = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
        max_leaves=12,
    )
    huge = st.sampled_from([100, 4097, 30_000, 100_000]).map(lambda n: "x" * n)
    slots = st.sampled_from(range(len(live.pool)))
    drawn = {
        "task": st.sampled_from(live.tasks) | st.text(max_size=30) | huge,
        "action": st.sampled_from(live.actions) | st.text(max_size=40) | huge,
        "sid": slots.map(lambda i: live.pool[i][0]) | st.text(max_size=30),
        "token": slots.map(lambda i: live.pool[i][1]) | st.text(max_size=50),
        "method": st.sampled_from(RPC_METHODS),
    }
    bodies = request_bodies(spec)

    def from_schema(schema: dict) -> Any:
        if "x" in schema:
            typed = drawn[schema["x"]]
        elif "anyOf" in schema:
            typed = st.one_of([from_schema(s) for s in schema["anyOf"]])
        elif "enum" in schema:
            typed = st.sampled_from(schema["enum"])
        elif "const" in schema:
            typed = st.just(schema["const"])
        elif schema.get("type") == "integer":
            typed = st.integers() | st.sampled_from([2**63, -(2**63) - 1, 10**70])
        elif schema.get("type") == "object":
            props = {k: from_schema(v) for k, v in schema.get("properties", {}).items()}
            extra = st.dictionaries(st.sampled_from(RESERVED) | st.text(max_size=10), any_json, max_size=2)
            typed = st.tuples(st.fixed_dictionaries({}, optional=props), extra).map(lambda p: {**p[1], **p[0]})
        elif schema.get("type") == "null":
            typed = st.none()
        elif schema.get("type") == "boolean":
            typed = st.booleans()
        elif schema.get("type") == "number":
            typed = st.floats(allow_nan=False) | st.integers()
        else:
            typed = st.text(max_size=40)
        return st.one_of(typed, typed, typed, any_json)  # mostly the documented type

    ops = [(m.upper(), path, op.get("parameters", [])) for path, item in spec["paths"].items() for m, op in item.items()]
    who = st.sampled_from(["own", "own", "other", "operator", "none"]) | st.text(max_size=50)

    @st.composite
    def request(draw: Callable) -> Request:
        method, path, params = draw(st.sampled_from(ops))
        body_schema = bodies.get((method, path))
        if draw(st.integers(0, 9)) == 0:  # a method the route does not take
            method = draw(st.sampled_from(METHODS))
        slot = draw(slots)
        sid, token = live.pool[slot]
        query = {}
        for p in params:
            if p["in"] == "path":
                value = draw(st.just(sid) | st.just(sid) | from_schema({"x": "sid"}) | from_schema(p.get("schema", {})))
                path = path.replace("{" + p["name"] + "}", urllib.parse.quote(str(value), safe=""))
            elif p["in"] == "query" and draw(st.booleans()):
                value = draw(from_schema(p.get("schema", {})))
                query[p["name"]] = value if isinstance(value, str) else json.dumps(value)
        if query:
            path += "?" + urllib.parse.urlencode(query)
        headers = {}
        holder = draw(who)
        if holder != "none":
            other = live.pool[(slot + 1) % len(live.pool)][1]
            given = {"own": token, "other": other, "operator": live.operator}.get(holder, holder)
            headers["Authorization"] = draw(st.sampled_from(["Bearer ", "Bearer ", "bearer ", "Basic "])) + given
        body = b""
        if body_schema is not None or draw(st.integers(0, 9)) == 0:
            kind = draw(st.integers(0, 5))
            if kind <= 4:
                value = draw(from_schema(body_schema) if kind <= 3 and body_schema is not None else any_json)
                body = json.dumps(value, ensure_ascii=draw(st.booleans())).encode("utf-8")
            else:
                body = draw(st.binary(max_size=300))
            headers["Content-Type"] = draw(st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded"]))
        return Request(method, path, headers, body, slot)

    return request()


def for_each(strategy: Any, n: int, seed: int, fn: Callable[[Any], None]) -> None:
    """Call `fn` on `n` examples of `strategy`, drawn from `seed` (generation only: nothing is shrunk,
    so `fn` records what it sees instead of raising)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed

    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @fixed_seed(seed)
    @given(strategy)
    def run(example: Any) -> None:
        fn(example)

    run()
