"""The OpenEnv-based environment server and its clients, on a tiny guessing game served for real on 127.0.0.1."""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import threading
import time
import urllib.parse
import urllib.request

import pytest

from sdar_envs.base import METADATA_KEYS, EnvStep, TextEnv
from sdar_envs.skills import SkillLibrary

GUESS_FACTORY = "tests.envs.test_server:GuessEnv"
OPERATOR = "operator-token-for-tests-0123456789"


class GuessEnv(TextEnv):
    """Guess the secret digit of a task; every observation names its task and step.

    Task ids are "{split}-{i}", the secret is i % 10; invalid actions are marked for hints.
    `closed` records every env that was closed (read by the TTL test in the same process).
    """

    family = "guess"
    closed: list[int] = []

    def __init__(self, n_tasks: int = 30, max_steps: int = 8) -> None:
        super().__init__()
        self.n_tasks = n_tasks
        self.max_steps = max_steps

    def task_ids(self, split: str = "test") -> list[str]:
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}; use train or test")
        return [f"{split}-{i}" for i in range(self.n_tasks)]

    def _md(self, **kw):
        md = {
            "won": False,
            "admissible_actions": [f"guess {i}" for i in range(10)],
            "task_type": "parity_even" if self.secret % 2 == 0 else "parity_odd",
            "valid_action": True,
            "error_kind": None,
            "hint_template_key": None,
        }
        md.update(kw)
        return md

    def _reset(self, task_id, seed):
        if task_id is None:
            task_id = f"test-{random.Random(seed).randrange(self.n_tasks)}"
        split, _, idx = task_id.partition("-")
        if split not in ("train", "test") or task_id not in self.task_ids(split):
            raise KeyError(f"no task {task_id!r}")
        self.tid, self.secret, self.t = task_id, int(idx) % 10, 0
        return EnvStep(f"[{task_id}] step 0: guess my digit", metadata=self._md(task=self.task_text, task_id=task_id))

    def _step(self, action):
        self.t += 1
        out_of_steps = self.t >= self.max_steps
        parts = action.split()
        if len(parts) != 2 or parts[0] != "guess" or not parts[1].isdigit():
            md = self._md(valid_action=False, error_kind="invalid_action", hint_template_key="action_format")
            return EnvStep(f"[{self.tid}] step {self.t}: say 'guess N'", 0.0, out_of_steps, md)
        g = int(parts[1])
        if g == self.secret:
            return EnvStep(f"[{self.tid}] step {self.t}: correct", 1.0, True, self._md(won=True, tries=self.t))
        hint = "higher" if g < self.secret else "lower"
        return EnvStep(f"[{self.tid}] step {self.t}: {hint}", 0.0, out_of_steps, self._md(tries=self.t))

    @property
    def task_text(self) -> str:
        return f"find the digit of {self.tid}"

    @property
    def task_type(self) -> str:
        return "parity_even" if self.secret % 2 == 0 else "parity_odd"

    def expert_action(self) -> str:
        return f"guess {self.secret}"

    def skills_key(self) -> str | None:
        return self.task_type

    @classmethod
    def skill_library(cls) -> SkillLibrary:
        return SkillLibrary(
            "guess",
            general=["read the higher/lower hint"],
            by_key={"parity_even": ["the digit is even"], "parity_odd": ["the digit is odd"]},
            mistakes={"*": ["repeating a guess"]},
        )

    def close(self) -> None:
        GuessEnv.closed.append(id(self))


# ---- fixtures -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    """The guessing game served from a child process, as the trainer and benchmark run it."""
    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server.config import ServerOptions

    url, handle = serve_in_background(
        GUESS_FACTORY, options=ServerOptions(max_sessions=32, max_action_chars=200), operator_token=OPERATOR
    )
    yield url
    handle.stop()
    assert not handle.alive()


