"""Sim-vs-engine fidelity: each generated sim problem is also written as an ALFWorld game, both play
the same actions (sim gold path, planner path, seeded random walks), and every step is compared.
The records of the comparison and the agreement rates over them are in household/fidelity_report.py."""

from __future__ import annotations

import random
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sdar_envs.household.alfworld_engine import AlfworldEngine
from sdar_envs.household.alfworld_pool import AlfworldPool
from sdar_envs.household.backend import TASK_TYPES
from sdar_envs.household.fidelity_report import (
    FidelityReport,
    ProblemResult,
    StepCompare,
    aggregate,
)
from sdar_envs.household.pddl import scene_from_sim, write_game
from sdar_envs.household.sim import SimHousehold, SimProblem, generate_problem, make_task_id

# verbs whose malformed or inapplicable variants the walks try, to compare failure handling
_INVALID_FORMS = (
    "go to {r}",
    "open {r}",
    "take {o} from {r}",
    "move {o} to {r}",
    "heat {o} with {r}",
    "cool {o} with {r}",
    "clean {o} with {r}",
    "use {o}",
    "examine {o}",
    "put {o} in {r}",
    "dance",
)
_LIST = re.compile(r"(you see |you are carrying: )(.*?)(\.(?:\s|$))")
_SPACES = re.compile(r"\s+")


@dataclass
class FidelityConfig:
    """What to compare.

    num_problems: sim problems to generate (task types cycle through `task_types`).
    difficulty: sim difficulty preset (or dict) the problems are drawn at.
    walks: seeded random walks per problem (besides the sim gold path and the planner path).
    walk_steps: length of each random walk.
    invalid_prob: chance a walk step tries an action that is not admissible (failure handling).
    seed: first problem seed (test seeds start at 900_000) and random-walk seed.
    task_types: the task types to cover.
    engine_gold: also replay the engine's planner path in the sim.
    max_examples: differences kept verbatim per kind, for the report.
    """

    num_problems: int = 12
    difficulty: Any = "default"
    walks: int = 2
    walk_steps: int = 25
    invalid_prob: float = 0.15
    seed: int = 900_000
    task_types: tuple[str, ...] = TASK_TYPES
    engine_gold: bool = True
    max_examples: int = 5


def normalize_observation(text: str) -> str:
    """Lower case, single spaces, and the items of every 'you see ...' list sorted.

    Exact comparison catches any wording change; this form forgives only list order and
    whitespace, so a difference that survives it is a real difference in content.
    """
    text = _SPACES.sub(" ", text.strip().lower())

    def _sort(m: re.Match[str]) -> str:
        items = [i.strip() for i in re.split(r",\s*(?:and\s+)?", m.group(2)) if i.strip()]
        return m.group(1) + ", ".join(sorted(items)) + m.group(3)

    return _LIST.sub(_sort, text)


def _invalid_action(rng: random.Random, sim_game: Any, admissible: set[str]) -> str:
    """A plausible action that is not admissible now (None-safe for empty rooms)."""
    for _ in range(20):
        form = rng.choice(_INVALID_FORMS)
        action = form.format(
            r=rng.choice(sim_game.rname), o=rng.choice(sim_game.oname or ["apple 1"])
        )
        if action not in admissible:
            return action
    return "dance"


def compare_problem(
    engine: Any,
    problem_dict: dict[str, Any],
    cfg_dict: dict[str, Any],
    game_dir: str,
    engine_problem_dict: dict[str, Any] | None = None,
) -> ProblemResult:
    """Play one sim problem in the sim and in `engine` along every path of the config.

    Runs where `engine` lives (this process, or an `AlfworldPool` worker through `call_with_engine`).
    engine_problem_dict: give the engine a different problem than the sim (to show that the
    check notices a difference); None plays the same problem in both.
    """
    cfg = FidelityConfig(**{**cfg_dict, "task_types": tuple(cfg_dict["task_types"])})
    problem = SimProblem.from_dict(problem_dict)
    result = ProblemResult(problem.task_id, problem.task_type)
    try:
        engine_problem = (
            SimProblem.from_dict(engine_problem_dict) if engine_problem_dict else problem
        )
        game_path = write_game(scene_from_sim(engine_problem), game_dir)
        sim = SimHousehold(difficulty=cfg.difficulty)
        play = _PairedPlay(engine, sim, problem, str(game_path), result)
        play.sim_gold()
        if cfg.engine_gold:
            play.engine_gold()
        for k in range(cfg.walks):
            play.random_walk(k, cfg)
    except Exception as exc:  # noqa: BLE001 - one broken problem is a finding, not a crash
        import traceback

        result.error = (
            f"{problem.task_id}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
        )
    _keep_examples(result, cfg.max_examples)
    return result


