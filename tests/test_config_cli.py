"""`sdar config show` and `sdar config fields`, run as a user runs them (a subprocess without torch)."""

import subprocess
import sys
from pathlib import Path

import yaml

from sdar.config import load_config

ROOT = Path(__file__).resolve().parents[1]
# the command line as a separate process in which torch and transformers cannot be imported
NO_TORCH = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
            "from sdar.cli import main; sys.exit(main(sys.argv[1:]))")


def sdar(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TORCH, *args], capture_output=True, text=True, check=False,
                          cwd=ROOT)


def test_config_show_prints_the_resolved_config_that_loads_back_the_same(tmp_path):
    config = "configs/paper/search-qwen2.5-3b.yaml"
    out = sdar("config", "show", "--config", config, "--set", "steps=3", "--set", "arm=grpo_hint")
    assert out.returncode == 0, out.stderr
    shown = yaml.safe_load(out.stdout)
    assert shown["steps"] == 3 and shown["arm"] == "grpo_hint" and shown["env"]["family"] == "searchqa"
    assert shown["rollout"]["max_turns"] == 4  # the family's and the file's settings, resolved
    assert "#   hint_distill_coef: 0.1" in out.stdout and "#   kl_coef: 0.001" in out.stdout  # the arm the loss uses
    path = tmp_path / "shown.yaml"
    path.write_text(out.stdout)
    assert load_config(path) == load_config(ROOT / config, {"steps": 3, "arm": "grpo_hint"})
    # the defaults alone, with a family's defaults filled in
    out = sdar("config", "show", "--set", "env.family=searchqa")
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["arm_overrides"] == {"kl_coef": 0.001}
    # the sampler's layout and the Scorer's chosen on this machine (a CPU here: decode steps, padded rows)
    assert "# on this machine (cpu): rollout.sampler auto -> batched, scoring.packed auto -> false" in out.stdout
    out = sdar("config", "show", "--set", "scoring.packed=true", "--set", "rollout.sampler=lookahead")
    assert "rollout.sampler lookahead -> lookahead, scoring.packed true -> true (the Scorer's layout: packed" in out.stdout


def test_config_show_reports_a_bad_setting_without_a_traceback():
    out = sdar("config", "show", "--config", "configs/household-tiny.yaml", "--set", "arm_overrides.kl_coeff=1")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "unknown arm setting(s) ['kl_coeff'] in arm_overrides; valid settings: agg," in out.stderr
    out = sdar("config", "show", "--config", "configs/nope.yaml")
    assert out.returncode == 2 and "config file configs/nope.yaml not found" in out.stderr


def test_config_fields_prints_each_settings_help():
    out = sdar("config", "fields", "rollout.")
    assert out.returncode == 0, out.stderr
    assert "rollout.temperature (float, default 1.0)\n    Sampling temperature" in out.stdout
    assert "steps (" not in out.stdout
    out = sdar("config", "fields", "nope")
    assert out.returncode == 2 and "no setting starts with 'nope'" in out.stderr
