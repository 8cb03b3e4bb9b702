"""sdar.ports.free_port: a port for a child server, drawn below the kernel's ephemeral range so that no outgoing
connection elsewhere on the machine can take it between the check and the child's bind (CI once failed on that:
torchrun's rendezvous port, found free in the ephemeral range, taken by a parallel test's gloo socket)."""

from __future__ import annotations

import socket

import pytest

import sdar.ports as ports
from sdar.ports import ephemeral_low, free_port


def test_a_port_is_drawn_below_the_ephemeral_range_and_is_free():
    low = ephemeral_low()
    if low is None:
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range here")
    drawn = {free_port() for _ in range(20)}
    assert all(max(1024, low - ports.SPAN) <= p < low for p in drawn), (low, drawn)
    assert len(drawn) > 1  # drawn, not a fixed port every caller would share
    for p in drawn:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free: a server can take it


class _Scripted:
    def __init__(self, ports_: list[int]) -> None:
        self.ports, self.asked = list(ports_), []

    def randrange(self, start: int, stop: int) -> int:
        self.asked.append((start, stop))
        return self.ports.pop(0)


def test_a_held_port_is_passed_over(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_low", lambda: 32768)
    with socket.socket() as held, socket.socket() as other:
        held.bind(("127.0.0.1", 0))
        held.listen()
        other.bind(("127.0.0.1", 0))
        taken, free = held.getsockname()[1], other.getsockname()[1]
        other.close()
        draw = _Scripted([taken, free])
        monkeypatch.setattr(ports, "_draw", draw)
        assert free_port() == free
    assert draw.asked == [(20768, 32768)] * 2


def test_without_a_range_or_a_free_draw_the_kernel_chooses(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_low", lambda: None)
    assert 0 < free_port() < 65536
    monkeypatch.setattr(ports, "ephemeral_low", lambda: 32768)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        monkeypatch.setattr(ports, "_draw", _Scripted([held.getsockname()[1]] * 3))
        port = free_port(tries=3)
        assert port != held.getsockname()[1]


def test_the_range_file_is_read_or_ignored(tmp_path):
    f = tmp_path / "range"
    f.write_text("32768\t60999\n")
    assert ephemeral_low(f) == 32768
    f.write_text("")
    assert ephemeral_low(f) is None
    assert ephemeral_low(tmp_path / "missing") is None
