"""Tests of the household simulator backend, its HouseholdEnv facade and the household skills.

Reference strings in the transcript tests were recorded from ALFWorld 0.4.2's TextWorld engine
playing official valid_seen games whose rooms the fixtures below rebuild object for object.
"""

from __future__ import annotations

import copy
import random
import statistics
import time
from collections import Counter

import pytest
from sdar_envs import METADATA_KEYS, make_env
from sdar_envs.household import TASK_TYPES, HouseholdEnv
from sdar_envs.household import wording as W
from sdar_envs.household.catalog import CAN_CONTAIN, OPENABLE, TASK_ROOMS
from sdar_envs.household.priors import LOCATION_PRIORS, priors_for
from sdar_envs.household.progress import NO_PROGRESS_KINDS
from sdar_envs.household.sim import (
    TEST_SEED_BASE,
    SimDifficulty,
    SimGame,
    SimGoal,
    SimHousehold,
    SimObject,
    SimProblem,
    SimReceptacle,
    generate_problem,
    make_task_id,
    parse_task_id,
    split_of,
)
from sdar_envs.household.sim_expert import expert_action
from sdar_envs.household.skills import (
    HINT_TEMPLATES,
    household_skill_library,
    prior_line,
    render_hint,
    task_receptacle_types,
    task_targets,
)

GOTO_KITCHEN = [
    *(f"go to cabinet {i}" for i in (1, 10, 2, 3, 4, 5, 6, 7, 8, 9)),
    "go to coffeemachine 1",
    "go to countertop 1",
    "go to countertop 2",
    "go to diningtable 1",
    "go to diningtable 2",
    "go to drawer 1",
    "go to drawer 2",
    "go to drawer 3",
    "go to fridge 1",
    "go to garbagecan 1",
    "go to microwave 1",
    "go to sinkbasin 1",
    "go to stoveburner 1",
    "go to stoveburner 2",
    "go to stoveburner 3",
    "go to stoveburner 4",
    "go to toaster 1",
]


def _problem(task_type, text, goal, receptacles, contents, openable=OPENABLE):
    recs = []
    for rtype, n in receptacles:
        recs += [
            SimReceptacle(f"{rtype} {k}", rtype, rtype in openable, False) for k in range(1, n + 1)
        ]
    objs = [SimObject(o, o.rsplit(" ", 1)[0], r) for r, names in contents.items() for o in names]
    return SimProblem(
        "sim/pick/000000", task_type, "kitchen", 0, text, recs, objs, goal, max_steps=200
    )


def heat_game() -> SimProblem:
    """valid_seen/pick_heat_then_place_in_recep-Apple-None-DiningTable-26 (the parts these tests touch)."""
    return _problem(
        "pick_heat_then_place_in_recep",
        "heat some apple and put it in diningtable",
        SimGoal("pick_heat_then_place_in_recep", "apple", "diningtable", None, "heat", 1),
        [
            ("cabinet", 10),
            ("coffeemachine", 1),
            ("countertop", 2),
            ("diningtable", 2),
            ("drawer", 3),
            ("fridge", 1),
            ("garbagecan", 1),
            ("microwave", 1),
            ("sinkbasin", 1),
            ("stoveburner", 4),
            ("toaster", 1),
        ],
        {
            "countertop 1": ["butterknife 1", "mug 1"],
            "diningtable 1": [
                "bread 1",
                "bread 2",
                "butterknife 2",
                "dishsponge 1",
                "fork 1",
                "potato 1",
                "spatula 1",
            ],
            "diningtable 2": [
                "apple 1",
                "bread 3",
                "cup 3",
                "egg 3",
                "peppershaker 2",
                "soapbottle 1",
                "soapbottle 2",
            ],
            "fridge 1": ["bowl 1", "cup 1", "egg 1", "lettuce 1", "plate 1", "tomato 1"],
            "microwave 1": ["egg 2", "mug 2"],
            "sinkbasin 1": ["plate 2", "spoon 1"],
        },
    )


def clean_game() -> SimProblem:
    """valid_seen/pick_clean_then_place_in_recep-SoapBar-None-Toilet-410."""
    return _problem(
        "pick_clean_then_place_in_recep",
        "clean some soapbar and put it in toilet",
        SimGoal("pick_clean_then_place_in_recep", "soapbar", "toilet", None, "clean", 1),
        [
            ("bathtubbasin", 1),
            ("countertop", 1),
            ("drawer", 6),
            ("garbagecan", 1),
            ("handtowelholder", 2),
            ("sinkbasin", 2),
            ("toilet", 1),
            ("toiletpaperhanger", 1),
            ("towelholder", 2),
        ],
        {
            "countertop 1": ["candle 2", "soapbar 1", "spraybottle 1", "toiletpaper 1"],
            "drawer 1": ["soapbar 2"],
            "drawer 2": ["candle 1"],
            "drawer 3": ["cloth 1"],
            "garbagecan 1": ["soapbar 3"],
            "handtowelholder 1": ["handtowel 1"],
            "handtowelholder 2": ["handtowel 2"],
            "toilet 1": ["cloth 2", "soapbottle 1"],
            "toiletpaperhanger 1": ["toiletpaper 2"],
            "towelholder 1": ["towel 1"],
            "towelholder 2": ["towel 2"],
        },
    )


