"""`sdar envs ...`: serve a family, play it in the terminal, write expert trajectories, list families,
and fill the skills store. `register(subparsers)` is called by `sdar.cli`."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from sdar_envs.base import available_envs, make_env
from sdar_envs.expert import write_expert_trajectories
from sdar_envs.server.config import add_serve_arguments, options_from_args
from sdar_envs.skills_store import open_skills_store

_MAX_SHOWN_ACTIONS = 40  # a person reads a short list; the rest are still accepted


def register(subparsers: Any) -> None:
    envs = subparsers.add_parser("envs", help="environment servers, play, expert trajectories, skills store")
    envs.set_defaults(func=lambda _args: envs.print_help() or 0)
    sub = envs.add_subparsers(dest="envs_command", metavar="ENVS_COMMAND")

    serve = sub.add_parser("serve", help="serve one family over HTTP/WebSocket (OpenEnv protocol)")
    add_serve_arguments(serve)
    serve.set_defaults(func=_serve)

    play = sub.add_parser("play", help="play an environment in the terminal (stdin may be piped)")
    play.add_argument("--env", required=True, help="family: household, shop, searchqa")
    play.add_argument("--backend", default=None, help="the family's backend (e.g. sim, alfworld)")
    play.add_argument("--url", default=None, help="play against a running server instead of a local env")
    play.add_argument("--task-id", default=None, help="task to play (default: drawn with --seed)")
    play.add_argument("--seed", type=int, default=0, help="seed for drawing the task (default 0)")
    play.add_argument("--episodes", type=int, default=1, help="episodes to play in a row (default 1)")
    play.set_defaults(func=_play)

    expert = sub.add_parser("expert", help="write expert trajectories as JSONL")
    expert.add_argument("--env", required=True, help="family: household, shop, searchqa")
    expert.add_argument("--n", type=int, default=200, help="episodes (default 200)")
    expert.add_argument("--out", required=True, help="output .jsonl path")
    expert.add_argument("--backend", default=None, help="the family's backend (e.g. sim, alfworld)")
    expert.add_argument("--split", default="train", help="task split (default train)")
    expert.add_argument("--seed", type=int, default=0, help="seed for task order and resets (default 0)")
    expert.add_argument("--max-steps", type=int, default=200, help="cap per episode (default 200)")
    expert.set_defaults(func=_expert)

    lst = sub.add_parser("list", help="list the registered families and their task counts")
    lst.set_defaults(func=_list)

    skills = sub.add_parser("skills", help="the skills store: populate, get, list")
    skills.add_argument("action", choices=("populate", "get", "list"), help="what to do")
    skills.add_argument("--store", default="skills.db", help="skills.db, sqlite:///path.db or dynamodb://TABLE?region=..&endpoint_url=..")
    skills.add_argument("--env", default=None, help="family (needed by populate and get)")
    skills.add_argument("--key", default=None, help="retrieval key for get (default: general skills only)")
    skills.add_argument("--backend", default=None, help="the family's backend when populating")
    skills.set_defaults(func=_skills)


def _env_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {} if getattr(args, "backend", None) is None else {"backend": args.backend}


# ---- serve ----------------------------------------------------------------------------------
def _serve(args: argparse.Namespace) -> int:
    from sdar_envs.server.process import run_server

    options = options_from_args(args)
    print(f"sdar envs: serving {options.family} on http://{options.host}:{options.port} (WebSocket /ws, health /health)", flush=True)
    run_server(options)
    return 0


# ---- play -----------------------------------------------------------------------------------
def _show(out: Any, out_stream: TextIO, first: bool) -> list[str]:
    md = out.metadata
    if first and md.get("task"):
        print(f"\n== task {md.get('task_id')}: {md['task']} ({md.get('task_type')})", file=out_stream)
    print(f"\n{out.observation}", file=out_stream)
    if not first:
        # an accepted action can still be an error site (no progress): marked, but not invalid
        if not md.get("valid_action", True):
            flag = f"  [invalid: {md.get('error_kind')}]"
        else:
            flag = f"  [no progress: {md['error_kind']}]" if md.get("error_kind") else ""
        print(f"(reward {out.reward:g}, done {out.done}, won {md.get('won')}){flag}", file=out_stream)
    actions = list(md.get("admissible_actions") or [])
    if actions and not out.done:
        print("actions:", file=out_stream)
        for i, a in enumerate(actions[:_MAX_SHOWN_ACTIONS], 1):
            print(f"  {i:2d}. {a}", file=out_stream)
        if len(actions) > _MAX_SHOWN_ACTIONS:
            print(f"  ... and {len(actions) - _MAX_SHOWN_ACTIONS} more (type them out)", file=out_stream)
    return actions


def play_session(env: Any, *, task_id: str | None, seed: int, episodes: int, stdin: TextIO, stdout: TextIO) -> dict[str, int]:
    """Interactive loop over any object with reset/step (TextEnv or RemoteEnv).

    Input: a number picks that admissible action, other text is sent as the action;
    ':expert' shows the gold action (local envs), ':quit' or end of input stops.
    """
    played = won = 0
    for ep in range(episodes):
        out = env.reset(task_id=task_id, seed=seed + ep)
        actions = _show(out, stdout, first=True)
        while not out.done:
            print("> ", end="", file=stdout, flush=True)
            line = stdin.readline()
            if not line or line.strip() in (":quit", ":q"):
                print("\n(stopped)", file=stdout)
                return {"episodes": played, "won": won}
            text = line.strip()
            if not text:
                continue
            if text == ":expert":
                try:
                    print(f"expert: {env.expert_action()}", file=stdout)
                except (AttributeError, NotImplementedError):
                    print("no expert available here (remote or family without one)", file=stdout)
                continue
            if text.isdigit() and actions:
                idx = int(text)
                if not 1 <= idx <= len(actions):
                    print(f"pick 1..{len(actions)} or type an action", file=stdout)
                    continue
                text = actions[idx - 1]
            print(f"[action] {text}", file=stdout)
            out = env.step(text)
            actions = _show(out, stdout, first=False)
        played += 1
        won += bool(out.metadata.get("won"))
        print(f"== episode over: {'won' if out.metadata.get('won') else 'not won'}", file=stdout)
    return {"episodes": played, "won": won}


def _play(args: argparse.Namespace) -> int:
    if args.url:
        from sdar_envs.client import RemoteEnv

        env: Any = RemoteEnv(args.url, args.env)
    else:
        from sdar_envs.base import make_env

        env = make_env(args.env, **_env_kwargs(args))
    try:
        result = play_session(env, task_id=args.task_id, seed=args.seed, episodes=args.episodes, stdin=sys.stdin, stdout=sys.stdout)
    finally:
        env.close()
    print(f"played {result['episodes']} episode(s), won {result['won']}")
    return 0


# ---- expert ---------------------------------------------------------------------------------
def _expert(args: argparse.Namespace) -> int:
    kwargs = dict(seed=args.seed, split=args.split, max_steps=args.max_steps, **_env_kwargs(args))
    if sys.stderr.isatty():
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task(f"{args.env} expert", total=args.n)
            summary = write_expert_trajectories(
                args.env, args.n, args.out, progress=lambda done, _n: bar.update(task, completed=done), **kwargs
            )
    else:
        summary = write_expert_trajectories(args.env, args.n, args.out, **kwargs)
    print(summary.line())
    return 0


# ---- list -----------------------------------------------------------------------------------
def _list(_args: argparse.Namespace) -> int:
    for name in available_envs():
        try:
            env = make_env(name)
        except Exception as exc:  # a family that cannot load is reported, not fatal
            print(f"{name:10s} unavailable: {type(exc).__name__}: {exc}")
            continue
        try:
            counts = []
            for split in ("train", "test"):
                try:
                    counts.append(f"{split} {len(env.task_ids(split))}")
                except (NotImplementedError, KeyError, ValueError):
                    counts.append(f"{split} -")
            print(f"{name:10s} {type(env).__module__}.{type(env).__name__}  tasks: {', '.join(counts)}")
        finally:
            env.close()
    return 0


# ---- skills ---------------------------------------------------------------------------------
def _skills(args: argparse.Namespace) -> int:
    store = open_skills_store(args.store)
    try:
        if args.action == "list":
            for family, key in store.list(args.env):
                print(f"{family}\t{key}")
            return 0
        if args.env is None:
            print(f"sdar envs skills {args.action} needs --env FAMILY", file=sys.stderr)
            return 2
        if args.action == "populate":
            n = store.populate(args.env, **_env_kwargs(args))
            print(f"wrote {n} skill entries for {args.env} to {args.store}")
            return 0
        try:
            print(store.get(args.env, args.key))
        except KeyError as exc:
            print(exc.args[0], file=sys.stderr)
            return 1
        return 0
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    """`sdar-envs` (or python -m sdar_envs.cli): the `envs` subcommands without the rest of the `sdar`
    CLI, for an install of the env distribution alone. `sdar-envs serve ...` and `sdar-envs envs serve ...`
    both work, so the container arguments written for `sdar` (`envs serve ...`, as the Helm chart and the
    launch component pass them) run unchanged on the env-server image, whose entry point is `sdar-envs`."""
    argv = list(argv if argv is not None else sys.argv[1:])
    if argv[:1] == ["envs"]:
        argv = argv[1:]
    parser = argparse.ArgumentParser(prog="sdar-envs")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv) if argv[:1] == ["--version"] else parser.parse_args(["envs", *argv])
    if args.version:
        from sdar_envs import __version__

        print(__version__)
        return 0
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
