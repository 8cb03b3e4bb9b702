"""The environment protocol every family implements (OpenEnv-style reset/step/state/close).

Step information the trainer needs travels in `EnvStep.metadata`; the HTTP layer copies it
into observation fields because OpenEnv's wire format drops `Observation.metadata`.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from pathlib import Path
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from sdar_envs.skills import SkillLibrary

def cache_root() -> Path:
    """sdar's one cache directory (not created): $SDAR_CACHE_DIR, else $XDG_CACHE_HOME/sdar, else
    ~/.cache/sdar. Models (sdar.models.cache), the MLflow schema template (sdar.tracking) and the ALFWorld
    data all live under it; it is defined here, at the bottom layer, because sdar depends on sdar_envs
    and never the other way."""
    if os.environ.get("SDAR_CACHE_DIR"):
        return Path(os.environ["SDAR_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sdar"


# Keys every step's metadata carries. `error_kind` and `hint_template_key` are set (non-empty) only at
# an error site: an action the environment refused (`valid_action` False), or one it accepted that
# made no progress (`valid_action` True: a non-task object taken, a search with no fitting result, ...;
# each family's progress.py). They drive the hint-distillation channel, the hint's fields coming from
# the step's `error_args` (what the agent observed: the action, names it saw, words of the task).
METADATA_KEYS = (
    "won",  # bool: the task is solved
    "admissible_actions",  # list[str]: valid actions now ([] where the family has none)
    "task_type",  # str: e.g. "pick_and_place", "heat", "two_hop"
    "valid_action",  # bool: the environment accepted the last action (understood and applicable)
    "error_kind",  # str | None: why the last action was refused or made no progress
    "hint_template_key",  # str | None: which hint template fits the error site
)


@dataclass
class EnvStep:
    """What `reset` and `step` return.

    observation: the text the agent sees now.
    reward: the reward of this transition (0.0 on reset).
    done: the episode has ended (won, lost, or out of steps).
    metadata: at least the keys of `METADATA_KEYS`.
    """

    observation: str
    reward: float = 0.0
    done: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "observation": self.observation,
            "reward": float(self.reward),
            "done": bool(self.done),
            "metadata": dict(self.metadata),
        }


class TextEnv(ABC):
    """A multi-turn text environment, one episode at a time.

    Subclasses implement `_reset` and `_step`; this base records the observations so that
    `state(t)` returns exactly what the agent saw at step t (t = 0 is the reset observation).
    """

    family: str = "base"

    def __init__(self) -> None:
        self._observations: list[str] = []
        self._task_id: str | None = None

    # ---- public API -------------------------------------------------------------------
    def reset(self, task_id: str | None = None, seed: int | None = None) -> EnvStep:
        """Start an episode on `task_id` (or a task drawn with `seed`)."""
        out = self._reset(task_id=task_id, seed=seed)
        # the episode's privileged text travels with the reset, so a remote client's teacher sees
        # exactly what an in-process one would (the student's prompt never reads it)
        out.metadata.setdefault("skills_key", self.skills_key())
        try:
            out.metadata.setdefault("privileged_skills", self.privileged_skills())
        except NotImplementedError:
            pass
        self._check(out)
        self._observations = [out.observation]
        return out

    def step(self, action: str) -> EnvStep:
        if not self._observations:
            raise RuntimeError("step() called before reset(); call reset() first")
        out = self._step(action)
        self._check(out)
        self._observations.append(out.observation)
        return out

    def state(self, t: int | None = None) -> str:
        """The exact observation of step t (0 = after reset); the latest when t is None."""
        if not self._observations:
            raise RuntimeError("state() called before reset(); call reset() first")
        if t is None:
            return self._observations[-1]
        if not 0 <= t < len(self._observations):
            raise IndexError(
                f"step {t} does not exist; this episode has steps 0..{len(self._observations) - 1}"
            )
        return self._observations[t]

    @property
    def num_steps(self) -> int:
        """Actions taken so far in this episode."""
        return max(len(self._observations) - 1, 0)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release engine resources."""

    # ---- to implement -----------------------------------------------------------------
    @abstractmethod
    def _reset(self, task_id: str | None, seed: int | None) -> EnvStep: ...

    @abstractmethod
    def _step(self, action: str) -> EnvStep: ...

    def task_ids(self, split: str = "test") -> list[str]:
        """Stable ids of the tasks of a split (families with fixed task sets override)."""
        raise NotImplementedError(f"{type(self).__name__} has no fixed task list")

    @property
    def task_text(self) -> str:
        """The goal of the current episode in words (e.g. 'put a clean apple in fridge')."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its task text")

    @property
    def task_type(self) -> str:
        """The task type of the current episode (also in every step's metadata)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its task type")

    def expert_action(self) -> str:
        """The gold next action from the current state (drives expert trajectories)."""
        raise NotImplementedError(f"{type(self).__name__} has no expert policy")

    def skills_key(self) -> str | None:
        """Rule-based retrieval key of the current task into the family's skill library."""
        return None

    @classmethod
    def skill_library(cls) -> "SkillLibrary":
        """The family's privileged skills (general, per key, common mistakes)."""
        raise NotImplementedError(f"{cls.__name__} has no skill library")

    def privileged_skills(self) -> str:
        """The skills text the privileged teacher gets for the current task."""
        return self.skill_library().render(self.skills_key())

    # ---- helpers ----------------------------------------------------------------------
    @staticmethod
    def _check(out: EnvStep) -> None:
        missing = [k for k in METADATA_KEYS if k not in out.metadata]
        if missing:
            raise ValueError(f"environment step metadata lacks {missing}; every step must carry {list(METADATA_KEYS)}")


_REGISTRY: dict[str, Callable[..., TextEnv] | str] = {}


def register_env(name: str, factory: Callable[..., TextEnv] | str) -> None:
    """Register a family under `name`; `factory` may be a callable or 'module:attr' (lazy)."""
    _REGISTRY[name] = factory


def available_envs() -> list[str]:
    return sorted(_REGISTRY)


def env_class(name: str) -> Callable[..., TextEnv]:
    """The registered factory (usually the TextEnv class) of family `name`."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; choose one of {', '.join(available_envs()) or '(none registered)'}")
    factory = _REGISTRY[name]
    if isinstance(factory, str):
        module, attr = factory.split(":")
        factory = getattr(importlib.import_module(module), attr)
        _REGISTRY[name] = factory
    return factory


def make_env(name: str, **kwargs: Any) -> TextEnv:
    """Build an environment by registered name, e.g. make_env('household', backend='sim')."""
    return env_class(name)(**kwargs)


def privileged_skills_for(env: Any, family: str, metadata: dict[str, Any]) -> str:
    """The privileged text of the episode `env` is playing: asked of the env when it is a
    local TextEnv, else rendered from the family's library and the reset's `skills_key`."""
    fn = getattr(env, "privileged_skills", None)
    if fn is not None:
        return fn()
    if metadata.get("privileged_skills"):
        return metadata["privileged_skills"]
    return env_class(family).skill_library().render(metadata.get("skills_key") or metadata.get("task_type"))