def light_game() -> SimProblem:
    """valid_seen/look_at_obj_in_light-AlarmClock-None-DeskLamp-323 (desk 1 and sidetables)."""
    return _problem(
        "look_at_obj_in_light",
        "examine the alarmclock with the desklamp",
        SimGoal("look_at_obj_in_light", "alarmclock", None, "desklamp", None, 1),
        [
            ("bed", 2),
            ("desk", 1),
            ("drawer", 11),
            ("dresser", 1),
            ("garbagecan", 1),
            ("safe", 1),
            ("sidetable", 2),
        ],
        {
            "bed 2": ["laptop 2", "laptop 1", "pillow 2", "pillow 1"],
            "desk 1": [
                "alarmclock 2",
                "book 1",
                "bowl 1",
                "cd 2",
                "desklamp 1",
                "mug 2",
                "mug 1",
                "pen 2",
                "pen 1",
            ],
            "dresser 1": ["alarmclock 1", "pencil 1"],
            "sidetable 1": ["alarmclock 3", "cd 3", "cellphone 2", "pen 3"],
            "sidetable 2": ["desklamp 2", "mug 3"],
        },
    )


def play(problem: SimProblem, actions: list[str]) -> tuple[SimHousehold, list]:
    backend = SimHousehold()
    steps = [backend.load(problem)]
    steps += [backend.step(a) for a in actions]
    return backend, steps


# ---- wording: replay real-engine transcripts ------------------------------------------------------
def test_intro_and_basic_feedback_match_engine_transcript():
    _, s = play(
        heat_game(),
        [
            "look",
            "inventory",
            "help",
            "go to countertop 1",
            "examine countertop 1",
            "go to fridge 1",
            "examine fridge 1",
            "take egg 1 from fridge 1",
            "open fridge 1",
            "open fridge 1",
            "look",
            "close fridge 1",
            "foo bar",
            "go to fridge 2",
        ],
    )
    assert s[0].observation == (
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see "
        "a cabinet 10, a cabinet 9, a cabinet 8, a cabinet 7, a cabinet 6, a cabinet 5, a cabinet 4, a cabinet 3, "
        "a cabinet 2, a cabinet 1, a coffeemachine 1, a countertop 2, a countertop 1, a diningtable 2, a diningtable 1, "
        "a drawer 3, a drawer 2, a drawer 1, a fridge 1, a garbagecan 1, a microwave 1, a sinkbasin 1, a stoveburner 4, "
        "a stoveburner 3, a stoveburner 2, a stoveburner 1, and a toaster 1.\n\n"
        "Your task is to: heat some apple and put it in diningtable."
    )
    assert s[0].metadata["admissible_actions"] == sorted(
        GOTO_KITCHEN + ["help", "inventory", "look"]
    )
    obs = [x.observation for x in s[1:]]
    assert obs == [
        "You are in the middle of a room. Looking quickly around you, you see nothing.",
        "You are not carrying anything.",
        W.HELP,
        "You arrive at countertop 1. On the countertop 1, you see a butterknife 1, and a mug 1.",
        "On the countertop 1, you see a butterknife 1, and a mug 1.",
        "You arrive at fridge 1. The fridge 1 is closed.",
        "The fridge 1 is closed.",
        "Nothing happens.",
        (
            "You open the fridge 1. The fridge 1 is open. In it, you see a bowl 1, a cup 1, a egg 1, a lettuce 1, "
            "a plate 1, and a tomato 1."
        ),
        "Nothing happens.",
        "You are facing the fridge 1. Next to it, you see nothing.",
        "You close the fridge 1.",
        "Nothing happens.",
        "Nothing happens.",
    ]
    assert W.HELP.startswith("Available commands:\n  look:") and W.HELP.endswith("sharp object\n")
    assert s[4].metadata["admissible_actions"] == sorted(
        [
            "examine countertop 1",
            *(g for g in GOTO_KITCHEN if g != "go to countertop 1"),
            "help",
            "inventory",
            "look",
            "take butterknife 1 from countertop 1",
            "take mug 1 from countertop 1",
        ]
    )
    at_fridge = [a for a in s[6].metadata["admissible_actions"] if not a.startswith("go to")]
    assert at_fridge == ["examine fridge 1", "help", "inventory", "look", "open fridge 1"]
    opened = [a for a in s[9].metadata["admissible_actions"] if not a.startswith("go to")]
    assert opened == ["close fridge 1", "examine fridge 1", "help", "inventory", "look"] + [
        f"take {o} from fridge 1"
        for o in ("bowl 1", "cup 1", "egg 1", "lettuce 1", "plate 1", "tomato 1")
    ]


