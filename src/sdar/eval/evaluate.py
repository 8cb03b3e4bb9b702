"""Success rate of a policy on a fixed list of held-out tasks, per task type, with a 95%
Wilson interval. The same task list is used for every arm and seed."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from sdar.agent.rollout import RolloutConfig, Trajectory, rollout
from sdar.progress import Progress


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate (well-behaved at 0 and 1, unlike Wald)."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass
class EvalResult:
    success: float
    ci95: tuple[float, float]
    n: int
    mean_reward: float
    mean_length: float
    invalid_rate: float
    per_type: dict[str, dict[str, Any]] = field(default_factory=dict)
    trajectories: list[Trajectory] = field(default_factory=list, repr=False)

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        out = {f"{prefix}/success": self.success, f"{prefix}/success_ci_low": self.ci95[0],
               f"{prefix}/success_ci_high": self.ci95[1], f"{prefix}/reward": self.mean_reward,
               f"{prefix}/episode_length": self.mean_length, f"{prefix}/invalid_rate": self.invalid_rate}
        for t, r in self.per_type.items():
            out[f"{prefix}/success/{t}"] = r["success"]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"success": self.success, "ci95": list(self.ci95), "n": self.n, "mean_reward": self.mean_reward,
                "mean_length": self.mean_length, "invalid_rate": self.invalid_rate, "per_type": self.per_type}


def episode_seed(sampling_seed: int, task_id: str, repeat: int) -> int:
    """The sampling seed of evaluation episode `repeat` of `task_id`: a stable hash (the same in every process and
    Python version), so an episode's draws depend on nothing else."""
    import hashlib

    digest = hashlib.sha256(f"{int(sampling_seed)}:{task_id}:{int(repeat)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2  # < 2**62, what torch.Generator.manual_seed takes


def evaluate(
    backend,
    tokenizer,
    env_factory: Callable[[], Any],
    task_ids: list[str],
    cfg: RolloutConfig,
    temperature: float = 0.4,
    episodes_per_task: int = 1,
    batch_episodes: int = 64,
    console: Any = None,
    sampling_seed: int | None = None,
) -> EvalResult:
    """Play every task `episodes_per_task` times at `temperature` (0 = greedy), `batch_episodes` at a time; the
    progress goes to `console` (`sdar.progress`: a bar on a terminal, in a log a line every tenth of the episodes
    as they end).

    Common random numbers: episode k of task t samples from its own generator, seeded by (sampling_seed, t, k)
    (`episode_seed`), so two policies evaluated at one sampling seed face the same draws on each episode, whatever
    the other episodes do; their paired difference then measures the policies. sampling_seed None: one draw of the
    global RNG (seed it first, as the pipeline's evaluate step does).
    """
    import torch

    ecfg = replace(cfg, temperature=temperature)
    jobs = [t for t in task_ids for _ in range(episodes_per_task)]
    base = int(torch.randint(0, 2**62, (1,))) if sampling_seed is None else int(sampling_seed)
    seeds = [episode_seed(base, t, k) for t in task_ids for k in range(episodes_per_task)]
    trajs: list[Trajectory] = []
    with Progress("evaluating", len(jobs), "episodes", console=console) as progress:
        for start in range(0, len(jobs), batch_episodes):
            chunk, chunk_seeds = jobs[start : start + batch_episodes], seeds[start : start + batch_episodes]
            envs = [env_factory() for _ in chunk]
            shown = [0]  # episodes of this chunk already counted: the bar moves as episodes end, not per chunk

            def ended(_turns: int, finished: int) -> None:
                if finished > shown[0]:
                    progress.advance(finished - shown[0])
                    shown[0] = finished

            try:
                trajs += rollout(backend, tokenizer, envs, chunk, list(range(len(chunk))), ecfg, progress=ended,
                                 episode_seeds=chunk_seeds)
            finally:
                for e in envs:
                    e.close()
            if len(chunk) > shown[0]:
                progress.advance(len(chunk) - shown[0])  # episodes cut by the turn limit
    by_type: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_type[t.task_type].append(t)
    wins = sum(t.won for t in trajs)
    turns = [turn for t in trajs for turn in t.turns]
    per_type = {
        k: {"success": sum(t.won for t in v) / len(v), "n": len(v),
            "ci95": list(wilson_interval(sum(t.won for t in v), len(v)))}
        for k, v in sorted(by_type.items())
    }
    n = len(trajs)
    return EvalResult(
        success=wins / max(n, 1), ci95=wilson_interval(wins, n), n=n,
        mean_reward=sum(t.reward for t in trajs) / max(n, 1),
        mean_length=sum(t.length for t in trajs) / max(n, 1),
        invalid_rate=sum(not (x.valid and x.env_valid) for x in turns) / max(len(turns), 1),
        per_type=per_type, trajectories=trajs,
    )
