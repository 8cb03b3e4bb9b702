"""benchmarks/bench_reliability.py end to end at a small size: each section prints its zeros (fuzz and
sessions against real servers on 127.0.0.1, one kill -9 of a real training run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def bench(tmp_path: Path, *args: str, timeout_s: float = 300) -> dict:
    """Run the benchmark with `args`; its JSON report, after checking that it exited 0 (every figure 0)."""
    out = tmp_path / "reliability.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_reliability.py"), *args, "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-4000:]}"
    report = json.loads(out.read_text())
    assert all(f["ok"] for f in report["figures"]), [f for f in report["figures"] if not f["ok"]]
    return report


def test_fuzz_section_prints_zeros(tmp_path):
    pytest.importorskip("hypothesis", reason="the schema fuzz needs hypothesis (the dev extra)")
    report = bench(tmp_path, "--only", "fuzz", "--families", "household",
                   "--fuzz-requests", "200", "--raw-requests", "100", "--ws-frames", "50")
    (fuzz,) = report["sections"]["fuzz"]
    assert (fuzz["schema_requests"], fuzz["raw_requests"], fuzz["ws_frames"]) == (200, 100, 50)
    assert fuzz["server_errors"] == fuzz["unanswered"] == 0
    assert fuzz["ws_session_kept"] and fuzz["plays_after"]
    refused = sum(n for status, n in fuzz["statuses"].items() if status.split()[-1].startswith("4"))
    assert refused > 100  # the generated requests did reach the refusals, not only /health


def test_sessions_section_prints_zeros(tmp_path):
    report = bench(tmp_path, "--only", "sessions", "--sessions", "32", "--session-steps", "8", "--victims", "4")
    cross, load = report["sections"]["sessions"]["cross"], report["sections"]["sessions"]["load"]
    assert cross["attempts"] > 100 and cross["allowed"] == 0 and cross["victims_disturbed"] == 0
    assert sum(cross["refused"].values()) == cross["attempts"]
    assert load["sessions"] == 32 and load["steps"] > 0
    assert load["lost"] == load["cross_talk"] == load["readback_mismatches"] == 0


@pytest.mark.slow
def test_kill_section_prints_zeros(tmp_path):
    # seed 8 kills early in the second step, after the first was logged and before the checkpoint every 2 steps
    report = bench(tmp_path, "--only", "kill", "--kills", "1", "--train-steps", "4", "--seed", "8")
    kill = report["sections"]["kill"]
    assert kill["finished"] and kill["kills_delivered"] == 1 and kill["steps_redone"] == 1
    assert kill["mlflow_duplicates"] == kill["mlflow_missing"] == kill["mlflow_extra"] == 0
    assert kill["checkpoints_lost"] == kill["incomplete_checkpoints"] == kill["runs_left_running"] == 0
    # resume replays each step from (seed, step) and the checkpointed RNG state: the same curve, to the bit
    # on one machine (tests/train/test_trainer.py allows 1e-5 across setups)
    assert kill["curve_max_abs_diff"] == pytest.approx(0.0, abs=1e-5)
    assert kill["final_weights_max_abs_diff"] == pytest.approx(0.0, abs=1e-5)


@pytest.mark.slow
def test_flood_section_prints_zeros(tmp_path):
    report = bench(tmp_path, "--only", "flood", "--flood", "500")
    flood = report["sections"]["flood"]
    from sdar_envs.server.config import ServerOptions

    held = ServerOptions().connections_per_client_limit  # what one address may hold at the defaults
    assert flood["connections"] == 500 and flood["refused_at_once"] == 500 - held
    assert flood["answered_later"] == {"408": held}  # each held one lost its connection at its deadline
    assert all(failed == 0 and ok >= 10 for ok, failed in flood["probes"].values()) and len(flood["probes"]) == 2
    assert flood["episodes"][1] == 0 and flood["episodes"][0] >= 10 and flood["open_after"] == 0


def test_reclaim_section_prints_zeros(tmp_path):
    report = bench(tmp_path, "--only", "reclaim", "--reclaim", "32")
    reclaim = report["sections"]["reclaim"]
    assert reclaim["told_why"] == reclaim["closed_by_server"] == 32 and reclaim["left_open"] == 0
    assert reclaim["server_connections_after"] == reclaim["server_sessions_after"] == 0


@pytest.mark.slow
def test_damage_section_prints_zeros(tmp_path):
    # one kind through `sdar train` (each resume is a process: ~20 s); every kind resumes in process in
    # tests/train/test_guards.py::test_resume_falls_back_from_a_damaged_newest_checkpoint
    report = bench(tmp_path, "--only", "damage", "--damages", "state scrambled", timeout_s=600)
    damage = report["sections"]["damage"]
    assert damage["resumed"] == {"state scrambled": 1}
    assert all(damage["finished"].values()) and damage["failed_resumes"] == damage["damaged_deleted"] == 0
    assert damage["told"] == 1
