"""How long an `sdar` command's process takes to end after its work is done, with and without
sdar.lifecycle.skip_the_final_collection (the interpreter's last garbage collections skipped at exit).

Each run is the real `sdar train` of a config in its own process: household-tiny at the tests' miniature size by
default (bench_train_step.py's SMOKE: a 2-layer model of width 64, one task x 2 episodes; one step, tracking off;
its warm start is built by the first run and cached), `--set KEY=VALUE` on top. "kept" runs the same command with the collections
kept (the hook marked as registered before the command starts).
The two alternate, `--repeats` times each. Printed per variant: the median seconds from the command's last line of
output to its exit, and of the whole process; then kept / skipped for both.
Run: .venv/bin/python benchmarks/bench_exit.py [--repeats 3] [--config configs/household-tiny.yaml]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_train_step import SMOKE

ROOT = Path(__file__).resolve().parents[1]
# the command as `sdar` runs it (sdar.cli.main), the hook registered or marked as already registered first
CHILD = ("import sys, sdar.lifecycle as lifecycle\n"
         "lifecycle._FROZEN_AT_EXIT = sys.argv[1] == 'kept'\n"
         "from sdar.cli import main\n"
         "sys.exit(main(sys.argv[2:]))\n")


MINIATURE = {**SMOKE, "steps": 1, "eval.every": 0, "tracking": False}


def one_run(variant: str, config: str, sets: list[str], out: Path) -> tuple[float, float]:
    """(seconds from the last line of output to the exit, seconds of the whole process) of one `sdar train`."""
    argv = [sys.executable, "-c", CHILD, variant, "train", "--config", config,
            *[a for k, v in MINIATURE.items() for a in ("--set", f"{k}={json.dumps(v)}")],
            *[a for kv in sets for a in ("--set", kv)], "--set", f"output_dir={json.dumps(str(out))}"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last = t0
    assert proc.stdout is not None
    tail = []
    for line in proc.stdout:
        last = time.perf_counter()
        tail = (tail + [line])[-20:]
    rc = proc.wait()
    end = time.perf_counter()
    if rc != 0:
        raise SystemExit(f"the {variant} run exited {rc}:\n{''.join(tail)}")
    return end - last, end - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs of each variant, alternating (default 3)")
    ap.add_argument("--config", default="configs/household-tiny.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override on top of the miniature (repeatable), as `sdar train --set` takes it")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    rows: dict[str, list[tuple[float, float]]] = {"kept": [], "skipped": []}
    with tempfile.TemporaryDirectory(prefix="sdar-bench-exit-") as tmp:
        for i in range(args.repeats):
            for variant in rows:
                rows[variant].append(one_run(variant, args.config, args.set, Path(tmp) / f"{variant}-{i}"))
    med = {v: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
           for v, runs in rows.items()}
    extra = "".join(f" --set {kv}" for kv in args.set)
    print(f"`sdar train --config {args.config}` at the miniature size{extra}, {args.repeats} run(s) of each, "
          "alternating; medians\n")
    print("| final collections | last output to exit | whole process |")
    print("|---|---|---|")
    for variant, (gap, whole) in med.items():
        print(f"| {variant} | {gap:.2f} s | {whole:.2f} s |")
    print(f"\nkept / skipped: last output to exit {med['kept'][0] / max(med['skipped'][0], 1e-9):.1f}x, "
          f"whole process {med['kept'][1] / med['skipped'][1]:.2f}x")


if __name__ == "__main__":
    main()