def _http(method, url, body=None, raw=None, token=None, source=None):
    """(status, parsed JSON) of one request, without raising on 4xx; `token` goes in as a Bearer
    token, `source` is the client address (e.g. 127.0.0.2, a second client on loopback)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if source is not None:
        parts = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30, source_address=(source, 0))
        try:
            conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read() or b"null")
        finally:
            conn.close()
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _open(server, **kw):
    """A new HTTP session: (session id, its token)."""
    status, created = _http("POST", f"{server}/sessions", **kw)
    assert status == 201, created
    return created["session_id"], created["session_token"]


def _local_trajectory(task_id, actions):
    env = GuessEnv()
    steps = [env.reset(task_id=task_id)]
    for a in actions:
        steps.append(env.step(a))
    return env, steps


# ---- the episode over the WebSocket ------------------------------------------------------------
def test_remote_episode_matches_local_env_step_for_step(server):
    from sdar_envs.client import RemoteEnv

    actions = ["guess 2", "hello there", "guess 9", "guess 7"]
    local, expected = _local_trajectory("test-7", actions)
    with RemoteEnv(server, GUESS_FACTORY) as env:
        got = [env.reset(task_id="test-7")] + [env.step(a) for a in actions]
        sid = env.session_id
        assert sid and env.num_steps == len(actions)
        for t, (g, e) in enumerate(zip(got, expected, strict=True)):
            assert (g.observation, g.reward, g.done) == (e.observation, e.reward, e.done)
            for key in METADATA_KEYS:
                assert g.metadata[key] == e.metadata[key], (t, key)
            assert g.metadata["step"] == t and g.metadata["session_id"] == sid
            assert g.metadata["task_id"] == "test-7" and g.metadata["task"] == "find the digit of test-7"
        # failure markers travel, and family-specific keys survive in the metadata
        assert got[2].metadata["error_kind"] == "invalid_action" and got[2].metadata["hint_template_key"] == "action_format"
        assert got[-1].metadata["won"] is True and got[-1].reward == 1.0 and got[-1].metadata["tries"] == 4
        # state(t) gives exactly the observation of step t, over the WebSocket and over HTTP
        for t in range(len(expected)):
            assert env.state(t) == local.state(t)
            assert env.observation_at(t) == got[t]
        assert env.state() == got[-1].observation
        with pytest.raises(IndexError, match=r"steps 0\.\.4"):
            env.state(9)
        assert env.credentials()[0] == sid
        token = env.credentials()[1]
        status, body = _http("GET", f"{server}/sessions/{sid}/state?t=9", token=token)
        assert status == 404 and "steps 0..4" in body["detail"]
        status, body = _http("GET", f"{server}/sessions/{sid}/state", token=token)
        assert status == 200 and body["step_count"] == 4 and body["done"] is True
        assert body["observations"] == [s.observation for s in expected]
        # a finished episode refuses more steps, and a new reset starts over in the same session
        from sdar_envs.client import EnvServerError

        with pytest.raises(EnvServerError, match="ended at step 4; reset"):
            env.step("guess 1")
        again = env.reset(seed=3)
        assert again.metadata["step"] == 0 and again.metadata["session_id"] == sid
        assert env.state(0) == again.observation


def test_any_openenv_client_can_play(server):
    """OpenEnv's own GenericEnvClient (what TRL-style code uses) drives the server unchanged."""
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=server).sync() as client:
        first = client.reset(task_id="train-4")
        assert first.observation["text"] == "[train-4] step 0: guess my digit" and first.reward == 0.0
        assert first.observation["admissible_actions"][4] == "guess 4"
        res = client.step({"message": "guess 4"})
        assert res.done is True and res.reward == 1.0 and res.observation["won"] is True
        state = client.state()
        assert state["step_count"] == 1 and state["task_id"] == "train-4" and len(state["observations"]) == 2


