"""envs/ is its own distribution (sdar-envs): it imports nothing of sdar, torch, transformers or mlflow,
declares none of them, and its version is the one sdar pins and forwards extras to."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import sdar_envs
from sdar_envs.cli import main

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "envs" / "src" / "sdar_envs"
FORBIDDEN = ("sdar", "torch", "transformers", "mlflow")
# a module named in a string, e.g. register_env("shop", "sdar_envs.shop:ShopEnv") or import_module("torch")
_MODULE_STRING = re.compile(rf"^({'|'.join(FORBIDDEN)})([.:]\w|$)")


def _forbidden(module: str) -> bool:
    return module.split(".")[0] in FORBIDDEN


def _crossings(path: Path, root: Path = REPO) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if _forbidden(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _forbidden(node.module):
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Call):
            # import_module("...") / find_spec("...") / register_env(name, "module:attr")
            for arg in node.args[:2]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _MODULE_STRING.match(arg.value):
                    found.append(f"{ast.unparse(node.func)}({arg.value!r})")
    return [f"{path.relative_to(root)}: {c}" for c in found]


def test_the_env_package_imports_nothing_of_sdar_or_the_training_stack():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 30, f"expected the env sources under {PACKAGE}"
    crossings = [c for f in files for c in _crossings(f)]
    assert crossings == [], "sdar_envs must stay installable without sdar and torch:\n" + "\n".join(crossings)


def test_the_scan_sees_each_kind_of_crossing(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os\nfrom sdar.config import x\nfrom sdar_envs import base\n"
        "def f():\n    import torch.nn\n    importlib.import_module('mlflow')\n    register_env('x', 'sdar.agent:X')\n"
    )
    assert _crossings(bad, tmp_path) == [
        "bad.py: from sdar.config import ...",
        "bad.py: import torch.nn",
        "bad.py: importlib.import_module('mlflow')",
        "bad.py: register_env('sdar.agent:X')",
    ]


def test_distribution_metadata_declares_no_training_stack_and_matches_sdar():
    envs_meta = tomllib.loads((REPO / "envs" / "pyproject.toml").read_text())["project"]
    sdar_meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[\s<>=!~\[;]", d, maxsplit=1)[0].lower() for d in envs_meta["dependencies"]]
    for extra in envs_meta["optional-dependencies"].values():
        names += [re.split(r"[\s<>=!~\[;]", d, maxsplit=1)[0].lower() for d in extra]
    assert not set(names) & {"torch", "transformers", "mlflow", "sdar"}, names
    assert envs_meta["version"] == sdar_envs.__version__
    # sdar pins exactly this version (met by the local install: `pip install -e ./envs -e .`)
    assert f"sdar-envs=={envs_meta['version']}" in sdar_meta["dependencies"]
    # and forwards the environments' extras rather than repeating their pins
    for extra in ("alfworld", "wiki"):
        assert sdar_meta["optional-dependencies"][extra] == [f"sdar-envs[{extra}]=={envs_meta['version']}"]
    assert envs_meta["scripts"]["sdar-envs"] == "sdar_envs.cli:main"


def test_sdar_envs_command_takes_both_argument_forms(tmp_path, capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == sdar_envs.__version__
    # `sdar-envs skills ...` and `sdar-envs envs skills ...` (the `sdar` form, as the chart passes it
    # to the image's entry point) are one command
    store = str(tmp_path / "skills.db")
    assert main(["skills", "populate", "--env", "shop", "--store", store]) == 0
    assert main(["envs", "skills", "list", "--store", store]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].startswith("wrote ") and all(line.startswith("shop\t") for line in listed[1:]) and listed[1:]
