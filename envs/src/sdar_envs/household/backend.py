"""The surface every household backend implements, so `HouseholdEnv` can drive either.

Backends: the fast simulator (`sim.SimHousehold`) and the real ALFWorld engine
(`alfworld_backend.AlfworldHousehold`); both return `EnvStep`s carrying all `METADATA_KEYS`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from sdar_envs.base import EnvStep

# The six ALFWorld task types, in ALFWorld's own names; they are the skills keys too.
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)


class HouseholdBackend(ABC):
    """One household engine, one episode at a time.

    `reset` starts an episode (a given `task_id`, or one drawn with `seed`) and returns the
    intro observation with metadata that also carries "task" (the goal text) and "task_id".
    `step` applies one action. Every returned `EnvStep.metadata` carries all `METADATA_KEYS`;
    `task_type` is one of `TASK_TYPES`.
    """

    name: str = "base"

    @abstractmethod
    def reset(self, task_id: str | None = None, seed: int | None = None) -> EnvStep:
        """Start an episode on `task_id` (or on a task drawn with `seed`)."""

    @abstractmethod
    def step(self, action: str) -> EnvStep:
        """Apply one action of the current episode."""

    @abstractmethod
    def task_ids(self, split: str = "test") -> list[str]:
        """Stable task ids of a split ("train" or "test"; backends may add more)."""

    @property
    @abstractmethod
    def task_text(self) -> str:
        """The goal of the current episode, e.g. 'put a clean apple in fridge'."""

    @property
    @abstractmethod
    def task_type(self) -> str:
        """The task type of the current episode, one of `TASK_TYPES`."""

    @abstractmethod
    def expert_action(self) -> str:
        """The gold next action from the current state (works mid-episode)."""

    def goal_object_type(self) -> str | None:
        """The object type the current episode's goal asks for, in the catalog's names ("apple",
        `catalog.OBJECT_TYPES`); None when unknown. Narrows the skills to the goal's priors."""
        problem = getattr(self, "problem", None)
        return problem.goal.object_type if problem is not None else None

    def close(self) -> None:
        """Release engine resources (processes, temp dirs)."""
