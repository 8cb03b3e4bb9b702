"""Multi-turn text environments: one protocol, several families, served over HTTP.

Families register themselves with `register_env`; `make_env(name, **kwargs)` builds one.
"""

__version__ = "0.1.0"  # the distribution's version (envs/pyproject.toml); servers report it

from sdar_envs.base import (
    METADATA_KEYS,
    EnvStep,
    TextEnv,
    available_envs,
    make_env,
    register_env,
)
from sdar_envs.skills import SkillLibrary

# families, imported lazily so that serving one family never loads another's engine
register_env("household", "sdar_envs.household:HouseholdEnv")
register_env("shop", "sdar_envs.shop:ShopEnv")
register_env("searchqa", "sdar_envs.searchqa:SearchQAEnv")

__all__ = [
    "METADATA_KEYS",
    "EnvStep",
    "SkillLibrary",
    "TextEnv",
    "available_envs",
    "make_env",
    "register_env",
]
