"""The seeded generator of household sim problems: a room for one of ALFWorld's six task types, drawn from the
task id's seed at a difficulty, kept only when the gold policy solves it (sim_expert.gold_length gives its
gold_steps). The problem's structure and task ids: sim_problem."""

from __future__ import annotations

import random
from typing import Any

from sdar_envs.household.catalog import (
    APPLIANCE,
    CAN_CONTAIN,
    LAMP_HOLDERS,
    LIGHT_TARGETS,
    NOT_PICKUPABLE,
    OPENABLE,
    ROOMS,
    TASK_ROOMS,
    TASK_STATE,
    TASK_TEMPLATES,
    state_ok,
)
from sdar_envs.household.priors import LOCATION_PRIORS, priors_for
from sdar_envs.household.sim_expert import gold_length
from sdar_envs.household.sim_game import SimGame
from sdar_envs.household.sim_problem import (
    SimDifficulty,
    SimGoal,
    SimObject,
    SimProblem,
    SimReceptacle,
    parse_task_id,
)

# generation retries when the gold path does not fit the horizon
_MAX_ATTEMPTS = 30


def _weighted(rng: random.Random, weights: dict[str, float]) -> str:
    keys = sorted(weights)
    return rng.choices(keys, weights=[weights[k] for k in keys], k=1)[0]


def _generate_once(
    task_type: str, seed: int, task_id: str, d: SimDifficulty, rng: random.Random
) -> SimProblem:
    room = rng.choice(TASK_ROOMS[task_type])
    spec = ROOMS[room]
    is_light = task_type == "look_at_obj_in_light"
    target, dest = _pick_target(task_type, spec, rng)
    receptacles, type_count = _draw_receptacles(spec, target, dest, is_light, d, rng)
    placed = _place_objects(task_type, room, spec, target, dest, receptacles, type_count, d, rng)
    objects = _numbered(placed, rng)
    templates = TASK_TEMPLATES[task_type]
    template = rng.choice(templates) if d.task_text_variants else templates[0]
    text = template.format(obj=target, recep=dest, toggle="desklamp")
    goal = SimGoal(
        task_type=task_type,
        object_type=target,
        receptacle_type=dest,
        toggle_type="desklamp" if is_light else None,
        state=TASK_STATE[task_type],
        count=2 if task_type == "pick_two_obj_and_place" else 1,
    )
    return SimProblem(
        task_id, task_type, room, seed, text, receptacles, objects, goal, max_steps=d.max_steps
    )


def _pick_target(task_type: str, spec, rng: random.Random) -> tuple[str, str | None]:
    """The target type, and (for placement tasks) a destination type that holds it, plus a different
    receptacle type it can start in (targets never start at the destination, as in ALFWorld)."""
    room_types = set(spec.always) | set(spec.fill)
    state = TASK_STATE[task_type]
    is_light = task_type == "look_at_obj_in_light"
    options: list[tuple[str, str | None]] = []
    for otype in spec.objects:
        if (
            otype in NOT_PICKUPABLE
            or not state_ok(state, otype)
            or (is_light and otype not in LIGHT_TARGETS)
        ):
            continue
        if is_light:
            if priors_for(otype, room_types):
                options.append((otype, None))
            continue
        for dest in sorted(room_types):
            if otype not in CAN_CONTAIN[dest] or (state is not None and dest == APPLIANCE[state]):
                continue
            if priors_for(otype, room_types - {dest}):
                options.append((otype, dest))
    return rng.choice(options)


def _draw_receptacles(
    spec, target: str, dest: str | None, is_light: bool, d: SimDifficulty, rng: random.Random
) -> tuple[list[SimReceptacle], dict[str, int]]:
    """The receptacles: the room's fixed set, the destination, a likely start for the target, a lamp
    holder, then more of the room's types up to the drawn count; and how many there are of each type."""
    room_types = set(spec.always) | set(spec.fill)
    required = list(spec.always)
    if dest is not None:
        required.append(dest)
    start_prior = priors_for(target, room_types - ({dest} if dest else set()))
    required.append(_weighted(rng, start_prior))
    if is_light:
        holders = priors_for("desklamp", room_types & set(LAMP_HOLDERS))
        required.append(_weighted(rng, holders))
    counts: dict[str, int] = {}
    for rtype in required:
        counts[rtype] = max(counts.get(rtype, 0), 1)
    n_rec = max(rng.randint(*d.num_receptacles), sum(counts.values()))
    while sum(counts.values()) < n_rec:
        room_left = {t: w for t, (w, cap) in spec.fill.items() if counts.get(t, 0) < cap}
        if not room_left:
            break
        rtype = _weighted(rng, room_left)
        counts[rtype] = counts.get(rtype, 0) + 1
    receptacles: list[SimReceptacle] = []
    for rtype in sorted(counts):
        for k in range(1, counts[rtype] + 1):
            openable = rtype in OPENABLE
            opened = openable and rng.random() >= d.closed_fraction
            receptacles.append(SimReceptacle(f"{rtype} {k}", rtype, openable, opened))
    return receptacles, dict(counts)


