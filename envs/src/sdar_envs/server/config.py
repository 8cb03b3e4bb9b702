"""Options of an environment server and their command-line form, kept apart from the app (`app.py`) so
that building the `sdar` CLI does not import FastAPI and OpenEnv."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any

# Environment variable holding the operator token (in a pod: mounted from a Secret). With it,
# GET /sessions lists every session and DELETE /sessions/{id} closes any; never in ServerOptions,
# which the server prints at start.
OPERATOR_TOKEN_ENV = "SDAR_ENV_OPERATOR_TOKEN"
MIN_OPERATOR_TOKEN_CHARS = 16


@dataclass
class ServerOptions:
    """How one environment server runs.

    family: a registered family ("household", "shop", "searchqa") or a factory "module:attr".
    env_kwargs: keyword arguments for the family's constructor (e.g. {"backend": "sim"}).
    host, port: where to listen (port 0: any free port).
    max_sessions: concurrent sessions (WebSocket and HTTP together); one more gets a clear error (503).
    max_sessions_per_client: open sessions one client address may hold (0: no limit); one more gets 429.
    max_connections_per_client: open connections (HTTP and WebSocket alike) one client address may hold;
        one more is answered 429 and closed at once, before it can hold anything. None: the sessions it
        may hold plus 64 for plain HTTP (0 when max_sessions_per_client is 0); 0: no limit.
    max_connections: open connections in all; one more is answered 503 and closed. None: max_sessions
        plus 256 for plain HTTP.
    probe_port: a second port answering only GET /health, outside every connection limit, for the
        kubelet's probes (the chart's NetworkPolicy admits clients to `port` only); None: no probe port.
    session_ttl_s: sessions idle longer than this are reclaimed and their env closed (None: never).
    reap_interval_s: how often idle sessions are looked for (None: min(TTL/4, 5 s)).
    max_action_chars: longest action accepted; longer ones are refused, the session goes on.
    header_timeout_s: a connection must send a complete request head within this (else 408, closed).
    body_timeout_s: a request body must arrive within this after its head (else 408, closed).
    keep_alive_s: idle keep-alive connections are closed after this many seconds.
    log_level: uvicorn's log level.

    The defaults come from how a training pipeline uses a server. A trainer pod holds one session per
    episode of a step, tasks_per_step x group_size at once (the paper: 16 x 8 = 128 for household and
    shop), all from its pod's address; a comparison trains one pod per (arm, seed) at once (3 arms x 1-3
    seeds). So a client address may hold 256 sessions (twice a paper-scale step: room for an evaluation
    or a restarted attempt whose old sessions are not reaped yet) and a server 1024 (8 such pods; about
    90 KB each for the sim, shop and search families, 15 MB for the real ALFWorld engine: size
    max_sessions to the pod's memory there). One address alone can never fill a server. Behind a proxy
    or NAT every client shares the proxy's address: set max_sessions_per_client (and with it
    max_connections_per_client) to 0 and limit clients at the proxy, or to the proxy's share.
    """

    family: str = "household"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8000
    max_sessions: int = 1024
    max_sessions_per_client: int = 256
    max_connections_per_client: int | None = None
    max_connections: int | None = None
    probe_port: int | None = None
    session_ttl_s: float | None = 900.0
    reap_interval_s: float | None = None
    max_action_chars: int = 4096
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    keep_alive_s: int = 5
    log_level: str = "warning"

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.session_ttl_s is not None and self.session_ttl_s <= 0:
            raise ValueError(f"session_ttl_s must be > 0 or None (no TTL), got {self.session_ttl_s}")
        if self.reap_interval_s is not None and self.reap_interval_s <= 0:
            raise ValueError(f"reap_interval_s must be > 0, got {self.reap_interval_s}")
        if self.max_action_chars < 1:
            raise ValueError(f"max_action_chars must be >= 1, got {self.max_action_chars}")
        if self.max_sessions_per_client < 0:
            raise ValueError(f"max_sessions_per_client must be >= 0 (0: no limit), got {self.max_sessions_per_client}")
        if self.max_connections_per_client is not None and self.max_connections_per_client < 0:
            raise ValueError(f"max_connections_per_client must be >= 0 (0: no limit), got {self.max_connections_per_client}")
        per_client, sessions = self.connections_per_client_limit, self.max_sessions_per_client
        if per_client and sessions and per_client < sessions:
            raise ValueError(
                f"max_connections_per_client={per_client} is below the {sessions} sessions a client may hold "
                "(max_sessions_per_client): every WebSocket session is a connection; raise it, or set it to 0 (no limit)"
            )
        if self.max_connections is not None and self.max_connections < self.max_sessions:
            raise ValueError(
                f"max_connections={self.max_connections} is below max_sessions={self.max_sessions}: every WebSocket "
                "session is a connection; raise it (or leave it unset: max_sessions + 256)"
            )
        if self.probe_port is not None and not 0 <= self.probe_port <= 65535:
            raise ValueError(f"probe_port must be a port number (0: any free port), got {self.probe_port}")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    @property
    def max_body_bytes(self) -> int:
        """Largest request body read: an action at the limit, JSON-escaped (up to 6 bytes a char), plus room."""
        return 6 * self.max_action_chars + 64 * 1024

    @property
    def connections_per_client_limit(self) -> int:
        """Open connections one client address may hold (0: no limit)."""
        if self.max_connections_per_client is not None:
            return self.max_connections_per_client
        return self.max_sessions_per_client + 64 if self.max_sessions_per_client else 0

    @property
    def connections_limit(self) -> int:
        """Open connections in all."""
        return self.max_connections if self.max_connections is not None else self.max_sessions + 256

    @property
    def reap_every_s(self) -> float:
        if self.reap_interval_s is not None:
            return self.reap_interval_s
        return min((self.session_ttl_s or 20.0) / 4, 5.0)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    d = ServerOptions()
    parser.add_argument("--env", required=True, help="family: household, shop, searchqa (or a factory 'module:attr')")
    parser.add_argument("--host", default=d.host, help=f"interface to listen on (default {d.host}; 0.0.0.0 in a pod)")
    parser.add_argument("--port", type=int, default=d.port, help=f"port (default {d.port}; 0 = any free port)")
    parser.add_argument("--backend", default=None, help="the family's backend, e.g. sim or alfworld for household")
    parser.add_argument("--env-kwargs", default="{}", help='more constructor arguments as JSON, e.g. \'{"max_steps": 30}\'')
    parser.add_argument("--max-sessions", type=int, default=d.max_sessions, help=f"concurrent sessions (default {d.max_sessions})")
    parser.add_argument(
        "--session-ttl", type=float, default=d.session_ttl_s, help=f"reclaim sessions idle this many seconds (default {d.session_ttl_s:g}; 0 = never)"
    )
    parser.add_argument(
        "--max-sessions-per-client",
        type=int,
        default=d.max_sessions_per_client,
        help=f"open sessions one client address may hold (default {d.max_sessions_per_client}; 0 = no limit)",
    )
    parser.add_argument(
        "--max-connections-per-client",
        type=int,
        default=None,
        help="open connections (HTTP and WebSocket) one client address may hold; more are answered 429 and closed "
        "(default: --max-sessions-per-client + 64; 0 = no limit)",
    )
    parser.add_argument(
        "--max-connections", type=int, default=None, help="open connections in all; more are answered 503 (default: --max-sessions + 256)"
    )
    parser.add_argument(
        "--probe-port",
        type=int,
        default=None,
        help="also answer GET /health on this port, outside every connection limit (the kubelet's probes; default: none)",
    )
    parser.add_argument("--reap-interval", type=float, default=None, help="seconds between idle checks (default min(TTL/4, 5))")
    parser.add_argument(
        "--max-action-chars", type=int, default=d.max_action_chars, help=f"longest action accepted (default {d.max_action_chars})"
    )
    parser.add_argument(
        "--header-timeout", type=float, default=d.header_timeout_s, help=f"seconds to send a request head (default {d.header_timeout_s:g})"
    )
    parser.add_argument(
        "--body-timeout", type=float, default=d.body_timeout_s, help=f"seconds to send a request body (default {d.body_timeout_s:g})"
    )
    parser.add_argument(
        "--keep-alive", type=int, default=d.keep_alive_s, help=f"seconds an idle keep-alive connection stays open (default {d.keep_alive_s})"
    )
    parser.add_argument("--log-level", default=d.log_level, help=f"uvicorn log level (default {d.log_level})")


def options_to_args(opts: ServerOptions) -> list[str]:
    """The command-line arguments that give `options_from_args` these options back (family, env kwargs and
    the port excepted: the caller passes those)."""
    args = [
        "--host", opts.host,
        "--max-sessions", str(opts.max_sessions),
        "--max-sessions-per-client", str(opts.max_sessions_per_client),
        "--session-ttl", str(opts.session_ttl_s or 0),
        "--max-action-chars", str(opts.max_action_chars),
        "--header-timeout", str(opts.header_timeout_s),
        "--body-timeout", str(opts.body_timeout_s),
        "--keep-alive", str(opts.keep_alive_s),
        "--log-level", opts.log_level,
    ]  # fmt: skip
    for flag, value in (("--max-connections-per-client", opts.max_connections_per_client),
                        ("--max-connections", opts.max_connections), ("--probe-port", opts.probe_port),
                        ("--reap-interval", opts.reap_interval_s)):  # fmt: skip
        if value is not None:
            args += [flag, str(value)]
    return args


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--env-kwargs is not valid JSON ({exc}); give an object like '{{\"backend\": \"sim\"}}'") from None
    if not isinstance(env_kwargs, dict):
        raise SystemExit("--env-kwargs must be a JSON object, e.g. '{\"backend\": \"sim\"}'")
    if args.backend is not None:
        env_kwargs["backend"] = args.backend
    return ServerOptions(
        family=args.env,
        env_kwargs=env_kwargs,
        host=args.host,
        port=args.port,
        max_sessions=args.max_sessions,
        max_sessions_per_client=args.max_sessions_per_client,
        max_connections_per_client=args.max_connections_per_client,
        max_connections=args.max_connections,
        probe_port=args.probe_port,
        session_ttl_s=args.session_ttl if args.session_ttl and args.session_ttl > 0 else None,
        reap_interval_s=args.reap_interval,
        max_action_chars=args.max_action_chars,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        keep_alive_s=args.keep_alive,
        log_level=args.log_level,
    )
