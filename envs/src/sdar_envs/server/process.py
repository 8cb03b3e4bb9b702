"""The server process: uvicorn configured for an env app (`uvicorn_config`, `env_server`, with the probe listener
beside it), bound sockets, `run_server`, and the command line `python -m sdar_envs.server` (`main`), which is also
what background servers run (sdar_envs.launcher)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI

from sdar_envs.server.app import create_env_app
from sdar_envs.server.config import ServerOptions, add_serve_arguments, options_from_args
from sdar_envs.server.limits import ProbeListener, guarded_protocols

WS_PING_INTERVAL_S = 30.0  # seconds between the server's keepalive pings on each WebSocket
WS_PING_TIMEOUT_S = 300.0  # seconds a WebSocket client may leave a keepalive ping unanswered before it is dropped


def uvicorn_config(app: FastAPI, options: ServerOptions) -> Any:
    import uvicorn

    limits = app.state.sdar_server.connections if hasattr(app.state, "sdar_server") else None
    http, ws = guarded_protocols(options.header_timeout_s, limits)
    return uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        log_level=options.log_level,
        # h11 with a deadline on request heads (uvicorn has none) and every connection, WebSockets included,
        # counted per client address and in all (ConnectionLimits); bodies are bounded by RequestGuard
        http=http,
        ws=ws,
        h11_max_incomplete_event_size=16 * 1024,  # request line + headers
        timeout_keep_alive=options.keep_alive_s,
        # ours instead: uvicorn's counts no WebSocket upgrade and answers every request 503, /health included
        limit_concurrency=None,
        # the per-client limits count the peer address; a forwarded header must not move it
        proxy_headers=False,
        # the transport limit only stops absurd frames; the action limit gives the clear error
        ws_max_size=max(1 << 20, options.max_body_bytes),
        ws_per_message_deflate=False,  # loopback and cluster-local traffic: CPU matters more than bytes
        # keepalive: a client that answers no ping for 5 minutes is gone (uvicorn's 20 s closed the sessions of
        # live trainers whose event-loop thread a loaded CPU starved for longer: SmolLM2 pipeline runs on 2 cores
        # lost an arm's rollout so); idle sessions are reclaimed by --session-ttl all the same
        ws_ping_interval=WS_PING_INTERVAL_S,
        ws_ping_timeout=WS_PING_TIMEOUT_S,
        timeout_graceful_shutdown=3,
        access_log=options.log_level == "debug",
    )


def env_server(app: FastAPI, options: ServerOptions, probe_sock: socket.socket | None = None) -> Any:
    """The uvicorn.Server serving `app`, and with `probe_sock` the probe listener (GET /health) beside it."""
    import uvicorn

    class EnvServer(uvicorn.Server):
        probe = ProbeListener(probe_sock) if probe_sock is not None else None

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.probe is not None and not self.should_exit:
                await self.probe.start()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if self.probe is not None:
                await self.probe.close()
            await super().shutdown(sockets)

    return EnvServer(uvicorn_config(app, options))


def bound_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def _raise_open_file_limit(wanted: int) -> None:
    """Every connection is a file descriptor: lift the soft limit toward `wanted` (up to the hard limit)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def run_server(options: ServerOptions, sock: socket.socket | None = None, probe_sock: socket.socket | None = None) -> None:
    """Serve until interrupted; `sock` (and `probe_sock`) are already bound sockets (background servers pass
    them); without `probe_sock`, options.probe_port is bound here when set."""
    if probe_sock is None and options.probe_port is not None:
        probe_sock = bound_socket(options.host, options.probe_port)
    _raise_open_file_limit(options.connections_limit + 1024)
    app = create_env_app(options)
    server = env_server(app, options, probe_sock)
    server.run(sockets=[sock] if sock is not None else None)


# ---- command line (also what background servers run) -----------------------------------------
def _exit_with_parent(parent_pid: int, every_s: float = 0.5) -> None:
    """Stop gracefully once `parent_pid` is no longer our parent, so no server outlives its starter.

    A polling thread, not prctl(PR_SET_PDEATHSIG): that fires when the starting *thread* ends and
    needs a preexec_fn, which is unsafe in a parent that runs threads.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(every_s)
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown closes every session

    threading.Thread(target=watch, name="sdar-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sdar_envs.server", description="Serve one sdar environment family.")
    add_serve_arguments(parser)
    parser.add_argument("--fd", type=int, default=None, help="serve on this already bound socket (used by serve_in_background)")
    parser.add_argument("--probe-fd", type=int, default=None, help="answer probes on this already bound socket (used by serve_in_background)")
    parser.add_argument("--parent-pid", type=int, default=None, help="stop when this process is gone (used by serve_in_background)")
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        _exit_with_parent(args.parent_pid)
    options = options_from_args(args)
    sock = socket.socket(fileno=args.fd) if args.fd is not None else None
    probe_sock = socket.socket(fileno=args.probe_fd) if args.probe_fd is not None else None
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"serving {options.family} with {json.dumps(asdict(options))}", file=sys.stderr, flush=True)
    run_server(options, sock, probe_sock)
    return 0
