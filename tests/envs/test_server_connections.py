"""Connections, not only sessions, are bounded per client address and in all; one address cannot take the
server's /health (or its probe port) down; reclaimed WebSockets are closed; request bodies are validated
against the models the server publishes. Real servers on 127.0.0.1 (other loopback addresses play other
clients), spoken to over raw sockets and WebSockets."""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.parse

import pytest

from tests.envs.test_server import GUESS_FACTORY, _http, _open
from tests.envs.test_server_limits import read_response


def _hold(port: int, n: int, source: str = "127.0.0.1") -> list[socket.socket]:
    """`n` connections from `source` that never send a byte (a slow-header client)."""
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
        out.append(s)
    return out


def _answered_at_once(sock: socket.socket) -> tuple[int | None, dict]:
    """The answer a connection gets without sending anything (a refused one gets it at once)."""
    status, _, body = read_response(sock, timeout_s=3.0)
    return status, (json.loads(body) if body else {})


def _probe(url: str, source: str | None = None) -> int:
    try:
        return _http("GET", f"{url}/health", source=source)[0]
    except OSError:
        return 0


def test_the_defaults_fit_a_pipeline_and_no_one_address_fills_a_server():
    from sdar_envs.server.config import ServerOptions

    d = ServerOptions()
    # a paper-scale trainer pod holds 16 x 8 = 128 sessions; an address may hold two such steps' worth
    assert d.max_sessions_per_client >= 2 * 16 * 8
    assert d.max_sessions >= 4 * d.max_sessions_per_client  # one address can never fill the server ...
    assert d.connections_per_client_limit == d.max_sessions_per_client + 64  # ... with its WebSockets and HTTP
    assert d.connections_limit == d.max_sessions + 256 > 3 * d.connections_per_client_limit
    # behind a proxy (one address for every client) both per-address limits go off together
    proxied = ServerOptions(max_sessions_per_client=0)
    assert proxied.connections_per_client_limit == 0
    with pytest.raises(ValueError, match="max_connections_per_client=10 is below the 20 sessions a client may hold"):
        ServerOptions(max_sessions_per_client=20, max_connections_per_client=10)
    with pytest.raises(ValueError, match="max_connections=10 is below max_sessions=20"):
        ServerOptions(max_sessions=20, max_connections=10)