def test_holding_and_appliance_feedback_match_engine_transcript():
    _, s = play(
        heat_game(),
        [
            "go to diningtable 1",
            "go to diningtable 1",
            "take bread 1 from diningtable 1",
            "go to microwave 1",
            "open microwave 1",
            "go to fridge 1",
            "go to diningtable 2",
        ],
    )
    assert s[1].observation == (
        "You arrive at diningtable 1. On the diningtable 1, you see a bread 2, a bread 1, a butterknife 2, "
        "a dishsponge 1, a fork 1, a potato 1, and a spatula 1."
    )
    assert s[2].observation == "Nothing happens."
    assert s[3].observation == "You pick up the bread 1 from the diningtable 1."
    no_goto = lambda st: [a for a in st.metadata["admissible_actions"] if not a.startswith("go to")]
    assert no_goto(s[3]) == [
        "examine bread 1",
        "examine diningtable 1",
        "help",
        "inventory",
        "look",
        "move bread 1 to diningtable 1",
    ]
    assert s[4].observation == "You arrive at microwave 1. The microwave 1 is closed."
    assert no_goto(s[4]) == [
        "examine bread 1",
        "examine microwave 1",
        "heat bread 1 with microwave 1",
        "help",
        "inventory",
        "look",
        "open microwave 1",
    ]
    assert (
        s[5].observation
        == "You open the microwave 1. The microwave 1 is open. In it, you see a egg 2, and a mug 2."
    )
    assert no_goto(s[6]) == [
        "cool bread 1 with fridge 1",
        "examine bread 1",
        "examine fridge 1",
        "help",
        "inventory",
        "look",
        "open fridge 1",
    ]
    assert s[7].observation == (
        "You arrive at diningtable 2. On the diningtable 2, you see a apple 1, a bread 3, a cup 3, a egg 3, "
        "a peppershaker 2, a soapbottle 2, and a soapbottle 1."
    )


def test_processing_examine_and_slice_match_engine_transcript():
    _, s = play(
        heat_game(),
        [
            "go to countertop 1",
            "take mug 1 from countertop 1",
            "examine mug 1",
            "go to microwave 1",
            "heat mug 1 with microwave 1",
            "go to sinkbasin 1",
            "clean mug 1 with sinkbasin 1",
            "go to fridge 1",
            "cool mug 1 with fridge 1",
            "inventory",
            "move mug 1 to fridge 1",
            "open fridge 1",
            "move mug 1 to fridge 1",
            "close fridge 1",
            "go to countertop 1",
            "take butterknife 1 from countertop 1",
            "go to fridge 1",
            "slice egg 1 with butterknife 1",
            "go to diningtable 2",
            "slice apple 1 with butterknife 1",
            "move butterknife 1 to diningtable 2",
            "take apple 1 from diningtable 2",
            "examine apple 1",
        ],
    )
    obs = [x.observation for x in s]
    assert obs[3] == "This is a normal mug 1. In it, you see nothing."
    assert obs[5] == "You heat the mug 1 using the microwave 1."
    assert (
        obs[6] == "You arrive at sinkbasin 1. On the sinkbasin 1, you see a plate 2, and a spoon 1."
    )
    assert obs[7] == "You clean the mug 1 using the sinkbasin 1."
    assert obs[9] == "You cool the mug 1 using the fridge 1."
    assert obs[10] == "You are carrying: a mug 1."
    assert obs[11] == "Nothing happens."  # the fridge is closed
    assert obs[13] == "You move the mug 1 to the fridge 1."
    assert obs[14] == "You close the fridge 1."
    # a held knife slices what is here, even inside the closed fridge (as the engine allows)
    slices = [a for a in s[17].metadata["admissible_actions"] if a.startswith("slice")]
    assert slices == [
        "slice egg 1 with butterknife 1",
        "slice lettuce 1 with butterknife 1",
        "slice tomato 1 with butterknife 1",
    ]
    assert obs[18] == "You sliced the egg 1 with the butterknife 1."
    assert [a for a in s[19].metadata["admissible_actions"] if a.startswith("slice")] == [
        "slice apple 1 with butterknife 1",
        "slice bread 3 with butterknife 1",
        "slice egg 3 with butterknife 1",
    ]
    assert obs[20] == "You sliced the apple 1 with the butterknife 1."
    assert obs[21] == "You move the butterknife 1 to the diningtable 2."
    assert [a for a in s[21].metadata["admissible_actions"] if a.startswith("take")] == [
        f"take {o} from diningtable 2"
        for o in (
            "apple 1",
            "bread 3",
            "butterknife 1",
            "cup 3",
            "egg 3",
            "peppershaker 2",
            "soapbottle 1",
            "soapbottle 2",
        )
    ]
    assert obs[23] == "This is a sliced apple 1."


