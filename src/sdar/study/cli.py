"""`sdar study run|status|report`: the evidence study as one resumable command (see sdar.study.runner)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from sdar.console import make_console
from sdar.tracking.view import how_to_open

DEFAULT_RESULTS = "docs/results"
DEFAULT_DOC = "docs/results.md"


def _default_work() -> str:
    from sdar.models.cache import cache_root

    return str(cache_root() / "study")


def _only(spec: str | None):
    """`family=household,arm=sdar,seed=0` -> a cell filter (each key optional, values split by '+')."""
    if not spec:
        return None
    want: dict[str, set[str]] = {}
    for part in spec.split(","):
        key, _, value = part.partition("=")
        if key not in ("family", "arm", "seed") or not value:
            raise SystemExit(f"--only {spec!r}: give key=value pairs with keys family, arm, seed "
                             "(e.g. family=household,seed=0+1)")
        want[key] = set(value.split("+"))
    return lambda c: all(str(getattr(c, k)) in v for k, v in want.items())


def _cmd_run(args: argparse.Namespace) -> int:
    from sdar.study.analysis import against_missing, write_report
    from sdar.study.runner import StaleResult, StudyRunner
    from sdar.study.spec import load_spec

    console = make_console(stderr=True)
    spec = load_spec(args.spec)
    runner = StudyRunner(spec, args.results, args.work or _default_work(), console=console, commit=args.commit,
                         redo_stale=args.redo_stale)
    missing = against_missing(runner.results, spec.against) if args.report and spec.against else None
    if missing:  # said before hours of training, not only at the report after them
        console.print(f"[yellow]warning:[/yellow] {missing}; until then the report leaves that table out",
                      soft_wrap=True)
    try:
        trained = runner.run(only=_only(args.only), max_runs=args.max_runs)
    except StaleResult as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        return 2
    console.print(f"{len(trained)} run(s) trained now; results in {runner.results}")
    if args.report:
        write_report(runner.results, args.report, without_missing=True)
        console.print(f"report written to {args.report}")
        runner.commit_files([Path(args.report), runner.results / "figures"], f"study {spec.name}: report")
    _print_view(runner, console)
    return 0


def _print_view(runner, console) -> None:
    """Where the study's runs open side by side in MLflow: the command that serves a local store and the URL."""
    try:
        view = runner.view()
    except Exception as exc:  # noqa: BLE001 - the study's results are written; only the view's link is missing
        console.print(f"MLflow: the study's view could not be saved ({type(exc).__name__}: {str(exc)[:200]})",
                      soft_wrap=True, markup=False, highlight=False)
        return
    if view is None:
        return
    serve = how_to_open(view, "the study's store")
    console.print(f"MLflow: the study's runs side by side (experiment 'study-{runner.spec.name}'): {serve}",
                  soft_wrap=True, markup=False, highlight=False)
    console.print(f"  {view['view_url']}", soft_wrap=True, markup=False, highlight=False)


