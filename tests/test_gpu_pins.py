"""The GPU set (issue 44.2): constraints/gpu.txt pins torch, vLLM, transformers and peft; the trainer image installs
exactly those torch and vLLM under it; pyproject's ranges admit every pin; and pip's resolver, against the index pip
uses (metadata only, nothing installed), resolves envs/ and the package with the gpu, cluster and trl extras under it
to exactly the pins. A new release cannot break the GPU install silently: this fails instead."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

import pytest
from packaging.requirements import Requirement

from tests.test_check_pins import _check_pins  # tools/check_pins.py, imported as that test does

ROOT = Path(__file__).resolve().parents[1]




def test_the_image_and_the_package_ranges_agree_with_the_gpu_set():
    pins = _check_pins().gpu_pins()
    core = ("torch", "vllm", "transformers", "peft")  # the set itself; other exact lines are resolver hints
    assert set(core) <= set(pins)
    dockerfile = (ROOT / "images" / "trainer" / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (TORCH_SPEC|VLLM_SPEC)=(\S+)$", dockerfile, re.MULTILINE))
    assert args == {"TORCH_SPEC": f"torch=={pins['torch']}", "VLLM_SPEC": f"vllm=={pins['vllm']}"}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]] + [
        Requirement(r) for extra in ("gpu", "trl") for r in project["optional-dependencies"][extra]]
    for name in core:
        version = pins[name]
        ranges = [r.specifier for r in reqs if r.name.lower() == name]
        assert ranges and all(s.contains(version) for s in ranges), (name, version, ranges)
    makefile = (ROOT / "Makefile").read_text()
    assert "TORCH_SPEC ?= $(shell grep -m1 '^torch==' constraints/gpu.txt)" in makefile  # one torch for CPU and GPU


@pytest.mark.slow
def test_the_gpu_set_resolves_against_the_index_to_its_pins():
    assert _check_pins().check_gpu_set() == []
