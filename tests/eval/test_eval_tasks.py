"""Which tasks an evaluation plays (sdar.eval.tasks): stratified over task types by default, the
first N on request, or a given list; and how `sdar eval`'s flags set them."""

from __future__ import annotations

from collections import Counter

import pytest

from sdar.config import load_config
from sdar_envs.household import TASK_TYPES
from sdar.eval.tasks import eval_task_set, read_task_list, select_tasks, task_type_of

CONFIG = "configs/household-tiny.yaml"
# ALFWorld-style game paths, sorted as list_games returns them: grouped by task type, so the first
# N are one or two types only (valid_seen's first 12 are all look_at_obj_in_light)
GAMES = sorted(f"valid_seen/{t}-Obj{i}-None-Recep-{i}/trial_T{i}/game.tw-pddl"
               for t, k in zip(TASK_TYPES, (23, 13, 27, 16, 25, 36)) for i in range(k))


def _types(ids):
    return Counter(task_type_of("household", t) for t in ids)


def test_stratified_selection_covers_every_task_type_round_robin():
    assert len(_types(GAMES[:12])) <= 2  # what `eval.tasks: 12` took before
    picked = select_tasks(GAMES, 12, lambda t: task_type_of("household", t))
    assert set(_types(picked).values()) == {2} and set(_types(picked)) == set(TASK_TYPES)
    assert picked == select_tasks(GAMES, 12, lambda t: task_type_of("household", t))  # deterministic
    # round-robin in the order types first appear, each type's ids in listing order
    first_of = {}
    for g in GAMES:
        first_of.setdefault(task_type_of("household", g), g)
    assert picked[:6] == list(first_of.values())
    # counts differ by at most one; a type that runs out leaves its share to the others
    seven = select_tasks(GAMES, 7, lambda t: task_type_of("household", t))
    assert sorted(_types(seven).values()) == [1, 1, 1, 1, 1, 2]
    big = select_tasks(GAMES, 90, lambda t: task_type_of("household", t))
    assert len(big) == 90 == len(set(big)) and min(_types(big).values()) == 13  # the smallest type, all of it
    assert sorted(select_tasks(GAMES, None, lambda t: task_type_of("household", t))) == GAMES
    assert select_tasks(GAMES, 10_000, lambda t: task_type_of("household", t)).__len__() == len(GAMES)


def test_first_n_stays_an_option_and_unknown_orders_are_errors():
    assert select_tasks(GAMES, 12, lambda t: task_type_of("household", t), order="first") == GAMES[:12]
    assert select_tasks(GAMES, 5, None) == GAMES[:5]  # no task types known: listing order
    with pytest.raises(ValueError, match="unknown eval task order 'random'.*stratified, first"):
        select_tasks(GAMES, 5, None, order="random")


def test_task_types_are_read_off_the_ids_of_each_family():
    assert task_type_of("household", "sim/heat/900003") == "pick_heat_then_place_in_recep"
    assert task_type_of("household", GAMES[0]) == "look_at_obj_in_light"
    assert task_type_of("searchqa", "searchqa/two_hop/000042") == "two_hop"
    assert task_type_of("shop", "shop/000123") is None
    assert task_type_of("household", "not-a-task") is None


def test_the_sim_test_split_keeps_its_listing_prefix():
    # the sim's test ids cycle through the six types, so stratified = the first N: evaluation
    # numbers measured before stratification stay comparable
    from sdar_envs import make_env

    cfg = load_config(CONFIG)
    env = make_env("household", **cfg.env.kwargs)
    ids = env.task_ids("test")
    assert eval_task_set(env, cfg) == ids[: cfg.eval.tasks]
    assert set(_types(eval_task_set(env, cfg)).values()) == {cfg.eval.tasks // 6}


class _NoSplits:
    def task_ids(self, split):
        raise ValueError(f"no split {split!r} here")


def test_a_given_task_list_is_used_as_is_without_reading_the_split(tmp_path):
    ids = [GAMES[40], GAMES[0]]
    cfg = load_config(CONFIG, {"eval.task_ids": ids})
    assert eval_task_set(_NoSplits(), cfg) == ids
    listing = tmp_path / "tasks.txt"
    listing.write_text(f"# two games\n{GAMES[40]}\n\n{GAMES[0]}  # the first\n")
    assert read_task_list(str(listing)) == ids
    assert read_task_list(f"{GAMES[40]}, {GAMES[0]}") == ids
    with pytest.raises(ValueError, match="no task ids"):
        read_task_list(" , ")


def test_eval_flags_become_config_overrides(tmp_path):
    from sdar.cli import build_parser
    from sdar.train.cli import _eval_overrides

    listing = tmp_path / "tasks.txt"
    listing.write_text("sim/heat/900003\nsim/pick/900000\n")
    args = build_parser().parse_args(["eval", "--config", CONFIG, "--backend", "alfworld", "--split", "valid_seen",
                                      "--tasks", str(listing), "--set", "eval.tasks=12"])
    ov = _eval_overrides(args)
    cfg = load_config(CONFIG, ov)
    assert cfg.env.kwargs["backend"] == "alfworld" and cfg.env.eval_split == "valid_seen"
    assert cfg.eval.task_ids == ["sim/heat/900003", "sim/pick/900000"] and cfg.eval.tasks == 12
    assert cfg.tracking is False and cfg.eval.task_order == "stratified"
