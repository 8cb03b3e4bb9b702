"""Gold-path win rate and engine timings of the real ALFWorld backend on official games.

Run: SDAR_ALFWORLD_DATA=../shared/data/alfworld .venv/bin/python benchmarks/bench_alfworld.py --workers 2
--smoke plays one game in process, and where the games or the engine are missing says so and skips (exit 0).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter, defaultdict

from sdar_envs.household.alfworld_backend import GoldEpisode, gold_path_eval


def summarize(episodes: list[GoldEpisode], wall_s: float, workers: int) -> dict:
    """Win rate (overall and per task type) and timings of a gold-path evaluation."""
    n = len(episodes)
    steps = sum(e.steps for e in episodes)
    step_s = sum(e.step_s for e in episodes)
    by_type: dict[str, list[bool]] = defaultdict(list)
    for e in episodes:
        by_type[e.task_type].append(e.won)

    def stats(values: list[float]) -> dict:
        return {
            "mean": statistics.fmean(values),
            "median": statistics.median(values),
            "max": max(values),
        }

    return {
        "games": n,
        "won": sum(e.won for e in episodes),
        "win_rate": sum(e.won for e in episodes) / n if n else 0.0,
        "errors": [f"{e.task_id}: {e.error}" for e in episodes if e.error],
        "lost": [e.task_id for e in episodes if not e.won],
        "win_rate_by_type": {t: sum(w) / len(w) for t, w in sorted(by_type.items())},
        "games_by_type": {t: len(w) for t, w in sorted(by_type.items())},
        "gold_steps": stats([float(e.steps) for e in episodes]),
        "reset_s": stats([e.reset_s for e in episodes]),
        "plan_s": stats([e.plan_s for e in episodes]),
        "episode_s": stats([e.episode_s for e in episodes]),
        "steps_per_s_per_process": steps / step_s if step_s else 0.0,
        "wall_s": wall_s,
        "workers": workers,
        "games_per_min": 60.0 * n / wall_s if wall_s else 0.0,
        "planners": dict(Counter(e.planner for e in episodes)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-dir", default=None, help="json_2.1.1 tree or tarball (default: $SDAR_ALFWORLD_DATA)"
    )
    parser.add_argument("--split", default="valid_seen")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="only the first N games")
    parser.add_argument("--max-steps", type=int, default=50)
    parser.add_argument(
        "--planner",
        choices=("auto", "fd"),
        default="auto",
        help="auto: recipe + fast-downward fallback",
    )
    parser.add_argument(
        "--job-timeout", type=float, default=900.0, help="seconds per game before it counts as lost"
    )
    parser.add_argument(
        "--json", default=None, help="also write the summary and episodes to this file"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="one game in process; skip (exit 0) without games or engine"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.limit, args.workers = 1, 1
        try:
            from sdar_envs.household.alfworld_data import resolve_data_root

            resolve_data_root(args.data_dir)
            import alfworld  # noqa: F401 - the engine
        except (FileNotFoundError, ImportError) as exc:
            print(f"skipped: {exc}")
            return 0

    done = [0]

    def progress(e: GoldEpisode) -> None:
        """A line per game on stderr (progress); a lost game's line on stdout too, where the summary is."""
        done[0] += 1
        status = "won " if e.won else "LOST"
        line = (f"[{done[0]:4d}] {status} steps={e.steps:2d} reset={e.reset_s:5.2f}s plan={e.plan_s:6.2f}s "
                f"episode={e.episode_s:6.2f}s [{e.planner}] {e.task_id}" + (f"  error: {e.error}" if e.error else ""))
        print(line, file=sys.stderr, flush=True)
        if not e.won:
            print(line, flush=True)

    episodes, wall_s = gold_path_eval(
        args.data_dir,
        args.split,
        workers=args.workers,
        limit=args.limit,
        max_steps=args.max_steps,
        progress=progress,
        planner=args.planner,
        job_timeout=args.job_timeout,
    )
    summary = summarize(episodes, wall_s, args.workers)
    print(
        f"ALFWorld gold-path evaluation, split={args.split}, workers={args.workers}, planner={args.planner}"
    )
    print(f"  win rate        {summary['won']}/{summary['games']} = {summary['win_rate']:.3f}")
    for t, rate in summary["win_rate_by_type"].items():
        print(f"    {t:32s} {rate:.3f} ({summary['games_by_type'][t]} games)")
    for key in ("reset_s", "plan_s", "episode_s", "gold_steps"):
        s = summary[key]
        print(f"  {key:15s} mean {s['mean']:.2f}  median {s['median']:.2f}  max {s['max']:.2f}")
    print(f"  steps/s/process {summary['steps_per_s_per_process']:.1f}")
    print(f"  wall            {wall_s:.1f} s ({summary['games_per_min']:.1f} games/min)")
    print(f"  planners        {summary['planners']}")
    if summary["errors"]:
        print("  errors:", *summary["errors"], sep="\n    ")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {"summary": summary, "episodes": [e.__dict__ for e in episodes]}, fh, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