def _cmd_transfer(args: argparse.Namespace) -> int:
    from sdar.study.runner import StudyRunner
    from sdar.study.spec import load_spec

    console = make_console(stderr=True)
    runner = StudyRunner(load_spec(args.spec), args.results, args.work or _default_work(), console=console,
                         commit=args.commit)
    written = runner.transfer(backend=args.backend, split=args.split, only=_only(args.only), games=args.games,
                              env_workers=args.env_workers)
    console.print(f"{len(written)} evaluation(s) on {args.backend} {args.split} written under {runner.results}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from rich.table import Table

    from sdar.study.runner import StudyRunner
    from sdar.study.spec import load_spec

    runner = StudyRunner(load_spec(args.spec), args.results, args.work or _default_work())
    rows = runner.status()
    table = Table(title=f"study {runner.spec.name}: {sum(r['state'] == 'done' for r in rows)}/{len(rows)} runs done")
    for col in ("run", "state", "evaluated at", "checkpoint at", "wall min"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["cell"], r["state"], ",".join(map(str, r["evaluated"])) or "-",
                      f"step {r['checkpoint']}" if r["checkpoint"] is not None else "-",
                      f"{r['wall_s'] / 60:.1f}" if r["wall_s"] else "-")
    make_console().print(table)
    if args.json:
        print(json.dumps(rows))
    _print_view(runner, make_console())
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from sdar.study.analysis import write_report

    results = Path(args.results) / args.study if args.study else Path(args.results)
    try:
        block = write_report(results, args.doc, against=args.against)
    except (FileNotFoundError, ValueError) as exc:  # no results (here or of the study it is compared against), or
        raise SystemExit(f"error: {exc}") from None  # results that cannot be paired: one line, no traceback
    print(block)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("study", help="arms x seeds x families as one resumable job, and its analysis")
    s = p.add_subparsers(dest="study_command", metavar="STUDY_COMMAND")
    r = s.add_parser("run", help="train and evaluate every pending run of a study spec (finished runs are skipped)")
    r.add_argument("--spec", required=True, help="study spec YAML, e.g. configs/study/evidence.yaml")
    r.add_argument("--results", default=DEFAULT_RESULTS, help="results root (JSON per run, meant to be committed)")
    r.add_argument("--work", default=None, help="checkpoints and MLflow store (default: <sdar cache>/study)")
    r.add_argument("--only", help="run a subset: family=household,arm=sdar+grpo,seed=0")
    r.add_argument("--max-runs", type=int, help="stop after training this many runs")
    r.add_argument("--commit", action="store_true", help="git-commit each result file as it is written")
    r.add_argument("--redo-stale", action="store_true",
                   help="re-run results made under another config instead of stopping with an error")
    r.add_argument("--report", nargs="?", const=DEFAULT_DOC, default=None,
                   help=f"regenerate the study's block of this markdown file at the end (default {DEFAULT_DOC})")
    r.set_defaults(func=_cmd_run)
    t = s.add_parser("transfer", help="household: the warm starts and finished runs on the real ALFWorld games "
                     "(all of a split, student and teacher, per task type, where episodes fail)")
    t.add_argument("--spec", required=True)
    t.add_argument("--results", default=DEFAULT_RESULTS)
    t.add_argument("--work", default=None)
    t.add_argument("--backend", default="alfworld", help="the household backend to evaluate on")
    t.add_argument("--split", default="valid_seen", help="its split (all of its games are played)")
    t.add_argument("--only", help="a subset of runs: family=household,arm=sdar,seed=0")
    t.add_argument("--games", type=int, help="play only this many games (stratified over task types; default all)")
    t.add_argument("--env-workers", type=int, default=min(4, os.cpu_count() or 1),
                   help="engine processes the episodes are spread over (default: the cores, at most 4; 1 = in this "
                        "process); the same episodes either way")
    t.add_argument("--commit", action="store_true", help="git-commit each result file as it is written")
    t.set_defaults(func=_cmd_transfer)
    st = s.add_parser("status", help="which runs of a study are done, partial (some steps evaluated), started "
                                     "(trained to a checkpoint) or pending, with each run's newest checkpoint")
    st.add_argument("--spec", required=True)
    st.add_argument("--results", default=DEFAULT_RESULTS)
    st.add_argument("--work", default=None)
    st.add_argument("--json", action="store_true", help="also print the rows as JSON")
    st.set_defaults(func=_cmd_status)
    rep = s.add_parser("report", help="tables (bootstrap CIs, paired differences) and curves from a study's results")
    rep.add_argument("--results", default=DEFAULT_RESULTS, help="results root, or a study's directory")
    rep.add_argument("--study", help="the study's name (its directory under --results)")
    rep.add_argument("--doc", default=DEFAULT_DOC, help="markdown file whose study block is regenerated")
    rep.add_argument("--against", help="another study beside it (its name) to pair each run with the same arm and "
                                       "seed there, and with its grpo when this study ran none (default: the "
                                       "spec's `against`)")
    rep.set_defaults(func=_cmd_report)
    p.set_defaults(func=lambda args: p.print_help() or 0)
