"""Load benchmark of the environment servers: N concurrent WebSocket sessions per family playing random
actions; prints steps/s and p50/p99 latency, and checks that no session is lost or sees another's episode.

    python benchmarks/bench_env_load.py [--families household shop searchqa] [--sessions 64]
        [--steps 200] [--duration 60] [--json results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import secrets
import sys
import time
from dataclasses import asdict, dataclass, field

from sdar_envs.base import EnvStep
from sdar_envs.client import AsyncRemoteEnv, EnvServerError, http_json
from sdar_envs.launcher import serve_in_background
from sdar_envs.server.config import ServerOptions

OPERATOR = secrets.token_urlsafe(32)  # lists the server's sessions for the cross-talk check
INVALID_RATE = 0.05  # share of deliberately invalid actions, so the error path is under load too


@dataclass
class FamilyResult:
    """One family's run. Latencies in milliseconds; `cross_talk` counts replies that named another
    session, task or step; `lost` counts sessions that failed or vanished from the server."""

    family: str
    sessions: int
    steps: int = 0
    resets: int = 0
    episodes_done: int = 0
    wall_s: float = 0.0
    steps_per_s: float = 0.0
    step_p50_ms: float = 0.0
    step_p99_ms: float = 0.0
    reset_p50_ms: float = 0.0
    reset_p99_ms: float = 0.0
    invalid_actions: int = 0
    cross_talk: int = 0
    lost: int = 0
    readback_mismatches: int = 0
    server_step_total: int = 0
    startup_s: float = 0.0
    problems: list[str] = field(default_factory=list)


def sample_action(rng: random.Random, out: EnvStep) -> str:
    """A random plausible action: an admissible one (placeholders filled from the task's words),
    a search/answer for free-text families, sometimes a deliberately invalid one."""
    if rng.random() < INVALID_RATE:
        return "xyzzy plugh"
    md = out.metadata
    words = re.findall(r"[A-Za-z0-9]+", md.get("task") or out.observation) or ["item"]
    phrase = " ".join(rng.sample(words, k=min(len(words), rng.randint(1, 4))))
    actions = md.get("admissible_actions") or []
    if actions:
        return rng.choice(actions).replace("<query>", phrase)
    if rng.random() < 0.7:
        return f"<search>{phrase}</search>"
    return f"<answer>{rng.choice(words)}</answer>"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


async def drive_session(i: int, url: str, task_ids: list[str], n_sessions: int, max_steps: int, deadline: float, res: FamilyResult,
                        step_ms: list[float], reset_ms: list[float]) -> tuple[AsyncRemoteEnv | None, list[EnvStep], int]:
    """Play random episodes on one session until its step budget or the deadline; check every reply."""
    rng = random.Random(i)
    env = AsyncRemoteEnv(url)
    episode: list[EnvStep] = []
    steps = 0
    try:
        await env.connect()
        sid = None
        k = 0
        while steps < max_steps and time.monotonic() < deadline:
            task = task_ids[(i + k * n_sessions) % len(task_ids)]
            k += 1
            t0 = time.perf_counter()
            out = await env.reset(task_id=task)
            reset_ms.append(1000 * (time.perf_counter() - t0))
            res.resets += 1
            sid = sid or out.metadata["session_id"]
            episode = [out]
            if (out.metadata["session_id"], out.metadata["task_id"], out.metadata["step"]) != (sid, task, 0):
                res.cross_talk += 1
                res.problems.append(f"session {i} reset {task} got {out.metadata['task_id']}/{out.metadata['step']}")
            while not out.done and steps < max_steps and time.monotonic() < deadline:
                action = sample_action(rng, out)
                t0 = time.perf_counter()
                out = await env.step(action)
                step_ms.append(1000 * (time.perf_counter() - t0))
                steps += 1
                episode.append(out)
                md = out.metadata
                res.invalid_actions += not md["valid_action"]
                if (md["session_id"], md["task_id"], md["step"]) != (sid, task, len(episode) - 1):
                    res.cross_talk += 1
                    res.problems.append(f"session {i} step {len(episode) - 1} of {task} got {md['task_id']}/{md['step']}")
            res.episodes_done += bool(out.done)
        return env, episode, steps
    except (EnvServerError, OSError, asyncio.TimeoutError) as exc:
        res.lost += 1
        res.problems.append(f"session {i} lost: {exc}")
        await env.close()
        return None, episode, steps


async def run_family(family: str, url: str, n_sessions: int, max_steps: int, duration_s: float, res: FamilyResult) -> None:
    task_ids = http_json("GET", f"{url}/tasks?split=test")["task_ids"]
    step_ms: list[float] = []
    reset_ms: list[float] = []
    start = time.monotonic()
    outcomes = await asyncio.gather(
        *(drive_session(i, url, task_ids, n_sessions, max_steps, start + duration_s, res, step_ms, reset_ms) for i in range(n_sessions))
    )
    res.wall_s = time.monotonic() - start
    res.steps = sum(steps for _, _, steps in outcomes)
    res.steps_per_s = res.steps / res.wall_s
    res.step_p50_ms, res.step_p99_ms = percentile(step_ms, 50), percentile(step_ms, 99)
    res.reset_p50_ms, res.reset_p99_ms = percentile(reset_ms, 50), percentile(reset_ms, 99)

    # every live session must still be on the server, with as many steps as its client took
    listed = {s["session_id"]: s for s in http_json("GET", f"{url}/sessions", token=OPERATOR)["sessions"]}
    res.server_step_total = sum(s["step_count"] for s in listed.values())
    rng = random.Random(0)
    for i, (env, episode, steps) in enumerate(outcomes):
        if env is None:
            continue
        sid = env.session_id
        if sid not in listed:
            res.lost += 1
            res.problems.append(f"session {i} ({sid}) is gone from the server")
            continue
        if listed[sid]["step_count"] != steps:
            res.cross_talk += 1
            res.problems.append(f"session {i}: server counted {listed[sid]['step_count']} steps, client {steps}")
        # state(t) read back over HTTP must be exactly what this session was sent at step t
        t = rng.randrange(len(episode))
        if await env.observation_at(t) != episode[t]:
            res.readback_mismatches += 1
            res.problems.append(f"session {i}: state({t}) differs from what step {t} returned")
    await asyncio.gather(*(env.close() for env, _, _ in outcomes if env is not None))


def bench_family(family: str, n_sessions: int, max_steps: int, duration_s: float) -> FamilyResult:
    res = FamilyResult(family=family, sessions=n_sessions)
    t0 = time.monotonic()
    n_max = max(256, n_sessions)
    opts = ServerOptions(max_sessions=n_max, max_sessions_per_client=n_max)  # every session comes from here
    url, handle = serve_in_background(family, options=opts, operator_token=OPERATOR)
    res.startup_s = time.monotonic() - t0
    with handle:
        asyncio.run(run_family(family, url, n_sessions, max_steps, duration_s, res))
        deadline = time.monotonic() + 10
        while (info := http_json("GET", f"{url}/info"))["active_sessions"] and time.monotonic() < deadline:
            time.sleep(0.1)
        if info["active_sessions"]:
            res.problems.append(f"{info['active_sessions']} sessions still open after every client closed")
        if info["sessions_created"] != n_sessions:
            res.problems.append(f"server created {info['sessions_created']} sessions for {n_sessions} clients")
    return res


def print_table(results: list[FamilyResult]) -> None:
    cols = ("family", "sessions", "steps", "episodes", "steps/s", "step p50 ms", "step p99 ms", "reset p50 ms", "cross-talk", "lost", "readback")
    rows = [
        (r.family, r.sessions, r.steps, r.episodes_done, f"{r.steps_per_s:.0f}", f"{r.step_p50_ms:.1f}", f"{r.step_p99_ms:.1f}",
         f"{r.reset_p50_ms:.1f}", r.cross_talk, r.lost, r.readback_mismatches)
        for r in results
    ]  # fmt: skip
    try:
        from rich.table import Table

        from sdar.console import make_console

        table = Table(title="environment server load")
        for c in cols:
            table.add_column(c, justify="left" if c == "family" else "right")
        for row in rows:
            table.add_row(*map(str, row))
        make_console(min_width=132).print(table)
    except ImportError:
        print(" | ".join(cols))
        for row in rows:
            print(" | ".join(map(str, row)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", default=["household", "shop", "searchqa"], help="families to load")
    p.add_argument("--sessions", type=int, default=64, help="concurrent sessions per family (default 64)")
    p.add_argument("--steps", type=int, default=200, help="step budget per session (default 200)")
    p.add_argument("--duration", type=float, default=60.0, help="time budget per family in seconds (default 60)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    if args.sessions < 1 or args.steps < 1:
        p.error("--sessions and --steps must be >= 1")
    results = []
    for family in args.families:
        print(f"{family}: {args.sessions} sessions x {args.steps} steps (at most {args.duration:g} s) ...", flush=True)
        results.append(bench_family(family, args.sessions, args.steps, args.duration))
    print_table(results)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"host: {os.cpu_count()} CPUs, load average {load:.1f}; client and server share them")
    failed = [r for r in results if r.cross_talk or r.lost or r.readback_mismatches or r.problems]
    for r in failed:
        print(f"{r.family}: {len(r.problems)} problem(s), first: {r.problems[:3]}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([asdict(r) for r in results], fh, indent=2)
    print("OK: no session lost, no cross-talk" if not failed else "FAILED: see problems above")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
