"""The comparison of arms on the same budget: a markdown results table and a PNG of success rate
and teacher-student gap over training steps, from each arm's evaluation and training history.

Inputs are plain dicts (what the pipeline's evaluate and gated_train steps write as JSON), so the
same code serves the KFP compare component, `sdar run --local` and notebooks. Nothing here writes to MLflow: the
comparison's runs and view are written by sdar.tracking.comparison from what this module computes.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sdar.eval.evaluate import wilson_interval
from sdar.tracking.view import (
    DISTILL_WEIGHT,
    GAP,
    GATE,
    HELD_OUT,
    TRAIN_SUCCESS,
    VS_WARM_START,
    WARM_START,
    ViewRows,
    arm_color,
)

# the teacher-student gap per step: SDAR's token gap (logged for every arm, since the trainer
# scores the teacher for all of them), else the all-token gap the trainer logs beside it
GAP_KEYS = ("sdar/gap_mean", "teacher/gap_all_tokens")
GATE_KEY = "sdar/gate_mean"


@dataclass
class ArmRun:
    """One trained (arm, seed): its held-out evaluation and its per-step training history.

    evaluation: `EvalResult.to_dict()` (success, ci95, n, per_type, ...).
    history: the trainer's per-step metric dicts (step, success, reward, sdar/gap_mean, ...).
    run_id: the arm's MLflow child run, when tracked.
    """

    arm: str
    seed: int
    evaluation: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    run_id: str | None = None

    @classmethod
    def from_dicts(cls, evaluation: dict[str, Any], history: dict[str, Any] | list[dict[str, Any]] | None = None) -> ArmRun:
        """From the evaluate step's JSON (which names arm and seed) and the training history JSON."""
        for key in ("arm", "seed", "success", "n"):
            if key not in evaluation:
                raise ValueError(f"evaluation result lacks {key!r}; it must be the JSON written by the evaluate step "
                                 f"(keys arm, seed, success, ci95, n, per_type), got keys {sorted(evaluation)}")
        steps: list[dict[str, Any]] = []
        run_id = evaluation.get("run_id") or None
        if isinstance(history, dict):
            if (history.get("arm"), int(history.get("seed", -1))) != (evaluation["arm"], int(evaluation["seed"])):
                raise ValueError(f"history of {history.get('arm')}/seed {history.get('seed')} paired with the evaluation "
                                 f"of {evaluation['arm']}/seed {evaluation['seed']}; pass matching pairs")
            steps = list(history.get("history", []))
            run_id = run_id or history.get("run_id") or None
        elif history is not None:
            steps = list(history)
        return cls(str(evaluation["arm"]), int(evaluation["seed"]), evaluation, steps, run_id)


@dataclass
class ArmSummary:
    """All seeds of one arm pooled: success over every evaluation episode with a Wilson 95% CI.

    seed_success: per-seed success rates (their spread shows seed variance).
    train_success_first / _last: rollout success in the first and last training steps (mean over seeds).
    gap_last / gate_last: teacher-student gap and SDAR gate at the last step (mean over seeds).
    vs_warm_start: `paired_vs_warm_start` (NaNs without the episodes' outcomes).
    """

    arm: str
    seeds: list[int]
    success: float
    ci95: tuple[float, float]
    n: int
    seed_success: list[float]
    per_type: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    train_success_first: float = math.nan
    train_success_last: float = math.nan
    gap_last: float = math.nan
    gate_last: float = math.nan
    run_ids: list[str] = field(default_factory=list)
    # held-out success minus the own seed's warm start, paired by seed, task and sampling draw: (mean, low, high)
    vs_warm_start: tuple[float, float, float] = (math.nan, math.nan, math.nan)


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _gap(row: dict[str, Any]) -> float:
    for key in GAP_KEYS:
        if key in row and row[key] is not None:
            return float(row[key])
    return math.nan


def warm_start_of(baseline: dict[str, Any] | None, seed: int) -> dict[str, Any] | None:
    """The evaluation of seed `seed`'s warm start in the baseline step's result (its `by_seed`), else the result
    itself when it is that seed's (an older single-seed result); None when the seed's warm start was not evaluated."""
    if not baseline:
        return None
    own = (baseline.get("by_seed") or {}).get(str(seed))
    if own is not None:
        return own
    return baseline if int(baseline.get("seed", -1)) == seed and not baseline.get("by_seed") else None


