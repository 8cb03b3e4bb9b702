"""The fast household simulator: seeded rooms for ALFWorld's six task types in ALFWorld's wording.

Thousands of steps per second in pure Python, a gold-path expert that searches by location priors,
and the `SimProblem` structure below so a generated room can be exported to the real engine.

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

from sdar_envs.base import EnvStep
from sdar_envs.household import wording as W
from sdar_envs.household.backend import TASK_TYPES, HouseholdBackend
from sdar_envs.household.catalog import (
    APPLIANCE,
    CAN_CONTAIN,
    CLEANABLE,
    COOLABLE,
    HEATABLE,
    LAMP_HOLDERS,
    LIGHT_TARGETS,
    LOCATION_PRIORS,
    NOT_PICKUPABLE,
    OPENABLE,
    RECEPTACLE_OBJECTS,
    ROOMS,
    SHARP,
    SLICEABLE,
    TASK_ROOMS,
    TASK_STATE,
    TASK_TEMPLATES,
    TOGGLEABLE,
    priors_for,
    state_ok,
)
from sdar_envs.household.progress import ProgressTracker

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
_VERB_FEEDBACK = {"heat": W.HEATED, "clean": W.CLEANED, "cool": W.COOLED}


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
    room_types = set(spec.always) | set(spec.fill)
    state = TASK_STATE[task_type]
    is_light = task_type == "look_at_obj_in_light"

    # target type, and (for placement tasks) a destination type that holds it, plus a different
    # receptacle type it can start in (targets never start at the destination, as in ALFWorld)
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
    target, dest = rng.choice(options)

    # receptacles: the room's fixed set, the destination, a likely start for the target,
    # and a lamp holder
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
    type_count = {t: c for t, c in counts.items()}

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

    placed: list[tuple[str, str]] = []  # (otype, receptacle)
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

    # numbers per type in random order: ALFWorld's numbering says nothing about where things are
    by_type: dict[str, list[int]] = {}
    for i, (otype, _) in enumerate(placed):
        by_type.setdefault(otype, []).append(i)
    names = [""] * len(placed)
    for otype, idxs in by_type.items():
        nums = list(range(1, len(idxs) + 1))
        rng.shuffle(nums)
        for i, num in zip(idxs, nums):
            names[i] = f"{otype} {num}"
    objects = [SimObject(names[i], otype, rec) for i, (otype, rec) in enumerate(placed)]

    templates = TASK_TEMPLATES[task_type]
    template = rng.choice(templates) if d.task_text_variants else templates[0]
    text = template.format(obj=target, recep=dest, toggle="desklamp")
    goal = SimGoal(
        task_type=task_type,
        object_type=target,
        receptacle_type=dest,
        toggle_type="desklamp" if is_light else None,
        state=state,
        count=2 if task_type == "pick_two_obj_and_place" else 1,
    )
    return SimProblem(
        task_id, task_type, room, seed, text, receptacles, objects, goal, max_steps=d.max_steps
    )


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


# ---- the game ---------------------------------------------------------------------------------
class SimGame:
    """One episode of a `SimProblem`: state, ALFWorld-worded transitions, admissible actions,
    and the gold policy."""

    def __init__(self, problem: SimProblem) -> None:
        self.problem = problem
        self.goal = problem.goal
        recs, objs = problem.receptacles, problem.objects
        self.rname = [r.name for r in recs]
        self.rtype = [r.rtype for r in recs]
        self.ropenable = [r.openable for r in recs]
        self.rindex = {n: i for i, n in enumerate(self.rname)}
        self.oname = [o.name for o in objs]
        self.otype = [o.otype for o in objs]
        self.oindex = {n: i for i, n in enumerate(self.oname)}
        if len(self.rindex) != len(recs) or len(self.oindex) != len(objs):
            raise ValueError(f"problem {problem.task_id} has duplicate receptacle or object names")
        # ALFWorld lists things by type, numbers descending; the expert tries numbers ascending
        self._list_key = [(t, -int(n.rsplit(" ", 1)[1])) for t, n in zip(self.otype, self.oname)]
        self.rorder = sorted(
            range(len(recs)), key=lambda i: (self.rtype[i], int(self.rname[i].rsplit(" ", 1)[1]))
        )
        intro_order = sorted(
            range(len(recs)), key=lambda i: (self.rtype[i], -int(self.rname[i].rsplit(" ", 1)[1]))
        )
        self._goto = [f"go to {n}" for n in self.rname]
        look = W.LOOK_ROOM.format(items=W.join_items([self.rname[i] for i in intro_order]))
        self.intro = W.INTRO.format(look=look, task=W.TASK_LINE.format(task=problem.task_text))
        # state
        self.loc: int | None = None
        self.held: int | None = None
        self.opened = [r.opened for r in recs]
        self.where = [self.rindex[o.location] for o in objs]
        self.contents: list[set[int]] = [set() for _ in recs]
        for i, r in enumerate(self.where):
            self.contents[r].add(i)
        n = len(objs)
        self.clean = [False] * n
        self.hot = [False] * n
        self.cool = [False] * n
        self.sliced = [False] * n
        self.toggled = [False] * n
        # receptacles whose contents the agent has seen; objects only move by the agent's hand, so
        # what it has seen stays true: this is the expert's (and a careful agent's) knowledge
        self.observed = [False] * len(recs)
        self.steps = 0
        self.won = False
        self.last_observation = self.intro
        self._admissible: list[str] | None = None

    # ---- text -------------------------------------------------------------------------------
    def _visible(self, r: int) -> bool:
        return not self.ropenable[r] or self.opened[r]

    def _listing(self, r: int) -> str:
        names = [self.oname[i] for i in sorted(self.contents[r], key=self._list_key.__getitem__)]
        return W.join_items(names)

    def _describe(self, r: int) -> str:
        name = self.rname[r]
        if self.ropenable[r]:
            if self.opened[r]:
                return W.IN_OPEN.format(r=name, items=self._listing(r))
            return W.IS_CLOSED.format(r=name)
        return W.ON_TOP.format(r=name, items=self._listing(r))

    # ---- actions ----------------------------------------------------------------------------
    def admissible(self) -> list[str]:
        """The actions the engine would accept now, sorted as ALFWorld sorts them."""
        if self._admissible is not None:
            return self._admissible
        acts = ["help", "inventory", "look"]
        loc, held = self.loc, self.held
        acts += [g for i, g in enumerate(self._goto) if i != loc]
        if held is not None:
            acts.append(f"examine {self.oname[held]}")
        if loc is not None:
            rn, rt = self.rname[loc], self.rtype[loc]
            acts.append(f"examine {rn}")
            visible = self._visible(loc)
            if self.ropenable[loc]:
                acts.append(f"close {rn}" if self.opened[loc] else f"open {rn}")
            here = self.contents[loc]
            if held is None:
                if visible:
                    acts += [
                        f"take {self.oname[o]} from {rn}"
                        for o in here
                        if self.otype[o] not in NOT_PICKUPABLE
                    ]
            else:
                hn, ht = self.oname[held], self.otype[held]
                if visible and ht in CAN_CONTAIN[rt]:
                    acts.append(f"move {hn} to {rn}")
                if rt == "microwave" and ht in HEATABLE:
                    acts.append(f"heat {hn} with {rn}")
                elif rt == "fridge" and ht in COOLABLE:
                    acts.append(f"cool {hn} with {rn}")
                elif rt == "sinkbasin" and ht in CLEANABLE:
                    acts.append(f"clean {hn} with {rn}")
                if ht in SHARP:
                    # the engine lets a held knife slice what is here, even in a closed receptacle
                    acts += [
                        f"slice {self.oname[o]} with {hn}"
                        for o in here
                        if self.otype[o] in SLICEABLE
                    ]
            acts += [f"use {self.oname[o]}" for o in here if self.otype[o] in TOGGLEABLE]
        acts.sort()
        self._admissible = acts
        return acts

    def apply(self, action: str) -> tuple[str, bool]:
        """Apply one action; returns (observation, valid). Invalid actions change nothing."""
        text = W.normalize(action)
        self.steps += 1
        if text not in self.admissible():
            self.last_observation = W.NOTHING_HAPPENS
            return W.NOTHING_HAPPENS, False
        self._admissible = None
        obs = self._execute(text)
        self.won = self._check_won()
        self.last_observation = obs
        return obs, True

    def _execute(self, text: str) -> str:
        if text == "look":
            if self.loc is None:
                return W.LOOK_ROOM.format(items="nothing")
            return W.LOOK_AT.format(r=self.rname[self.loc])
        if text == "inventory":
            if self.held is None:
                return W.CARRYING_NOTHING
            return W.CARRYING.format(items=W.join_items([self.oname[self.held]]))
        if text == "help":
            return W.HELP
        p = W.parse_action(text)
        assert p is not None  # admissible actions always parse
        if p.verb == "go":
            r = self.rindex[p.target]
            self.loc = r
            if self._visible(r):
                self.observed[r] = True
            return W.ARRIVE.format(r=self.rname[r], contents=self._describe(r))
        if p.verb == "open":
            r = self.rindex[p.target]
            self.opened[r] = True
            self.observed[r] = True
            return W.OPENED.format(r=self.rname[r], contents=self._describe(r))
        if p.verb == "close":
            r = self.rindex[p.target]
            self.opened[r] = False
            return W.CLOSED.format(r=self.rname[r])
        if p.verb == "take":
            o, r = self.oindex[p.obj], self.rindex[p.target]
            self.contents[r].discard(o)
            self.where[o] = -1
            self.held = o
            return W.PICKED.format(o=self.oname[o], r=self.rname[r])
        if p.verb == "move":
            o, r = self.oindex[p.obj], self.rindex[p.target]
            self.contents[r].add(o)
            self.where[o] = r
            self.held = None
            return W.MOVED.format(o=self.oname[o], r=self.rname[r])
        if p.verb in _VERB_FEEDBACK:
            o, r = self.oindex[p.obj], self.rindex[p.target]
            if p.verb == "heat":
                self.hot[o], self.cool[o] = True, False
            elif p.verb == "cool":
                self.cool[o], self.hot[o] = True, False
            else:
                self.clean[o] = True
            return _VERB_FEEDBACK[p.verb].format(o=self.oname[o], r=self.rname[r])
        if p.verb == "slice":
            o = self.oindex[p.obj]
            self.sliced[o] = True
            return W.SLICED.format(o=self.oname[o], k=p.target)
        if p.verb == "use":
            o = self.oindex[p.obj]
            self.toggled[o] = True  # ALFWorld's toggle always reports "turn on" and stays toggled
            return W.TURNED_ON.format(o=self.oname[o])
        if p.verb == "examine":
            if p.target in self.rindex:
                r = self.rindex[p.target]
                if self._visible(r):
                    self.observed[r] = True
                return self._describe(r)
            o = self.oindex[p.target]
            return W.examine_object(
                self.oname[o],
                self.otype[o],
                clean=self.clean[o],
                hot=self.hot[o],
                cool=self.cool[o],
                sliced=self.sliced[o],
                receptacle_object=self.otype[o] in RECEPTACLE_OBJECTS,
            )
        raise AssertionError(f"unhandled admissible action {text!r}")

    # ---- goal -------------------------------------------------------------------------------
    def _has_state(self, o: int) -> bool:
        s = self.goal.state
        if s is None:
            return True
        return {"clean": self.clean, "heat": self.hot, "cool": self.cool}[s][o]

    def _check_won(self) -> bool:
        g = self.goal
        if g.task_type == "look_at_obj_in_light":
            if self.held is None or self.otype[self.held] != g.object_type or self.loc is None:
                return False
            return any(
                self.toggled[o] and self.otype[o] == g.toggle_type for o in self.contents[self.loc]
            )
        for r, here in enumerate(self.contents):
            if self.rtype[r] != g.receptacle_type:
                continue
            n = sum(1 for o in here if self.otype[o] == g.object_type and self._has_state(o))
            if n >= g.count:
                return True
        return False

    # ---- gold policy ------------------------------------------------------------------------
    def _go_or_open(self, r: int) -> str | None:
        """The step that makes receptacle r reachable and visible, or None when it already is."""
        if self.loc != r:
            return self._goto[r]
        if not self._visible(r):
            return f"open {self.rname[r]}"
        return None

    def _search(self, otype: str, skip_type: str | None) -> str:
        """Next step of a search for `otype`: the likeliest unseen receptacle by location prior.

        The uninformed expert knows neither the priors nor which receptacle types can hold
        what: it goes through the unseen receptacles in listing order (type, then number),
        the order of the agent memory's "Not visited" line, so its choice is a rule a small
        model can read off the prompt while the skills text carries what it lacks.
        """
        if not self.use_priors:
            known = self.known_order.get(otype, [])
            unseen = sorted(
                (r for r in self.rorder if not self.observed[r]),
                key=lambda r: known.index(self.rtype[r]) if self.rtype[r] in known else len(known),
            )
            if not unseen:
                return "look"
            step = self._go_or_open(unseen[0])
            return step if step is not None else "look"
        prior = LOCATION_PRIORS.get(otype, {})
        best, best_key = None, None
        for r in self.rorder:
            if (
                self.observed[r]
                or otype not in CAN_CONTAIN[self.rtype[r]]
                or self.rtype[r] == skip_type
            ):
                continue
            key = -prior.get(self.rtype[r], 0.0)
            if best_key is None or key < best_key:
                best, best_key = r, key
        if best is None:  # nothing left that should hold it: look everywhere unseen
            unseen = [r for r in self.rorder if not self.observed[r]]
            if not unseen:
                return "look"
            best = unseen[0]
        step = self._go_or_open(best)
        return step if step is not None else "look"

    def _fetch(self, candidates: list[int], skip_type: str | None) -> str:
        """Get one of `candidates` (objects of the target type) into the hand; hands are empty."""
        known = [o for o in candidates if self.where[o] >= 0 and self.observed[self.where[o]]]
        if not known:
            return self._search(
                self.otype[candidates[0]] if candidates else self.goal.object_type, skip_type
            )
        here = [o for o in known if self.where[o] == self.loc]
        if here:
            o = here[0]
        else:
            o = min(
                known,
                key=lambda i: (not self._visible(self.where[i]), self.rorder.index(self.where[i])),
            )
        r = self.where[o]
        step = self._go_or_open(r)
        return step if step is not None else f"take {self.oname[o]} from {self.rname[r]}"

    def _drop(self) -> str:
        """Put down a held object that the task does not need, as close as possible."""
        o = self.held
        assert o is not None
        ot = self.otype[o]
        if (
            self.loc is not None
            and self._visible(self.loc)
            and ot in CAN_CONTAIN[self.rtype[self.loc]]
        ):
            return f"move {self.oname[o]} to {self.rname[self.loc]}"
        holders = [r for r in self.rorder if ot in CAN_CONTAIN[self.rtype[r]]]
        r = min(holders, key=lambda i: (not self._visible(i), self.rorder.index(i)))
        step = self._go_or_open(r)
        return step if step is not None else f"move {self.oname[o]} to {self.rname[r]}"

    def _destination(self) -> int:
        """The receptacle to fill: the one holding most targets, else the cheapest to reach."""
        g = self.goal
        dests = [r for r in self.rorder if self.rtype[r] == g.receptacle_type]

        def key(r: int) -> tuple[int, bool, bool, int]:
            done = sum(
                1 for o in self.contents[r] if self.otype[o] == g.object_type and self._has_state(o)
            )
            return (-done, r != self.loc, not self._visible(r), self.rorder.index(r))

        return min(dests, key=key)

    # the expert searches by location priors; the warm-start's uninformed expert switches them off
    use_priors: bool = True
    known_order: dict[str, list[str]] = {}

    def expert_action(
        self, use_priors: bool = True, known_order: dict[str, list[str]] | None = None
    ) -> str:
        """The gold next action from the current state (any state, including after mistakes).

        use_priors=False searches unseen receptacles in listing order instead of by location
        prior: an expert without the privileged knowledge the skills text carries.
        known_order (with use_priors=False): object type -> receptacle types to search first,
        in order, before the listing order: an expert that knows just what a skills text says.
        """
        self.use_priors = use_priors
        self.known_order = dict(known_order or {})
        try:
            return self._expert_action()
        finally:
            self.use_priors = True
            self.known_order = {}

    def _expert_action(self) -> str:
        if self.won:
            return "look"
        g = self.goal
        held = self.held
        if g.task_type == "look_at_obj_in_light":
            if held is not None and self.otype[held] == g.object_type:
                lamps = [
                    o
                    for o, t in enumerate(self.otype)
                    if t == g.toggle_type and self.where[o] >= 0 and self.observed[self.where[o]]
                ]
                if lamps:
                    lamp = min(
                        lamps,
                        key=lambda o: (self.where[o] != self.loc, self.rorder.index(self.where[o])),
                    )
                    if self.loc != self.where[lamp]:
                        return self._goto[self.where[lamp]]
                    return f"use {self.oname[lamp]}"
                return self._search(g.toggle_type or "desklamp", None)
            if held is not None:
                return self._drop()
            targets = [o for o, t in enumerate(self.otype) if t == g.object_type]
            return self._fetch(targets, None)

        dest = self._destination()
        if held is not None:
            if self.otype[held] != g.object_type:
                return self._drop()
            if not self._has_state(held):
                app_type = APPLIANCE[g.state]  # type: ignore[index]
                apps = [r for r in self.rorder if self.rtype[r] == app_type]
                app = self.loc if self.loc in apps else apps[0]
                if self.loc != app:
                    return self._goto[app]
                return f"{g.state} {self.oname[held]} with {self.rname[app]}"
            step = self._go_or_open(dest)
            return step if step is not None else f"move {self.oname[held]} to {self.rname[dest]}"
        if g.count > 1:
            targets = [
                o for o, t in enumerate(self.otype) if t == g.object_type and self.where[o] != dest
            ]
        else:
            targets = [
                o
                for o, t in enumerate(self.otype)
                if t == g.object_type
                and not (self.rtype[self.where[o]] == g.receptacle_type and self._has_state(o))
            ]
        return self._fetch(targets, g.receptacle_type)

    def gold_length(self, limit: int = 400) -> int | None:
        """Steps the gold policy needs from now (None if it does not finish within `limit`)."""
        start = self.steps
        while not self.won:
            if self.steps - start >= limit:
                return None
            _, valid = self.apply(self.expert_action())
            if not valid:  # a bug in the expert, never expected: report the task as unsolved
                return None
        return self.steps - start


# ---- failure diagnosis --------------------------------------------------------------------------
def diagnose(game: SimGame, action: str) -> tuple[str, str, dict[str, str]]:
    """Why `action` was not admissible: (error_kind, hint_template_key, args for the hint text).

    `game` is a SimGame or any view with the same fields (the alfworld backend builds one from
    the engine's facts): rname, rindex, rtype, oname, oindex, otype, where, loc, held, _visible(r).
    """
    p = W.parse_action(action)
    if p is None:
        return "invalid_action", "household/invalid_action", {"action": action}
    if p.verb == "put":
        return (
            "invalid_action",
            "household/use_move",
            {"object": p.obj or "", "receptacle": p.target or ""},
        )
    rec = game.rindex.get(p.target) if p.target is not None else None
    obj = game.oindex.get(p.obj) if p.obj is not None else None
    here = game.rname[game.loc] if game.loc is not None else ""
    args = {"object": p.obj or "", "receptacle": p.target or "", "here": here}
    held_name = game.oname[game.held] if game.held is not None else ""
    args["held"] = held_name

    def at(r: int | None) -> bool:
        return r is not None and game.loc == r

    if p.verb == "go":
        if rec is None:
            return "unknown_receptacle", "household/unknown_receptacle", args
        return "already_here", "household/already_here", args
    if p.verb in ("open", "close", "examine") and rec is None:
        if p.verb == "examine" and p.target in game.oindex:
            return "not_holding", "household/take_first", {**args, "object": p.target}
        return "unknown_receptacle", "household/unknown_receptacle", args
    if p.verb in ("open", "close", "examine"):
        if not at(rec):
            return "not_at_receptacle", "household/go_to_first", args
        return "not_admissible", "household/not_admissible", args
    if p.verb == "take":
        if game.held is not None:
            return "hands_full", "household/hands_full", args
        if rec is None:
            return "unknown_receptacle", "household/unknown_receptacle", args
        if not at(rec):
            return "not_at_receptacle", "household/go_to_first", args
        if not game._visible(rec):
            return "receptacle_closed", "household/open_first", args
        if obj is None or game.where[obj] != rec:
            return "object_not_here", "household/object_not_here", args
        return "not_admissible", "household/not_admissible", args
    if p.verb in ("move", "heat", "clean", "cool"):
        if obj is None or game.held != obj:
            return "not_holding", "household/take_first", args
        if rec is None:
            return "unknown_receptacle", "household/unknown_receptacle", args
        if not at(rec):
            return "not_at_receptacle", "household/go_to_first", args
        if p.verb == "move":
            if not game._visible(rec):
                return "receptacle_closed", "household/open_first", args
            return "cannot_contain", "household/cannot_contain", args
        if game.rtype[rec] != APPLIANCE[p.verb]:
            return (
                "wrong_appliance",
                "household/wrong_appliance",
                {**args, "appliance": APPLIANCE[p.verb]},
            )
        return "cannot_process", "household/cannot_process", args
    if p.verb == "use":
        if obj is None or game.otype[obj] not in TOGGLEABLE:
            return "not_toggleable", "household/not_toggleable", args
        return "object_not_here", "household/object_not_here", {**args, "receptacle": ""}
    return "not_admissible", "household/not_admissible", args


# ---- the backend --------------------------------------------------------------------------------
class SimHousehold(HouseholdBackend):
    """The `sim` backend of `HouseholdEnv`: generated ALFWorld-style tasks, thousands of steps/s.

    difficulty: a `SimDifficulty`, a preset name ("easy", "default", "hard", "alfworld") or a dict.
    task_types: restrict generated tasks (reset without task_id, train ids) to these types.
    test_size: size of the fixed test split (ids cycle through the six types).
    train_size: size of the listed train split; `reset(seed=s)` draws from all 900,000 train seeds.
    seed: seeds the draw of tasks for `reset()` with neither task_id nor seed.
    """

    name = "sim"

    def __init__(
        self,
        difficulty: SimDifficulty | str | dict[str, Any] | None = None,
        task_types: list[str] | tuple[str, ...] | None = None,
        test_size: int = 200,
        train_size: int = 6000,
        seed: int = 0,
    ) -> None:
        self.difficulty = SimDifficulty.coerce(difficulty)
        types = tuple(task_types) if task_types else TASK_TYPES
        unknown = [t for t in types if t not in KIND_OF]
        if unknown:
            raise ValueError(f"unknown task types {unknown}; choose from {', '.join(TASK_TYPES)}")
        if not 0 < test_size <= SEED_LIMIT - TEST_SEED_BASE:
            raise ValueError(f"test_size={test_size} must be in 1..{SEED_LIMIT - TEST_SEED_BASE}")
        if not 0 < train_size <= TEST_SEED_BASE:
            raise ValueError(f"train_size={train_size} must be in 1..{TEST_SEED_BASE}")
        self.task_types = types
        self.test_size = test_size
        self.train_size = train_size
        self._rng = random.Random(seed)
        self.game: SimGame | None = None
        self.problem: SimProblem | None = None
        self.progress: ProgressTracker | None = None
        self._done = False

    # ---- task sets --------------------------------------------------------------------------
    def task_ids(self, split: str = "test") -> list[str]:
        if split == "test":
            return [
                make_task_id(TASK_TYPES[i % len(TASK_TYPES)], TEST_SEED_BASE + i)
                for i in range(self.test_size)
            ]
        if split == "train":
            return [
                make_task_id(self.task_types[i % len(self.task_types)], i)
                for i in range(self.train_size)
            ]
        raise ValueError(f"unknown split {split!r}; the sim backend has 'train' and 'test'")

    def draw_task_id(self, seed: int | None = None) -> str:
        """A training task id: drawn from `seed` when given, else from the backend's own stream."""
        rng = random.Random(seed) if seed is not None else self._rng
        return make_task_id(rng.choice(self.task_types), rng.randrange(TEST_SEED_BASE))

    # ---- episode ----------------------------------------------------------------------------
    def reset(self, task_id: str | None = None, seed: int | None = None) -> EnvStep:
        if task_id is None:
            task_id = self.draw_task_id(seed)
        return self.load(generate_problem(task_id, self.difficulty))

    def load(self, problem: SimProblem) -> EnvStep:
        """Start an episode on a given problem (e.g. one read back from JSON)."""
        self.problem = problem
        self.game = SimGame(problem)
        self.progress = ProgressTracker(problem.task_text)
        self._done = False
        meta = self._metadata(valid=True)
        meta["task"] = problem.task_text
        meta["task_id"] = problem.task_id
        meta["max_steps"] = problem.max_steps
        return EnvStep(self.game.intro, 0.0, False, meta)

    def step(self, action: str) -> EnvStep:
        game = self._require()
        if not isinstance(action, str):
            raise TypeError(
                f"action must be a string such as 'go to fridge 1', not {type(action).__name__}"
            )
        if self._done:
            meta = self._metadata(valid=False, error=("episode_over", "household/episode_over", {}))
            return EnvStep(game.last_observation, 0.0, True, meta)
        # an accepted action may still make no progress: the tracker reads the state before it
        accepted = W.normalize(action) in game.admissible()
        progress = self.progress.check(game, action) if accepted else None
        obs, valid = game.apply(action)
        error = progress if valid else diagnose(game, action)
        won = game.won
        self._done = won or game.steps >= game.problem.max_steps
        return EnvStep(
            obs, 1.0 if won else 0.0, self._done, self._metadata(valid=valid, error=error)
        )

    def _metadata(
        self, valid: bool, error: tuple[str, str, dict[str, str]] | None = None
    ) -> dict[str, Any]:
        game = self._require()
        return {
            "won": game.won,
            "admissible_actions": list(game.admissible()),
            "task_type": game.problem.task_type,
            "valid_action": valid,
            "error_kind": error[0] if error else None,
            "hint_template_key": error[1] if error else None,
            "error_args": error[2] if error else None,
            "steps": game.steps,
        }

    def _require(self) -> SimGame:
        if self.game is None:
            raise RuntimeError("no episode: call reset() first")
        return self.game

    @property
    def task_text(self) -> str:
        return self._require().problem.task_text

    @property
    def task_type(self) -> str:
        return self._require().problem.task_type

    def expert_action(
        self, use_priors: bool = True, known_order: dict[str, list[str]] | None = None
    ) -> str:
        return self._require().expert_action(use_priors=use_priors, known_order=known_order)
