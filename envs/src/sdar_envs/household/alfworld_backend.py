"""`AlfworldHousehold`, the household backend on the real ALFWorld engine and the official games,
and the gold-path evaluation. The games, the engine and the worker pool live in alfworld_data,
alfworld_engine and alfworld_pool; their public names are importable from here too."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sdar_envs.base import EnvStep
from sdar_envs.household.alfworld_data import (
    DATA_ENV_VAR,
    MAX_TASK_ID_CHARS,
    catalog_object_type,
    default_cache_dir,
    list_games,
    parse_task_text,
    resolve_data_root,
    resolve_split,
    task_type_of,
)
from sdar_envs.household.alfworld_engine import (
    ENGINE_LOCK,
    AlfworldEngine,
    GoldEpisode,
    forbid_network,
)
from sdar_envs.household.alfworld_pool import AlfworldPool, AlfworldWorkerError, shared_pool
from sdar_envs.household.backend import HouseholdBackend

# the real engine's public names, importable from the backend module as before the split
__all__ = [
    "DATA_ENV_VAR",
    "AlfworldEngine",
    "AlfworldHousehold",
    "AlfworldPool",
    "AlfworldWorkerError",
    "GoldEpisode",
    "catalog_object_type",
    "default_cache_dir",
    "forbid_network",
    "gold_path_eval",
    "list_games",
    "parse_task_text",
    "resolve_data_root",
    "shared_pool",
    "task_type_of",
]


class AlfworldHousehold(HouseholdBackend):
    """The real ALFWorld engine behind `HouseholdEnv(backend="alfworld")`.

    data_dir: json_2.1.1 tree or tarball (see `resolve_data_root`); None reads $SDAR_ALFWORLD_DATA.
    split: the split `reset()` without a task id draws from ("valid_seen" = the paper's evaluation
        set; "test" and "train" are aliases, see `resolve_split`). Resolved on that first draw, so a
        data tree without it still plays the task ids of the splits it has.
    workers: 1 runs the engine in this process; k > 1 pins this backend's session to one of
        k shared worker processes (`shared_pool`), so many envs in one process run in parallel.
    max_steps: force `done` after this many actions (ALFWorld's evaluation and the paper use
        50, as does the sim; None: only a win ends an episode).
    cache_dir: where a tarball is unpacked (default $SDAR_CACHE_DIR/alfworld or ~/.cache/sdar/alfworld).
    pool: an explicit `AlfworldPool` to use instead of the shared one.
    planner: how `expert_action` plans ("auto": domain recipe checked step by step with a
        fast-downward fallback; "fd": fast-downward only, optimal but up to minutes per game).
    """

    name = "alfworld"

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        split: str = "valid_seen",
        workers: int = 1,
        max_steps: int | None = 50,
        cache_dir: str | os.PathLike | None = None,
        pool: AlfworldPool | None = None,
        planner: str = "auto",
    ) -> None:
        self.root = resolve_data_root(data_dir, cache_dir)
        self._split = split
        self.max_steps = max_steps
        self._pool: AlfworldPool | None = None
        self._session: int | None = None
        self._engine: AlfworldEngine | None = None
        if pool is not None or workers > 1:
            self._pool = pool if pool is not None else shared_pool(workers, self.root)
            self._session = self._pool.open_session(max_steps=max_steps, planner=planner)
        else:
            self._engine = AlfworldEngine(self.root, max_steps=max_steps, planner=planner)
        self._next = 0
        self._task_text: str | None = None
        self._task_type: str | None = None
        self._goal_object: str | None = None

    @property
    def split(self) -> str:
        """The split directory `reset()` without a task id draws from (an error naming the splits
        present when the data tree lacks it)."""
        return resolve_split(self.root, self._split)

    def _call(self, method: str, *args: Any) -> Any:
        if self._engine is not None:
            with ENGINE_LOCK:
                return getattr(self._engine, method)(*args)
        if self._pool is None or self._session is None:
            raise RuntimeError("this ALFWorld backend is closed; create a new one")
        return self._pool.call(self._session, method, *args)

    def task_ids(self, split: str = "test") -> list[str]:
        return list_games(self.root, split)

    def reset(self, task_id: str | None = None, seed: int | None = None) -> EnvStep:
        if task_id is None:
            games = list_games(self.root, self.split)
            if seed is not None:
                task_id = random.Random(seed).choice(games)
            else:
                # no seed: walk the split in order, so repeated resets cover every game
                task_id = games[self._next % len(games)]
                self._next += 1
        else:
            self._check_game(task_id)
        out = self._call("reset", task_id)
        self._task_text = out.metadata["task"]
        self._task_type = out.metadata["task_type"]
        self._goal_object = self._call("goal_object_type")
        return out

    def _check_game(self, task_id: str) -> None:
        """A KeyError (an unknown task: the env server's 404) unless `task_id` names a game file
        under the data root; checked here, before an engine (maybe in a worker) sees it."""
        if not isinstance(task_id, str) or not task_id or len(task_id) > MAX_TASK_ID_CHARS or "\0" in task_id:
            shown = task_id[:80] + "..." if isinstance(task_id, str) and len(task_id) > 80 else task_id
            raise KeyError(
                f"no ALFWorld game {shown!r}: a task id is a game path from task_ids(split), "
                f"at most {MAX_TASK_ID_CHARS} characters"
            )
        path = self.root / task_id
        try:
            inside = path.resolve().is_relative_to(self.root.resolve()) and not Path(task_id).is_absolute()
            found = inside and path.is_file()
        except (OSError, ValueError, RuntimeError):  # too long a name, a symlink loop
            found = False
        if not found:
            shown = task_id if len(task_id) <= 200 else task_id[:200] + "..."
            raise KeyError(f"no ALFWorld game {shown!r} under the data root; task ids come from task_ids(split)")

    def goal_object_type(self) -> str | None:
        return self._goal_object

    def step(self, action: str) -> EnvStep:
        if self._task_type is None:
            raise RuntimeError("step() before reset(); call reset() first")
        return self._call("step", action)

    @property
    def task_text(self) -> str:
        if self._task_text is None:
            raise RuntimeError("no episode yet; call reset() first")
        return self._task_text

    @property
    def task_type(self) -> str:
        if self._task_type is None:
            raise RuntimeError("no episode yet; call reset() first")
        return self._task_type

    def expert_action(self) -> str:
        return self._call("expert_action")

    def plan(self) -> list[str]:
        """The full remaining gold path from the current state."""
        return self._call("plan")

    def close(self) -> None:
        if self._pool is not None and self._session is not None:
            self._pool.close_session(self._session)
            self._session = None
        if self._engine is not None:
            self._engine.close()
            self._engine = None


def gold_path_eval(
    data_dir: str | os.PathLike | None = None,
    split: str = "valid_seen",
    workers: int = 2,
    limit: int | None = None,
    max_steps: int = 50,
    progress: Callable[[GoldEpisode], None] | None = None,
    planner: str = "auto",
    job_timeout: float = 900.0,
) -> tuple[list[GoldEpisode], float]:
    """Play every game of `split` (first `limit`) along the gold path over `workers`.

    Returns the episodes and the wall-clock seconds; the win rate is the fraction won. With
    workers > 1 a game running past `job_timeout` seconds counts as lost (its worker is
    replaced); in-process (workers=1) there is no timeout.
    """
    root = resolve_data_root(data_dir)
    games = list_games(root, split)[:limit]
    t0 = time.perf_counter()
    if workers <= 1:
        engine = AlfworldEngine(root, planner=planner)
        episodes = []
        try:
            for task_id in games:
                episode = engine.gold_episode(task_id, max_steps)
                episodes.append(episode)
                if progress is not None:
                    progress(episode)
        finally:
            engine.close()
    else:
        with AlfworldPool(workers=workers, root=root) as pool:
            episodes = pool.gold_episodes(
                games,
                max_steps=max_steps,
                progress=progress,
                job_timeout=job_timeout,
                planner=planner,
            )
    return episodes, time.perf_counter() - t0