def test_clean_task_wins_like_the_engine():
    _, s = play(
        clean_game(),
        [
            "go to countertop 1",
            "take soapbar 1 from countertop 1",
            "go to toilet 1",
            "move soapbar 1 to toilet 1",
            "examine toilet 1",
            "take soapbar 1 from toilet 1",
            "go to sinkbasin 1",
            "examine soapbar 1",
            "clean soapbar 1 with sinkbasin 1",
            "examine soapbar 1",
            "go to toilet 1",
            "move soapbar 1 to toilet 1",
        ],
    )
    assert s[0].observation.split("\n\n")[1] == (
        "You are in the middle of a room. Looking quickly around you, you see a bathtubbasin 1, a countertop 1, "
        "a drawer 6, a drawer 5, a drawer 4, a drawer 3, a drawer 2, a drawer 1, a garbagecan 1, a handtowelholder 2, "
        "a handtowelholder 1, a sinkbasin 2, a sinkbasin 1, a toilet 1, a toiletpaperhanger 1, a towelholder 2, "
        "and a towelholder 1."
    )
    assert s[4].observation == "You move the soapbar 1 to the toilet 1."
    assert s[4].reward == 0.0 and not s[4].done  # not clean yet
    assert (
        s[5].observation == "On the toilet 1, you see a cloth 2, a soapbar 1, and a soapbottle 1."
    )
    assert s[8].observation == "There's nothing special about soapbar 1."
    assert s[9].observation == "You clean the soapbar 1 using the sinkbasin 1."
    assert s[10].observation == "This is a clean soapbar 1."
    assert s[12].observation == "You move the soapbar 1 to the toilet 1."
    assert (s[12].reward, s[12].done, s[12].metadata["won"]) == (1.0, True, True)
    assert all(x.reward == 0.0 and not x.done for x in s[:12])


def test_light_task_wins_like_the_engine():
    _, s = play(
        light_game(),
        [
            "go to desk 1",
            "examine alarmclock 2",
            "use desklamp 1",
            "use desklamp 1",
            "take alarmclock 2 from desk 1",
        ],
    )
    assert s[1].observation == (
        "You arrive at desk 1. On the desk 1, you see a alarmclock 2, a book 1, a bowl 1, a cd 2, a desklamp 1, "
        "a mug 2, a mug 1, a pen 2, and a pen 1."
    )
    adm = [a for a in s[1].metadata["admissible_actions"] if not a.startswith("go to")]
    assert adm == [
        "examine desk 1",
        "help",
        "inventory",
        "look",
        "take alarmclock 2 from desk 1",
        "take book 1 from desk 1",
        "take bowl 1 from desk 1",
        "take cd 2 from desk 1",
        "take mug 1 from desk 1",
        "take mug 2 from desk 1",
        "take pen 1 from desk 1",
        "take pen 2 from desk 1",
        "use desklamp 1",
    ]
    assert s[2].observation == "Nothing happens."  # only held objects can be examined
    assert s[3].observation == s[4].observation == "You turn on the desklamp 1."
    assert s[5].observation == "You pick up the alarmclock 2 from the desk 1."
    assert (s[5].reward, s[5].done) == (1.0, True)


def test_join_items_and_examine_templates():
    assert W.join_items([]) == "nothing"
    assert W.join_items(["apple 1"]) == "a apple 1"
    assert W.join_items(["apple 1", "egg 2"]) == "a apple 1, and a egg 2"
    assert W.join_items(["a 1", "b 1", "c 1"]) == "a a 1, a b 1, and a c 1"
    kw = {"clean": False, "hot": False, "cool": False, "sliced": False, "receptacle_object": False}
    assert W.examine_object("apple 1", "apple", **{**kw, "hot": True}) == "This is a hot apple 1."
    assert W.examine_object("apple 1", "apple", **{**kw, "cool": True}) == "This is a cold apple 1."
    assert (
        W.examine_object("apple 1", "apple", **{**kw, "cool": True, "clean": True})
        == "This is a cool and clean apple 1."
    )
    assert (
        W.examine_object("apple 1", "apple", **{**kw, "hot": True, "sliced": True})
        == "This is a hot sliced apple 1."
    )


