"""The household family's privileged skills and hint texts (the teacher's extra context).

Per-task-type skills quote the simulator's location priors, generated from `catalog` so they
cannot drift.
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

from sdar_envs.household.backend import TASK_TYPES
from sdar_envs.household.catalog import (
    APPLIANCE,
    LAMP_HOLDERS,
    LIGHT_TARGETS,
    NOT_PICKUPABLE,
    ROOMS,
    TASK_ROOMS,
    TASK_STATE,
    state_ok,
)
from sdar_envs.household.priors import priors_for
from sdar_envs.skills import SkillLibrary

# how many receptacle types each prior line names (most likely first)
PRIOR_TOP_K = 4

GENERAL = [
    "Only admissible actions work; anything else answers 'Nothing happens.' and wastes a step.",
    "Use exact names with numbers, e.g. 'apple 1', 'cabinet 3'.",
    "Go to a receptacle before acting on it: 'go to countertop 1' also shows what is on it.",
    (
        "Cabinets, drawers, fridges, microwaves and safes start closed: 'open R' shows what is "
        "inside; you must open them before taking from or moving into them."
    ),
    "You hold one object at a time; take with 'take O from R', put down with 'move O to R'.",
    (
        "Remember what you have seen and never search a receptacle twice; search the likeliest "
        "receptacles first."
    ),
    "The object you need never starts in a receptacle of the goal's type.",
]

MISTAKES_ALL = [
    "Writing 'put O in R': this engine only understands 'move O to R'.",
    "Repeating an action that answered 'Nothing happens.'.",
    "Trying to take an object while already holding one.",
    "Taking from or moving into a closed receptacle without opening it.",
    "Acting on a receptacle you have not gone to.",
]

_BY_TYPE = {
    "pick_and_place_simple": [
        (
            "Plan: find the object, take it, go to a receptacle of the goal type, open it if "
            "closed, move the object to it."
        ),
    ],
    "look_at_obj_in_light": [
        (
            "Plan: find the object and take it, find a desklamp, go to the desklamp while holding "
            "the object, then 'use desklamp N'. Solved when you hold the object next to a lamp that"
            " is on."
        ),
        "The desklamp cannot be taken; it stays where it is. A lamp you turned on stays on.",
    ],
    "pick_clean_then_place_in_recep": [
        (
            "Plan: find and take the object, go to a sinkbasin, 'clean O with sinkbasin N' while "
            "holding it, then go to the goal receptacle and move it there."
        ),
    ],
    "pick_heat_then_place_in_recep": [
        (
            "Plan: find and take the object, go to the microwave, 'heat O with microwave N' while "
            "holding it (no need to open the microwave), then go to the goal receptacle and move it"
            " there."
        ),
    ],
    "pick_cool_then_place_in_recep": [
        (
            "Plan: find and take the object, go to the fridge, 'cool O with fridge N' while holding"
            " it (no need to open the fridge), then go to the goal receptacle and move it there."
        ),
    ],
    "pick_two_obj_and_place": [
        (
            "Plan: find one object, take it, move it to the goal receptacle; then find a second one"
            " (a different number) and move it to the same receptacle. Both must end in one "
            "receptacle."
        ),
        "Remember where you saw other instances while searching for the first one.",
    ],
}

_MISTAKES = {
    "pick_and_place_simple": ["Moving the object to a receptacle of the wrong type."],
    "look_at_obj_in_light": [
        "Trying to take the desklamp.",
        "Using the lamp while it is somewhere else than you: go to the lamp first.",
    ],
    "pick_clean_then_place_in_recep": [
        (
            "Moving the object into the sinkbasin: that does not clean it; use 'clean O with "
            "sinkbasin N'."
        )
    ],
    "pick_heat_then_place_in_recep": [
        (
            "Moving the object into the microwave: that does not heat it; use 'heat O with "
            "microwave N'."
        )
    ],
    "pick_cool_then_place_in_recep": [
        "Moving the object into the fridge: that does not cool it; use 'cool O with fridge N'."
    ],
    "pick_two_obj_and_place": [
        "Putting the two objects in two different receptacles of the goal type.",
        "Taking back the object you already placed.",
    ],
}

# hint texts per `hint_template_key`; {receptacle}, {object}, {held}, {appliance}, {action} come
# from the marked step's `error_args`
HINT_TEMPLATES = {
    "household/invalid_action": "'{action}' is not a command. Use an admissible action such as "
    "'go to <receptacle>', 'take <object> from <receptacle>' or 'move <object> to <receptacle>'.",
    "household/use_move": "Put things down with 'move {object} to {receptacle}', not 'put'.",
    "household/unknown_receptacle": "There is no {receptacle} here; use the receptacle names "
    "from the room description.",
    "household/already_here": "You are already at {receptacle}; act on it or go somewhere else.",
    "household/go_to_first": "You are not at {receptacle}; 'go to {receptacle}' first.",
    "household/open_first": "The {receptacle} is closed; 'open {receptacle}' first.",
    "household/hands_full": "You are already holding {held}; put it down with "
    "'move {held} to <receptacle>' first.",
    "household/object_not_here": "There is no {object} in {receptacle}; take only what is "
    "listed there.",
    "household/take_first": "You are not holding {object}; take it first.",
    "household/cannot_contain": "{receptacle} cannot hold {object}; choose another receptacle.",
    "household/wrong_appliance": "That needs a {appliance}: heat with a microwave, cool with a "
    "fridge, clean with a sinkbasin.",
    "household/cannot_process": "{object} cannot be processed that way.",
    "household/not_toggleable": "Only a desklamp can be used: go to it and 'use desklamp N'.",
    "household/not_admissible": "That is not possible now; choose one of the admissible actions.",
    "household/episode_over": "The episode is over.",
    # no-progress sites of accepted actions (progress.py); {target}, {goal_receptacle}, {toggle},
    # {state}, {needed}, {appliance} and {task} come from the task text, the rest from the action
    "household/non_task_object": "The task is to {task}: {object} is not the {target} it asks for, so "
    "taking it makes no progress. Put it down and look for the {target}.",
    "household/revisit_nothing_new": "You have already seen everything in {receptacle}: there is no "
    "{wanted} there, and the task does not need you there now. Go to a receptacle you have not "
    "looked into yet.",
    "household/wrong_receptacle": "The task is to {task}: moving {object} to {receptacle} makes no "
    "progress. Take it again and move it to any {goal_receptacle}.",
    "household/keep_holding": "The task is to {task}: you must hold the {target} by a lit {toggle}, "
    "so moving {object} to {receptacle} makes no progress. Take it again, go to the {toggle} and use it.",
    "household/process_first": "The task asks for a {state} {target}: {needed} {object} with a "
    "{appliance} first, then move it to any {goal_receptacle}.",
    "household/wrong_process": "The task is to {task}: it asks you to {needed} the {target} with a "
    "{appliance}, not to {verb} it.",
    "household/no_process_needed": "The task is to {task}: it does not ask you to {verb} {object}, so "
    "'{action}' makes no progress.",
    "household/already_processed": "The {object} is already {state}; doing it again makes no progress. "
    "Move it to any {goal_receptacle} now.",
    "household/lamp_not_needed": "The task is to {task}: it needs no lamp, so '{action}' makes no "
    "progress.",
}


class _Blank(dict):
    def __missing__(self, key: str) -> str:
        return f"<{key}>"


def render_hint(key: str, args: dict[str, str] | None = None) -> str:
    """The hint text for a marked step's `hint_template_key`, filled with its `error_args`."""
    if key not in HINT_TEMPLATES:
        raise KeyError(
            f"no household hint template {key!r}; known keys: {', '.join(sorted(HINT_TEMPLATES))}"
        )
    return HINT_TEMPLATES[key].format_map(_Blank({k: v for k, v in (args or {}).items() if v}))