def test_remote_env_refuses_the_wrong_family_and_lists_tasks(server):
    from sdar_envs.client import RemoteEnv

    with pytest.raises(ValueError, match="serves 'tests.envs.test_server:GuessEnv', not 'shop'"):
        RemoteEnv(server, "shop")
    with RemoteEnv(server) as env:
        assert env.task_ids("train") == GuessEnv().task_ids("train")
        from sdar_envs.client import EnvServerError

        with pytest.raises(EnvServerError, match="unknown split 'dev'") as err:
            env.task_ids("dev")
        assert err.value.status == 400


# ---- HTTP sessions and bad input ----------------------------------------------------------------
def test_http_session_lifecycle(server):
    sid, token = _open(server)
    status, first = _http("POST", f"{server}/sessions/{sid}/reset", {"task_id": "test-3"}, token=token)
    assert status == 200 and first["observation"]["text"].startswith("[test-3] step 0")
    status, nxt = _http("POST", f"{server}/sessions/{sid}/step", {"action": {"message": "guess 5"}}, token=token)
    assert status == 200 and nxt["observation"]["text"] == "[test-3] step 1: lower" and nxt["observation"]["step"] == 1
    status, listed = _http("GET", f"{server}/sessions", token=OPERATOR)
    assert sid in [s["session_id"] for s in listed["sessions"]]
    assert next(s for s in listed["sessions"] if s["session_id"] == sid)["step_count"] == 1
    status, read = _http("GET", f"{server}/sessions/{sid}/state?t=1", token=token)
    assert status == 200 and read == nxt
    assert _http("DELETE", f"{server}/sessions/{sid}", token=token)[0] == 200
    status, body = _http("POST", f"{server}/sessions/{sid}/step", {"action": {"message": "guess 3"}}, token=token)
    assert status == 404 and "unknown session" in body["detail"] and "POST /sessions" in body["detail"]


def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(server):
    from sdar_envs.client import EnvServerError, RemoteEnv

    with RemoteEnv(server) as bystander:
        bystander.reset(task_id="test-8")
        sid, token = _open(server)
        base = f"{server}/sessions/{sid}"

        status, body = _http("POST", f"{base}/step", {"action": {"message": "guess 1"}}, token=token)
        assert status == 409 and "step before reset" in body["detail"]
        status, body = _http("POST", f"{base}/reset", {"task_id": "nope-1"}, token=token)
        assert status == 404 and "has no task 'nope-1'" in body["detail"] and "GET /tasks" in body["detail"]
        status, body = _http("POST", f"{base}/reset", {"task_id": "t" * 5000}, token=token)
        assert status == 404 and "no task id of 5000 characters" in body["detail"]
        status, body = _http("POST", f"{base}/reset", {"task": "test-1"}, token=token)
        assert status == 400 and "unknown reset parameter(s) ['task']" in body["detail"]
        status, body = _http("POST", f"{base}/reset", raw=b'{"task_id": ', token=token)
        assert status == 400 and "malformed JSON" in body["detail"]
        assert _http("POST", f"{base}/reset", {"task_id": "test-1"}, token=token)[0] == 200
        status, body = _http("POST", f"{base}/step", {"message": "guess 1"}, token=token)
        assert status == 400 and '{"action": {"message": "look"}}' in body["detail"]
        status, body = _http("POST", f"{base}/step", {"action": {"text": "guess 1"}}, token=token)
        assert status == 422 and any(e["loc"][-1] in ("message", "text") for e in body["detail"])
        status, body = _http("POST", f"{base}/step", {"action": {"message": "x" * 201}}, token=token)
        assert status == 413 and "201 characters, over this server's limit of 200" in body["detail"]
        status, body = _http("POST", f"{server}/sessions/not-a-session/reset", {}, token=token)
        assert status == 404 and "unknown session 'not-a-session'" in body["detail"]

        # the same refusals over the WebSocket come back as errors naming the problem
        with RemoteEnv(server) as env:
            with pytest.raises(EnvServerError, match="has no task 'test-99'"):
                env.reset(task_id="test-99")
            with pytest.raises(EnvServerError, match="step before reset"):
                env.step("guess 1")
            env.reset(task_id="test-2")
            with pytest.raises(EnvServerError, match="over this server's limit of 200"):
                env.step("y" * 500)
            assert env.step("guess 2").metadata["won"] is True  # the refused action did not count

        # after all that, the HTTP session, the bystander and /health are fine
        assert _http("POST", f"{base}/step", {"action": {"message": "guess 1"}}, token=token)[1]["observation"]["won"] is True
        assert bystander.step("guess 8").metadata["won"] is True
        assert _http("GET", f"{server}/health") == (200, {"status": "healthy"})
        _http("DELETE", base, token=token)