# ---- gold path and random policy --------------------------------------------------------------------
@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_gold_path_wins_generated_tasks(task_type):
    env = HouseholdEnv(backend="sim")
    wins, lengths = 0, []
    for seed in range(200):
        step = env.reset(task_id=make_task_id(task_type, seed))
        assert step.metadata["task_type"] == task_type
        while not step.done:
            step = env.step(env.expert_action())
            assert step.metadata["valid_action"], (env.backend.problem.task_id, step.observation)
        wins += step.metadata["won"]
        lengths.append(env.num_steps)
    assert wins >= 198, f"gold path won {wins}/200 {task_type} tasks"
    assert 3 <= statistics.mean(lengths) <= 25
    # the gold path is the generator's recorded gold length
    assert env.num_steps == env.backend.problem.gold_steps


def test_gold_path_recovers_after_random_actions():
    env = HouseholdEnv(backend="sim", difficulty=SimDifficulty(max_steps=300))
    rng = random.Random(0)
    for seed in range(150):
        step = env.reset(seed=seed)
        for _ in range(rng.randint(5, 40)):
            if step.done:
                break
            step = env.step(
                rng.choice(step.metadata["admissible_actions"] + ["put apple 1 in fridge 1"])
            )
        while not step.done:
            step = env.step(env.expert_action())
            assert step.metadata["valid_action"]
        assert step.metadata["won"], env.backend.problem.task_id


def test_random_admissible_policy_mostly_loses():
    env = HouseholdEnv(backend="sim")
    rng = random.Random(1)
    wins = 0
    for seed in range(300):
        step = env.reset(seed=seed)
        while not step.done:
            step = env.step(rng.choice(step.metadata["admissible_actions"]))
        wins += step.metadata["won"]
        assert env.num_steps <= env.backend.problem.max_steps
    assert wins / 300 < 0.15, f"random policy won {wins}/300"


# ---- admissible actions and error markers -----------------------------------------------------------
def test_every_admissible_action_is_valid_and_others_are_not():
    backend = SimHousehold()
    rng = random.Random(2)
    checked = 0
    for seed in range(40):
        step = backend.reset(seed=seed)
        for _ in range(rng.randint(0, 12)):
            step = backend.step(rng.choice(step.metadata["admissible_actions"]))
            if step.done:
                break
        if step.done:
            continue
        game = backend.game
        for action in game.admissible():
            clone = copy.deepcopy(game)
            obs, valid = clone.apply(action)
            assert valid and obs != W.NOTHING_HAPPENS, action
            checked += 1
        # inadmissible: a go-to of where we are, take of an object elsewhere, a made-up receptacle
        elsewhere = next(o for o, r in enumerate(game.where) if r >= 0 and r != game.loc)
        bad = [
            f"take {game.oname[elsewhere]} from {game.rname[game.where[elsewhere]]}",
            "go to spaceship 1",
        ]
        if game.loc is not None:
            bad.append(f"go to {game.rname[game.loc]}")
        for action in bad:
            assert action not in game.admissible()
            clone = copy.deepcopy(game)
            assert clone.apply(action) == (W.NOTHING_HAPPENS, False)
    assert checked > 200


@pytest.mark.parametrize(
    ("actions", "kind", "hint"),
    [
        (["dance wildly"], "invalid_action", "household/invalid_action"),
        (
            ["go to countertop 1", "take mug 1 from countertop 1", "put mug 1 in countertop 1"],
            "invalid_action",
            "household/use_move",
        ),
        (
            ["go to fridge 1", "take egg 1 from fridge 1"],
            "receptacle_closed",
            "household/open_first",
        ),
        (["take mug 1 from countertop 1"], "not_at_receptacle", "household/go_to_first"),
        (["open fridge 1"], "not_at_receptacle", "household/go_to_first"),
        (
            ["go to countertop 1", "take apple 1 from countertop 1"],
            "object_not_here",
            "household/object_not_here",
        ),
        (
            [
                "go to countertop 1",
                "take mug 1 from countertop 1",
                "take butterknife 1 from countertop 1",
            ],
            "hands_full",
            "household/hands_full",
        ),
        (
            ["go to microwave 1", "heat apple 1 with microwave 1"],
            "not_holding",
            "household/take_first",
        ),
        (
            ["go to countertop 1", "take mug 1 from countertop 1", "heat mug 1 with countertop 1"],
            "wrong_appliance",
            "household/wrong_appliance",
        ),
        (
            [
                "go to countertop 1",
                "take butterknife 1 from countertop 1",
                "go to microwave 1",
                "heat butterknife 1 with microwave 1",
            ],
            "cannot_process",
            "household/cannot_process",
        ),
        (
            [
                "go to countertop 1",
                "take mug 1 from countertop 1",
                "go to toaster 1",
                "move mug 1 to toaster 1",
            ],
            "cannot_contain",
            "household/cannot_contain",
        ),
        (["go to countertop 1", "go to countertop 1"], "already_here", "household/already_here"),
        (["go to bathtub 1"], "unknown_receptacle", "household/unknown_receptacle"),
    ],
)
def test_failed_actions_carry_error_markers(actions, kind, hint):
    _, steps = play(heat_game(), actions)
    last = steps[-1]
    assert last.observation == "Nothing happens."
    assert last.metadata["valid_action"] is False
    assert (last.metadata["error_kind"], last.metadata["hint_template_key"]) == (kind, hint)
    assert hint in HINT_TEMPLATES and render_hint(hint, last.metadata["error_args"])
    # the steps before were accepted (taking the mug the task does not ask for is marked as an
    # accepted no-progress step, tests/envs/test_household_progress.py)
    for st in steps[:-1]:
        assert st.metadata["valid_action"]
        assert st.metadata["error_kind"] in (None, *NO_PROGRESS_KINDS)


