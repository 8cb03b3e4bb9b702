"""SkillLibrary.render: the full privileged text and the compact parts a tiny model's teacher gets."""

import pytest
from sdar_envs.skills import SkillLibrary

LIB = SkillLibrary(family="f", general=["g1"], by_key={"k": ["s1"]}, mistakes={"*": ["m*"], "k": ["mk"]})


def test_render_full_and_compact_parts():
    assert LIB.render("k") == ("General skills:\n- g1\nSkills for k:\n- s1\n"
                               "Common mistakes to avoid:\n- m*\n- mk")
    assert LIB.render(None) == "General skills:\n- g1\nCommon mistakes to avoid:\n- m*"
    assert LIB.render(None, common_mistakes=False) == "General skills:\n- g1"
    assert LIB.render("k", general=False, common_mistakes=False) == "Skills for k:\n- s1\nCommon mistakes to avoid:\n- mk"
    assert LIB.render("k", general=False) == "Skills for k:\n- s1\nCommon mistakes to avoid:\n- m*\n- mk"


def test_render_names_an_unknown_key():
    with pytest.raises(KeyError, match="known keys: k"):
        LIB.render("x", general=False)
