"""Options of an environment server and their command-line form, kept apart from `server.py` so
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
    max_sessions: concurrent sessions (WebSocket and HTTP together); one more gets a clear error.
    max_sessions_per_client: open sessions one client address may hold (0: no limit); one more
        gets 429. One trainer opens tasks_per_step x group_size sessions at once (paper: 16 x 8).
    session_ttl_s: sessions idle longer than this are reclaimed and their env closed (None: never).
    reap_interval_s: how often idle sessions are looked for (None: min(TTL/4, 5 s)).
    max_action_chars: longest action accepted; longer ones are refused, the session goes on.
    header_timeout_s: a connection must send a complete request head within this (else 408, closed).
    body_timeout_s: a request body must arrive within this after its head (else 408, closed).
    keep_alive_s: idle keep-alive connections are closed after this many seconds.
    log_level: uvicorn's log level.
    """

    family: str = "household"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8000
    max_sessions: int = 256
    max_sessions_per_client: int = 128
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
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    @property
    def max_body_bytes(self) -> int:
        """Largest request body read: an action at the limit, JSON-escaped (up to 6 bytes a char), plus room."""
        return 6 * self.max_action_chars + 64 * 1024

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
        session_ttl_s=args.session_ttl if args.session_ttl and args.session_ttl > 0 else None,
        reap_interval_s=args.reap_interval,
        max_action_chars=args.max_action_chars,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        keep_alive_s=args.keep_alive,
        log_level=args.log_level,
    )
