"""The household family: ALFWorld's six task types over a fast simulator or the real engine.

`HouseholdEnv(backend="sim"|"alfworld")` is the entry point; backends implement `HouseholdBackend`.
"""

from sdar_envs.household.backend import TASK_TYPES, HouseholdBackend
from sdar_envs.household.env import BACKENDS, HouseholdEnv, load_backend
from sdar_envs.household.sim import SimDifficulty, SimHousehold, SimProblem, generate_problem

__all__ = [
    "BACKENDS",
    "TASK_TYPES",
    "HouseholdBackend",
    "HouseholdEnv",
    "SimDifficulty",
    "SimHousehold",
    "SimProblem",
    "generate_problem",
    "load_backend",
]
