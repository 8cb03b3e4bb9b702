"""A loopback port to start a server on, when the server cannot be handed a bound socket (a child process that takes
`--port`: `mlflow server`, an environment server's image, torchrun's rendezvous).

A port the kernel hands out itself (to any `connect()` on the machine, or a bind to port 0) comes from its ephemeral
range (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default), so one found free there can be taken by
another process's outgoing connection between the check and the child's bind: the child then fails with EADDRINUSE
(gloo opens such connections by the dozen for every rank of every job). A port below that range is never handed out
by the kernel; only a process that asks for it by number can take it. So `free_port` draws from below the range,
checking that nothing holds the port, and falls back to the kernel's choice only where no such range is readable.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
SPAN = 12000  # ports below the ephemeral range to draw from: 20768-32767 under the default range
_draw = random.SystemRandom()  # never the seeded global generator: parallel workers seeded alike would draw alike


def ephemeral_low(path: Path = EPHEMERAL_RANGE) -> int | None:
    """The first port of the kernel's ephemeral range, or None where it cannot be read (not Linux)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", tries: int = 64) -> int:
    """A port on `host` that nothing holds now, below the kernel's ephemeral range where that range is known."""
    low = ephemeral_low()
    if low is not None and low - 1024 >= 1024:
        start = max(1024, low - SPAN)
        for _ in range(tries):
            port = _draw.randrange(start, low)
            if _bindable(host, port):
                return port
    with socket.socket() as s:  # the kernel's choice: no range to draw from, or every draw was held
        s.bind((host, 0))
        return s.getsockname()[1]
