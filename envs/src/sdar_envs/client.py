"""Clients of sdar environment servers: `RemoteEnv` (sync, what the trainer uses) and `AsyncRemoteEnv`.

Both speak OpenEnv's WebSocket protocol through OpenEnv's `EnvClient`; the session belongs to that
connection, which asks the server for the session's token only when a step is read back over HTTP
(`observation_at`). `serve_in_background` starts a server on 127.0.0.1 in a child process (or a
thread) and waits for /health.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

# first, so that openenv is imported without its Gradio web UI (see openenv_models)
from sdar_envs.openenv_models import step_from_payload

# isort: split
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from websockets.protocol import State as WSState

from sdar_envs.base import EnvStep

if TYPE_CHECKING:
    from sdar_envs.server_config import ServerOptions


class EnvServerError(RuntimeError):
    """The environment server refused a request; `status` (HTTP) or `code` (WebSocket) says why."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None, url: str = ""):
        where = f" [{url}]" if url else ""
        tag = f"HTTP {status}" if status is not None else (code or "error")
        super().__init__(f"{tag}{where}: {message}")
        self.message = message
        self.status = status
        self.code = code


# ---- plain HTTP helpers (the session routes, /info, /tasks) ------------------------------------
def _http_base(url: str) -> str:
    url = url.rstrip("/")
    if url.startswith("ws://"):
        return "http://" + url[5:]
    if url.startswith("wss://"):
        return "https://" + url[6:]
    return url if "://" in url else "http://" + url


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback never goes through a proxy


def http_json(
    method: str, url: str, body: dict[str, Any] | None = None, timeout_s: float = 30.0, token: str | None = None
) -> Any:
    """One JSON request; HTTP errors become `EnvServerError` carrying the server's message.

    token: a session token (session routes) or the operator token, sent as a Bearer token.
    """
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    host = urllib.parse.urlsplit(url).hostname or ""
    opener = _DIRECT if host in ("127.0.0.1", "localhost", "::1") else urllib.request.build_opener()
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            detail = json.loads(raw).get("detail", raw.decode(errors="replace"))
        except (ValueError, AttributeError):
            detail = raw.decode(errors="replace")
        raise EnvServerError(str(detail), status=exc.code, url=url) from None
    except (urllib.error.URLError, OSError) as exc:
        raise EnvServerError(f"cannot reach the environment server ({exc}); is it running?", url=url) from None
    return json.loads(raw) if raw else None


def fetch_observation(base_url: str, session_id: str, t: int, timeout_s: float = 30.0, token: str | None = None) -> EnvStep:
    """state(t) for anyone holding a session id and its token (e.g. an external teacher given them
    by the session's owner): step t exactly as returned."""
    url = f"{_http_base(base_url)}/sessions/{urllib.parse.quote(session_id)}/state?t={int(t)}"
    return step_from_payload(http_json("GET", url, timeout_s=timeout_s, token=token))