def test_malformed_websocket_messages_do_not_end_the_session(server):
    from websockets.sync.client import connect

    with connect(server.replace("http://", "ws://") + "/ws") as ws:
        ws.send("{not json")
        err = json.loads(ws.recv(timeout=10))
        assert err["type"] == "error" and err["data"]["code"] == "INVALID_JSON"
        ws.send(json.dumps({"type": "step", "data": {"msg": "guess 1"}}))
        err = json.loads(ws.recv(timeout=10))
        assert err["data"]["code"] == "VALIDATION_ERROR"
        ws.send(json.dumps({"type": "reset", "data": {"task_id": "test-6"}}))
        ok = json.loads(ws.recv(timeout=10))
        assert ok["type"] == "observation" and ok["data"]["observation"]["task_id"] == "test-6"


def test_concurrent_sessions_keep_their_own_episodes(server):
    """16 sessions step in parallel threads; every reply must carry its own task and step."""
    from sdar_envs.client import RemoteEnv

    errors: list[str] = []

    def play(i: int) -> None:
        rng = random.Random(i)
        task = f"train-{i}"
        try:
            with RemoteEnv(server) as env:
                out = env.reset(task_id=task)
                sid = out.metadata["session_id"]
                t = 0
                while not out.done:
                    out = env.step(f"guess {rng.randrange(10)}")
                    t += 1
                    md = out.metadata
                    if (md["task_id"], md["step"], md["session_id"]) != (task, t, sid) or not out.observation.startswith(f"[{task}] step {t}:"):
                        errors.append(f"session {i} got {md['task_id']}/{md['step']}: {out.observation}")
                if env.state(0) != f"[{task}] step 0: guess my digit":
                    errors.append(f"session {i} state(0) is {env.state(0)!r}")
        except Exception as exc:  # collected: an exception in a thread would be lost
            errors.append(f"session {i}: {exc!r}")

    threads = [threading.Thread(target=play, args=(i,)) for i in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert errors == []


# ---- sessions belong to whoever opened them ------------------------------------------------------
def _ws_connect(server, source=None):
    """A raw WebSocket to /ws (from `source`, a loopback address, when given)."""
    import socket as socket_mod

    from websockets.sync.client import connect

    uri = server.replace("http://", "ws://") + "/ws"
    if source is None:
        return connect(uri, open_timeout=10)
    host, port = urllib.parse.urlsplit(server).hostname, urllib.parse.urlsplit(server).port
    sock = socket_mod.create_connection((host, port), timeout=10, source_address=(source, 0))
    return connect(uri, sock=sock, open_timeout=10)


def _ws_ask(ws, message):
    ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message))
    return json.loads(ws.recv(timeout=10))


def test_session_list_shows_counts_and_ids_only_to_the_operator(server):
    from sdar_envs.client import RemoteEnv

    with RemoteEnv(server) as trainer:
        ws_sid = trainer.reset(task_id="test-1").metadata["session_id"]
        http_sid, http_token = _open(server)
        status, listed = _http("GET", f"{server}/sessions")
        assert status == 200 and "sessions" not in listed
        assert ws_sid not in json.dumps(listed) and http_sid not in json.dumps(listed)
        assert listed["active"] >= 2 and listed["websocket"] >= 1 and listed["http"] >= 1 and listed["yours"] >= 2
        assert listed["max"] == 32 and listed["max_per_client"] == 256
        # a session's own token, or a made-up one, is not the operator's
        for token in (http_token, "x" * 40):
            status, body = _http("GET", f"{server}/sessions", token=token)
            assert status == 403 and "operator token" in body["detail"] and "sessions" not in body
        status, listed = _http("GET", f"{server}/sessions", token=OPERATOR)
        kinds = {s["session_id"]: (s["kind"], s["client"]) for s in listed["sessions"]}
        assert kinds[ws_sid] == ("ws", "127.0.0.1") and kinds[http_sid] == ("http", "127.0.0.1")
        assert all("token" not in key for s in listed["sessions"] for key in s)  # ids, never tokens
        assert _http("DELETE", f"{server}/sessions/{http_sid}", token=http_token)[0] == 200


