"""`sdar teachers serve`: the local teacher pool (rule experts and policy checkpoints) as an
OpenAI-compatible server; `sdar teachers replay`: a rollout file's turns to DPO pairs (channel 3)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sdar.console import make_console
from sdar.lifecycle import Terminated, ending_on_signals
from sdar.replay.config import DEFAULT_LOCAL_EXPERTS
from sdar.replay.pairs import build_pairs, write_pairs


def _cmd_serve(args: argparse.Namespace) -> int:
    from sdar.replay.server import serve_local_pool

    console = make_console(stderr=True)
    experts = args.expert if args.expert is not None else list(DEFAULT_LOCAL_EXPERTS)
    try:
        ctx = serve_local_pool(args.family, policies=args.policy or (), experts=experts, host=args.host,
                               port=args.port)
        pool = ctx.__enter__()
    except (ValueError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        return 2

    try:
        # the server is a thread of this process: SIGTERM and SIGHUP stop it as Ctrl-C does, port released
        with ending_on_signals():
            print(pool.url, flush=True)
            for name in pool.models:
                print(f"  model: {name}", flush=True)
            console.print(f"serving {len(pool.models)} {args.family} teacher(s); as replay.teachers:\n" + "\n".join(
                f"  - {{name: {m}, base_url: {pool.url}, model: {m}}}" for m in pool.models)
                + "\nCtrl-C (or SIGTERM) stops it.")
            while pool._thread is not None and pool._thread.is_alive():
                time.sleep(0.5)
            return 1  # the server thread ended on its own
    except KeyboardInterrupt:
        return 0
    except Terminated as exc:
        print(f"sdar teachers serve: {exc}; the teacher server at {pool.url} is stopped", flush=True)
        return exc.code
    finally:
        ctx.__exit__(None, None, None)


def _family_of(path: Path) -> str:
    with path.open() as fh:
        for line in fh:
            if line.strip():
                return json.loads(line)["family"]
    raise SystemExit(f"{path} holds no trajectories")


def _cmd_replay(args: argparse.Namespace) -> int:
    from rich.table import Table

    from sdar.agent.prompts import PromptBuilder
    from sdar.config import load_config
    from sdar.eval.report import read_trajectories
    from sdar.replay.server import open_teacher_pool

    console = make_console(stderr=True)
    src = Path(args.trajectories)
    if not src.is_file():
        console.print(f"[red]error:[/red] no trajectory file at {src}; write one with the rollout step "
                      "(sdar.eval.report.write_trajectories)")
        return 2
    out = Path(args.out)
    try:
        family = _family_of(src)
        overrides = {"env.family": family}
        if args.teacher_pool:
            from sdar.replay.config import load_pool_file

            overrides.update({f"replay.{k}": v for k, v in load_pool_file(args.teacher_pool).items()})
        cfg = load_config(args.config, overrides)
        trajs = read_trajectories(src)
        builder = PromptBuilder(family, history=cfg.rollout.history, show_admissible=cfg.rollout.show_admissible)
        with open_teacher_pool(cfg.replay, family, cache_dir=out.parent / "replay-cache") as pool:
            console.print(f"replaying {sum(len(t.turns) for t in trajs)} turns of {len(trajs)} {family} "
                          f"trajectories to {', '.join(e.name for e in pool.endpoints)}")
            pairs, stats = build_pairs(trajs, pool, builder, family, min_agree=cfg.replay.min_agree)
    except (ValueError, OSError, KeyError) as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        return 2
    write_pairs(out, pairs)
    stats_path = out.with_name(out.stem + ".stats.json")
    stats_path.write_text(json.dumps(stats, indent=2, sort_keys=True))
    table = Table(title=f"teacher replay: {len(pairs)} DPO pairs")
    for col in ("turns", "agreement", "student agrees", "pairs/traj", "calls", "cache hits", "failures", "cost $"):
        table.add_column(col, justify="right")
    g = stats.get
    table.add_row(f"{g('replay/turns', 0):.0f}", f"{g('replay/agreement_rate', 0):.2f}",
                  f"{g('replay/student_agrees_rate', 0):.2f}", f"{g('replay/pairs_per_trajectory', 0):.2f}",
                  f"{g('replay/calls', 0):.0f}", f"{g('replay/cache_hits', 0):.0f}", f"{g('replay/failures', 0):.0f}",
                  f"{g('replay/cost_usd', 0):.4f}")
    console.print(table)
    if g("replay/budget_exhausted"):
        console.print("[yellow]the teacher budget was reached: later turns got no replies (raise replay.budget_usd)")
    print(json.dumps({"pairs": str(out), "stats": str(stats_path), "n_pairs": len(pairs)}))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("teachers", help="the N-teacher pool of Composer channel 3 (trace replay)")
    sub = p.add_subparsers(dest="teachers_command", metavar="SUBCOMMAND", required=True)
    s = sub.add_parser("serve", help="serve rule experts and policy checkpoints as OpenAI-compatible teachers",
                       description="Serve the local teacher pool on HOST:PORT (GET /v1/models, POST "
                                   "/v1/chat/completions) until Ctrl-C; prints the base URL and the model names.")
    s.add_argument("--family", required=True, choices=("household", "shop", "searchqa"), help="environment family")
    s.add_argument("--policy", action="append", metavar="NAME=PATH[:skills]",
                   help="serve a checkpoint (repeatable); ':skills' prepends the task's privileged skills")
    s.add_argument("--expert", action="append", metavar="VARIANT",
                   help="serve a rule-expert variant (repeatable; default: the replay.local_experts default)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8300, help="port (default 8300; 0 = any free one)")
    s.set_defaults(func=_cmd_serve)
    r = sub.add_parser("replay", help="ask the teacher pool about every turn of a rollout file; write DPO pairs",
                       description="Replay each turn of a trajectory file (sdar.eval.report.write_trajectories) to the "
                                   "teachers of the config's `replay` section (none: the local pool) and write the "
                                   "pairs as JSONL (sdar.replay.write_pairs) plus <out>.stats.json.")
    r.add_argument("--trajectories", required=True, metavar="FILE.jsonl", help="the rollout's trajectories")
    r.add_argument("--config", default=None, help="training YAML whose `replay` and `rollout.history` apply "
                                                  "(default: the defaults for the file's family)")
    r.add_argument("--teacher-pool", default=None, metavar="POOL.yaml",
                   help="the pool's `replay` settings (like configs/teachers/example.yaml); default: the config's")
    r.add_argument("--out", default="replay-pairs.jsonl", help="where the pairs go (default replay-pairs.jsonl)")
    r.set_defaults(func=_cmd_replay)
