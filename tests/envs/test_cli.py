"""`sdar envs ...`: play from piped stdin (locally and against a server), expert, list, skills."""

from __future__ import annotations

import io
import json

from sdar_envs.base import register_env
from sdar_envs.cli import main, play_session
from tests.envs.test_server import GUESS_FACTORY, GuessEnv

register_env("guess_cli", GuessEnv)


def test_play_reads_numbers_and_text_from_piped_stdin(monkeypatch, capsys):
    # test-7: "2" picks 'guess 1' (higher), free text is invalid, ':expert' shows the answer, "8" wins
    monkeypatch.setattr("sys.stdin", io.StringIO("2\nwhat now\n:expert\n99\n8\n"))
    assert main(["play", "--env", "guess_cli", "--task-id", "test-7"]) == 0
    out = capsys.readouterr().out
    assert "== task test-7: find the digit of test-7" in out
    assert "[action] guess 1" in out and "step 1: higher" in out
    assert "[action] what now" in out and "[invalid: invalid_action]" in out
    assert "expert: guess 7" in out and "pick 1..10" in out
    assert "[action] guess 7" in out and "won True" in out and "played 1 episode(s), won 1" in out


def test_play_stops_at_end_of_input_and_against_a_server(capsys):
    from sdar_envs.client import RemoteEnv
    from sdar_envs.launcher import serve_in_background

    url, handle = serve_in_background(GUESS_FACTORY, in_process=True)
    with handle, RemoteEnv(url) as env:
        out = io.StringIO()
        result = play_session(env, task_id=None, seed=0, episodes=3, stdin=io.StringIO("guess 0\n"), stdout=out)
        text = out.getvalue()
        assert result == {"episodes": 0, "won": 0} and "(stopped)" in text
        assert text.count("[action]") == 1 and "step 1:" in text
        # the episode played over the wire is the one the server recorded
        assert env.state(1) in text and env.state(0) in text


def test_expert_command_writes_jsonl(tmp_path, capsys):
    out = tmp_path / "e.jsonl"
    assert main(["expert", "--env", "guess_cli", "--n", "12", "--out", str(out), "--split", "test"]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 12 and all(r["won"] for r in lines)
    assert f"12 guess_cli/default expert episodes -> {out}: won 12 (100.0%)" in capsys.readouterr().out


def test_list_and_skills_commands(tmp_path, capsys):
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    assert "guess_cli" in listing and "tasks: train 30, test 30" in listing
    store = tmp_path / "skills.db"
    assert main(["skills", "populate", "--env", "guess_cli", "--store", str(store)]) == 0
    assert "wrote 3 skill entries for guess_cli" in capsys.readouterr().out
    assert main(["skills", "get", "--env", "guess_cli", "--key", "parity_odd", "--store", str(store)]) == 0
    assert capsys.readouterr().out.strip() == GuessEnv.skill_library().render("parity_odd")
    assert main(["skills", "get", "--env", "guess_cli", "--key", "nope", "--store", str(store)]) == 1
    assert "known keys" in capsys.readouterr().err
    assert main(["skills", "list", "--store", str(store)]) == 0
    assert capsys.readouterr().out.splitlines() == ["guess_cli\t*", "guess_cli\tparity_even", "guess_cli\tparity_odd"]


def test_serve_command_serves_until_terminated():
    """`sdar envs serve` (the Helm chart's entry point; run here through sdar_envs.cli's own main,
    which builds the same subcommand) answers /health and plays over /ws."""
    import subprocess
    import sys

    from sdar.ports import free_port
    from sdar_envs.client import RemoteEnv
    from sdar_envs.launcher import ServerHandle, wait_healthy

    port = free_port()  # free now, below the kernel's ephemeral range: released just before the server takes it
    proc = subprocess.Popen(
        [sys.executable, "-m", "sdar_envs.cli", "serve", "--env", GUESS_FACTORY, "--port", str(port), "--max-sessions", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    handle = ServerHandle(url=f"http://127.0.0.1:{port}", family="guess", process=proc)
    try:
        wait_healthy(handle.url, 90, handle)
        with RemoteEnv(handle.url, GUESS_FACTORY) as env:
            assert env.info()["max_sessions"] == 3
            env.reset(task_id="train-5")
            assert env.step("guess 5").metadata["won"] is True
    finally:
        handle.stop()
    assert proc.returncode is not None and f"serving {GUESS_FACTORY} on http://127.0.0.1:{port}" in proc.stdout.read()
