"""`sdar eval --backend alfworld --split valid_seen`: a sim-trained warm start evaluated on the official
ALFWorld games with one flag, student and teacher, per task type (issue 12.7)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from sdar_envs.household import TASK_TYPES

from .conftest import SMALL

pytest.importorskip("alfworld", reason="the alfworld extra is not installed (pip install 'sdar[alfworld]')")
pytestmark = [pytest.mark.alfworld, pytest.mark.slow]
DATA = os.environ.get("SDAR_ALFWORLD_DATA")


@pytest.mark.skipif(not DATA, reason="SDAR_ALFWORLD_DATA is not set: point it at the official ALFWorld games")
def test_sdar_eval_on_the_official_games_with_one_flag(tiny_ckpt, tmp_path, capsys):
    from sdar.cli import main
    from sdar_envs.household.alfworld_backend import list_games, resolve_data_root, task_type_of

    # a data tree holding valid_seen only (the last two games of each task type): no train split,
    # which evaluation never needs
    root = resolve_data_root(DATA)
    by_type: dict[str, list[str]] = {}
    for game in list_games(root, "valid_seen"):
        by_type.setdefault(task_type_of(game), []).append(game)
    assert set(by_type) == set(TASK_TYPES)
    tree = tmp_path / "json_2.1.1"
    for games in by_type.values():
        for game in games[-2:]:
            trial = os.path.dirname(game)
            shutil.copytree(root / trial, tree / trial)
    assert len(list_games(tree, "valid_seen")) == 12
    sets = [f"{k}={json.dumps(v)}" for k, v in {**SMALL, "eval.tasks": 6}.items()]
    argv = ["eval", "--config", "configs/household-tiny.yaml", "--backend", "alfworld", "--split", "valid_seen",
            "--set", f"env.kwargs.data_dir={tree}", "--set", f"output_dir={tmp_path / 'out'}"]
    for item in sets:
        argv += ["--set", item]
    capsys.readouterr()
    assert main(argv) == 0
    out, err = capsys.readouterr()
    result = json.loads(out.strip().splitlines()[-1])
    # the cached sim-trained warm start of the same config is evaluated, none is built on the engine
    assert "building the warm-started tiny model" not in err
    # stratified: the first game of each type (the first six of the split are three types only)
    assert sorted(result["task_ids"]) == sorted(games[-2] for games in by_type.values())
    for who in ("student", "teacher"):
        assert result[who]["n"] == 6
        assert set(result[who]["per_type"]) == set(TASK_TYPES)
        assert all(v["n"] == 1 for v in result[who]["per_type"].values())
    assert "success per task type" in err and "pick_two_obj_and_place" in err
