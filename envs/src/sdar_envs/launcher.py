"""Starting environment servers to talk to: `serve_in_background` starts a server on 127.0.0.1 in a child process
(`python -m sdar_envs.server`) or a thread and waits for /health (`wait_healthy`); its `ServerHandle` stops it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sdar_envs.base import available_envs
from sdar_envs.client import EnvServerError, http_json
from sdar_envs.server.config import ServerOptions, options_to_args

if TYPE_CHECKING:
    from sdar_envs.server.config import ServerOptions


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
        if self._thread is not None:
            stop_server_thread(self._server, self._thread, timeout_s)
        if self.log_path is not None and self.process is not None and self.process.poll() is not None:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def stop_server_thread(server: Any, thread: threading.Thread, timeout_s: float = 10.0) -> bool:
    """Stop a uvicorn `server` running in `thread`: gracefully (its open connections get uvicorn's
    timeout_graceful_shutdown), then, if the thread still runs after `timeout_s`, forced (uvicorn's second Ctrl-C).
    Waiting matters beyond the daemon thread itself: the server's event loop is what stops the AnyIO worker threads
    that ran its sync handlers, which are not daemons, so an interpreter left with a live loop never exits. True
    once the thread has ended."""
    if server is not None:
        server.should_exit = True
    thread.join(timeout=timeout_s)
    if thread.is_alive() and server is not None:
        server.force_exit = True
        thread.join(timeout=timeout_s)
    return not thread.is_alive()


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
    if ":" not in family and family not in available_envs():
        # checked here, so a typo fails at once instead of after a child process starts
        raise ValueError(f"unknown environment {family!r}; choose one of {', '.join(available_envs())} or give 'module:attr'")
    base = options if options is not None else ServerOptions()
    opts = replace(base, family=family, env_kwargs=dict(env_kwargs), port=port)
    from sdar_envs.server.process import bound_socket

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
        from sdar_envs.server.config import OPERATOR_TOKEN_ENV

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
    from sdar_envs.server.app import create_env_app
    from sdar_envs.server.process import env_server

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
