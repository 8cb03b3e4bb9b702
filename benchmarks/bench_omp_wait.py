"""Seconds per RL step under each way PyTorch's OpenMP threads wait (sdar.openmp), beside issue 46's measurement.

Each run is `sdar train` as a person runs it (a process of its own, `python -m sdar.cli train`), issue 46's command by
default: household-tiny's setting on SmolLM2-135M (its real weights, untrained: no warm start), arm sdar, 2 tasks x 2
rollouts, `--steps` steps, no evaluation, no tracking. The runs:
- before: the same command at --before REV (default a54e8fa, where issue 46 measured 59-60 s a step: float32, its
  OpenMP threads asleep at once), its tree exported by `git archive` and run with this interpreter;
- alone: this tree in --dtype (bfloat16) under each wait of --waits, one process at a time, interleaved over --rounds:
  passive (OMP_WAIT_POLICY=PASSIVE, sdar's setting before sdar.openmp), spin (sdar's default now: GOMP_SPINCOUNT
  1000), default (libgomp's own: up to 300,000 spins);
- shared: two processes of the same run at once on the same cores, under each wait of --shared (libgomp's default is
  not among the defaults: two such steps took 180-400 s each against 35-50 asleep).
Printed per run: each step's seconds and the median after the first (the first warms up), each step's teacher-student
gap (the same in every run of one dtype and code: the same trajectories), and the before run's median over this one's.
Run:
  .venv/bin/python benchmarks/bench_omp_wait.py [--before a54e8fa] [--steps 3] [--waits passive,spin,default]
      [--shared passive,spin] [--rounds 1] [--dtype bfloat16] [--model smollm2] [--set KEY=VALUE] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from sdar.openmp import KNOBS, describe  # noqa: E402

# the variables each wait sets (on top of an environment without either knob)
WAITS = {"passive": {"OMP_WAIT_POLICY": "PASSIVE"}, "spin": {}, "default": {"GOMP_SPINCOUNT": "300000"}}
# the line `sdar train` prints after each step (the same at a54e8fa): its gap and its seconds
STEP_LINE = re.compile(r"^\[\w+\] step (\d+)/\d+: (?:.*?gap ([-+]?\d+\.\d+))?.*?(\d+\.\d+)s/step")


def command(args, model: str | None, dtype: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "sdar.cli", "train", "--config", args.config, "--arm", args.arm, "--steps",
           str(args.steps), "--set", f"tasks_per_step={args.tasks_per_step}", "--set", f"group_size={args.group_size}",
           "--set", "eval.every=0", "--set", "tracking=false"]
    if model:
        cmd += ["--set", f"model.name_or_path={model}"]
    if dtype:
        cmd += ["--set", f"model.dtype={dtype}"]
    for kv in args.set:
        cmd += ["--set", kv]
    return cmd


def environment(wait: str, tree: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KNOBS}
    env.update(WAITS[wait])
    env["COLUMNS"] = "200"
    if tree is not None:  # an exported revision: its own sources first
        env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), str(tree / "envs" / "src"), env.get("PYTHONPATH", "")])
    return env


def start(cmd: list[str], env: dict, cwd: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([*cmd, "--set", f"output_dir={out}"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, what: str) -> dict:
    text, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{what}: sdar train exited {proc.returncode}:\n{text[-3000:]}")
    steps = [m.groups() for m in map(STEP_LINE.match, text.splitlines()) if m]
    if not steps:
        raise SystemExit(f"{what}: no step line (`[arm] step k/N: ... gap G S.Ss/step`) in its output:\n{text[-3000:]}")
    seconds = [float(s) for _, _, s in steps]
    timed = seconds[1:] or seconds
    return {"seconds": seconds, "gaps": [float(g) for _, g, _ in steps if g is not None], "median_s": statistics.median(timed)}


def run(cmds: list[tuple[str, list[str], dict, Path]], tmp: Path) -> list[dict]:
    """Run the commands at once (one: alone; two: sharing the cores); each one's figures."""
    procs = [(what, start(cmd, env, cwd, tmp / f"run{i}-{time.monotonic_ns()}")) for i, (what, cmd, env, cwd) in
             enumerate(cmds)]
    return [finish(p, what) for what, p in procs]


def export(rev: str, into: Path) -> Path:
    """The tree of `rev` (git archive), under `into`."""
    tree = into / f"tree-{rev}"
    tree.mkdir()
    tar = into / f"{rev}.tar"
    with open(tar, "wb") as f:
        proc = subprocess.run(["git", "archive", rev], cwd=ROOT, stdout=f, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"--before {rev}: git archive failed ({proc.stderr.strip()}); give a revision this clone "
                         "has, or --before '' to skip it")
    with tarfile.open(tar) as t:
        t.extractall(tree, filter="data")
    return tree


