"""images/env-server/Dockerfile, read as Docker reads it (no Docker engine here): pinned base,
slim multi-stage build of the env distribution alone (no torch), non-root user, /tmp-only writes,
and a HEALTHCHECK that works on a real server."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

import pytest

from sdar.ports import free_port as _free_port
from tests.deploy.conftest import REPO

IMAGE_DIR = REPO / "images" / "env-server"
DOCKERFILE = IMAGE_DIR / "Dockerfile"


@dataclass
class Stage:
    """One FROM ... section: its base image, alias and instructions as (KEYWORD, argument text)."""

    base: str
    alias: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for arg in self.all("ENV"):
            for token in shlex.split(arg):
                key, _, value = token.partition("=")
                out[key] = value
        return out


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages); joins `\\` continuations and drops comments like Docker does."""
    lines, buf = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        lines.append(buf + stripped)
        buf = ""
    assert not buf, "the Dockerfile ends inside a continued line"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, arg = line.partition(" ")
        keyword, arg = keyword.upper(), arg.strip()
        if keyword == "FROM":
            parts = arg.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], parts[0])
            alias = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base, alias))
        elif not stages and keyword == "ARG":
            name, _, default = arg.partition("=")
            global_args[name] = default
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, arg))
    return global_args, stages


@pytest.fixture(scope="module")
def dockerfile():
    return parse_dockerfile(DOCKERFILE.read_text())


def test_base_image_is_a_pinned_python_311_slim(dockerfile):
    _global_args, stages = dockerfile
    assert len(stages) == 2, "a build stage with compilers and a slim runtime stage"
    for stage in stages:
        image, _, tag = stage.base.partition(":")
        assert image == "python"
        # a concrete patch release: never `latest`, never a floating 3.11-slim
        assert re.fullmatch(r"3\.11\.\d+-slim(-\w+)?", tag), stage.base
    assert stages[0].base == stages[1].base, "build and runtime must share the interpreter"


def test_build_stage_compiles_runtime_stage_stays_slim(dockerfile):
    _, (build, runtime) = dockerfile
    build_runs = " ".join(build.all("RUN"))
    assert "build-essential" in build_runs and "cmake" in build_runs
    runtime_runs = " ".join(runtime.all("RUN"))
    for tool in ("build-essential", "cmake", "g++", "gcc", "git"):
        assert not re.search(rf"(^|\s){re.escape(tool)}(\s|$)", runtime_runs), (
            f"{tool} in the runtime stage"
        )
    copies = runtime.all("COPY")
    assert any(c.startswith(f"--from={build.alias} /opt/venv") for c in copies), copies
    # only the venv crosses stages: no source tree, no compilers
    assert all(c.startswith("--from=") for c in copies), copies


def test_installs_the_env_distribution_alone_without_torch(dockerfile):
    _, (build, _) = dockerfile
    runs = build.all("RUN")
    (install,) = [r for r in runs if re.search(r"pip install \"?\.", r)]
    # the build context is envs/ only (sdar-envs: no torch, transformers or mlflow) ...
    assert all(c.split()[0].startswith("envs/") for c in build.all("COPY"))
    # ... nothing installs torch, and the build fails if a dependency brought it back
    assert not any("torch" in r.lower() for r in runs if r is not install)
    assert "find_spec('torch') is not None" in install
    assert "sdar-envs --version" in install
    args = dict(a.partition("=")[::2] for a in build.all("ARG"))
    assert "TORCH_SPEC" not in args and "TORCH_INDEX_URL" not in args
    assert args["EXTRAS"] == "alfworld"
    envs_meta = (REPO / "envs" / "pyproject.toml").read_text()
    assert re.search(r"^alfworld = ", envs_meta, re.MULTILINE), "EXTRAS must be an extra of envs/pyproject.toml"


def test_runtime_runs_as_uid_10001_and_writes_only_under_tmp(dockerfile):
    _, (_, runtime) = dockerfile
    users = runtime.all("USER")
    assert users and users[-1].split(":")[0] == "10001"
    assert any("--uid 10001" in r for r in runtime.all("RUN")), "the user must exist in /etc/passwd"
    env = runtime.env()
    for var in ("HOME", "XDG_CACHE_HOME", "SDAR_CACHE_DIR", "MPLCONFIGDIR", "HF_HOME"):
        assert env[var] == "/tmp" or env[var].startswith("/tmp/"), (var, env[var])
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # a read-only root filesystem has no room for .pyc
    assert env["PATH"].startswith("/opt/venv/bin:")


