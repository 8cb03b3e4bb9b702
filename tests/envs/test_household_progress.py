"""Tests of the household no-progress error sites (sdar_envs/household/progress.py): accepted actions
that make no progress are marked with an error kind and a hint, on the sim and on the real engine."""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

import pytest
import yaml

from sdar_envs import make_env
from sdar_envs.household.catalog import TASK_TEMPLATES
from sdar_envs.household.progress import NO_PROGRESS_HINTS, NO_PROGRESS_KINDS, TaskGoal, parse_task
from sdar_envs.household.sim import SimGoal
from sdar_envs.household.skills import HINT_TEMPLATES, render_hint

from .test_household_sim import _problem, heat_game, light_game, play

TINY = Path(__file__).resolve().parents[2] / "configs" / "household-tiny.yaml"
HEAT = "heat some apple and put it in diningtable"
LIGHT = "examine the alarmclock with the desklamp"
BOOK = "put a book in bed"
# official games the sim fixtures rebuild (test_household_sim.py), played by the real engine below
OFFICIAL = {
    "heat": "valid_seen/pick_heat_then_place_in_recep-Apple-None-DiningTable-26/"
    "trial_T20190907_060234_011675/game.tw-pddl",
    "light": "valid_seen/look_at_obj_in_light-AlarmClock-None-DeskLamp-323/"
    "trial_T20190909_044715_250790/game.tw-pddl",
}


def book_game():
    """A bedroom pick-and-place with a desklamp the task does not need."""
    return _problem(
        "pick_and_place_simple",
        BOOK,
        SimGoal("pick_and_place_simple", "book", "bed"),
        [("bed", 1), ("desk", 1), ("drawer", 1)],
        {"desk 1": ["book 1", "desklamp 1", "pen 1"], "drawer 1": ["cd 1"]},
    )


# ---- reading the goal off the task text ---------------------------------------------------------
def test_every_alfworld_goal_template_parses_back():
    for task_type, templates in TASK_TEMPLATES.items():
        for template in templates:
            text = template.format(obj="apple", recep="countertop", toggle="desklamp")
            goal = parse_task(text)
            assert goal is not None and goal.task_type == task_type and goal.obj == "apple", text
            assert goal.receptacle == (None if task_type == "look_at_obj_in_light" else "countertop")
    assert parse_task(f"Your task is to: {HEAT}.") == TaskGoal(
        "pick_heat_then_place_in_recep", "apple", "diningtable", None, "heat", HEAT
    )
    assert parse_task(LIGHT).wanted == ("alarmclock", "desklamp")
    assert parse_task("put a clean apple in fridge").state == "clean"
    assert parse_task("make a sandwich") is None


# ---- each kind from a hand-played episode ---------------------------------------------------------
_TAKE_MUG = ["go to countertop 1", "take mug 1 from countertop 1"]
_TAKE_APPLE = ["go to diningtable 2", "take apple 1 from diningtable 2"]


@pytest.mark.parametrize(
    ("game", "actions", "kind", "key", "args"),
    [
        (heat_game, _TAKE_MUG, "non_task_object", "household/non_task_object",
         {"object": "mug 1", "receptacle": "countertop 1", "target": "apple", "task": HEAT}),
        (heat_game, ["go to countertop 1", "go to sinkbasin 1", "go to countertop 1"],
         "revisit_nothing_new", "household/revisit_nothing_new",
         {"receptacle": "countertop 1", "wanted": "apple", "action": "go to countertop 1"}),
        # holding the apple before heating it, the diningtable (the goal's type) is no use yet
        (heat_game, ["go to diningtable 1", *_TAKE_APPLE, "go to diningtable 1"],
         "revisit_nothing_new", "household/revisit_nothing_new", {"receptacle": "diningtable 1"}),
        (heat_game, [*_TAKE_APPLE, "go to countertop 1", "move apple 1 to countertop 1"],
         "wrong_receptacle", "household/wrong_receptacle",
         {"object": "apple 1", "receptacle": "countertop 1", "goal_receptacle": "diningtable"}),
        (light_game, ["go to desk 1", "take alarmclock 2 from desk 1", "move alarmclock 2 to desk 1"],
         "wrong_receptacle", "household/keep_holding",
         {"object": "alarmclock 2", "receptacle": "desk 1", "toggle": "desklamp", "target": "alarmclock"}),
        (heat_game, [*_TAKE_APPLE, "go to diningtable 1", "move apple 1 to diningtable 1"],
         "skipped_process", "household/process_first",
         {"object": "apple 1", "state": "hot", "needed": "heat", "appliance": "microwave"}),
        (heat_game, [*_TAKE_APPLE, "go to fridge 1", "cool apple 1 with fridge 1"],
         "wrong_process", "household/wrong_process",
         {"verb": "cool", "needed": "heat", "appliance": "microwave", "target": "apple"}),
        (heat_game, [*_TAKE_MUG, "go to microwave 1", "heat mug 1 with microwave 1"],
         "wrong_process", "household/no_process_needed", {"verb": "heat", "object": "mug 1"}),
        (heat_game, ["go to countertop 1", "take butterknife 1 from countertop 1", "go to diningtable 2",
                     "slice apple 1 with butterknife 1"],
         "wrong_process", "household/no_process_needed", {"verb": "slice", "object": "apple 1"}),
        (heat_game, [*_TAKE_APPLE, "go to microwave 1", "heat apple 1 with microwave 1",
                     "heat apple 1 with microwave 1"],
         "wrong_process", "household/already_processed", {"object": "apple 1", "state": "hot"}),
        (book_game, ["go to desk 1", "use desklamp 1"], "wrong_process", "household/lamp_not_needed",
         {"action": "use desklamp 1", "task": BOOK}),
    ],
)  # fmt: skip
def test_accepted_no_progress_steps_are_marked(game, actions, kind, key, args):
    _, steps = play(game(), actions)
    last = steps[-1].metadata
    assert last["valid_action"] is True and steps[-1].observation != "Nothing happens."
    assert (last["error_kind"], last["hint_template_key"]) == (kind, key)
    assert kind in NO_PROGRESS_KINDS and key in NO_PROGRESS_HINTS and key in HINT_TEMPLATES
    assert args.items() <= last["error_args"].items()
    text = render_hint(key, last["error_args"])
    assert "<" not in text and all(v in text for k, v in args.items() if f"{{{k}}}" in HINT_TEMPLATES[key])


