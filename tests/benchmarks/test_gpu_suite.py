"""benchmarks/gpu_suite.sh rehearsed at its dry size on the CPU, in an interpreter that has what a GPU machine without
our extras has: a virtual environment holding this one's packages but for MLflow, OpenEnv, pydantic and vLLM (absent,
not just failing to import: importlib finds no spec and no distribution of them). Every section must run and print
its figures, so the suite cannot rot between the runs on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.benchmarks.test_smoke import check_train_step_figures, number, table_rows

ROOT = Path(__file__).resolve().parents[2]
ABSENT = ("mlflow", "openenv", "pydantic", "vllm")  # what a GPU machine without our extras lacks
SECTIONS = ("tiny", "qwen2.5-0.5b", "qwen2.5-1.5b", "fsdp")


def bare_python(where: Path) -> Path:
    """A virtual environment whose site-packages links every package of this one but the ABSENT ones (and those
    named after them: pydantic_core, mlflow_skinny, openapi_pydantic, ...); its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower().replace("-", "_")
        if not any(word in name for word in ABSENT) and not (site / entry.name).exists():
            (site / entry.name).symlink_to(entry)
    return python


@pytest.mark.slow
def test_gpu_suite_dry_run_without_the_extras(tmp_path):
    python = bare_python(tmp_path / "venv")
    for module in ABSENT:  # the rehearsal's interpreter really lacks them
        probe = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True)
        assert probe.returncode != 0 and "No module named" in probe.stderr, module
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(python), "PYTHONPATH": ""}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_suite.sh"), "--dry", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=540, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    environment = (out / "env.txt").read_text()
    assert "extras: " + ", ".join(f"{m} absent" for m in ABSENT) in environment, environment
    summary = {line.split()[0]: line.split()[1:] for line in (out / "summary.txt").read_text().splitlines()}
    assert tuple(summary) == SECTIONS, summary
    for name, (rc, *_) in summary.items():
        assert rc == "0", f"{name} exited {rc}:\n" + (out / f"{name}.log").read_text()[-4000:]
    # bench_train_step.py's smoke runs: tiny with the speed-ups on and off and the phases' raw limits, one arm on
    # each published shape
    tiny = (out / "tiny.log").read_text()
    check_train_step_figures(tiny, arms={"grpo", "sdar"}, modes={"on", "off"})
    limits = [r for r in table_rows(tiny) if len(r) == 5 and r[0] in ("grpo", "sdar")]
    assert len(limits) == 4 and all(number(c) > 0 for r in limits for c in r[2:])
    assert set(json.loads((out / "tiny.json").read_text())["rows"]) == {"grpo/on", "grpo/off", "sdar/on", "sdar/off"}
    for shape, arm in (("qwen2.5-0.5b", "sdar"), ("qwen2.5-1.5b", "grpo")):
        log = (out / f"{shape}.log").read_text()
        assert f"model {shape} (1 of " in log
        check_train_step_figures(log, arms={arm}, modes={"padded", "on"} if shape == "qwen2.5-0.5b" else {"on"})
    assert '"world_size": 1' in (out / "fsdp.log").read_text()