def task_targets(task_type: str) -> list[str]:
    """The object types the simulator asks for in tasks of `task_type`."""
    state = TASK_STATE[task_type]
    out: set[str] = set()
    for room in TASK_ROOMS[task_type]:
        for otype in ROOMS[room].objects:
            if otype in NOT_PICKUPABLE or not state_ok(state, otype):
                continue
            if task_type == "look_at_obj_in_light" and otype not in LIGHT_TARGETS:
                continue
            out.add(otype)
    return sorted(out)


def task_receptacle_types(task_type: str) -> set[str]:
    """The receptacle types of the rooms tasks of `task_type` are generated in."""
    return {t for room in TASK_ROOMS[task_type] for t in (*ROOMS[room].always, *ROOMS[room].fill)}


def prior_line(otype: str, top_k: int = PRIOR_TOP_K, present: set[str] | None = None) -> str:
    """'apple: fridge 24%, countertop 23%, ...': where objects of a type usually start.

    present: renormalise over these receptacle types (a task type's rooms); all when None.
    """
    ranked = _ranked(otype, top_k, present)
    return f"{otype}: " + ", ".join(f"{r} {round(100 * w)}%" for r, w in ranked)


def _ranked(otype: str, top_k: int, present: set[str] | None) -> list[tuple[str, float]]:
    return sorted(priors_for(otype, present).items(), key=lambda kv: (-kv[1], kv[0]))[:top_k]


def listed_search_order(task_type: str, otype: str, top_k: int = PRIOR_TOP_K) -> list[str]:
    """The receptacle types the skills text lists for `otype` in a `task_type` task, likeliest
    first: what a reader of the skills knows about where to search (the desklamp too)."""
    present = task_receptacle_types(task_type)
    if otype == "desklamp":
        present = present & set(LAMP_HOLDERS)
    return [r for r, _ in _ranked(otype, top_k, present)]


def _type_skills(task_type: str, top_k: int) -> list[str]:
    skills = list(_BY_TYPE[task_type])
    state = TASK_STATE[task_type]
    if state is not None:
        skills.append(f"There is always a {APPLIANCE[state]} in the room for this task.")
    present = task_receptacle_types(task_type)
    if task_type == "look_at_obj_in_light":
        lamp = prior_line("desklamp", top_k, present & set(LAMP_HOLDERS)).split(": ", 1)[1]
        skills.append(f"Where the desklamp usually stands: {lamp}.")
    rooms = ", ".join(TASK_ROOMS[task_type])
    skills.append(
        f"These tasks happen in: {rooms}. Where things usually start (search in this order):"
    )
    skills += [prior_line(o, top_k, present) for o in task_targets(task_type)]
    return skills


@lru_cache(maxsize=8)
def household_skill_library(top_k: int = PRIOR_TOP_K, compact: bool = False) -> SkillLibrary:
    """The household SkillLibrary: general skills, per-type skills with priors, mistakes.

    compact: a short library for small models' prompt budgets: one general skill (search the
    likeliest receptacles first), the per-type skills and priors, and the per-type mistakes.
    """
    by_key = {t: _type_skills(t, top_k) for t in TASK_TYPES}
    mistakes: dict[str, list[str]] = defaultdict(list)
    if not compact:
        mistakes["*"] = list(MISTAKES_ALL)
    for t in TASK_TYPES:
        mistakes[t] = list(_MISTAKES[t])
    general = [g for g in GENERAL if "likeliest" in g] if compact else list(GENERAL)
    return SkillLibrary(family="household", general=general, by_key=by_key, mistakes=dict(mistakes))
