"""The environment distribution (envs/, sdar-envs) on its own: installed into a fresh virtual
environment with no torch, it serves a household game that a client plays over HTTP on 127.0.0.1.
This is what the env-server image does, without Docker."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sdar.ports import free_port as _free_port
from sdar_envs.client import RemoteEnv
from sdar_envs.launcher import ServerHandle, wait_healthy

REPO = Path(__file__).resolve().parents[2]
# what sdar-envs must never bring along (the point of the separate distribution)
HEAVY = ("torch", "transformers", "mlflow", "sdar")


@pytest.fixture(scope="module")
def envs_venv(tmp_path_factory) -> Path:
    """A fresh venv with `pip install envs/` (a regular install, as the image does) and nothing else."""
    base = tmp_path_factory.mktemp("envs-venv")
    # built from a copy, as the image builds from its context: the build leaves the checkout untouched
    source = shutil.copytree(REPO / "envs", base / "envs", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(source)],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert pip.returncode == 0, f"pip install envs/ failed:\n{pip.stdout[-3000:]}\n{pip.stderr[-3000:]}"
    return venv


@pytest.mark.slow
def test_env_distribution_installs_without_torch_and_serves(envs_venv, tmp_path):
    python = str(envs_venv / "bin" / "python")
    # cwd outside the repository and a clean environment, so only the venv's own packages count
    env = {"PATH": f"{envs_venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "SDAR_CACHE_DIR": str(tmp_path / "cache")}
    for module in HEAVY:
        probe = subprocess.run([python, "-c", f"import {module}"], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, f"{module} is importable in the envs venv"
    version = subprocess.run([str(envs_venv / "bin" / "sdar-envs"), "--version"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, check=True)
    import sdar_envs

    assert version.stdout.strip() == sdar_envs.__version__

    port = _free_port()
    # the image's argument form: `envs serve ...`, as the Helm chart passes it to the entry point
    argv = [str(envs_venv / "bin" / "sdar-envs"), "envs", "serve", "--env", "household", "--backend", "sim",
            "--host", "127.0.0.1", "--port", str(port)]
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
                                stdout=out, stderr=subprocess.STDOUT)
    handle = ServerHandle(url=f"http://127.0.0.1:{port}", family="household", process=proc, log_path=log)
    try:
        wait_healthy(handle.url, 90, handle)
        with RemoteEnv(handle.url, "household") as remote:
            assert remote.info()["sdar_version"] == sdar_envs.__version__
            first = remote.reset(seed=0)
            assert first.metadata["task"] and first.metadata["admissible_actions"]
            step = remote.step(first.metadata["admissible_actions"][0])
            assert step.metadata["valid_action"] is True
            assert isinstance(step.reward, float) and step.observation
    finally:
        handle.stop()