def test_render_hint_fills_arguments_and_rejects_unknown_keys():
    assert (
        render_hint("household/open_first", {"receptacle": "fridge 1"})
        == "The fridge 1 is closed; 'open fridge 1' first."
    )
    with pytest.raises(KeyError, match="known keys"):
        render_hint("household/nope")


def test_metadata_keys_rewards_and_horizon():
    env = HouseholdEnv(backend="sim", difficulty=SimDifficulty(max_steps=5))
    step = env.reset(task_id="sim/two/000003")
    assert set(METADATA_KEYS) <= set(step.metadata)
    assert step.metadata["task"] == env.task_text and step.metadata["task_id"] == "sim/two/000003"
    assert f"Your task is to: {env.task_text}." in step.observation
    for i in range(5):
        step = env.step("look")
        assert set(METADATA_KEYS) <= set(step.metadata)
        assert step.reward == 0.0 and step.done == (i == 4)
    assert not step.metadata["won"]
    after = env.step("inventory")  # past the end: the engine's frozen answer, marked as a failure
    assert after.done and after.reward == 0.0 and after.observation == step.observation
    assert after.metadata["error_kind"] == "episode_over"


def test_state_returns_exact_observations():
    env = make_env("household", backend="sim")
    seen = [env.reset(task_id="sim/heat/000010").observation]
    for action in ["look", "go to fridge 1", "open fridge 1", "nonsense", env.expert_action()]:
        seen.append(env.step(action).observation)
    assert [env.state(t) for t in range(len(seen))] == seen
    assert env.state() == seen[-1]
    with pytest.raises(IndexError, match="steps 0..5"):
        env.state(6)


# ---- determinism, splits, knobs -------------------------------------------------------------------
def _gold_run(env, **reset_kwargs):
    step = env.reset(**reset_kwargs)
    out = [step.observation]
    while not step.done:
        step = env.step(env.expert_action())
        out.append(step.observation)
    return out


def test_determinism_by_task_id_and_seed():
    assert (
        generate_problem("sim/cool/000042").to_dict()
        == generate_problem("sim/cool/000042").to_dict()
    )
    a, b = HouseholdEnv(backend="sim"), HouseholdEnv(backend="sim")
    assert _gold_run(a, seed=7) == _gold_run(b, seed=7)
    assert _gold_run(a, task_id="sim/look/000005") == _gold_run(b, task_id="sim/look/000005")
    intros = {HouseholdEnv(backend="sim").reset(seed=s).observation for s in range(30)}
    assert len(intros) >= 28
    # seedless resets follow the backend's own seeded stream
    assert [a.reset().observation for _ in range(3)] != [a.reset().observation for _ in range(3)]
    c, d = HouseholdEnv(backend="sim", seed=5), HouseholdEnv(backend="sim", seed=5)
    assert [c.reset().observation for _ in range(3)] == [d.reset().observation for _ in range(3)]


def test_problem_json_round_trip_replays_identically():
    problem = generate_problem("sim/two/000011")
    again = SimProblem.from_dict(problem.to_dict())
    g1, g2 = SimGame(problem), SimGame(again)
    assert g1.intro == g2.intro
    while not g1.won:
        action = expert_action(g1)
        assert action == expert_action(g2)
        assert g1.apply(action) == g2.apply(action)
    assert g2.won


def test_train_and_test_splits_are_disjoint_and_fixed():
    backend = SimHousehold(test_size=120, train_size=600)
    test_ids, train_ids = backend.task_ids("test"), backend.task_ids("train")
    assert len(test_ids) == 120 == len(set(test_ids)) and len(train_ids) == 600
    assert not set(test_ids) & set(train_ids)
    assert backend.task_ids("test") == test_ids
    assert Counter(parse_task_id(t)[0] for t in test_ids) == {t: 20 for t in TASK_TYPES}
    assert all(split_of(t) == "test" for t in test_ids) and all(
        split_of(t) == "train" for t in train_ids
    )
    assert all(parse_task_id(backend.draw_task_id(seed=s))[1] < TEST_SEED_BASE for s in range(200))
    assert len(SimHousehold().task_ids("test")) == 200
    with pytest.raises(ValueError, match="'train' and 'test'"):
        backend.task_ids("valid")


