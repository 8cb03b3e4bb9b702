"""The fast household simulator: seeded rooms for ALFWorld's six task types in ALFWorld's wording.

Thousands of steps per second in pure Python, a gold-path expert that searches by location priors,
and a problem structure that exports a generated room to the real engine. `SimHousehold` (here) is
the backend; the problems and their generator are in sim_problem, the game and `diagnose` in
sim_game, its gold policy in sim_expert, and their public names are importable from here too.
"""

from __future__ import annotations

import random
from typing import Any

from sdar_envs.base import EnvStep
from sdar_envs.household import wording as W
from sdar_envs.household.backend import TASK_TYPES, HouseholdBackend
from sdar_envs.household.progress import ProgressTracker
from sdar_envs.household.sim_expert import expert_action
from sdar_envs.household.sim_game import SimGame, diagnose
from sdar_envs.household.sim_generate import generate_problem
from sdar_envs.household.sim_problem import (
    DIFFICULTY_PRESETS,
    KIND_OF,
    SEED_LIMIT,
    TASK_KINDS,
    TEST_SEED_BASE,
    SimDifficulty,
    SimGoal,
    SimObject,
    SimProblem,
    SimReceptacle,
    make_task_id,
    parse_task_id,
    split_of,
)

# the sim's public names, importable from here as before the split
__all__ = [
    "DIFFICULTY_PRESETS",
    "KIND_OF",
    "SEED_LIMIT",
    "TASK_KINDS",
    "TEST_SEED_BASE",
    "SimDifficulty",
    "SimGame",
    "SimGoal",
    "SimHousehold",
    "SimObject",
    "SimProblem",
    "SimReceptacle",
    "diagnose",
    "generate_problem",
    "make_task_id",
    "parse_task_id",
    "split_of",
]


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
        return expert_action(self._require(), use_priors=use_priors, known_order=known_order)
