"""The household family (ALFWorld's six task types) as one `TextEnv` over two backends.

backend="sim" is the fast generated-room simulator (local default); backend="alfworld" is
the real ALFWorld/TextWorld engine on official games (imported only when asked for).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from sdar_envs.base import EnvStep, TextEnv
from sdar_envs.household.backend import HouseholdBackend
from sdar_envs.household.catalog import OBJECT_TYPES
from sdar_envs.household.skills import PRIOR_TOP_K, household_skill_library, listed_search_order
from sdar_envs.skills import SkillLibrary

# backend name -> "module:attr"; imported lazily so the sim never loads TextWorld
BACKENDS = {
    "sim": "sdar_envs.household.sim:SimHousehold",
    "alfworld": "sdar_envs.household.alfworld_backend:AlfworldHousehold",
}


# The backends' own keyword arguments (a test checks them against the constructors). A config
# written for one backend (configs/household-tiny.yaml: the sim's `difficulty`) must work with
# `backend: alfworld` too, so an option only the other backend knows is dropped with a note.
BACKEND_OPTIONS: dict[str, tuple[str, ...]] = {
    "sim": ("difficulty", "task_types", "test_size", "train_size", "seed"),
    "alfworld": ("data_dir", "split", "workers", "max_steps", "cache_dir", "pool", "planner"),
}
_NOTED: set[tuple[str, tuple[str, ...]]] = set()


def backend_kwargs(name: str, kwargs: dict[str, Any], note: bool = True) -> dict[str, Any]:
    """The part of `kwargs` backend `name` takes.

    Options of another household backend are dropped (the sim's `difficulty` means nothing to the
    official games, whose rooms are fixed), with one warning per process and backend when `note`;
    an option no backend knows is an error that lists the valid ones.
    """
    if name not in BACKENDS:
        raise ValueError(
            f"unknown household backend {name!r}; choose one of {', '.join(sorted(BACKENDS))}"
        )
    own = BACKEND_OPTIONS[name]
    others = {k for b, opts in BACKEND_OPTIONS.items() if b != name for k in opts}
    unknown = sorted(k for k in kwargs if k not in own and k not in others)
    if unknown:
        raise TypeError(
            f"unknown household option(s) {unknown} for backend {name!r}; its options: "
            f"{', '.join(own)} (and `skills`); other backends': {', '.join(sorted(others))}"
        )
    dropped = tuple(sorted(k for k in kwargs if k not in own))
    if dropped and note and (name, dropped) not in _NOTED:
        _NOTED.add((name, dropped))
        owners = ", ".join(
            f"{k} ({'/'.join(b for b, opts in BACKEND_OPTIONS.items() if k in opts)})" for k in dropped
        )
        warnings.warn(
            f"household backend {name!r} ignores the option(s) of another backend: {owners}",
            UserWarning,
            stacklevel=3,
        )
    return {k: v for k, v in kwargs.items() if k in own}


def load_backend(name: str, **kwargs: Any) -> HouseholdBackend:
    """Build the household backend `name` ("sim" or "alfworld") with its own kwargs (another
    backend's options are dropped with a note, see `backend_kwargs`)."""
    kwargs = backend_kwargs(name, kwargs)
    module, attr = BACKENDS[name].split(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise ImportError(
            f"household backend {name!r} could not be imported ({exc}); "
            "install its engine (alfworld needs `pip install alfworld`) or use backend='sim'"
        ) from exc
    return cls(**kwargs)


class HouseholdEnv(TextEnv):
    """ALFWorld-style household tasks.

    backend: "sim" (default; generated rooms, thousands of steps/s) or "alfworld" (the real
        engine on official games). Remaining keyword arguments go to the backend, e.g.
        `HouseholdEnv(backend="sim", difficulty="easy")` or a `SimDifficulty`; those of the other
        backend are ignored with a note, so one config serves both (see `backend_kwargs`).
    """

    family = "household"

    def __init__(self, backend: str = "sim", skills: dict[str, Any] | None = None, **backend_kwargs: Any) -> None:
        """skills: options of `household_skill_library` for this env's privileged text,
        e.g. {"top_k": 2, "compact": True} for a small model's prompt budget."""
        super().__init__()
        self.backend_name = backend
        self.backend = load_backend(backend, **backend_kwargs)
        self.skill_options = dict(skills or {})

    def _reset(self, task_id: str | None, seed: int | None) -> EnvStep:
        self._task_id = task_id
        out = self.backend.reset(task_id=task_id, seed=seed)
        self._task_id = out.metadata.get("task_id", task_id)
        return out

    def _step(self, action: str) -> EnvStep:
        return self.backend.step(action)

    def task_ids(self, split: str = "test") -> list[str]:
        return self.backend.task_ids(split)

    @property
    def task_text(self) -> str:
        return self.backend.task_text

    @property
    def task_type(self) -> str:
        return self.backend.task_type

    def expert_action(self) -> str:
        return self.backend.expert_action()

    def uninformed_expert_action(self) -> str:
        """The gold next action of an expert that does not know the location priors (it
        searches in listing order); the warm-start imitates it in prompts without skills."""
        if self.backend_name != "sim":
            return self.backend.expert_action()
        return self.backend.expert_action(use_priors=False)

    def skilled_expert_action(self) -> str:
        """The gold next action of an expert that knows exactly what this episode's skills text
        says (the listed likeliest receptacle types of the goal object, and of the desklamp),
        searching those first and then in listing order; the warm-start imitates it in prompts
        that carry the skills, so the teacher's edge is a rule it can read off its context."""
        if self.backend_name != "sim":
            return self.backend.expert_action()

        task_type = self.backend.task_type
        top_k = int(self.skill_options.get("top_k", PRIOR_TOP_K))
        goal = self.backend.problem.goal.object_type
        known = {goal: listed_search_order(task_type, goal, top_k)}
        if task_type == "look_at_obj_in_light":
            known["desklamp"] = listed_search_order(task_type, "desklamp", top_k)
        return self.backend.expert_action(use_priors=False, known_order=known)

    def skills_key(self) -> str | None:
        # retrieval is rule-based: the task type selects the per-type skills
        return self.backend.task_type

    def privileged_skills(self) -> str:
        """The task type's skills; with skills={"target_only": True} the location-prior lines
        are narrowed to the goal's object type (a finer rule-based retrieval that keeps a
        small model's teacher prompt short)."""
        opts = dict(self.skill_options)
        target_only = opts.pop("target_only", False)
        text = household_skill_library(**opts).render(self.skills_key())
        goal = self.backend.goal_object_type() if target_only else None
        if goal is None:
            return text
        keep = []
        for line in text.splitlines():
            head = line[2:].split(":", 1)[0] if line.startswith("- ") else ""
            if head in OBJECT_TYPES and head != goal:
                continue
            keep.append(line)
        return "\n".join(keep)

    @classmethod
    def skill_library(cls) -> SkillLibrary:
        return household_skill_library()

    def close(self) -> None:
        self.backend.close()