def test_bad_inputs_get_clear_errors():
    with pytest.raises(ValueError, match="expected 'sim/<kind>/<6-digit seed>'"):
        HouseholdEnv(backend="sim").reset(task_id="heat-12")
    with pytest.raises(ValueError, match="unknown SimDifficulty fields"):
        SimDifficulty.coerce({"rooms": 3})
    with pytest.raises(ValueError, match="choose one of easy, default, hard, alfworld"):
        SimDifficulty.preset("insane")
    with pytest.raises(ValueError, match="low <= high"):
        SimDifficulty(num_receptacles=(9, 3))
    with pytest.raises(
        ValueError, match="unknown household backend 'thor'; choose one of alfworld, sim"
    ):
        HouseholdEnv(backend="thor")
    with pytest.raises(ValueError, match="unknown task types"):
        SimHousehold(task_types=["fly"])
    with pytest.raises(RuntimeError, match="reset"):
        SimHousehold().step("look")


def _sizes(difficulty, n=60):
    probs = [generate_problem(make_task_id(TASK_TYPES[i % 6], i), difficulty) for i in range(n)]
    return (
        statistics.mean(len(p.receptacles) for p in probs),
        statistics.mean(len(p.objects) for p in probs),
        probs,
    )


def test_difficulty_knobs_change_problem_sizes():
    easy_r, easy_o, _ = _sizes("easy")
    def_r, def_o, _ = _sizes("default")
    hard_r, hard_o, hard = _sizes("hard")
    assert easy_r < def_r < hard_r and easy_o < def_o < hard_o
    assert all(12 <= len(p.receptacles) <= 20 for p in hard if p.room == "kitchen")
    _, _, opened = _sizes(SimDifficulty(closed_fraction=0.0), n=30)
    assert all(r.opened for p in opened for r in p.receptacles if r.openable)
    _, _, closed = _sizes(SimDifficulty(closed_fraction=1.0), n=30)
    assert not any(r.opened for p in closed for r in p.receptacles)
    _, _, many = _sizes(SimDifficulty(target_copies=(3, 3)), n=30)
    for p in many:
        n_target = sum(o.otype == p.goal.object_type for o in p.objects)
        assert n_target == (4 if p.goal.count == 2 else 3)
        assert all(
            o.location.rsplit(" ", 1)[0] != p.goal.receptacle_type
            for o in p.objects
            if o.otype == p.goal.object_type
        )
    assert all(p.max_steps == 30 for p in _sizes("easy", n=6)[2])


def test_generated_rooms_respect_task_constraints():
    for i in range(120):
        task_type = TASK_TYPES[i % 6]
        p = generate_problem(make_task_id(task_type, i))
        types = {r.rtype for r in p.receptacles}
        assert p.room in TASK_ROOMS[task_type]
        for o in p.objects:
            assert o.otype in CAN_CONTAIN[o.location.rsplit(" ", 1)[0]], (o, p.task_id)
        if p.goal.state:
            assert {"clean": "sinkbasin", "heat": "microwave", "cool": "fridge"}[
                p.goal.state
            ] in types
        if task_type == "look_at_obj_in_light":
            assert any(o.otype == "desklamp" for o in p.objects)
        else:
            assert p.goal.receptacle_type in types
        assert p.gold_steps is not None and p.gold_steps <= p.max_steps


def test_generator_follows_the_location_priors():
    """With prior_weight=1 the targets start where the skills say they usually are."""
    counts = Counter()
    for seed in range(300):
        p = generate_problem(
            make_task_id("pick_heat_then_place_in_recep", seed), SimDifficulty(prior_weight=1.0)
        )
        for o in p.objects:
            if o.otype == "apple":
                counts[o.location.rsplit(" ", 1)[0]] += 1
    assert counts and set(counts) <= set(LOCATION_PRIORS["apple"])


# ---- skills ---------------------------------------------------------------------------------------
SPECIFIC = {
    "pick_and_place_simple": "receptacle of the goal type, open it if closed",
    "look_at_obj_in_light": "use desklamp N",
    "pick_clean_then_place_in_recep": "clean O with sinkbasin N",
    "pick_heat_then_place_in_recep": "heat O with microwave N",
    "pick_cool_then_place_in_recep": "cool O with fridge N",
    "pick_two_obj_and_place": "Both must end in one receptacle",
}


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_skills_state_type_specific_plan_and_priors(task_type):
    text = household_skill_library().render(task_type)
    assert text.startswith("General skills:") and "Common mistakes to avoid:" in text
    assert SPECIFIC[task_type] in text
    assert not any(SPECIFIC[t] in text for t in TASK_TYPES if t != task_type)
    present = task_receptacle_types(task_type)
    for otype in task_targets(task_type):
        line = prior_line(otype, present=present)
        assert f"- {line}" in text
        top = max(priors_for(otype, present).items(), key=lambda kv: (kv[1], -ord(kv[0][0])))[0]
        assert line.startswith(f"{otype}: {top} ")
    env = HouseholdEnv(backend="sim")
    step = env.reset(task_id=make_task_id(task_type, 1))
    assert env.skills_key() == task_type
    assert env.privileged_skills() == text
    assert f"{step.metadata['task'].split()[0]}" in env.task_text


