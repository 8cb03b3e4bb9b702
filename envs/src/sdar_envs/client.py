"""Clients of sdar environment servers: `RemoteEnv` (sync, what the trainer uses) and `AsyncRemoteEnv`.

Both speak OpenEnv's WebSocket protocol through OpenEnv's `EnvClient`; the session belongs to that
connection, which asks the server for the session's token only when a step is read back over HTTP
(`observation_at`). Starting a server to talk to is `sdar_envs.launcher`'s (`serve_in_background`).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

# first, so that openenv is imported without its Gradio web UI (see openenv_models)
from sdar_envs.openenv_models import step_from_payload

# isort: split
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from websockets.protocol import State as WSState

from sdar_envs.base import EnvStep


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
