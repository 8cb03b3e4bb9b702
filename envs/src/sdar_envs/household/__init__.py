"""The household family: ALFWorld's six task types over a fast simulator or the real engine.

`HouseholdEnv(backend="sim"|"alfworld")` is the entry point; backends implement `HouseholdBackend`.
The catalog's vocabulary (object and receptacle types, what opens, holds or toggles, task wording) is
re-exported here for code outside the package that reads observations, e.g. sdar's agent memory.
"""

from sdar_envs.household.backend import TASK_TYPES, HouseholdBackend
from sdar_envs.household.catalog import (
    APPLIANCE,
    CAN_CONTAIN,
    LOCATION_PRIORS,
    OBJECT_TYPES,
    OPENABLE,
    RECEPTACLE_TYPES,
    TASK_TEMPLATES,
    TOGGLEABLE,
)
from sdar_envs.household.env import BACKENDS, HouseholdEnv, load_backend
from sdar_envs.household.sim import SimDifficulty, SimHousehold, SimProblem, generate_problem

__all__ = [
    "APPLIANCE",
    "BACKENDS",
    "CAN_CONTAIN",
    "LOCATION_PRIORS",
    "OBJECT_TYPES",
    "OPENABLE",
    "RECEPTACLE_TYPES",
    "TASK_TEMPLATES",
    "TASK_TYPES",
    "TOGGLEABLE",
    "HouseholdBackend",
    "HouseholdEnv",
    "SimDifficulty",
    "SimHousehold",
    "SimProblem",
    "generate_problem",
    "load_backend",
]