def test_http_session_routes_need_that_sessions_token(server):
    sid, token = _open(server)
    other_sid, other_token = _open(server)
    assert len(token) >= 40 and token != other_token
    base = f"{server}/sessions/{sid}"
    routes = [
        ("POST", f"{base}/reset", {"task_id": "test-5"}),
        ("POST", f"{base}/step", {"action": {"message": "guess 1"}}),
        ("GET", f"{base}/state", None),
        ("GET", f"{base}/state?t=0", None),
        ("DELETE", base, None),
    ]
    for method, url, body in routes:
        status, reply = _http(method, url, body)
        assert status == 401 and "Authorization: Bearer <session_token>" in reply["detail"], (method, url)
        status, reply = _http(method, url, body, token=other_token)  # another session's token
        assert status == 403 and "does not open session" in reply["detail"], (method, url)
        status, reply = _http(method, url, body, token=token + "x")
        assert status == 403, (method, url)
    # the refused requests changed nothing: the session is there, with no episode
    status, state = _http("GET", f"{base}/state", token=token)
    assert status == 200 and state["observations"] == []
    assert _http("POST", f"{base}/reset", {"task_id": "test-5"}, token=token)[0] == 200
    # the operator may read and close any session, but not play one
    status, reply = _http("POST", f"{base}/step", {"action": {"message": "guess 5"}}, token=OPERATOR)
    assert status == 403
    assert _http("GET", f"{base}/state?t=0", token=OPERATOR)[0] == 200
    assert _http("DELETE", base, token=OPERATOR) == (200, {"session_id": sid, "closed": True})
    assert _http("GET", f"{base}/state", token=token)[0] == 404
    assert _http("DELETE", f"{server}/sessions/{other_sid}", token=other_token)[0] == 200


def test_websocket_sessions_belong_to_their_connection(server):
    from sdar_envs.client import RemoteEnv

    with RemoteEnv(server) as env:
        env.reset(task_id="test-4")
        env.step("guess 1")
        sid, token = env.credentials()
        base = f"{server}/sessions/{sid}"
        # nobody else can play, reset or close it: without a token, nor with its own token over HTTP
        for method, url, body in [
            ("POST", f"{base}/reset", {"task_id": "test-1"}),
            ("POST", f"{base}/step", {"action": {"message": "guess 4"}}),
            ("DELETE", base, None),
        ]:
            assert _http(method, url, body)[0] == 401
            status, reply = _http(method, url, body, token=token)
            assert status == 403 and "belongs to its WebSocket connection" in reply["detail"]
        # OpenEnv's session close over /mcp (and over another WebSocket) needs the token too
        rpc = {"jsonrpc": "2.0", "method": "openenv/session/close", "params": {"session_id": sid}, "id": 7}
        status, reply = _http("POST", f"{server}/mcp", rpc)
        assert status == 401 and reply["error"]["message"].startswith("session routes need the session's token")
        with _ws_connect(server) as intruder:
            reply = _ws_ask(intruder, {"type": "mcp", "data": rpc})
            assert reply["type"] == "error" and "no MCP tools" in reply["data"]["message"]
        # its token lets a reader (e.g. a teacher) read the steps back
        status, step1 = _http("GET", f"{base}/state?t=1", token=token)
        assert status == 200 and step1["observation"]["text"] == "[test-4] step 1: higher"
        # and the episode went on untouched
        out = env.step("guess 4")
        assert out.metadata["step"] == 2 and out.metadata["won"] is True and out.metadata["session_id"] == sid


