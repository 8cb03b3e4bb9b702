"""images/trainer/Dockerfile and `make images`, read statically: Docker is not installed on this
machine (nor in CI), so nothing is built here. Checked: a pinned CUDA base, torch and vLLM pinned
and installed before the package with its gpu,cluster extras, a non-root user, no secrets baked
in, `sdar train` as the default command, a context filter, and image names that agree between
the Makefile, components/_image.py (what the pipeline runs) and sdar.images (what TorchX runs)."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess

import pytest

from tests.deploy.conftest import REPO
from tests.deploy.test_env_server_image import parse_dockerfile

IMAGE_DIR = REPO / "images" / "trainer"
DOCKERFILE = IMAGE_DIR / "Dockerfile"


@pytest.fixture(scope="module")
def dockerfile():
    return parse_dockerfile(DOCKERFILE.read_text())


def _args(stage) -> dict[str, str]:
    return dict(a.partition("=")[::2] for a in stage.all("ARG"))


def test_base_is_a_pinned_cuda_runtime_shared_by_both_stages(dockerfile):
    global_args, stages = dockerfile
    assert len(stages) == 2, "a build stage and a runtime stage"
    assert stages[0].base == stages[1].base == global_args["CUDA_IMAGE"]
    image, _, tag = stages[0].base.partition(":")
    assert image == "nvidia/cuda"
    # a concrete CUDA patch release, never `latest` or a floating major; Ubuntu 24.04's Python 3.12
    # meets vLLM's >= 3.11
    assert re.fullmatch(r"\d+\.\d+\.\d+-(cudnn-)?runtime-ubuntu24\.04", tag), stages[0].base


def test_torch_and_vllm_are_pinned_and_installed_before_the_gpu_extra(dockerfile):
    from packaging.requirements import Requirement

    _, (build, _) = dockerfile
    args = _args(build)
    torch_req, vllm_req = Requirement(args["TORCH_SPEC"]), Requirement(args["VLLM_SPEC"])
    assert (torch_req.name, vllm_req.name) == ("torch", "vllm")
    for req in (torch_req, vllm_req):
        (spec,) = req.specifier
        assert spec.operator == "==", f"{req} must be an exact pin"
    extras = set(args["EXTRAS"].split(","))
    assert {"gpu", "cluster"} <= extras
    runs = build.all("RUN")
    first = next(i for i, r in enumerate(runs) if "${TORCH_SPEC}" in r)
    assert "${VLLM_SPEC}" in runs[first], "torch and vLLM are resolved together (vLLM pins torch)"
    package = next(i for i, r in enumerate(runs) if re.search(r'pip install -c constraints/gpu\.txt "\.\[\$\{EXTRAS\}\]"', r))
    assert "-c /build/constraints/gpu.txt" in runs[first], "torch and vLLM under the GPU set's constraints"
    assert first < package
    # the pinned torch satisfies the package's own torch range, so installing the package never swaps it
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    torch_range = next(Requirement(d) for d in project["dependencies"] if Requirement(d).name == "torch")
    (pinned,) = torch_req.specifier
    assert torch_range.specifier.contains(pinned.version), (torch_range, pinned)
    gpu_extra = [Requirement(d).name for d in project["optional-dependencies"]["gpu"]]
    assert "vllm" in gpu_extra
    assert "torchx-nightly" in [Requirement(d).name for d in project["optional-dependencies"]["cluster"]]


def test_runtime_runs_as_uid_10001_with_writable_paths_under_tmp(dockerfile):
    _, (_, runtime) = dockerfile
    users = runtime.all("USER")
    assert users and users[-1].split(":")[0] == "10001"
    assert any("--uid 10001" in r for r in runtime.all("RUN")), "the user must exist in /etc/passwd"
    env = runtime.env()
    for var in ("HOME", "XDG_CACHE_HOME", "SDAR_CACHE_DIR", "HF_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"):
        assert env[var] == "/tmp" or env[var].startswith("/tmp/"), (var, env[var])
    assert env["PATH"].startswith("/opt/venv/bin:")
    copies = runtime.all("COPY")
    assert any(c.startswith("--from=build /opt/venv") for c in copies), copies
    assert runtime.all("WORKDIR")[-1] == "/workspace"


def test_no_secret_is_baked_in(dockerfile):
    _, stages = dockerfile
    names = []
    for stage in stages:
        names += list(stage.env()) + [a.partition("=")[0] for a in stage.all("ARG")]
    secretish = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL|MLFLOW_TRACKING_URI|AWS_", re.IGNORECASE)
    assert not [n for n in names if secretish.search(n)], names
    assert not any(".aws" in c or ".netrc" in c or "kube" in c for s in stages for c in s.all("COPY"))


def test_default_command_trains_with_a_config_the_image_holds(dockerfile):
    _, (_, runtime) = dockerfile
    assert json.loads(runtime.all("ENTRYPOINT")[-1]) == ["sdar"]
    cmd = json.loads(runtime.all("CMD")[-1])
    from sdar.cli import build_parser

    args = build_parser().parse_args(cmd)
    assert cmd[0] == "train" and args.func.__name__ == "_cmd_train"
    assert (REPO / args.config).is_file(), args.config
    assert any(c.split()[-2:] == ["configs", "./configs"] for c in runtime.all("COPY")), "configs/ must be in the image"
    label = next(a for a in runtime.all("ARG") if a.startswith("VERSION="))
    import sdar

    assert label == f"VERSION={sdar.__version__}"


def test_dockerignore_admits_only_what_the_build_copies(dockerfile):
    _, (build, runtime) = dockerfile
    for ignore in (IMAGE_DIR / "Dockerfile.dockerignore", REPO / ".dockerignore"):
        patterns = [p for p in ignore.read_text().splitlines() if p and not p.startswith("#")]

        def included(path: str, patterns: list[str] = patterns) -> bool:
            keep = True
            for pattern in patterns:
                negate = pattern.startswith("!")
                pat = (pattern[1:] if negate else pattern).rstrip("/")
                if fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(path, pat + "/*") or \
                        fnmatch.fnmatch(path, pat.replace("**/", "")):
                    keep = negate
            return keep

        copied = [c.split()[0] for c in build.all("COPY")] + [c.split()[-2] for c in runtime.all("COPY")
                                                              if not c.startswith("--from=")]
        for path in copied:
            assert included(path), (ignore, path)
        for path in ("pyproject.toml", "README.md", "src/sdar/cli.py", "configs/household-tiny.yaml"):
            assert included(path), (ignore, path)
        for path in (".venv/bin/python", "tests/conftest.py", ".git/HEAD", "runs/x/history.json",
                     "src/sdar/__pycache__/x.pyc", ".cache/tools/helm"):
            assert not included(path), (ignore, path)


# ---- make images ---------------------------------------------------------------------------
def _makefile_target(name: str) -> list[str]:
    text = (REPO / "Makefile").read_text()
    m = re.search(rf"^{re.escape(name)}:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert m, f"no `{name}` target in the Makefile"
    return [line.strip() for line in m.group(1).splitlines()]


def test_images_target_builds_both_dockerfiles_under_registry_and_tag():
    text = (REPO / "Makefile").read_text()
    assert re.search(r"^REGISTRY \?= \S+", text, re.MULTILINE) and re.search(r"^TAG \?= ", text, re.MULTILINE)
    recipe = " ".join(_makefile_target("images"))
    assert "-f images/trainer/Dockerfile" in recipe and "-f images/env-server/Dockerfile" in recipe
    push = " ".join(_makefile_target("push-images"))
    assert "$(TRAINER_IMAGE)" in push and "$(ENV_SERVER_IMAGE)" in push
    assert re.search(r"^TRAINER_IMAGE := \$\(REGISTRY\)/sdar-trainer:\$\(TAG\)$", text, re.MULTILINE)
    assert re.search(r"^ENV_SERVER_IMAGE := \$\(REGISTRY\)/sdar-env-server:\$\(TAG\)$", text, re.MULTILINE)


def _make_n(*args: str) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout
    return re.findall(r"(?:-t|push) (\S+)", out)


def test_make_and_the_pipeline_name_the_same_images(monkeypatch):
    import importlib

    import components._image as image_mod
    from sdar.images import env_server_image, trainer_image

    for var in ("SDAR_IMAGE", "SDAR_ENV_IMAGE", "SDAR_REGISTRY", "SDAR_IMAGE_TAG"):
        monkeypatch.delenv(var, raising=False)
    env_ref, trainer_ref = _make_n("images")
    assert trainer_ref == image_mod.DEFAULT_IMAGE == trainer_image() == "ghcr.io/sdar/sdar-trainer:0.1.0"
    assert env_ref == image_mod.DEFAULT_ENV_IMAGE == env_server_image()
    # another registry and tag: make's REGISTRY/TAG and the pipeline's SDAR_REGISTRY/SDAR_IMAGE_TAG agree
    pushed = _make_n("push-images", "REGISTRY=123.dkr.ecr.example/team", "TAG=7")
    monkeypatch.setenv("SDAR_REGISTRY", "123.dkr.ecr.example/team")
    monkeypatch.setenv("SDAR_IMAGE_TAG", "7")
    try:
        reloaded = importlib.reload(image_mod)
        assert reloaded.base_image() in pushed and reloaded.env_image() in pushed
        assert trainer_image() == reloaded.base_image() == "123.dkr.ecr.example/team/sdar-trainer:7"
        monkeypatch.setenv("SDAR_IMAGE", "reg.example/custom:1")  # a full reference still wins
        assert importlib.reload(image_mod).base_image() == trainer_image() == "reg.example/custom:1"
    finally:
        monkeypatch.undo()
        importlib.reload(image_mod)