def test_exposes_8000_and_serves_by_default(dockerfile):
    _, (_, runtime) = dockerfile
    assert runtime.all("EXPOSE") == ["8000"]
    assert json.loads(runtime.all("ENTRYPOINT")[-1]) == ["sdar-envs"]
    cmd = json.loads(runtime.all("CMD")[-1])
    # sdar-envs takes the `sdar` argument form (`envs serve ...`) that the chart and launcher pass
    assert cmd[0] == "envs"
    from tests.deploy.test_helm_chart import sdar_envs_parser

    args = sdar_envs_parser().parse_args(cmd)
    assert (args.envs_command, args.env, args.host, args.port) == (
        "serve",
        "household",
        "0.0.0.0",
        8000,
    )
    label = next(a for a in runtime.all("ARG") if a.startswith("VERSION="))
    import sdar
    import sdar_envs

    assert label == f"VERSION={sdar.__version__}" == f"VERSION={sdar_envs.__version__}"


def test_dockerignore_admits_only_what_the_build_copies(dockerfile):
    _, (build, _) = dockerfile
    # BuildKit reads <Dockerfile>.dockerignore next to the Dockerfile for a repo-root context
    patterns = [
        p
        for p in (IMAGE_DIR / "Dockerfile.dockerignore").read_text().splitlines()
        if p and not p.startswith("#")
    ]

    def included(path: str) -> bool:
        keep = True
        for pattern in patterns:
            negate = pattern.startswith("!")
            pat = pattern[1:] if negate else pattern
            pat = pat.rstrip("/")
            hit = (
                fnmatch.fnmatch(path, pat)
                or fnmatch.fnmatch(path, pat + "/*")
                or fnmatch.fnmatch(path, pat.replace("**/", ""))
            )
            if hit:
                keep = negate
        return keep

    copied = [c.split()[0] for c in build.all("COPY")]
    assert copied == ["envs/pyproject.toml", "envs/src"]
    for path in ("envs/pyproject.toml", "envs/README.md", "envs/src/sdar_envs/server/app.py"):
        assert included(path), path
    for path in (
        "pyproject.toml",  # sdar's own: the image never sees the torch-requiring distribution
        "src/sdar/__init__.py",
        "envs/src/sdar_envs/__pycache__/x.pyc",
        ".venv/bin/python",
        "tests/conftest.py",
        ".git/HEAD",
        ".cache/tools/helm",
        "mlruns/0/meta.yaml",
        "src/sdar/__pycache__/x.pyc",
    ):
        assert not included(path), path


# ---- the HEALTHCHECK command, run against a real server ------------------------------------
def test_healthcheck_command_passes_on_a_live_server_and_fails_without_one(dockerfile, tmp_path):
    _, (_, runtime) = dockerfile
    (health,) = runtime.all("HEALTHCHECK")
    exec_form = json.loads(health[health.index("CMD") + 3 :].strip())
    assert exec_form[0] == "python"
    assert "/health" in exec_form[-1]
    port = _free_port()
    serve = "from tests.deploy.test_helm_chart import sdar_envs_parser as p; a = p().parse_args(); a.func(a)"
    argv = [
        sys.executable,
        "-c",
        serve,
        "envs",
        "serve",
        "--env",
        "shop",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with open(tmp_path / "server.log", "w") as log:
        server = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    env = {"PATH": "/usr/bin:/bin", "SDAR_ENV_PORT": str(port)}
    cmd = [sys.executable, *exec_form[1:]]
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "server.log").read_text()
                assert time.monotonic() < deadline, "the server did not answer /health within 60 s"
                time.sleep(0.2)
        assert subprocess.run(cmd, check=False, env=env, timeout=30).returncode == 0
    finally:
        server.terminate()
        server.wait(timeout=30)
    # the same check against the now closed port must report unhealthy
    assert (
        subprocess.run(cmd, check=False, env=env, capture_output=True, timeout=30).returncode != 0
    )