def test_skill_priors_come_from_the_generator_tables(monkeypatch):
    from sdar_envs.household import priors

    household_skill_library.cache_clear()
    monkeypatch.setitem(priors.LOCATION_PRIORS, "apple", {"garbagecan": 0.9, "fridge": 0.1})
    try:
        text = household_skill_library().render("pick_heat_then_place_in_recep")
        assert "- apple: garbagecan 90%, fridge 10%" in text
    finally:
        household_skill_library.cache_clear()


# ---- speed ----------------------------------------------------------------------------------------
def test_simulator_runs_thousands_of_steps_per_second():
    backend = SimHousehold()
    rng = random.Random(3)
    step = backend.reset(task_id="sim/pick/000001")
    t0 = time.perf_counter()
    for _ in range(5000):
        step = backend.step(rng.choice(step.metadata["admissible_actions"]))
        if step.done:
            step = backend.reset(task_id="sim/pick/000001")
    rate = 5000 / (time.perf_counter() - t0)
    assert rate > 2000, f"{rate:.0f} steps/s"


# ---- the three experts behind the warm start ------------------------------------------------
def _tiny_env_kwargs() -> dict:
    """The environment of the laptop experiment, configs/household-tiny.yaml."""
    from pathlib import Path

    from sdar.config import load_config

    return load_config(Path(__file__).parents[2] / "configs" / "household-tiny.yaml").env.kwargs


_TINY = _tiny_env_kwargs()
_TINY_DIFFICULTY = _TINY["difficulty"]


def _expert_success(env, method: str, tasks: list[str]) -> float:
    wins = 0
    for tid in tasks:
        env.reset(task_id=tid)
        out = None
        for _ in range(60):
            out = env.step(getattr(env, method)())
            if out.done:
                break
        wins += bool(out.metadata["won"])
    return wins / len(tasks)


def test_uninformed_expert_searches_in_listing_order():
    """It knows neither priors nor which types hold what: its first move is always the first
    receptacle of the memory's listing order (type, then number)."""
    from sdar.agent.memory import HouseholdMemory

    env = make_env("household", backend="sim", difficulty=_TINY_DIFFICULTY)
    for tid in env.task_ids("test")[:60]:
        out = env.reset(task_id=tid)
        m = HouseholdMemory()
        m.update(out.observation)
        assert env.uninformed_expert_action() == f"go to {m.room[0]}"
        assert m.render().endswith(f"Search next: go to {m.room[0]}.")


def test_skilled_expert_follows_the_skills_text_then_listing_order():
    from sdar_envs.household.skills import listed_search_order

    env = make_env("household", backend="sim", difficulty=_TINY_DIFFICULTY,
                   skills={"top_k": 1, "compact": True, "target_only": True})  # top 1: one listed type
    moved_to_listed = 0
    for tid in env.task_ids("test")[:60]:
        env.reset(task_id=tid)
        game = env.backend.game
        goal = env.backend.problem.goal.object_type
        listed = listed_search_order(env.task_type, goal, 1)
        assert listed and listed[0] in env.privileged_skills()  # the rule reads the text it is given
        first = env.skilled_expert_action()
        holders = sorted((game.rtype[r], int(game.rname[r].rsplit(" ", 1)[1]), game.rname[r])
                         for r in range(len(game.rname)) if game.rtype[r] == listed[0])
        if holders and env.task_type != "look_at_obj_in_light":
            assert first == f"go to {holders[0][2]}"
            moved_to_listed += 1
    assert moved_to_listed >= 20


def test_skills_are_worth_it_at_the_tiny_difficulty():
    """In expert space the skills-following expert beats the uninformed one clearly (the gap the
    privileged teacher can show), and the full-prior expert always wins."""
    env = make_env("household", **_TINY)
    tasks = env.task_ids("test")[:120]
    informed = _expert_success(env, "expert_action", tasks)
    skilled = _expert_success(env, "skilled_expert_action", tasks)
    uninformed = _expert_success(env, "uninformed_expert_action", tasks)
    assert informed == 1.0
    assert skilled >= uninformed + 0.1, (skilled, uninformed)
    assert 0.3 <= uninformed <= 0.7, uninformed