class _PairedPlay:
    """The sim and the engine stepped side by side on one problem; every pair of steps is compared
    into `result` (a `StepCompare`, and a diff entry per kind of disagreement)."""

    def __init__(
        self, engine: Any, sim: Any, problem: Any, game_path: str, result: ProblemResult
    ) -> None:
        self.engine, self.sim, self.problem = engine, sim, problem
        self.game_path, self.result = game_path, result
        self.horizon = problem.max_steps

    def sim_gold(self) -> None:
        """The sim's gold path, replayed in the engine."""
        s, e = self._start("sim_gold")
        for _ in range(self.horizon):
            if s.done or e.metadata["won"]:
                break
            s, e = self._both("sim_gold", self.sim.expert_action())
        self.result.final_won["sim_gold"] = (bool(s.metadata["won"]), bool(e.metadata["won"]))

    def engine_gold(self) -> None:
        """The engine's planner path (omniscient: it walks straight to hidden objects), in the sim;
        fast-downward when the engine was built with planner="fd" (as run_fidelity does)."""
        s, e = self._start("engine_gold")
        plan = self.engine.plan()
        for action in plan[: self.horizon]:
            s, e = self._both("engine_gold", action)
            if s.done or e.metadata["won"]:
                break
        self.result.final_won["engine_gold"] = (bool(s.metadata["won"]), bool(e.metadata["won"]))

    def random_walk(self, k: int, cfg: FidelityConfig) -> None:
        """Seeded random walk `k` over the actions both accept, some inadmissible ones mixed in."""
        rng = random.Random(f"fidelity|{cfg.seed}|{self.problem.task_id}|{k}")
        path = f"walk{k}"
        s, e = self._start(path)
        for _ in range(cfg.walk_steps):
            if s.done or e.metadata["won"]:
                break
            sa, ea = set(s.metadata["admissible_actions"]), set(e.metadata["admissible_actions"])
            if rng.random() < cfg.invalid_prob:
                action = _invalid_action(rng, self.sim.game, sa | ea)
            else:
                shared = sorted(sa & ea) or sorted(sa)
                action = rng.choice(shared)
            s, e = self._both(path, action)
        self.result.final_won[path] = (bool(s.metadata["won"]), bool(e.metadata["won"]))

    def _start(self, path: str) -> tuple[Any, Any]:
        s = self.sim.load(self.problem)
        t0 = time.perf_counter()
        e = self.engine.reset(self.game_path)
        self.result.engine_reset_s += time.perf_counter() - t0
        self._compare(path, "<reset>", s, e)
        return s, e

    def _both(self, path: str, action: str) -> tuple[Any, Any]:
        s = self.sim.step(action)
        t0 = time.perf_counter()
        e = self.engine.step(action)
        self.result.engine_step_s += time.perf_counter() - t0
        self.result.engine_steps += 1
        self._compare(path, action, s, e)
        return s, e

    def _compare(self, path: str, action: str, s: Any, e: Any) -> None:
        sa, ea = s.metadata["admissible_actions"], e.metadata["admissible_actions"]
        c = StepCompare(
            path=path,
            action=action,
            admissible=sorted(sa) == sorted(ea),
            observation=s.observation == e.observation,
            observation_norm=normalize_observation(s.observation)
            == normalize_observation(e.observation),
            won=bool(s.metadata["won"]) == bool(e.metadata["won"]),
            valid=bool(s.metadata["valid_action"]) == bool(e.metadata["valid_action"]),
            error_kind=s.metadata["error_kind"] == e.metadata["error_kind"],
            sim_valid=bool(s.metadata["valid_action"]),
            sim_error_kind=s.metadata["error_kind"],
        )
        self.result.steps.append(c)
        if not c.admissible:
            only_sim, only_engine = sorted(set(sa) - set(ea)), sorted(set(ea) - set(sa))
            self._note("admissible", path, action, only_sim, only_engine)
        if not c.observation:
            kind = "observation" if not c.observation_norm else "observation_order"
            self._note(kind, path, action, s.observation, e.observation)
        if not c.won:
            self._note("won", path, action, s.metadata["won"], e.metadata["won"])
        if not c.valid or not c.error_kind:
            self._note("error", path, action, s.metadata["error_kind"], e.metadata["error_kind"])

    def _note(self, kind: str, path: str, action: str, sim_value: Any, engine_value: Any) -> None:
        self.result.diffs.append(
            {
                "kind": kind,
                "path": path,
                "task_id": self.problem.task_id,
                "action": action,
                "sim": sim_value,
                "engine": engine_value,
            }
        )


