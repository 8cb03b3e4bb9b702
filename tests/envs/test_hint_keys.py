"""Every `hint_template_key` a family's code can emit has a hint template, and every template is emitted:
the keys are read off the source (the string literals "<family>/<key>"), so a new error site without a
template, or a template left behind, fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import sdar_envs
from sdar.teacher.hints import hint_templates

ENVS = Path(sdar_envs.__file__).resolve().parent


def emitted_keys(family: str) -> set[str]:
    """The hint keys written in the family's code (its skills.py, which holds the templates, aside)."""
    pattern = re.compile(rf"[\"']({family}/[a-z_]+)[\"']")
    keys: set[str] = set()
    for path in (ENVS / family).glob("*.py"):
        if path.name != "skills.py":
            keys |= set(pattern.findall(path.read_text()))
    return keys


@pytest.mark.parametrize("family", ["household", "shop", "searchqa"])
def test_emitted_hint_keys_and_templates_match(family):
    emitted, templates = emitted_keys(family), set(hint_templates(family))
    assert emitted, f"no hint keys found in {ENVS / family}"
    assert emitted - templates == set(), "keys the env emits without a template"
    assert templates - emitted == set(), "templates no code emits"
