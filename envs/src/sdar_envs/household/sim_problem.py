"""The household simulator's problems: difficulty settings, the `SimProblem` structure, task ids and
the seeded generator of rooms for ALFWorld's six task types (a generated room also exports to the
real engine: pddl.scene_from_sim).

Problem structure (`SimProblem`, JSON via `to_dict`/`from_dict`):
    task_id "sim/<kind>/<6-digit seed>", task_type (ALFWorld name), room ("kitchen", "bathroom",
    "bedroom", "livingroom"), seed, task_text (e.g. "heat some apple and put it in diningtable"),
    max_steps, gold_steps;
    receptacles: [SimReceptacle(name "cabinet 3", rtype "cabinet", openable, opened)], where
        `catalog.RECEPTACLE_TYPES[rtype]` is the ALFWorld type name ("Cabinet");
    objects: [SimObject(name "apple 1", otype "apple", location "fridge 1")], every object
        starts in a receptacle; `catalog.OBJECT_TYPES[otype]` is the ALFWorld name;
        `catalog.CAN_CONTAIN`, HEATABLE, COOLABLE, CLEANABLE, SLICEABLE, TOGGLEABLE and
        NOT_PICKUPABLE give the PDDL facts;
    goal: SimGoal(object_type, receptacle_type (None for the light task), toggle_type
        ("desklamp" for the light task), state ("clean" | "heat" | "cool" | None), count (2 for
        pick_two, else 1)).
The agent starts in the middle of the room (at no receptacle). Numbers are per type, from 1.
Listings are sorted by type, then number descending (as ALFWorld prints them).
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from sdar_envs.household.backend import TASK_TYPES
from sdar_envs.household.catalog import (
    APPLIANCE,
    CAN_CONTAIN,
    LAMP_HOLDERS,
    LIGHT_TARGETS,
    LOCATION_PRIORS,
    NOT_PICKUPABLE,
    OPENABLE,
    ROOMS,
    TASK_ROOMS,
    TASK_STATE,
    TASK_TEMPLATES,
    priors_for,
    state_ok,
)
from sdar_envs.household.sim_game import SimGame

# short kind used in task ids ("sim/heat/000123") <-> ALFWorld task type
TASK_KINDS: dict[str, str] = {
    "pick": "pick_and_place_simple",
    "look": "look_at_obj_in_light",
    "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep",
    "cool": "pick_cool_then_place_in_recep",
    "two": "pick_two_obj_and_place",
}
KIND_OF = {v: k for k, v in TASK_KINDS.items()}
# seeds [0, TEST_SEED_BASE) are training tasks, [TEST_SEED_BASE, SEED_LIMIT) test tasks:
# disjoint by construction
TEST_SEED_BASE = 900_000
SEED_LIMIT = 1_000_000
_TASK_ID = re.compile(r"^sim/(?P<kind>[a-z]+)/(?P<seed>\d{6})$")
# generation retries when the gold path does not fit the horizon
_MAX_ATTEMPTS = 30


# ---- configuration ----------------------------------------------------------------------------
@dataclass
class SimDifficulty:
    """How large and how hard generated rooms are (ranges are inclusive, drawn per task).

    num_receptacles: receptacles in the room (raised to the task's required minimum).
    num_distractors: objects that are not the task's target type.
    target_copies: instances of the target type (pick_two gets one more, and at least 2).
    closed_fraction: share of openable receptacles (cabinet, drawer, fridge, microwave, safe)
        that start closed; ALFWorld starts all of them closed (1.0).
    prior_weight: probability an object is placed by its location prior rather than uniformly
        over the receptacles that can hold it; higher makes the privileged skills more useful.
    max_steps: the horizon; the episode ends unsolved after this many actions (paper: 50).
    task_text_variants: draw either of ALFWorld's two goal phrasings (False: always the first).
    """

    num_receptacles: tuple[int, int] = (6, 12)
    num_distractors: tuple[int, int] = (3, 8)
    target_copies: tuple[int, int] = (1, 2)
    closed_fraction: float = 1.0
    prior_weight: float = 0.85
    max_steps: int = 50
    task_text_variants: bool = True

    def __post_init__(self) -> None:
        for name in ("num_receptacles", "num_distractors", "target_copies"):
            value = tuple(getattr(self, name))
            if len(value) != 2 or value[0] > value[1] or value[0] < 0:
                raise ValueError(
                    f"SimDifficulty.{name}={value!r} must be a (low, high) pair "
                    "with 0 <= low <= high"
                )
            setattr(self, name, (int(value[0]), int(value[1])))
        if self.num_receptacles[0] < 1:
            raise ValueError(
                "SimDifficulty.num_receptacles must allow at least 1 receptacle; "
                "raise the low bound"
            )
        if self.target_copies[0] < 1:
            raise ValueError(
                "SimDifficulty.target_copies must be at least 1; a task needs its target object"
            )
        for name in ("closed_fraction", "prior_weight"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"SimDifficulty.{name}={getattr(self, name)!r} must lie in [0, 1]")
        if self.max_steps < 1:
            raise ValueError(f"SimDifficulty.max_steps={self.max_steps!r} must be >= 1")

    @classmethod
    def preset(cls, name: str) -> SimDifficulty:
        """A named difficulty: easy, default, hard, alfworld (ALFWorld-sized rooms)."""
        if name not in DIFFICULTY_PRESETS:
            raise ValueError(
                f"unknown sim difficulty {name!r}; choose one of {', '.join(DIFFICULTY_PRESETS)}"
            )
        return replace(DIFFICULTY_PRESETS[name])

    @classmethod
    def coerce(cls, value: SimDifficulty | str | dict[str, Any] | None) -> SimDifficulty:
        """Accept a SimDifficulty, a preset name, a dict of fields (YAML), or None (default)."""
        if value is None:
            return cls()
        if isinstance(value, SimDifficulty):
            return value
        if isinstance(value, str):
            return cls.preset(value)
        if isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(
                    f"unknown SimDifficulty fields {unknown}; "
                    f"known fields: {', '.join(sorted(known))}"
                )
            return cls(**value)
        raise TypeError(
            "difficulty must be a SimDifficulty, a preset name or a dict, "
            f"not {type(value).__name__}"
        )


DIFFICULTY_PRESETS: dict[str, SimDifficulty] = {
    "easy": SimDifficulty(
        num_receptacles=(4, 6),
        num_distractors=(1, 3),
        target_copies=(1, 2),
        closed_fraction=0.5,
        prior_weight=0.95,
        max_steps=30,
    ),
    "default": SimDifficulty(),
    "hard": SimDifficulty(
        num_receptacles=(12, 20),
        num_distractors=(8, 16),
        target_copies=(1, 2),
        prior_weight=0.7,
        max_steps=50,
    ),
    "alfworld": SimDifficulty(
        num_receptacles=(18, 30),
        num_distractors=(20, 35),
        target_copies=(1, 3),
        prior_weight=0.75,
        max_steps=50,
    ),
}


# ---- the problem ------------------------------------------------------------------------------
@dataclass
class SimReceptacle:
    """A receptacle: name "cabinet 3", type "cabinet", whether it opens, whether it starts open."""

    name: str
    rtype: str
    openable: bool
    opened: bool = False


@dataclass
class SimObject:
    """An object: name "apple 1", type "apple", and the receptacle it starts in."""

    name: str
    otype: str
    location: str


@dataclass
class SimGoal:
    """What solves the task.

    object_type: the target object type ("apple").
    receptacle_type: where it must go ("fridge"); None for look_at_obj_in_light.
    toggle_type: the lamp to turn on ("desklamp") for look_at_obj_in_light, else None.
    state: "clean" | "heat" | "cool" the object must have been given, else None.
    count: objects of the type needed in one receptacle (2 for pick_two_obj_and_place).
    """

    task_type: str
    object_type: str
    receptacle_type: str | None = None
    toggle_type: str | None = None
    state: str | None = None
    count: int = 1


@dataclass
class SimProblem:
    """A generated household task; see the module docstring for the structure."""

    task_id: str
    task_type: str
    room: str
    seed: int
    task_text: str
    receptacles: list[SimReceptacle]
    objects: list[SimObject]
    goal: SimGoal
    max_steps: int = 50
    gold_steps: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SimProblem:
        data = dict(data)
        data["receptacles"] = [SimReceptacle(**r) for r in data["receptacles"]]
        data["objects"] = [SimObject(**o) for o in data["objects"]]
        data["goal"] = SimGoal(**data["goal"])
        return cls(**data)


# ---- task ids ---------------------------------------------------------------------------------
def make_task_id(task_type: str, seed: int) -> str:
    """The id of the sim task of `task_type` drawn with `seed` (0 <= seed < 1_000_000)."""
    if task_type not in KIND_OF:
        raise ValueError(f"unknown task type {task_type!r}; choose one of {', '.join(TASK_TYPES)}")
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"sim task seed {seed} out of range; use 0 <= seed < {SEED_LIMIT}")
    return f"sim/{KIND_OF[task_type]}/{seed:06d}"


def parse_task_id(task_id: str) -> tuple[str, int]:
    """(task_type, seed) of a sim task id such as 'sim/heat/000123'."""
    m = _TASK_ID.match(task_id or "")
    if not m or m["kind"] not in TASK_KINDS:
        raise ValueError(
            f"{task_id!r} is not a sim task id; expected 'sim/<kind>/<6-digit seed>' "
            "with kind one of "
            f"{', '.join(TASK_KINDS)}, e.g. 'sim/heat/000123'"
        )
    return TASK_KINDS[m["kind"]], int(m["seed"])


def split_of(task_id: str) -> str:
    """'train' or 'test': test tasks use seeds >= TEST_SEED_BASE."""
    return "test" if parse_task_id(task_id)[1] >= TEST_SEED_BASE else "train"


# ---- generation -------------------------------------------------------------------------------
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
        problem.gold_steps = SimGame(problem).gold_length()
        if problem.gold_steps is not None and problem.gold_steps <= d.max_steps:
            return problem
        if best is None or (problem.gold_steps or 10**9) < (best.gold_steps or 10**9):
            best = problem
    assert best is not None
    return best
