import json
import subprocess
import sys

from sdar.cli import main


def test_arms_command_prints_every_arm(capsys):
    assert main(["arms"]) == 0
    out = capsys.readouterr().out
    for name in ("grpo", "grpo_opsd", "sdar", "opsd", "skill_grpo"):
        assert name in out
    assert main(["arms", "--json"]) == 0
    rows = {r["arm"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["sdar"]["gate_beta"] == 5.0 and rows["grpo_opsd"]["gate_beta"] == 0.0


def test_console_script_help_lists_subcommands():
    out = subprocess.run([sys.executable, "-m", "sdar.cli", "--help"], capture_output=True, text=True, check=True)
    assert "arms" in out.stdout
