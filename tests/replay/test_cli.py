"""`sdar teachers serve` (a real subprocess, interrupted) and `sdar teachers replay` (in process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from sdar.agent.rollout import Trajectory, Turn
from sdar.cli import main
from sdar.eval.report import write_trajectories
from sdar.replay import read_pairs
from tests.replay.test_server import VIEW


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


# SIGHUP takes SIGTERM's path (sdar.lifecycle.ending_on_signals; tests/test_lifecycle.py sends both to sdar ui)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_serves_until_a_signal_ends_it_and_frees_the_port(sig):
    """Ctrl-C and kill (SIGTERM; a closing terminal's SIGHUP goes the same way) stop the server (a thread of the process), say so, and
    release the port (issue 43.1)."""
    import socket
    import urllib.parse

    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")  # SIGABRT dumps every thread's stack
    # the child starts with Ctrl-C at its default, as from a terminal: an ignored SIGINT is inherited (CI caught the
    # server still in its wait loop 30 s after SIGINT, twice). tests/conftest.py sees to it for the whole suite; this
    # keeps the test true under any runner
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "sdar.cli", "teachers", "serve", "--family", "shop", "--port",
                                 "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                cwd=Path(__file__).parent)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1"), proc.stderr.read()
        assert [proc.stdout.readline().strip() for _ in range(2)] == ["model: rule", "model: rule-b"]
        assert [m.id for m in client(url).models.list().data] == ["rule", "rule-b"]
    finally:
        proc.send_signal(sig)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # say where it hangs: faulthandler prints each thread's stack
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"sdar teachers serve still ran 30 s after {signal.Signals(sig).name}; its threads:\n"
                        f"{err[-8000:]}")
    port = urllib.parse.urlsplit(url).port
    if sig == signal.SIGINT:
        assert proc.returncode == 0
    else:
        assert proc.returncode == 128 + sig and f"ended by {signal.Signals(sig).name}" in out and "is stopped" in out
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still answers after the server ended"


def test_replay_writes_pairs_and_stats(tmp_path, capsys):
    turns = [Turn(view=VIEW, prompt_ids=[1, 2], response_ids=[3, 4], response_text="<action>look</action>",
                  action="look", valid=True, env_valid=True, reward=0.0)]
    src = tmp_path / "rollout" / "trajectories.jsonl"
    write_trajectories(src, [Trajectory("household/x", "pick_and_place_simple", 0, skills="S", turns=turns)],
                       "household")
    out = tmp_path / "pairs" / "pairs.jsonl"
    assert main(["teachers", "replay", "--trajectories", str(src), "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == {"pairs": str(out), "stats": str(out.with_name("pairs.stats.json")), "n_pairs": 1}
    [pair] = read_pairs(out)
    assert (pair.chosen, pair.rejected, pair.prompt_ids, pair.rejected_ids) == ("go to countertop 1", "look", [1, 2],
                                                                                 [3, 4])
    stats = json.loads(Path(printed["stats"]).read_text())
    assert stats["replay/pairs"] == 1 and stats["replay/calls"] == 2
    assert list((tmp_path / "pairs" / "replay-cache").rglob("*.json"))  # replies kept beside the pairs
    # a pool file: one rule expert cannot reach min_agree=2
    pool = tmp_path / "pool.yaml"
    pool.write_text("local_experts: [b]\n")
    assert main(["teachers", "replay", "--trajectories", str(src), "--out", str(out), "--teacher-pool",
                 str(pool)]) == 2
    assert "replay.min_agree=2 but the pool has 1 teacher(s)" in capsys.readouterr().err