def test_mcp_session_lifecycle_uses_tokens(server):
    create = {"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1}
    status, reply = _http("POST", f"{server}/mcp", create)
    assert status == 200
    sid, token = reply["result"]["session_id"], reply["result"]["session_token"]
    close = {"jsonrpc": "2.0", "method": "openenv/session/close", "id": 2, "params": {"session_id": sid, "session_token": "nope"}}
    status, reply = _http("POST", f"{server}/mcp", close)
    assert status == 403 and reply["error"]["message"] == f"that token does not open session {sid}"
    assert _http("POST", f"{server}/sessions/{sid}/reset", {"task_id": "test-2"}, token=token)[0] == 200
    close["params"]["session_token"] = token
    assert _http("POST", f"{server}/mcp", close) == (200, {"jsonrpc": "2.0", "id": 2, "result": {"session_id": sid, "closed": True}})
    status, reply = _http("POST", f"{server}/mcp", {"jsonrpc": "2.0", "method": "tools/list", "id": 3})
    assert status == 404 and "no MCP tools" in reply["error"]["message"]


def test_one_client_cannot_lock_others_out():
    """A client opening idle sessions stops at its own limit (429); another client still gets in."""
    from sdar_envs.client import EnvServerError, RemoteEnv
    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server.config import ServerOptions

    opts = ServerOptions(max_sessions=6, max_sessions_per_client=3)
    url, handle = serve_in_background(GUESS_FACTORY, options=opts, in_process=True)
    with handle:
        hog = [_open(url), _open(url)]
        ws_hog = RemoteEnv(url)
        ws_hog.reset(task_id="test-1")
        status, body = _http("POST", f"{url}/sessions")
        assert status == 429 and "already holds 3 open sessions" in body["detail"] and "--max-sessions-per-client" in body["detail"]
        status, body = _http("POST", f"{url}/mcp", {"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1})
        assert status == 429
        extra = RemoteEnv(url)
        with pytest.raises(EnvServerError, match="already holds 3 open sessions") as err:
            extra.reset(task_id="test-2")
        assert err.value.code == "TOO_MANY_SESSIONS"
        extra.close()
        # a second client (another loopback address) plays, over HTTP and over a WebSocket
        sid, token = _open(url, source="127.0.0.2")
        status, out = _http("POST", f"{url}/sessions/{sid}/reset", {"task_id": "test-3"}, token=token, source="127.0.0.2")
        assert status == 200 and out["observation"]["task_id"] == "test-3"
        with _ws_connect(url, source="127.0.0.2") as ws:
            assert _ws_ask(ws, {"type": "reset", "data": {"task_id": "test-4"}})["type"] == "observation"
            assert _http("GET", f"{url}/sessions", source="127.0.0.2")[1]["yours"] == 2
        # closing one of its own frees a place for the first client
        assert _http("DELETE", f"{url}/sessions/{hog[0][0]}", token=hog[0][1])[0] == 200
        assert _http("POST", f"{url}/sessions")[0] == 201
        ws_hog.close()


def test_tokens_stay_out_of_the_server_log():
    from sdar_envs.client import RemoteEnv
    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server.config import ServerOptions

    url, handle = serve_in_background(GUESS_FACTORY, options=ServerOptions(log_level="debug"), operator_token=OPERATOR)
    with handle:
        sid, token = _open(url)
        _http("POST", f"{url}/sessions/{sid}/reset", {"task_id": "test-1"}, token=token)
        _http("POST", f"{url}/sessions/{sid}/step", {"action": {"message": "guess 9"}}, token=token + "x")
        _http("GET", f"{url}/sessions", token=OPERATOR)
        _http("GET", f"{url}/sessions", token="wrong-operator-token-000000")
        with RemoteEnv(url) as env:
            env.reset(task_id="test-2")
            ws_token = env.credentials()[1]
        _http("DELETE", f"{url}/sessions/{sid}", token=token)
        time.sleep(0.3)
        log_text = handle.log_tail(1_000_000)
        assert "POST /sessions" in log_text  # the access log is on at debug
        for secret in (token, ws_token, OPERATOR):
            assert secret not in log_text


def test_operator_token_must_be_long_enough(monkeypatch):
    from sdar_envs.server.app import create_env_app, operator_token_from_env
    from sdar_envs.server.config import OPERATOR_TOKEN_ENV, ServerOptions

    monkeypatch.setenv(OPERATOR_TOKEN_ENV, "short")
    with pytest.raises(ValueError, match="has 5 characters; use at least 16"):
        operator_token_from_env()
    with pytest.raises(ValueError, match="at least 16 characters"):
        create_env_app(ServerOptions(family=GUESS_FACTORY), operator_token="short")
    monkeypatch.setenv(OPERATOR_TOKEN_ENV, "  ")
    assert operator_token_from_env() is None


# ---- limits: capacity and idle TTL (in-process servers, so closes can be observed) --------------
def test_capacity_limit_gives_a_clear_error_and_frees_up():
    from sdar_envs.client import EnvServerError, RemoteEnv
    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server.config import ServerOptions

    url, handle = serve_in_background(GUESS_FACTORY, options=ServerOptions(max_sessions=2), in_process=True)
    with handle:
        a, b = RemoteEnv(url), RemoteEnv(url)
        a.reset(task_id="test-1")
        b.reset(task_id="test-2")
        status, body = _http("POST", f"{url}/sessions")
        assert status == 503 and "capacity (2/2 sessions)" in body["detail"] and "--max-sessions" in body["detail"]
        c = RemoteEnv(url)
        with pytest.raises(EnvServerError, match="capacity") as err:
            c.reset(task_id="test-3")
        assert err.value.code == "CAPACITY_REACHED"
        c.close()
        a.close()
        deadline = time.monotonic() + 5
        while _http("GET", f"{url}/info")[1]["active_sessions"] > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        with RemoteEnv(url) as d:
            assert d.reset(task_id="test-4").metadata["task_id"] == "test-4"
        assert b.step("guess 2").metadata["won"] is True
        b.close()


def test_idle_sessions_are_reclaimed_and_their_env_closed():
    from sdar_envs.client import EnvServerError, RemoteEnv
    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server.config import ServerOptions

    opts = ServerOptions(session_ttl_s=1.0, reap_interval_s=0.1)
    url, handle = serve_in_background(GUESS_FACTORY, options=opts, in_process=True)
    with handle:
        idle_ws, busy_ws = RemoteEnv(url), RemoteEnv(url)
        idle_ws.reset(task_id="test-1")
        busy_ws.reset(task_id="test-0")
        sid, token = _open(url)
        closed_before = len(GuessEnv.closed)
        t_end = time.monotonic() + 2.4
        while time.monotonic() < t_end:  # keeps one session busy while two sit idle
            busy_ws.step("guess 5")
            busy_ws.reset(task_id="test-0")
            time.sleep(0.1)
        info = _http("GET", f"{url}/info")[1]
        assert info["active_sessions"] == 1 and info["sessions_expired"] == 2
        assert len(GuessEnv.closed) - closed_before == 2
        # the reclaimed session's own token learns why (and the operator's would); without a token nothing is
        # said about the id (401, as for a live or an unknown one); another session's token gets 403
        status, body = _http("POST", f"{url}/sessions/{sid}/reset", {}, token=token)
        assert status == 410 and "idle for more than 1 s" in body["detail"]
        assert _http("GET", f"{url}/sessions/{sid}/state", token=token)[0] == 410
        for target in (sid, "no-such-session"):
            status, body = _http("POST", f"{url}/sessions/{target}/reset", {})
            assert status == 401 and "need the session's token" in body["detail"] and target not in body["detail"]
        other_sid, other = _open(url)
        status, body = _http("GET", f"{url}/sessions/{sid}/state", token=other)
        assert status == 403 and "idle" not in body["detail"]
        assert _http("GET", f"{url}/sessions/no-such-session/state", token=other)[0] == 404
        _http("DELETE", f"{url}/sessions/{other_sid}", token=other)
        with pytest.raises(EnvServerError, match="idle for more than 1 s"):
            idle_ws.step("guess 1")
        assert busy_ws.step("guess 0").metadata["won"] is True
        idle_ws.close()
        busy_ws.close()


def test_async_remote_env_drives_many_sessions_from_one_loop():
    from sdar_envs.client import AsyncRemoteEnv
    from sdar_envs.launcher import serve_in_background

    url, handle = serve_in_background(GUESS_FACTORY, in_process=True)

    async def one(i: int) -> tuple[str, int, bool]:
        async with AsyncRemoteEnv(url) as env:
            out = await env.reset(task_id=f"test-{i}")
            assert await env.observation_at(0) == out  # read back over HTTP with the session's token
            lo, hi = 0, 9
            while not out.done:  # bisect on the higher/lower hints
                guess = (lo + hi) // 2
                out = await env.step(f"guess {guess}")
                if out.observation.endswith("higher"):
                    lo = guess + 1
                elif out.observation.endswith("lower"):
                    hi = guess - 1
            return out.metadata["task_id"], out.metadata["step"], out.metadata["won"]

    async def main():
        return await asyncio.gather(*(one(i) for i in range(12)))

    with handle:
        results = asyncio.run(main())
    assert [r[0] for r in results] == [f"test-{i}" for i in range(12)]
    assert all(won and steps <= 4 for _, steps, won in results)


def test_startup_failures_name_the_problem():
    from sdar_envs.launcher import serve_in_background

    with pytest.raises(ValueError, match="unknown environment 'no_such_family'; choose one of .*household"):
        serve_in_background("no_such_family")
    # a child that dies while starting is reported with the end of its log
    with pytest.raises(RuntimeError, match="exited during startup(.|\n)*unexpected keyword argument 'bogus'"):
        serve_in_background(GUESS_FACTORY, bogus=1, startup_timeout_s=60)
    with pytest.raises(ValueError, match="cannot load environment factory 'tests.envs.test_server:Missing'"):
        serve_in_background("tests.envs.test_server:Missing", in_process=True)
    with pytest.raises(TypeError, match="env kwargs must be JSON values"):
        serve_in_background(GUESS_FACTORY, n_tasks=object())
    from sdar_envs.server.config import ServerOptions

    with pytest.raises(ValueError, match="max_sessions must be >= 1"):
        ServerOptions(max_sessions=0)


def test_the_server_implements_the_session_table_the_routes_use():
    """The routes know the server only through sdar_envs.server.routes.SessionTable (and a session's environment
    through SessionEnv): every member those interfaces name exists on the server's classes, methods as methods."""
    import inspect

    from sdar_envs.server.environment import SdarEnvironment
    from sdar_envs.server.routes import SessionEnv, SessionTable
    from sdar_envs.server.sessions import SdarEnvServer

    for protocol, cls in ((SessionTable, SdarEnvServer), (SessionEnv, SdarEnvironment)):
        members = [n for n in vars(protocol) if not n.startswith("_")] + list(protocol.__annotations__)
        assert members, protocol
        for name in members:
            if name in protocol.__annotations__:  # an attribute the server sets in __init__
                assert name in inspect.getsource(cls.__init__), f"{cls.__name__} has no {name}"
                continue
            want, got = getattr(protocol, name), getattr(cls, name, None)
            assert got is not None, f"{cls.__name__} lacks {name}, which {protocol.__name__} names"
            if inspect.isfunction(want):
                assert inspect.iscoroutinefunction(want) == inspect.iscoroutinefunction(got), name
                assert list(inspect.signature(want).parameters) == list(inspect.signature(got).parameters), name
