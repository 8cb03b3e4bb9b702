"""Expert trajectories: play a family's gold policy (`TextEnv.expert_action`) and write shared JSONL.

One episode per line: {family, backend, task_id, task_type, task, skills_key, won, reward, steps, final_observation};
the supervised warm start and the checks read these files back with `read_expert_trajectories`.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdar_envs.base import TextEnv, make_env

RECORD_KEYS = ("family", "backend", "task_id", "task_type", "task", "skills_key", "won", "reward", "steps", "final_observation")
STEP_KEYS = ("observation", "admissible_actions", "action", "reward", "done")


@dataclass
class ExpertSummary:
    """What `write_expert_trajectories` wrote.

    episodes: lines written; won: episodes the expert solved; steps: actions over all episodes;
    seconds: wall time of the whole run; path: the JSONL file.
    """

    family: str
    backend: str
    path: str
    episodes: int
    won: int
    steps: int
    seconds: float

    @property
    def traj_per_s(self) -> float:
        return self.episodes / self.seconds if self.seconds > 0 else float("inf")

    @property
    def win_rate(self) -> float:
        return self.won / self.episodes if self.episodes else 0.0

    @property
    def mean_steps(self) -> float:
        return self.steps / self.episodes if self.episodes else 0.0

    def line(self) -> str:
        return (
            f"{self.episodes} {self.family}/{self.backend} expert episodes -> {self.path}: won {self.won} "
            f"({100 * self.win_rate:.1f}%), {self.mean_steps:.1f} steps/episode, {self.traj_per_s:.1f} trajectories/s"
        )


def _backend_name(env: TextEnv, env_kwargs: dict[str, Any]) -> str:
    if env_kwargs.get("backend") is not None:
        return str(env_kwargs["backend"])
    name = getattr(env, "backend_name", None)
    if isinstance(name, str):
        return name
    backend = getattr(env, "backend", None)
    return backend if isinstance(backend, str) else "default"


def _optional(get: Callable[[], Any]) -> Any:
    try:
        return get()
    except NotImplementedError:
        return None


def play_expert_episode(env: TextEnv, *, task_id: str | None, seed: int | None, max_steps: int, family: str, backend: str) -> dict[str, Any]:
    """One episode of the expert policy as a JSONL record (see the module docstring)."""
    out = env.reset(task_id=task_id, seed=seed)
    md = out.metadata
    record: dict[str, Any] = {
        "family": family,
        "backend": backend,
        "task_id": md.get("task_id", task_id),
        "task_type": md.get("task_type"),
        "task": md.get("task") or _optional(lambda: env.task_text),
        "skills_key": _optional(env.skills_key),
    }
    steps: list[dict[str, Any]] = []
    total = 0.0
    won = bool(md.get("won", False))
    done = out.done
    observation = out.observation
    admissible = list(md.get("admissible_actions") or [])
    while not done and len(steps) < max_steps:
        action = env.expert_action()
        nxt = env.step(action)
        steps.append(
            {"observation": observation, "admissible_actions": admissible, "action": action, "reward": float(nxt.reward), "done": bool(nxt.done)}
        )
        total += float(nxt.reward)
        won = bool(nxt.metadata.get("won", False))
        done = nxt.done
        observation = nxt.observation
        admissible = list(nxt.metadata.get("admissible_actions") or [])
    record.update(won=won, reward=total, steps=steps, final_observation=observation)
    return record


def write_expert_trajectories(
    family: str,
    n: int,
    out_path: str | Path,
    seed: int = 0,
    split: str = "train",
    *,
    max_steps: int = 200,
    progress: Callable[[int, int], None] | None = None,
    **env_kwargs: Any,
) -> ExpertSummary:
    """Play `n` expert episodes of `family` and write them to `out_path` as JSONL.

    Tasks: the split's task ids in a `seed`-shuffled order (cycled when n exceeds them), episode i
    reset with seed `seed + i`; families without a fixed task list draw tasks from that seed.
    max_steps caps an episode whose expert does not finish (recorded with won = false).
    progress(done, total) is called after each episode. Returns counts and trajectories/s.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1 episodes, got {n}")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    env = make_env(family, **env_kwargs)
    try:
        backend = _backend_name(env, env_kwargs)
        try:
            ids: list[str] | None = list(env.task_ids(split))
        except NotImplementedError:
            ids = None
        if ids is not None and not ids:
            raise ValueError(f"family {family!r} has no tasks in split {split!r}")
        if ids is not None:
            random.Random(seed).shuffle(ids)
        won = steps = 0
        tmp = out_path.with_name(out_path.name + ".tmp")
        with tmp.open("w") as fh:
            for i in range(n):
                task_id = ids[i % len(ids)] if ids else None
                rec = play_expert_episode(env, task_id=task_id, seed=seed + i, max_steps=max_steps, family=family, backend=backend)
                fh.write(json.dumps(rec) + "\n")
                won += bool(rec["won"])
                steps += len(rec["steps"])
                if progress is not None:
                    progress(i + 1, n)
        os.replace(tmp, out_path)  # a reader never sees a half-written file
    finally:
        env.close()
    return ExpertSummary(family, backend, str(out_path), n, won, steps, time.perf_counter() - start)


def validate_trajectory(rec: dict[str, Any], where: str = "record") -> None:
    """Raise ValueError naming the first way `rec` departs from the shared format."""
    missing = [k for k in RECORD_KEYS if k not in rec]
    if missing:
        raise ValueError(f"{where} lacks {missing}; expert records carry {list(RECORD_KEYS)}")
    if not isinstance(rec["won"], bool) or not isinstance(rec["reward"], (int, float)):
        raise ValueError(f"{where}: 'won' must be a bool and 'reward' a number")
    if not isinstance(rec["steps"], list):
        raise ValueError(f"{where}: 'steps' must be a list")
    for j, step in enumerate(rec["steps"]):
        lacking = [k for k in STEP_KEYS if k not in step]
        if lacking:
            raise ValueError(f"{where} step {j} lacks {lacking}; steps carry {list(STEP_KEYS)}")


def iter_expert_trajectories(path: str | Path) -> Iterator[dict[str, Any]]:
    """Validated records of a trajectory file, one per line."""
    with Path(path).open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno} is not JSON ({exc}); expected one episode per line") from exc
            validate_trajectory(rec, f"{path}:{lineno}")
            yield rec


def read_expert_trajectories(path: str | Path) -> list[dict[str, Any]]:
    return list(iter_expert_trajectories(path))