def test_hint_texts_read_well_and_reveal_nothing_unseen():
    _, steps = play(heat_game(), ["go to countertop 1", "go to sinkbasin 1", "go to countertop 1"])
    md = steps[-1].metadata
    assert render_hint(md["hint_template_key"], md["error_args"]) == (
        "You have already seen everything in countertop 1: there is no apple there, and the task does "
        "not need you there now. Go to a receptacle you have not looked into yet."
    )
    _, steps = play(heat_game(), [*_TAKE_APPLE, "go to diningtable 1", "move apple 1 to diningtable 1"])
    md = steps[-1].metadata
    assert render_hint(md["hint_template_key"], md["error_args"]) == (
        "The task asks for a hot apple: heat apple 1 with a microwave first, then move it to any diningtable."
    )
    # the arguments are the task text, its words and the action's names (plus the state word and the
    # appliance the task's verb implies), never where an unseen thing is
    implied = {"state": "hot", "appliance": "microwave"}
    for key, value in md["error_args"].items():
        assert value in f"{HEAT} | move apple 1 to diningtable 1" or implied.get(key) == value, key


def test_useful_steps_stay_unmarked():
    # the gold path of the heat task, and going back to where the object needing work now goes
    gold = [*_TAKE_APPLE, "go to microwave 1", "heat apple 1 with microwave 1", "go to diningtable 1",
            "move apple 1 to diningtable 1"]
    _, steps = play(heat_game(), ["go to microwave 1", *gold])
    assert steps[-1].metadata["won"]
    assert all(s.metadata["error_kind"] is None for s in steps)
    # putting down an object the task does not need undoes a mistake; a closed receptacle seen
    # only closed is not searched yet
    _, steps = play(heat_game(), [*_TAKE_MUG, "move mug 1 to countertop 1", "go to fridge 1", "go to sinkbasin 1",
                                  "go to fridge 1"])
    assert [s.metadata["error_kind"] for s in steps[3:]] == [None] * 4
    # in the light task the lamp is a task object too: going back to it is not a wasted visit
    _, steps = play(light_game(), ["go to desk 1", "take alarmclock 2 from desk 1", "go to bed 2", "go to desk 1",
                                   "use desklamp 1"])
    assert steps[-1].metadata["won"] and all(s.metadata["error_kind"] is None for s in steps)


# ---- the expert never, a random policy often -------------------------------------------------------
def _tiny_env():
    kwargs = yaml.safe_load(TINY.read_text())["env"]["kwargs"]
    return make_env("household", **kwargs)


def _site_rate(env, task_ids, policy, seed=0):
    rng = random.Random(seed)
    steps, kinds = 0, Counter()
    for task_id in task_ids:
        out = env.reset(task_id=task_id)
        while not out.done:
            out = env.step(policy(env, out, rng))
            steps += 1
            if out.metadata["valid_action"] and out.metadata["error_kind"]:
                kinds[out.metadata["error_kind"]] += 1
    return sum(kinds.values()) / steps, kinds


