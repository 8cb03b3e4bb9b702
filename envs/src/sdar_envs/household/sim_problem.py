"""The household simulator's problems: difficulty settings, the `SimProblem` structure, task ids and
what the seeded generator of rooms for ALFWorld's six task types (sim_generate) draws from (a generated room
also exports to the real engine: pddl.scene_from_sim).

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

import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from sdar_envs.household.backend import TASK_TYPES

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
