"""The agent's memory per family, written into each prompt: the household's compact memory of what the agent has
seen (`sdar_envs.household.memory.HouseholdMemory`: receptacles visited and what was there, the object held, the
next place), none for the others.
"""

from __future__ import annotations

from sdar_envs.household.memory import HouseholdMemory

__all__ = ["HouseholdMemory", "NoMemory", "memory_for"]


class NoMemory:
    """Families whose history window is enough (shop, search-QA)."""

    def update(self, observation: str) -> None:
        pass

    def render(self) -> str:
        return ""


def memory_for(family: str, task: str = "") -> HouseholdMemory | NoMemory:
    """The memory of `family`; `task` (household) flags the objects the task names where they were seen."""
    return HouseholdMemory(task) if family == "household" else NoMemory()