def paired_vs_warm_start(runs: list[ArmRun], baseline: dict[str, Any] | None) -> tuple[float, float, float]:
    """Held-out success of `runs` (one arm, any seeds) minus each one's own seed's warm start, paired by episode:
    rows are (seed, sampling repeat), columns tasks, and every cell pairs the arm's and the warm start's episode of
    one task at one sampling draw (common random numbers). Mean and bootstrap 95% interval resampling rows and
    tasks (sdar.eval.stats.paired_difference); NaNs when an evaluation lacks its episodes' outcomes."""
    import numpy as np

    from sdar.eval.stats import paired_difference

    arm_rows, base_rows = [], []
    for r in runs:
        base = warm_start_of(baseline, r.seed)
        if base is None or "outcomes" not in base or "outcomes" not in r.evaluation:
            return (math.nan, math.nan, math.nan)
        tasks = list(dict.fromkeys(t for t, _, _ in base["outcomes"]))
        mine = {(t, k): w for t, k, w in r.evaluation["outcomes"]}
        theirs = {(t, k): w for t, k, w in base["outcomes"]}
        if set(mine) != set(theirs):
            raise ValueError(f"{r.arm}/seed {r.seed} and its warm start played different episodes; evaluate both with "
                             "the same eval_tasks and episodes_per_task")
        for k in sorted({k for _, k in mine}):
            arm_rows.append([mine[(t, k)] for t in tasks])
            base_rows.append([theirs[(t, k)] for t in tasks])
    return paired_difference(np.array(arm_rows, dtype=float), np.array(base_rows, dtype=float))


def summarize(runs: list[ArmRun], baseline: dict[str, Any] | None = None) -> list[ArmSummary]:
    """One summary per arm, in the order arms first appear in `runs`; with the baseline step's result, each arm's
    paired difference from its seeds' warm starts."""
    by_arm: dict[str, list[ArmRun]] = defaultdict(list)
    for r in runs:
        by_arm[r.arm].append(r)
    out = []
    for arm, rs in by_arm.items():
        rs = sorted(rs, key=lambda r: r.seed)
        wins = sum(round(float(r.evaluation["success"]) * int(r.evaluation["n"])) for r in rs)
        n = sum(int(r.evaluation["n"]) for r in rs)
        types: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for r in rs:
            for t, v in (r.evaluation.get("per_type") or {}).items():
                types[t].append((float(v["success"]), int(v.get("n", 1))))
        per_type = {t: sum(s * k for s, k in v) / max(sum(k for _, k in v), 1) for t, v in sorted(types.items())}
        hist = [r.history for r in rs if r.history]
        out.append(ArmSummary(
            arm=arm, seeds=[r.seed for r in rs], success=wins / max(n, 1), ci95=wilson_interval(wins, n), n=n,
            seed_success=[float(r.evaluation["success"]) for r in rs], per_type=per_type,
            steps=max((len(h) for h in hist), default=0),
            train_success_first=_mean([float(h[0].get("success", math.nan)) for h in hist]),
            train_success_last=_mean([float(h[-1].get("success", math.nan)) for h in hist]),
            gap_last=_mean([_gap(h[-1]) for h in hist]),
            gate_last=_mean([float(h[-1].get(GATE_KEY, math.nan)) for h in hist]),
            run_ids=[r.run_id for r in rs if r.run_id], vs_warm_start=paired_vs_warm_start(rs, baseline),
        ))
    return out