def _place_objects(
    task_type: str,
    room: str,
    spec,
    target: str,
    dest: str | None,
    receptacles: list[SimReceptacle],
    type_count: dict[str, int],
    d: SimDifficulty,
    rng: random.Random,
) -> list[tuple[str, str]]:
    """(object type, receptacle) of every object: the target's copies (never at the destination), the lamp,
    the distractors."""
    is_light = task_type == "look_at_obj_in_light"

    def place(otype: str, exclude: str | None = None) -> str:
        cands = [r for r in receptacles if otype in CAN_CONTAIN[r.rtype] and r.rtype != exclude]
        if not cands:
            raise RuntimeError(
                f"no receptacle can hold {otype}"
            )  # prevented by the required types above
        prior = LOCATION_PRIORS[otype]
        weights = [prior.get(r.rtype, 0.0) / type_count[r.rtype] for r in cands]
        if rng.random() < d.prior_weight and sum(weights) > 0:
            return rng.choices(cands, weights=weights, k=1)[0].name
        return rng.choice(cands).name

    placed: list[tuple[str, str]] = []
    copies = rng.randint(*d.target_copies)
    if task_type == "pick_two_obj_and_place":
        copies = max(2, copies + 1)
    placed += [(target, place(target, exclude=dest)) for _ in range(copies)]
    has_holder = any(r.rtype in LAMP_HOLDERS for r in receptacles)
    if is_light or (room in ("bedroom", "livingroom") and has_holder and rng.random() < 0.5):
        holders = [r for r in receptacles if r.rtype in LAMP_HOLDERS]
        hp = LOCATION_PRIORS["desklamp"]
        lamp_at = rng.choices(
            holders, weights=[hp.get(r.rtype, 0.01) / type_count[r.rtype] for r in holders], k=1
        )[0]
        placed.append(("desklamp", lamp_at.name))
    pool = [o for o in spec.objects if o != target and o not in NOT_PICKUPABLE]
    pool = [o for o in pool if any(o in CAN_CONTAIN[r.rtype] for r in receptacles)]
    for _ in range(rng.randint(*d.num_distractors)):
        otype = rng.choice(pool)
        placed.append((otype, place(otype)))
    return placed


def _numbered(placed: list[tuple[str, str]], rng: random.Random) -> list[SimObject]:
    """The objects, numbered per type in random order: ALFWorld's numbering says nothing about where things are."""
    by_type: dict[str, list[int]] = {}
    for i, (otype, _) in enumerate(placed):
        by_type.setdefault(otype, []).append(i)
    names = [""] * len(placed)
    for otype, idxs in by_type.items():
        nums = list(range(1, len(idxs) + 1))
        rng.shuffle(nums)
        for i, num in zip(idxs, nums):
            names[i] = f"{otype} {num}"
    return [SimObject(names[i], otype, rec) for i, (otype, rec) in enumerate(placed)]


def generate_problem(
    task_id: str, difficulty: SimDifficulty | str | dict[str, Any] | None = None
) -> SimProblem:
    """The problem behind `task_id` at `difficulty`, deterministic in both.

    Rooms whose gold path does not fit the horizon are redrawn (up to 30 times; the shortest
    is kept), so every task is solvable within `max_steps` in practice.
    """
    d = SimDifficulty.coerce(difficulty)
    task_type, seed = parse_task_id(task_id)
    best: SimProblem | None = None
    for attempt in range(_MAX_ATTEMPTS):
        # `random` hashes string seeds with sha512: stable across processes and PYTHONHASHSEED
        rng = random.Random(f"sdar-household-sim|{task_type}|{seed}|{attempt}")
        problem = _generate_once(task_type, seed, task_id, d, rng)
        problem.gold_steps = gold_length(SimGame(problem))
        if problem.gold_steps is not None and problem.gold_steps <= d.max_steps:
            return problem
        if best is None or (problem.gold_steps or 10**9) < (best.gold_steps or 10**9):
            best = problem
    assert best is not None
    return best
