"""Seconds per RL step for each arm on the same tasks, and the SDAR/GRPO ratio.

Every arm plays the same tasks from the same warm start (same seed), so the difference is the
teacher's extra forward pass and the loss. GRPO skips the teacher here (teacher_for_all_arms
false), as a production GRPO run would. Run:
  .venv/bin/python benchmarks/bench_train_step.py [--config configs/household-tiny.yaml] [--steps 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/household-tiny.yaml")
    ap.add_argument("--arms", default="grpo,grpo_opsd,sdar")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per arm (after one warm-up step)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    args = ap.parse_args()
    import yaml
    from rich.console import Console
    from rich.table import Table

    from sdar.config import load_config
    from sdar.train import Trainer

    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    console = Console()
    rows = {}
    for arm in args.arms.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = load_config(args.config, {**overrides, "arm": arm, "tracking": False, "output_dir": tmp,
                                            "teacher_for_all_arms": False, "eval_every": 0})
            trainer = Trainer(cfg, console=console)
            results = [trainer.train_step(step).metrics for step in range(args.steps + 1)][1:]
        rows[arm] = {k: statistics.median(r[k] for r in results)
                     for k in ("time/step_s", "time/rollout_s", "time/score_s", "time/update_s", "turn_samples")}
    table = Table(title=f"seconds per RL step (median of {args.steps}), {args.config}")
    for col in ("arm", "step", "rollout", "score (old/ref/teacher)", "update", "turn samples", "x grpo"):
        table.add_column(col, justify="right")
    base = rows.get("grpo", next(iter(rows.values())))["time/step_s"]
    for arm, r in rows.items():
        table.add_row(arm, f"{r['time/step_s']:.1f}", f"{r['time/rollout_s']:.1f}", f"{r['time/score_s']:.1f}",
                      f"{r['time/update_s']:.1f}", f"{r['turn_samples']:.0f}", f"{r['time/step_s'] / base:.2f}")
    console.print(table)
    if "sdar" in rows and "grpo" in rows:
        console.print(f"SDAR/GRPO seconds-per-step ratio: {rows['sdar']['time/step_s'] / rows['grpo']['time/step_s']:.2f}x")


if __name__ == "__main__":
    main()