def _fmt(x: float, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def results_table(summaries: list[ArmSummary], baseline: dict[str, Any] | None = None) -> str:
    """A markdown table: one row per arm (and the warm-started policy first when `baseline`, an
    `EvalResult.to_dict()`, is given); the best held-out success is in bold unless tied. "vs own warm start" is the
    paired difference with its bootstrap interval where the evaluations kept their episodes, else the plain
    difference from the baseline row."""
    types = sorted({t for s in summaries for t in s.per_type} | set((baseline or {}).get("per_type", {})))
    head = ["arm", "seeds", "success (95% CI)", "vs own warm start (paired, 95% CI)", *types,
            "train success first -> last",
            "gap last", "gate last", "steps"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    base = float(baseline["success"]) if baseline else None
    if baseline:
        lo, hi = baseline.get("ci95", (math.nan, math.nan))
        row = ["warm start (no RL)", "-", f"{base:.3f} [{lo:.3f}, {hi:.3f}] (n={baseline.get('n', '?')})", "-"]
        row += [_fmt(float(baseline.get("per_type", {}).get(t, {}).get("success", math.nan))) for t in types]
        row += ["-", "-", "-", "0"]
        lines.append("| " + " | ".join(row) + " |")
    best = max((s.success for s in summaries), default=None)
    unique_best = sum(s.success == best for s in summaries) == 1 and len(summaries) > 1
    for s in summaries:
        succ = f"{s.success:.3f} [{s.ci95[0]:.3f}, {s.ci95[1]:.3f}] (n={s.n})"
        if unique_best and s.success == best:  # a tie has no winner to point at
            succ = f"**{succ}**"
        lo, hi = s.vs_warm_start[1:]
        delta = ("-" if base is None else f"{s.success - base:+.3f}") if math.isnan(s.vs_warm_start[0]) else \
            f"{s.vs_warm_start[0]:+.3f} [{lo:+.3f}, {hi:+.3f}]"
        row = [s.arm, ",".join(map(str, s.seeds)), succ, delta]
        row += [_fmt(s.per_type.get(t, math.nan)) for t in types]
        row += [f"{_fmt(s.train_success_first)} -> {_fmt(s.train_success_last)}", _fmt(s.gap_last, "+.3f"),
                _fmt(s.gate_last), str(s.steps)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _curve(runs: list[ArmRun], key_fn) -> tuple[list[int], list[float], list[float], list[float]]:
    """Mean, min and max over seeds of a per-step value (steps where at least one seed has it)."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for r in runs:
        for i, row in enumerate(r.history):
            v = key_fn(row)
            if v is not None and not math.isnan(v):
                by_step[int(row.get("step", i))].append(v)
    steps = sorted(by_step)
    return (steps, [_mean(by_step[s]) for s in steps], [min(by_step[s]) for s in steps],
            [max(by_step[s]) for s in steps])


def computed(runs: list[ArmRun]) -> dict[str, list[dict[str, float]]]:
    """What each arm computed per step (mean over its seeds): its teacher-student gap, SDAR gate and distillation
    weight (the registered arm's lambda x the gate: 0 for GRPO, lambda x 0.5 for the naive arm), so the arms
    differ visibly even where a few steps cannot separate their success."""
    from sdar.algos import get_arm

    by_arm: dict[str, list[ArmRun]] = defaultdict(list)
    for r in runs:
        by_arm[r.arm].append(r)
    out: dict[str, list[dict[str, float]]] = {}
    for arm, rs in by_arm.items():
        try:
            lam = get_arm(arm).sdar_coef
        except (KeyError, ValueError):
            lam = math.nan
        steps, gaps, _, _ = _curve(rs, _gap)
        gates = dict(zip(*_curve(rs, lambda row: float(row.get(GATE_KEY, math.nan)))[:2]))
        success = dict(zip(*_curve(rs, lambda row: float(row.get("success", math.nan)))[:2]))
        out[arm] = [{"step": st, "success": success.get(st, math.nan), "gap": gap, "gate": gates.get(st, math.nan),
                     "distill_weight": lam * gates.get(st, math.nan)} for st, gap in zip(steps, gaps)]
    return out


def computed_table(runs: list[ArmRun]) -> str:
    """`computed` as markdown: a row per arm and step."""
    lines = ["## What each arm computed per step (mean over seeds)", "",
             "| arm | step | training success | gap | gate | distillation weight |", "|---|---:|---:|---:|---:|---:|"]
    for arm, rows in computed(runs).items():
        for row in rows:
            lines.append(f"| {arm} | {row['step']} | {_fmt(row['success'])} | {_fmt(row['gap'], '+.4f')} | "
                         f"{_fmt(row['gate'], '.4f')} | {_fmt(row['distill_weight'], '.5f')} |")
    return "\n".join(lines) + "\n"


def _smooth(ys: list[float], window: int) -> list[float]:
    if window <= 1:
        return ys
    return [_mean(ys[max(0, i - window + 1) : i + 1]) for i in range(len(ys))]


def plot_comparison(runs: list[ArmRun], path: str | Path, baseline: dict[str, Any] | None = None,
                    title: str = "") -> Path:
    """A PNG with two panels over training steps, one line per arm (mean over seeds, band = seed
    range): rollout success rate (with periodic and final held-out evaluation as markers) and the
    teacher-student log-prob gap. Returns the path written."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in pods
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    by_arm: dict[str, list[ArmRun]] = defaultdict(list)
    for r in runs:
        by_arm[r.arm].append(r)

    fig, (ax_s, ax_g) = plt.subplots(1, 2, figsize=(12, 4.5))
    last_step = 0
    for i, (arm, rs) in enumerate(by_arm.items()):
        c = arm_color(arm)  # the arm's colour in MLflow too
        steps, mean, lo, hi = _curve(rs, lambda row: float(row.get("success", math.nan)))
        if steps:
            window = max(1, len(steps) // 10)
            ax_s.plot(steps, _smooth(mean, window), color=c, label=f"{arm} (rollouts)")
            if len(rs) > 1:
                ax_s.fill_between(steps, lo, hi, color=c, alpha=0.15)
            last_step = max(last_step, steps[-1])
        ev_steps, ev_mean, _, _ = _curve(rs, lambda row: float(row.get("eval/success", math.nan)))
        if ev_steps:
            ax_s.plot(ev_steps, ev_mean, "o", color=c, markersize=4)
        final = summarize(rs)[0]
        x = (steps[-1] if steps else 0) + 0.5 + 0.25 * i  # side by side, so the intervals stay readable
        ax_s.errorbar([x], [final.success], yerr=[[final.success - final.ci95[0]], [final.ci95[1] - final.success]],
                      fmt="D", color=c, capsize=3, label=f"{arm} held-out {final.success:.2f}")
        gsteps, gmean, glo, ghi = _curve(rs, _gap)
        if gsteps:
            ax_g.plot(gsteps, gmean, color=c, label=arm)
            if len(rs) > 1:
                ax_g.fill_between(gsteps, glo, ghi, color=c, alpha=0.15)
    if baseline is not None:
        ax_s.axhline(float(baseline["success"]), color=arm_color(WARM_START), linestyle="--",
                     label=f"warm start {float(baseline['success']):.2f}")
    ax_s.set(xlabel="training step", ylabel="success rate", title="success rate", ylim=(-0.02, 1.02))
    ax_g.axhline(0.0, color="grey", linewidth=0.8)
    ax_g.set(xlabel="training step", ylabel="log p_teacher - log p_student (per token)",
             title="teacher-student gap")
    ax_s.legend(fontsize=7, loc="best")
    if ax_g.lines[1:]:
        ax_g.legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@dataclass
class Comparison:
    """What `write_comparison` produced: the table, the per-arm summaries and the files written."""

    table: str
    summaries: list[ArmSummary]
    table_path: Path
    plot_path: Path
    json_path: Path

    @property
    def files(self) -> list[Path]:
        """The table, the plot and the JSON."""
        return [self.table_path, self.plot_path, self.json_path]

    def metrics(self) -> dict[str, float]:
        """Flat metrics per arm (`<arm>/success`, `<arm>/success_ci_low`, ...), for MLflow and KFP."""
        out: dict[str, float] = {}
        for s in self.summaries:
            out.update({f"{s.arm}/success": s.success, f"{s.arm}/success_ci_low": s.ci95[0],
                        f"{s.arm}/success_ci_high": s.ci95[1], f"{s.arm}/episodes": float(s.n)})
            for k, v in (("gap_last", s.gap_last), ("gate_last", s.gate_last), ("train_success_last", s.train_success_last),
                         ("vs_warm_start", s.vs_warm_start[0]), ("vs_warm_start_ci_low", s.vs_warm_start[1]),
                         ("vs_warm_start_ci_high", s.vs_warm_start[2])):
                if not math.isnan(v):
                    out[f"{s.arm}/{k}"] = v
        return out


def write_comparison(runs: list[ArmRun], out_dir: str | Path, baseline: dict[str, Any] | None = None,
                     title: str = "") -> Comparison:
    """Write comparison.md, comparison.png and comparison.json into `out_dir`."""
    if not runs:
        raise ValueError("no arm results to compare; every arm failed or the arm list was empty")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = summarize(runs, baseline)
    table = results_table(summaries, baseline)
    header = f"# {title}\n\n" if title else ""
    (out / "comparison.md").write_text(header + table + "\n" + computed_table(runs))
    plot = plot_comparison(runs, out / "comparison.png", baseline, title)
    data = {"title": title, "baseline": baseline, "arms": [asdict(s) for s in summaries], "computed": computed(runs),
            "runs": [{"arm": r.arm, "seed": r.seed, "run_id": r.run_id, "evaluation": r.evaluation} for r in runs]}
    (out / "comparison.json").write_text(json.dumps(data, indent=1, default=str))
    return Comparison(table, summaries, out / "comparison.md", plot, out / "comparison.json")


def view_rows(runs: list[ArmRun], baseline: dict[str, Any] | None) -> list:
    """What the comparison's MLflow view shows, per run: each seed's warm-start run gets its held-out success at step
    0; each arm run its held-out success and its paired difference from its own warm start at step 0, and per
    training step its success, gap, gate and distillation weight (`computed`, per seed). Runs without an id are left
    out (an untracked arm). sdar.tracking.comparison.log_view_metrics writes them."""
    rows = [ViewRows(ws["run_id"], 0, {HELD_OUT: float(ws["success"])})
            for ws in ((baseline or {}).get("by_seed") or {}).values() if ws.get("run_id")]
    for r in runs:
        if not r.run_id:
            continue
        diff = paired_vs_warm_start([r], baseline)[0]
        rows.append(ViewRows(r.run_id, 0, {HELD_OUT: float(r.evaluation["success"]), VS_WARM_START: diff}))
        rows += [ViewRows(r.run_id, int(row["step"]), {TRAIN_SUCCESS: row["success"], GAP: row["gap"],
                                                       GATE: row["gate"], DISTILL_WEIGHT: row["distill_weight"]})
                 for row in computed([r]).get(r.arm, [])]
    return rows