def report(rows: list[dict], before: dict | None, args) -> str:
    def fmt(xs, f):
        return ", ".join(f.format(x) for x in xs)

    out = [f"`sdar train --config {args.config} --arm {args.arm}`, {args.tasks_per_step} tasks x {args.group_size} "
           f"rollouts, {args.steps} steps a run (the median leaves out the first); model: {args.model or 'as the config says'}",
           "", "| run | code | dtype | OpenMP wait | processes at once | s / step (each) | median s / step | gap (each) | "
           "before / this |", "|---|---|---|---|---:|---|---:|---|---:|"]
    for r in rows:
        ratio = f"{before['median_s'] / r['median_s']:.2f}x" if before else "-"
        out.append(f"| {r['run']} | {r['code']} | {r['dtype']} | {r['wait']} | {r['processes']} | "
                   f"{fmt(r['seconds'], '{:.1f}')} | {r['median_s']:.2f} | {fmt(r['gaps'], '{:+.3f}')} | {ratio} |")
    def by_wait(kind):  # each wait's median seconds per step over its runs of `kind` (rounds, processes)
        waits = {}
        for r in rows:
            if r["run"].startswith(kind):
                waits.setdefault(r["wait"], []).append(r)
        return {w: {**rs[0], "median_s": statistics.median(r["median_s"] for r in rs)} for w, rs in waits.items()}

    alone, shared = by_wait("alone"), by_wait("shared")
    lines = []
    for tag, group in (("alone", alone), ("two at once", shared)):
        if "passive" in group:
            for w, r in group.items():
                if w != "passive":
                    lines.append(f"{tag}: {w} / passive seconds per step {r['median_s'] / group['passive']['median_s']:.2f}x")
    if before:
        best = min(alone.values(), key=lambda r: r["median_s"]) if alone else None
        if best:
            lines.append(f"before ({before['code']}, {before['dtype']}, {before['wait']}) / this tree ({best['dtype']}, "
                         f"{best['wait']}, alone): {before['median_s'] / best['median_s']:.2f}x faster per step")
    return "\n".join(out + [""] + lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/household-tiny.yaml")
    ap.add_argument("--model", default="smollm2", help="model.name_or_path ('' keeps the config's)")
    ap.add_argument("--arm", default="sdar")
    ap.add_argument("--dtype", default="bfloat16", help="model.dtype of this tree's runs ('' keeps the config's)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tasks-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--before", default="a54e8fa", help="the revision of the before run ('' skips it)")
    ap.add_argument("--before-dtype", default="float32", help="model.dtype of the before run")
    ap.add_argument("--waits", default="passive,spin,default", help=f"alone, of: {', '.join(WAITS)}")
    ap.add_argument("--shared", default="passive,spin", help="two processes at once, of the same ('' skips them)")
    ap.add_argument("--rounds", type=int, default=1, help="the alone runs, interleaved this many times")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides for every run")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    waits = [w for w in args.waits.split(",") if w]
    shared = [w for w in args.shared.split(",") if w]
    for w in waits + shared:
        if w not in WAITS:
            raise SystemExit(f"unknown wait {w!r}: pick from {', '.join(WAITS)}")
    here = command(args, args.model, args.dtype)
    rows, before = [], None
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        if args.before:
            tree = export(args.before, tmp)
            (r,) = run([("before", command(args, args.model, args.before_dtype), environment("passive", tree), tree)], tmp)
            before = {**r, "run": "before", "code": args.before, "dtype": args.before_dtype or "config",
                      "wait": describe(environment("passive", None)), "processes": 1}
            rows.append(before)
        for k in range(args.rounds):
            for w in waits:
                (r,) = run([(f"alone {w}", here, environment(w, None), ROOT)], tmp)
                rows.append({**r, "run": f"alone, round {k + 1}" if args.rounds > 1 else "alone", "code": "this tree",
                             "dtype": args.dtype or "config", "wait": describe(environment(w, None)), "processes": 1})
        for w in shared:
            for r in run([(f"shared {w} {i}", here, environment(w, None), ROOT) for i in range(2)], tmp):
                rows.append({**r, "run": "shared", "code": "this tree", "dtype": args.dtype or "config",
                             "wait": describe(environment(w, None)), "processes": 2})
    print(report(rows, before, args))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"rows": rows, "argv": sys.argv[1:]}, indent=1))


if __name__ == "__main__":
    main()