# ---- OpenEnv client subclass ----------------------------------------------------------------------
class SdarEnvClient(EnvClient[Any, dict, dict]):
    """OpenEnv's async WebSocket client for sdar servers; actions are strings (or {"message": str}).

    One connection is one server session for its whole life: where openenv 0.10's client reconnects a
    socket the server has closed (a new, empty session), this one reports why the server closed it."""

    def _step_payload(self, action: Any) -> dict[str, Any]:
        if isinstance(action, str):
            return {"message": action}
        if isinstance(action, dict):
            return action
        if hasattr(action, "model_dump"):
            return action.model_dump(exclude={"metadata"})
        raise TypeError(f"an action is a string or {{'message': str}}, got {type(action).__name__}")

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[dict]:
        return StepResult(observation=payload.get("observation", {}), reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> dict:
        return payload

    async def _ensure_connected(self) -> None:
        # openenv/core/env_client.py (0.10), EnvClient._connect_async: a socket the server closed is dropped and a
        # new one opened, i.e. a new server session, so the next step would land on an env with no episode. The
        # server closes a session's socket only to end it (reclaimed when idle, capacity): say so, every time.
        ws = self._ws
        if ws is not None and ws.state in (WSState.CLOSING, WSState.CLOSED):
            response = await self._pending_message()  # the server's last word (e.g. why it reclaimed the session)
            if response is not None and response.get("type") == "error":
                self._raise_error(response)
            raise EnvServerError(
                "the server closed this session's WebSocket; open a new client (a new session) and reset",
                code="CLOSED",
                url=self._ws_url or "",
            )
        await super()._ensure_connected()

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        # OpenEnv raises a bare RuntimeError; ours keeps the server's code and message apart
        try:
            await self._send(message)
            response = await self._receive()
        except EnvServerError:
            raise
        except ConnectionError as exc:
            raise EnvServerError(str(exc), code="CONNECT", url=self._ws_url) from exc
        except Exception as exc:
            if type(exc).__name__.startswith("ConnectionClosed"):
                # the server may have said why before closing (e.g. capacity): read that first
                response = await self._pending_message()
                if response is not None and response.get("type") == "error":
                    self._raise_error(response)
                raise EnvServerError(
                    f"the server closed the WebSocket ({exc}); the server may be full, restarted, or the message too large",
                    code="CLOSED",
                    url=self._ws_url,
                ) from exc
            raise
        if response.get("type") == "error":
            self._raise_error(response)
        return response

    async def session_credentials(self) -> dict[str, str]:
        """{"session_id", "session_token"} of this connection's session, for reading it over HTTP."""
        response = await self._send_and_receive({"type": "session"})
        if response.get("type") != "session":
            raise EnvServerError(f"unexpected reply to a session request: {response.get('type')!r}", url=self._ws_url)
        return dict(response["data"])

    async def _pending_message(self) -> dict[str, Any] | None:
        try:
            return json.loads(await asyncio.wait_for(self._ws.recv(), timeout=1.0))  # type: ignore[union-attr]
        except Exception:
            return None

    def _raise_error(self, response: dict[str, Any]) -> None:
        data = response.get("data", {})
        detail = data.get("message", "unknown error")
        if data.get("errors"):
            detail += f": {data['errors']}"
        if data.get("code") == "CAPACITY_REACHED":
            detail = detail.rstrip(". ") + "; close other sessions or restart the server with a larger --max-sessions"
        elif data.get("code") == "TOO_MANY_SESSIONS":
            detail = detail.rstrip(". ") + "; or restart the server with a larger --max-sessions-per-client"
        raise EnvServerError(detail, code=str(data.get("code", "UNKNOWN")), url=self._ws_url)


def _as_step(result: StepResult[dict]) -> EnvStep:
    return step_from_payload({"observation": result.observation, "reward": result.reward, "done": result.done})


def _select_state(observations: list[str], t: int | None) -> str:
    if not observations:
        raise RuntimeError("state() called before reset(); call reset() first")
    if t is None:
        return observations[-1]
    if not 0 <= t < len(observations):
        raise IndexError(f"step {t} does not exist; this episode has steps 0..{len(observations) - 1}")
    return observations[t]


class _RemoteBase:
    def __init__(self, base_url: str, family: str | None, check_family: bool) -> None:
        self.base_url = _http_base(base_url)
        self.family = family
        self.session_id: str | None = None
        self.num_steps = 0
        self._token: str | None = None  # the session's token, asked for on the first HTTP read-back
        if family is not None and check_family:
            served = self.info()["family"]
            if served != family:
                raise ValueError(f"the server at {self.base_url} serves {served!r}, not {family!r}; point at the {family} server")

    def info(self) -> dict[str, Any]:
        return http_json("GET", f"{self.base_url}/info")

    def task_ids(self, split: str = "test") -> list[str]:
        return list(http_json("GET", f"{self.base_url}/tasks?split={urllib.parse.quote(split)}")["task_ids"])

    def _check_started(self) -> None:
        if self.session_id is None:
            raise RuntimeError("observation_at() before reset(); call reset() first")

    def _keep_credentials(self, creds: dict[str, str]) -> tuple[str, str]:
        self.session_id, self._token = creds["session_id"], creds["session_token"]
        return self.session_id, self._token

    def _track(self, out: EnvStep) -> EnvStep:
        self.session_id = out.metadata.get("session_id") or self.session_id
        self.num_steps = int(out.metadata.get("step") or 0)
        return out

    @staticmethod
    def _reset_data(task_id: str | None, seed: int | None) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if task_id is not None:
            data["task_id"] = task_id
        if seed is not None:
            data["seed"] = int(seed)
        return data


class RemoteEnv(_RemoteBase):
    """A TextEnv-like handle on one server session: reset / step / state(t) / close.

    Built on OpenEnv's `SyncEnvClient` (a WebSocket held open for the session). `family`, when
    given, is checked against the server's so a client never plays the wrong environment.
    """

    def __init__(
        self,
        base_url: str,
        family: str | None = None,
        *,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 300.0,
        check_family: bool = True,
    ) -> None:
        super().__init__(base_url, family, check_family)
        self._client = SdarEnvClient(self.base_url, connect_timeout_s=connect_timeout_s, message_timeout_s=message_timeout_s).sync()
        try:
            self._client.connect()
        except ConnectionError as exc:
            self._client.close()
            raise EnvServerError(str(exc), code="CONNECT", url=self.base_url) from exc

    def reset(self, task_id: str | None = None, seed: int | None = None) -> EnvStep:
        return self._track(_as_step(self._client.reset(**self._reset_data(task_id, seed))))

    def step(self, action: str) -> EnvStep:
        return self._track(_as_step(self._client.step(action)))

    def state(self, t: int | None = None) -> str:
        """The observation text of step t (0 = after reset), the latest when t is None, like TextEnv.state."""
        return _select_state(self.server_state()["observations"], t)

    def server_state(self) -> dict[str, Any]:
        """The session state: ids, step count, done, and every observation text so far."""
        return self._client.state()

    def credentials(self) -> tuple[str, str]:
        """(session id, session token): what someone else (e.g. a teacher) needs to read this
        session's steps over HTTP (`fetch_observation`). Only the holder of this connection plays it."""
        if self._token is None:
            self._keep_credentials(self._client.session_credentials())
        return self.session_id, self._token  # type: ignore[return-value]

    def observation_at(self, t: int) -> EnvStep:
        """The exact observation (with metadata) of step t, read back over HTTP."""
        self._check_started()
        sid, token = self.credentials()
        return fetch_observation(self.base_url, sid, t, token=token)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncRemoteEnv(_RemoteBase):
    """The asyncio twin of `RemoteEnv`, for driving many sessions from one event loop."""

    def __init__(
        self,
        base_url: str,
        family: str | None = None,
        *,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 300.0,
        check_family: bool = False,
    ) -> None:
        super().__init__(base_url, family, check_family)
        self._client = SdarEnvClient(self.base_url, connect_timeout_s=connect_timeout_s, message_timeout_s=message_timeout_s)

    async def connect(self) -> AsyncRemoteEnv:
        try:
            await self._client.connect()
        except ConnectionError as exc:
            raise EnvServerError(str(exc), code="CONNECT", url=self.base_url) from exc
        return self

    async def reset(self, task_id: str | None = None, seed: int | None = None) -> EnvStep:
        return self._track(_as_step(await self._client.reset(**self._reset_data(task_id, seed))))

    async def step(self, action: str) -> EnvStep:
        return self._track(_as_step(await self._client.step(action)))

    async def state(self, t: int | None = None) -> str:
        return _select_state((await self._client.state())["observations"], t)

    async def credentials(self) -> tuple[str, str]:
        """(session id, session token), as `RemoteEnv.credentials`."""
        if self._token is None:
            self._keep_credentials(await self._client.session_credentials())
        return self.session_id, self._token  # type: ignore[return-value]

    async def observation_at(self, t: int) -> EnvStep:
        """The exact observation (with metadata) of step t, read back over HTTP (in a thread)."""
        self._check_started()
        sid, token = await self.credentials()
        return await asyncio.to_thread(fetch_observation, self.base_url, sid, t, 30.0, token)

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> AsyncRemoteEnv:
        return await self.connect()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


# ---- starting servers -----------------------------------------------------------------------------
@dataclass
class ServerHandle:
    """A running background server: `url` (and `probe_url`, its probe port's, when it has one), and `stop()`
    to end it (also on `with` exit)."""

    url: str
    family: str
    probe_url: str | None = None
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    _thread: threading.Thread | None = field(default=None, repr=False)
    _server: Any = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return self._thread is not None and self._thread.is_alive()

    def log_tail(self, n_chars: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-n_chars:]

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout_s)
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        if self.log_path is not None and self.process is not None and self.process.poll() is not None:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def wait_healthy(url: str, timeout_s: float = 90.0, handle: ServerHandle | None = None) -> None:
    """Poll GET /health until it answers 200; fail early if the server process died."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if handle is not None and not handle.alive():
            raise RuntimeError(f"the {handle.family} server exited during startup; its log ends with:\n{handle.log_tail()}")
        try:
            if http_json("GET", f"{url}/health", timeout_s=5.0).get("status") == "healthy":
                return
        except EnvServerError as exc:
            last = exc
        time.sleep(0.1)
    tail = handle.log_tail() if handle is not None else ""
    raise TimeoutError(f"server at {url} not healthy after {timeout_s:g} s (last error: {last}); log tail:\n{tail}")


def serve_in_background(
    family: str,
    *,
    options: ServerOptions | None = None,
    port: int = 0,
    in_process: bool = False,
    startup_timeout_s: float = 120.0,
    die_with_parent: bool = True,
    operator_token: str | None = None,
    **env_kwargs: Any,
) -> tuple[str, ServerHandle]:
    """Start a server for `family` on a free 127.0.0.1 port and wait until /health answers.

    options: a `ServerOptions` for limits and host (its family, env_kwargs and port are ignored; a
        probe_port of 0 binds any free port, given back as `handle.probe_url`).
    port: the port to listen on (0: any free port, the default).
    in_process: serve from a thread of this process instead of a child process (fast to start).
    die_with_parent: the child server ends when this process ends (set False to outlive it).
    operator_token: the server's operator token (lists and closes every session); default: the
        child inherits $SDAR_ENV_OPERATOR_TOKEN, an in-process server reads it.
    env_kwargs: the family's constructor arguments, e.g. backend="sim".
    Returns (url, handle); `handle.stop()` ends the server.
    """
    from sdar_envs.base import available_envs
    from sdar_envs.server_config import ServerOptions

    if ":" not in family and family not in available_envs():
        # checked here, so a typo fails at once instead of after a child process starts
        raise ValueError(f"unknown environment {family!r}; choose one of {', '.join(available_envs())} or give 'module:attr'")
    base = options if options is not None else ServerOptions()
    opts = replace(base, family=family, env_kwargs=dict(env_kwargs), port=port)
    from sdar_envs.server import bound_socket

    try:
        kwargs_json = json.dumps(opts.env_kwargs)
    except TypeError as exc:
        if not in_process:
            raise TypeError(
                f"env kwargs must be JSON values to reach a server process ({exc}); pass plain values or use in_process=True"
            ) from None
    sock = bound_socket(opts.host, port)
    probe_sock = bound_socket(opts.host, opts.probe_port) if opts.probe_port is not None else None
    host_for_url = f"[{opts.host}]" if ":" in opts.host else opts.host
    url = f"http://{host_for_url}:{sock.getsockname()[1]}"
    probe_url = f"http://{host_for_url}:{probe_sock.getsockname()[1]}" if probe_sock is not None else None
    if probe_sock is not None:
        opts = replace(opts, probe_port=probe_sock.getsockname()[1])
    if in_process:
        return url, _serve_thread(url, opts, sock, startup_timeout_s, operator_token, probe_sock, probe_url)
    return url, _serve_process(url, opts, sock, probe_sock, probe_url, kwargs_json, startup_timeout_s,
                               die_with_parent, operator_token)


def _serve_process(url: str, opts: Any, sock: socket.socket, probe_sock: socket.socket | None, probe_url: str | None,
                   kwargs_json: str, startup_timeout_s: float, die_with_parent: bool, operator_token: str | None
                   ) -> ServerHandle:  # fmt: skip
    """`python -m sdar_envs.server` on the bound sockets (the child gets its own copies), waited for until healthy."""
    from sdar_envs.server_config import options_to_args

    family = opts.family
    log_file = tempfile.NamedTemporaryFile(prefix=f"sdar-{family.replace(':', '_')}-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "sdar_envs.server", "--env", family, "--fd", str(sock.fileno()),
           "--port", url.rsplit(":", 1)[1], "--env-kwargs", kwargs_json, *options_to_args(opts)]  # fmt: skip
    fds = [sock.fileno()]
    if probe_sock is not None:
        cmd += ["--probe-fd", str(probe_sock.fileno())]
        fds.append(probe_sock.fileno())
    if die_with_parent:
        cmd += ["--parent-pid", str(os.getpid())]
    env = dict(os.environ)
    # the child imports what this process can (e.g. a factory 'module:attr' defined in a test)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    if operator_token is not None:
        from sdar_envs.server_config import OPERATOR_TOKEN_ENV

        env[OPERATOR_TOKEN_ENV] = operator_token  # the environment, not argv: ps shows argv
    try:
        proc = subprocess.Popen(cmd, pass_fds=tuple(fds), stdout=log_file, stderr=subprocess.STDOUT, env=env)
    finally:
        sock.close()  # the child holds its own copies
        if probe_sock is not None:
            probe_sock.close()
        log_file.close()
    handle = ServerHandle(url=url, family=family, probe_url=probe_url, process=proc, log_path=Path(log_file.name))
    try:
        wait_healthy(url, startup_timeout_s, handle)
    except BaseException:
        handle.stop()
        raise
    return handle


def _serve_thread(url: str, opts: Any, sock: socket.socket, startup_timeout_s: float, operator_token: str | None,
                  probe_sock: socket.socket | None = None, probe_url: str | None = None) -> ServerHandle:  # fmt: skip
    from sdar_envs.server import create_env_app, env_server

    server = env_server(create_env_app(opts, operator_token=operator_token), opts, probe_sock)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"sdar-env-{opts.family}", daemon=True)
    thread.start()
    handle = ServerHandle(url=url, family=opts.family, probe_url=probe_url, _thread=thread, _server=server)
    try:
        wait_healthy(url, startup_timeout_s, handle)
    except BaseException:
        handle.stop()
        raise
    return handle