def test_experts_never_make_a_no_progress_step_and_random_play_often_does():
    # measured on these 60 household-tiny test tasks: every expert 0 sites; uniform random
    # admissible actions 0.080 sites per step (44 revisits, 4 non-task objects in 600 steps)
    env = _tiny_env()
    tasks = env.task_ids("test")[:60]
    for expert in (env.expert_action, env.uninformed_expert_action, env.skilled_expert_action):
        rate, kinds = _site_rate(env, tasks, lambda e, out, rng, expert=expert: expert())
        assert rate == 0.0, kinds
    rate, kinds = _site_rate(env, tasks, lambda e, out, rng: rng.choice(out.metadata["admissible_actions"]))
    assert rate > 0.04 and {"revisit_nothing_new", "non_task_object"} <= set(kinds), (rate, kinds)


def test_on_default_rooms_random_play_meets_every_kind():
    env = make_env("household", backend="sim")
    tasks = env.task_ids("test")[:60]
    rate, kinds = _site_rate(env, tasks, lambda e, out, rng: e.expert_action())
    assert rate == 0.0, kinds
    rate, kinds = _site_rate(env, tasks, lambda e, out, rng: rng.choice(out.metadata["admissible_actions"]))
    # measured: 0.165 sites per step; skipped_process is rare at random (1 in 120 tasks), the
    # hand-played test above covers it
    assert rate > 0.1 and set(kinds) >= set(NO_PROGRESS_KINDS) - {"skipped_process"}, (rate, kinds)


# ---- the real engine marks the same steps -------------------------------------------------------------
_ENGINE_PLAY = {
    "heat": ["go to countertop 1", "take mug 1 from countertop 1", "go to sinkbasin 1", "move mug 1 to sinkbasin 1",
             "go to countertop 1", "take butterknife 1 from countertop 1", "go to diningtable 2",
             "slice apple 1 with butterknife 1", "move butterknife 1 to diningtable 2",
             "take apple 1 from diningtable 2", "go to countertop 1", "move apple 1 to countertop 1",
             "take apple 1 from countertop 1", "go to diningtable 1", "move apple 1 to diningtable 1",
             "take apple 1 from diningtable 1", "go to fridge 1", "cool apple 1 with fridge 1", "go to microwave 1",
             "heat apple 1 with microwave 1", "heat apple 1 with microwave 1", "go to sinkbasin 1",
             "go to diningtable 1", "move apple 1 to diningtable 1"],
    "light": ["go to desk 1", "take alarmclock 2 from desk 1", "move alarmclock 2 to desk 1",
              "take alarmclock 2 from desk 1", "go to bed 2", "go to desk 1", "use desklamp 1"],
}


@pytest.mark.alfworld
@pytest.mark.parametrize("name", sorted(_ENGINE_PLAY))
def test_the_alfworld_engine_marks_the_same_steps_as_the_sim(name):
    pytest.importorskip("alfworld", reason="the alfworld extra is not installed (pip install 'sdar[alfworld]')")
    from sdar_envs.household import alfworld_backend as ab

    if not os.environ.get(ab.DATA_ENV_VAR):
        pytest.skip(f"{ab.DATA_ENV_VAR} is not set: the official ALFWorld games are needed")
    engine = ab.AlfworldEngine(ab.resolve_data_root(os.environ[ab.DATA_ENV_VAR]), max_steps=100)
    try:
        actions = _ENGINE_PLAY[name]
        _, sim = play({"heat": heat_game, "light": light_game}[name](), actions)
        real = [engine.reset(OFFICIAL[name])] + [engine.step(a) for a in actions]
    finally:
        engine.close()
    keys = ("valid_action", "error_kind", "hint_template_key", "error_args")
    for action, s, e in zip(["<reset>", *actions], sim, real):
        assert [s.metadata[k] for k in keys] == [e.metadata[k] for k in keys], action
    marked = Counter(s.metadata["error_kind"] for s in sim if s.metadata["error_kind"])
    assert set(marked) == ({"wrong_receptacle"} if name == "light" else set(NO_PROGRESS_KINDS))


@pytest.mark.alfworld
def test_fidelity_compares_the_no_progress_kinds(tmp_path):
    pytest.importorskip("alfworld", reason="the alfworld extra is not installed (pip install 'sdar[alfworld]')")
    from sdar_envs.household import fidelity as fid

    # generated rooms exported as games: needs the engine, not the official data. Measured on 36
    # default problems (2,438 steps, 122 revisits, 40 non-task objects, 8 wrong processes, 3 wrong
    # receptacles compared): error kind agreement 1.000
    cfg = fid.FidelityConfig(num_problems=3, difficulty="easy", walks=2, walk_steps=25, engine_gold=False)
    report = fid.run_fidelity(cfg, workers=1, game_dir=str(tmp_path))
    assert not report.errors and report.valid_agreement == report.error_kind_agreement == 1.0, report.summary()
    assert {"revisit_nothing_new", "non_task_object"} <= set(report.error_kinds), report.summary()
    assert "error kinds compared: " in report.summary()