def _keep_examples(result: ProblemResult, max_examples: int) -> None:
    """Keep the report small: at most `max_examples` differences of each kind, then one
    `_counts` entry with how many of each kind there were."""
    counts = Counter(d["kind"] for d in result.diffs)
    seen: Counter[str] = Counter()
    trimmed = []
    for d in result.diffs:
        seen[d["kind"]] += 1
        if seen[d["kind"]] <= max_examples:
            trimmed.append(d)
    result.diffs = trimmed
    result.diffs.append({"kind": "_counts", **dict(counts)})


def make_problems(cfg: FidelityConfig) -> list[dict[str, Any]]:
    """The sim problems of the check (dicts, so they travel to worker processes)."""
    unknown = [t for t in cfg.task_types if t not in TASK_TYPES]
    if unknown:
        raise ValueError(f"unknown task types {unknown}; choose from {', '.join(TASK_TYPES)}")
    problems = []
    for i in range(cfg.num_problems):
        task_type = cfg.task_types[i % len(cfg.task_types)]
        problems.append(
            generate_problem(make_task_id(task_type, cfg.seed + i), cfg.difficulty).to_dict()
        )
    return problems


def run_fidelity(
    cfg: FidelityConfig | None = None,
    workers: int = 1,
    game_dir: str | None = None,
    progress: Callable[[ProblemResult], None] | None = None,
) -> FidelityReport:
    """Generate the problems, play them in both backends, and aggregate the agreement rates.

    workers > 1 spreads problems over an `AlfworldPool` (one engine per worker process).
    game_dir: where the generated games go (a temporary directory when None).
    """
    cfg = cfg or FidelityConfig()
    t0 = time.perf_counter()
    problems = make_problems(cfg)
    cfg_dict = {**asdict(cfg), "task_types": list(cfg.task_types)}
    results: list[ProblemResult] = []
    with tempfile.TemporaryDirectory(prefix="sdar-fidelity-") as tmp:
        out = str(Path(game_dir) if game_dir else Path(tmp))
        if workers <= 1:
            # the planner path is fast-downward's own (cheap on generated rooms), not the recipe
            engine = AlfworldEngine(root=None, max_steps=None, planner="fd")
            for p in problems:
                r = compare_problem(engine, p, cfg_dict, out)
                results.append(r)
                if progress:
                    progress(r)
        else:
            with AlfworldPool(workers=workers) as pool:
                jobs = [(f"{__name__}:compare_problem", p, cfg_dict, out) for p in problems]
                for r in pool.imap_unordered("call_with_engine", jobs, planner="fd"):
                    results.append(r)
                    if progress:
                        progress(r)
    return aggregate(results, time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    """`python -m sdar_envs.household.fidelity --problems 24 --workers 2`: print the report."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=FidelityConfig.num_problems)
    parser.add_argument("--difficulty", default="default")
    parser.add_argument("--walks", type=int, default=FidelityConfig.walks)
    parser.add_argument("--walk-steps", type=int, default=FidelityConfig.walk_steps)
    parser.add_argument("--seed", type=int, default=FidelityConfig.seed)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the full report here")
    args = parser.parse_args(argv)
    cfg = FidelityConfig(
        num_problems=args.problems,
        difficulty=args.difficulty,
        walks=args.walks,
        walk_steps=args.walk_steps,
        seed=args.seed,
    )
    report = run_fidelity(
        cfg,
        workers=args.workers,
        progress=lambda r: print(f"  {r.task_id}: {len(r.steps)} steps", flush=True),
    )
    print(report.summary())
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report.to_dict(), fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