def test_one_address_cannot_take_health_down():
    """Slow connections from one address stop at its own limit (answered 429 at once and closed); /health on the
    main port (from another address) and on the probe port (from that same address, as a kubelet on its node
    would) keep answering, and another client keeps playing; many addresses together stop at the global limit,
    and the probe port still answers."""
    from sdar_envs.client import RemoteEnv
    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server.config import ServerOptions

    opts = ServerOptions(max_sessions=16, max_sessions_per_client=8, max_connections_per_client=12, max_connections=40,
                         probe_port=0, header_timeout_s=30.0)  # fmt: skip
    url, handle = serve_in_background(GUESS_FACTORY, options=opts)
    port = urllib.parse.urlsplit(url).port
    assert handle.probe_url is not None and handle.probe_url != url
    with handle:
        held = _hold(port, 12)
        time.sleep(0.3)
        refused = _hold(port, 40)  # one address's flood, beyond its limit: each answered at once
        answers = [_answered_at_once(s) for s in refused]
        for s in refused:
            s.close()
        assert {status for status, _ in answers} == {429}
        assert "already holds 12 open connections" in answers[0][1]["detail"]
        assert "--max-connections-per-client" in answers[0][1]["detail"]
        # the held ones are still open (their header deadline is 30 s), and /health answers throughout
        assert all(_probe(url, source="127.0.0.2") == 200 for _ in range(10))
        assert all(_probe(handle.probe_url) == 200 for _ in range(10))  # from the flooding address itself
        assert _probe(url) == 429  # the main port refuses the flooding address itself: its probes use the probe port
        # a client on another address plays a whole episode meanwhile
        sid, token = _open(url, source="127.0.0.3")
        status, out = _http("POST", f"{url}/sessions/{sid}/reset", {"task_id": "test-4"}, token=token, source="127.0.0.3")
        assert status == 200
        status, out = _http("POST", f"{url}/sessions/{sid}/step", {"action": {"message": "guess 4"}}, token=token, source="127.0.0.3")
        assert status == 200 and out["observation"]["won"] is True
        info = _http("GET", f"{url}/info", source="127.0.0.2")[1]
        assert info["max_connections_per_client"] == 12 and info["max_connections"] == 40
        status, counts = _http("GET", f"{url}/sessions", source="127.0.0.2")
        assert counts["connections"]["refused_per_client"] >= 40
        # many addresses together fill the server: the next connection gets 503, the probe port still answers
        for i in range(4, 8):
            held += _hold(port, 12 if i < 7 else 5, source=f"127.0.0.{i}")
        time.sleep(0.3)
        late = _hold(port, 1, source="127.0.0.9")[0]
        status, body = _answered_at_once(late)
        late.close()
        assert status == 503 and "its limit (--max-connections)" in body["detail"]
        assert _probe(handle.probe_url) == 200
        # the probe port answers nothing but /health
        probe_port = urllib.parse.urlsplit(handle.probe_url).port
        with socket.create_connection(("127.0.0.1", probe_port), timeout=5) as s:
            s.sendall(b"POST /sessions HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(s)[0] == 404
        for s in held:
            s.close()
        # once they are gone, everyone is served again
        deadline = time.monotonic() + 10
        while _probe(url) != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _probe(url) == 200


def test_the_probe_port_cannot_be_filled_by_one_address():
    """Should a client reach the probe port (the NetworkPolicy off), it holds at most a few connections there:
    the kubelet, on another address, is still answered."""
    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server.config import ServerOptions

    url, handle = serve_in_background(GUESS_FACTORY, options=ServerOptions(probe_port=0), in_process=True)
    probe_port = urllib.parse.urlsplit(handle.probe_url).port
    with handle:
        silent = _hold(probe_port, 4)  # its share, each waiting for a request head
        time.sleep(0.2)
        extra = _hold(probe_port, 1)[0]
        assert read_response(extra, timeout_s=3.0)[0] is None  # closed without an answer
        assert _probe(handle.probe_url, source="127.0.0.2") == 200
        for s in silent + [extra]:
            s.close()
        time.sleep(0.2)
        assert _probe(handle.probe_url) == 200


def test_websockets_count_against_the_connection_limits():
    """uvicorn's own limit never counted WebSocket upgrades; ours counts them from the upgrade to their close."""
    from websockets.sync.client import connect

    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server.config import ServerOptions

    opts = ServerOptions(max_sessions=64, max_sessions_per_client=0, max_connections_per_client=5)
    url, handle = serve_in_background(GUESS_FACTORY, options=opts, in_process=True)
    ws_url = url.replace("http://", "ws://") + "/ws"
    with handle, contextlib.ExitStack() as stack:
        conns = [stack.enter_context(connect(ws_url, open_timeout=10)) for _ in range(5)]
        for i, ws in enumerate(conns):
            ws.send(json.dumps({"type": "reset", "data": {"task_id": f"test-{i}"}}))
            assert json.loads(ws.recv(timeout=10))["type"] == "observation"
        for _ in range(20):  # the refusal waits for the handshake: answered at connect, the client often found
            with pytest.raises(Exception, match="429"):  # the socket closed before it could send, no status
                connect(ws_url, open_timeout=10)
        assert _http("GET", f"{url}/health", source="127.0.0.2") == (200, {"status": "healthy"})
        status, counts = _http("GET", f"{url}/sessions", source="127.0.0.2")
        assert counts["connections"]["open"] >= 5 and counts["connections"]["yours"] == 1
        conns.pop().close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # its place is freed when it closes
            try:
                with connect(ws_url, open_timeout=10) as ws:
                    ws.send(json.dumps({"type": "reset", "data": {"task_id": "test-9"}}))
                    assert json.loads(ws.recv(timeout=10))["type"] == "observation"
                break
            except Exception:  # noqa: BLE001 - the close is still on its way
                time.sleep(0.1)
        else:
            pytest.fail("a closed WebSocket did not free its place")


def test_reclaimed_websockets_are_closed_with_the_reason():
    """The reaper closes a reclaimed WebSocket (an error message saying why, then a close frame), so no idle
    connection stays open: the server's connection count goes back to zero with no client traffic."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server.config import ServerOptions

    opts = ServerOptions(session_ttl_s=1.0, reap_interval_s=0.1)
    url, handle = serve_in_background(GUESS_FACTORY, options=opts, in_process=True)
    ws_url = url.replace("http://", "ws://") + "/ws"
    with handle, contextlib.ExitStack() as stack:
        conns = [stack.enter_context(connect(ws_url, open_timeout=10)) for _ in range(12)]
        for i, ws in enumerate(conns):
            ws.send(json.dumps({"type": "reset", "data": {"task_id": f"test-{i}"}}))
            assert json.loads(ws.recv(timeout=10))["type"] == "observation"
        assert _http("GET", f"{url}/info")[1]["open_connections"] >= 12
        for ws in conns:  # no traffic: each is reclaimed after 1 s and told so
            reply = json.loads(ws.recv(timeout=10))
            assert reply["type"] == "error" and reply["data"]["code"] == "SESSION_EXPIRED"
            assert "idle for more than 1 s" in reply["data"]["message"]
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
            assert "reclaimed; reconnect" in closed.value.rcvd.reason
        deadline = time.monotonic() + 5
        while _http("GET", f"{url}/info")[1]["open_connections"] > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        info = _http("GET", f"{url}/info")[1]
        assert info["open_connections"] <= 1 and info["active_sessions"] == 0 and info["sessions_expired"] == 12


# ---- bodies: validated against published models, before anything is called --------------------------
RESERVED = [{"self": 1}, {"sid": "x"}, {"func": 1}, {"kwargs": {}}, {"args": []}, {"call": 1}, {"step": True}]
WRONG_IDS = [{"episode_id": 5}, {"episode_id": {"a": 1}}, {"episode_id": True}, {"episode_id": 1.5},
             {"task_id": 7}, {"seed": "3"}, {"seed": 1.5}, {"seed": True}, {"seed": -1}, {"episode_id": "e" * 300}]


def test_reset_and_step_bodies_never_cause_a_server_error(tmp_path):
    from sdar_envs.launcher import serve_in_background

    url, handle = serve_in_background(GUESS_FACTORY, in_process=True)
    with handle:
        sid, token = _open(url)
        base = f"{url}/sessions/{sid}"
        assert _http("POST", f"{base}/reset", {"task_id": "test-3", "episode_id": "ep-1"}, token=token)[0] == 200
        for body in RESERVED:
            status, reply = _http("POST", f"{base}/reset", body, token=token)
            assert status == 400 and f"unknown reset parameter(s) {sorted(body)}" in reply["detail"], (body, reply)
        for body in WRONG_IDS:
            status, reply = _http("POST", f"{base}/reset", body, token=token)
            assert status == 422 and reply["error"] == "invalid_request", (body, reply)
            assert reply["detail"][0]["loc"] == [next(iter(body))], (body, reply)
            # the refused body touched nothing: the episode and its state read back as before
            status, state = _http("GET", f"{base}/state", token=token)
            assert status == 200 and state["episode_id"] == "ep-1" and state["task_id"] == "test-3", (body, state)
        for body in [{"action": {"message": "guess 1"}, **extra} for extra in RESERVED] + [{"action": "guess 1"}]:
            status, reply = _http("POST", f"{base}/step", body, token=token)
            assert status in (400, 422) and "detail" in reply, (body, reply)
        assert _http("GET", f"{base}/state", token=token)[1]["step_count"] == 0
        status, out = _http("POST", f"{base}/step", {"action": {"message": "guess 3"}}, token=token)
        assert status == 200 and out["observation"]["won"] is True


def test_a_failed_reset_leaves_no_task_behind():
    from sdar_envs.launcher import serve_in_background

    url, handle = serve_in_background(GUESS_FACTORY, in_process=True)
    with handle:
        sid, token = _open(url)
        base = f"{url}/sessions/{sid}"
        assert _http("POST", f"{base}/reset", {"task_id": "test-3"}, token=token)[0] == 200
        assert _http("POST", f"{base}/reset", {"task_id": "nope-1"}, token=token)[0] == 404
        status, state = _http("GET", f"{base}/state", token=token)
        assert status == 200 and state["task_id"] is None and state["task"] is None and state["observations"] == []
        assert state["episode_id"] is None and state["step_count"] == 0 and state["done"] is False
        assert _http("POST", f"{base}/step", {"action": {"message": "guess 3"}}, token=token)[0] == 409


def test_the_served_schema_declares_every_request_body():
    from sdar_envs.launcher import serve_in_background

    url, handle = serve_in_background(GUESS_FACTORY, in_process=True)
    with handle:
        spec = _http("GET", f"{url}/openapi.json")[1]
    schemas = spec["components"]["schemas"]
    for path, name in (("/sessions/{sid}/reset", "SdarResetRequest"), ("/sessions/{sid}/step", "SdarStepRequest"),
                       ("/mcp", "JsonRpcRequest")):  # fmt: skip
        body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{name}"}
        assert schemas[name].get("additionalProperties") is not True
    reset = schemas["SdarResetRequest"]
    assert set(reset["properties"]) == {"task_id", "seed", "episode_id"} and reset["additionalProperties"] is False
    step = schemas["SdarStepRequest"]
    assert step["required"] == ["action"] and step["properties"]["action"]["$ref"] == "#/components/schemas/SdarAction"
    assert schemas["SdarAction"]["required"] == ["message"]


def test_options_survive_the_command_line_a_background_server_is_started_with():
    import dataclasses

    from sdar_envs.server.config import ServerOptions, add_serve_arguments, options_from_args, options_to_args

    opts = ServerOptions(family="shop", env_kwargs={"backend": "sim"}, port=1234, max_sessions=77, max_sessions_per_client=9,
                         max_connections_per_client=20, max_connections=300, probe_port=4321, session_ttl_s=12.5,
                         reap_interval_s=0.5, max_action_chars=99, header_timeout_s=3.0, body_timeout_s=4.0, keep_alive_s=6,
                         log_level="info")  # fmt: skip
    # every field is off its default, so a flag options_to_args forgot would show in the round trip
    assert all(getattr(opts, f.name) != getattr(ServerOptions(), f.name) for f in dataclasses.fields(opts)
               if f.name != "host")  # fmt: skip
    parser = _parser(add_serve_arguments)
    back = options_from_args(parser.parse_args(["--env", "shop", "--port", "1234", "--backend", "sim", *options_to_args(opts)]))
    assert back == opts
    assert options_from_args(parser.parse_args(["--env", "x", *options_to_args(ServerOptions())])) == ServerOptions(family="x")


def _parser(add):
    import argparse

    parser = argparse.ArgumentParser()
    add(parser)
    return parser


def _stalled_session(monkeypatch, *, interval_s: float, timeout_s: float, stall_s: float) -> str:
    """A household session whose client's event-loop thread is blocked for `stall_s` (it answers no ping meanwhile)
    against a server pinging every `interval_s` that drops a client after `timeout_s` without an answer; then one
    step on the same session. Returns its observation, or the error it raised."""
    from sdar_envs.client import RemoteEnv
    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server import process

    monkeypatch.setattr(process, "WS_PING_INTERVAL_S", interval_s)
    monkeypatch.setattr(process, "WS_PING_TIMEOUT_S", timeout_s)
    url, handle = serve_in_background("household", backend="sim", in_process=True)
    try:
        env = RemoteEnv(url, "household")
        assert env.reset(task_id=None, seed=1).observation
        env._client._loop.call_soon_threadsafe(time.sleep, stall_s)  # the sync client's event-loop thread
        time.sleep(stall_s + 0.5)
        try:
            return env.step("look").observation
        except Exception as exc:  # noqa: BLE001 - what the client raises for a dropped session is the finding
            return f"error: {exc!r}"
        finally:
            with contextlib.suppress(Exception):
                env.close()
    finally:
        handle.stop()


@pytest.mark.slow
def test_a_client_whose_event_loop_stalls_past_uvicorns_ping_timeout_keeps_its_session(monkeypatch):
    """A trainer on a loaded CPU can leave the server's keepalive pings unanswered for tens of seconds (its WebSocket's
    event-loop thread starved); the session must survive that: the server drops a client after WS_PING_TIMEOUT_S of
    silence, 300 s, not uvicorn's 20 s, which closed the sessions of SmolLM2 pipeline runs on 2 cores. Run at a
    twentieth of the time scale (a ping every 1 s): a stall of 6 s keeps the session when the timeout is 15 s (300 s
    scaled) and loses it at 1 s (uvicorn's 20 s scaled), so the stall is long enough to be dropped."""
    from sdar_envs.server.app import create_env_app
    from sdar_envs.server.config import ServerOptions
    from sdar_envs.server.process import WS_PING_INTERVAL_S, WS_PING_TIMEOUT_S, uvicorn_config

    assert WS_PING_TIMEOUT_S >= 120
    options = ServerOptions(family="household", env_kwargs={"backend": "sim"})
    config = uvicorn_config(create_env_app(options), options)  # what a server is started with
    assert (config.ws_ping_interval, config.ws_ping_timeout) == (WS_PING_INTERVAL_S, WS_PING_TIMEOUT_S) == (30.0, 300.0)
    kept = _stalled_session(monkeypatch, interval_s=1.0, timeout_s=WS_PING_TIMEOUT_S / 20, stall_s=6.0)
    assert not kept.startswith("error:"), kept
    dropped = _stalled_session(monkeypatch, interval_s=1.0, timeout_s=1.0, stall_s=6.0)
    assert dropped.startswith("error:"), f"a stall past the ping timeout kept its session, so the test shows nothing: {dropped}"
