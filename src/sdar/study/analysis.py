"""What a study's results show: success per family, arm and eval step with 95% intervals over seeds
and tasks, paired differences between arms, curves per step, and the naive arm's gap drift.

Intervals are bootstrap percentiles that resample seeds and, within the resampled seeds, tasks
(the same task draw for every seed and both arms of a difference: the runs of one family play the
same held-out tasks, and the arms of one seed share a warm start and an evaluation seed). With one
seed the interval covers task sampling only, and the table says so through its seed count.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sdar.eval.stats import BOOTSTRAP, bootstrap_mean, paired_difference

PAPER_NAIVE_GAP = (-0.13, -0.21)  # the paper's naive GRPO+OPSD teacher-student gap, early -> late (ALGORITHM.md)
CURVES = (  # (history key, panel title): the per-step figures, one line per arm, a band over seeds
    ("success", "rollout success (train tasks)"),
    ("teacher/gap_free_tokens", "teacher - student log-prob gap (free tokens)"),
    ("sdar/gate_mean", "gate mean (free tokens)"),
    ("sdar/pos_gap_frac", "share of free tokens with gap > 0"),
    ("loss/entropy", "policy entropy (free tokens)"),
    ("invalid_action_rate", "invalid action rate (turns)"),
)


@dataclass
class Runs:
    """A study's results as read from its directory: warm starts and runs, keyed (family, seed[, arm])."""

    name: str
    spec: dict[str, Any]
    warm: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    runs: dict[tuple[str, int, str], dict[str, Any]] = field(default_factory=dict)
    transfer: dict[tuple[str, int, str], dict[str, Any]] = field(default_factory=dict)  # (family, seed, who)

    def families(self) -> list[str]:
        return list(dict.fromkeys([f for f, _ in self.warm] + [f for f, _, _ in self.runs]))

    def arms(self, family: str) -> list[str]:
        return list(dict.fromkeys(a for f, _, a in self.runs if f == family))

    def seeds(self, family: str, arm: str | None = None) -> list[int]:
        return sorted({s for f, s, a in self.runs if f == family and (arm is None or a == arm)})


def load_results(directory: str | Path) -> Runs:
    """Every finished warm-start and run JSON under `directory` (<results>/<study>)."""
    d = Path(directory)
    spec_file = d / "spec.json"
    if not spec_file.is_file():
        raise FileNotFoundError(f"{d} holds no study results (no spec.json); run `sdar study run --spec ...` first")
    out = Runs(name=d.name, spec=json.loads(spec_file.read_text()))
    for f in sorted(d.glob("*/seed*/*.json")):
        rec = json.loads(f.read_text())
        if f.name.endswith(".transfer.json"):
            out.transfer[(rec["family"], int(rec["seed"]), rec["who"])] = rec
        elif f.name == "warmstart.json":
            out.warm[(rec["family"], int(rec["seed"]))] = rec
        else:
            out.runs[(rec["family"], int(rec["seed"]), rec["arm"])] = rec
    return out


def outcome_matrix(records: list[dict[str, Any]], tasks: list[str]) -> np.ndarray:
    """[seeds, tasks] of 0/1 outcomes; `records` hold `tasks` mappings (task id -> 0/1)."""
    return np.array([[rec["tasks"][t] for t in tasks] for rec in records], dtype=float)


def common_tasks(records: list[dict[str, Any]]) -> list[str]:
    """The task ids every record played, in the first record's order; an error if they differ."""
    if not records:
        return []
    first = list(records[0]["tasks"])
    for rec in records[1:]:
        if set(rec["tasks"]) != set(first):
            raise ValueError("evaluations of one family played different held-out tasks; a study's runs must share "
                             "eval_tasks and env.eval_split (run them again with one config per family)")
    return first


def _fmt(x: float, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _ci(mean: float, lo: float, hi: float, sign: bool = False) -> str:
    f = "+.3f" if sign else ".3f"
    return "-" if math.isnan(mean) else f"{mean:{f}} [{lo:{f}}, {hi:{f}}]"


def success_rows(r: Runs, family: str) -> list[dict[str, Any]]:
    """One row per (arm, eval step) and the warm start's student and teacher at step 0."""
    rows = []
    seeds = sorted({s for f, s in r.warm if f == family})
    for who in ("student", "teacher"):
        recs = [r.warm[(family, s)][who] for s in seeds]
        if recs:
            tasks = common_tasks(recs)
            rows.append({"arm": f"warm start ({who})", "step": 0, "seeds": len(recs), "tasks": len(tasks),
                         "ci": bootstrap_mean(outcome_matrix(recs, tasks)),
                         "per_seed": [rec["success"] for rec in recs]})
    steps = sorted({int(k) for (f, _, _), rec in r.runs.items() if f == family for k in rec["evals"]})
    for arm in r.arms(family):
        for step in steps:
            recs = [r.runs[(family, s, arm)]["evals"][str(step)] for s in r.seeds(family, arm)
                    if str(step) in r.runs[(family, s, arm)]["evals"]]
            if not recs:
                continue
            tasks = common_tasks(recs)
            rows.append({"arm": arm, "step": step, "seeds": len(recs), "tasks": len(tasks),
                         "ci": bootstrap_mean(outcome_matrix(recs, tasks)),
                         "per_seed": [rec["success"] for rec in recs]})
    return rows


WARM = "warm start"


def _paired_rows(a: str, b: str, seeds: list[int], evals) -> list[dict[str, Any]]:
    """a - b at every eval step both reached at all `seeds`; `evals(who, seed)` -> {step: eval record}."""
    if not seeds:
        return []
    steps = sorted(set.intersection(*[set(evals(who, s)) for s in seeds for who in (a, b)]), key=int)
    rows = []
    for step in steps:
        ra, rb = ([evals(who, s)[step] for s in seeds] for who in (a, b))
        tasks = common_tasks(ra + rb)
        rows.append({"a": a, "b": b, "step": int(step), "seeds": len(seeds), "tasks": len(tasks),
                     "ci": paired_difference(outcome_matrix(ra, tasks), outcome_matrix(rb, tasks))})
    return rows


def difference_rows(r: Runs, family: str, pairs: tuple[tuple[str, str], ...] = (
        ("sdar", "grpo"), ("sdar", "grpo_opsd"), ("grpo_opsd", "grpo"))) -> list[dict[str, Any]]:
    """Paired differences a - b at every eval step both arms reached, over the seeds both ran: `pairs`, every
    other arm against grpo, and an SDAR arm with more channels (sdar_composer) against sdar (what the channels
    add to SDAR); then each arm against its own warm start (the step-0 student of the same seed)."""

    def evals(who: str, seed: int) -> dict[str, dict[str, Any]]:
        if who == WARM:
            return {str(k): r.warm[(family, seed)]["student"] for k in r.spec.get("eval_steps", [])}
        return r.runs[(family, seed, who)]["evals"]

    rows = []
    extra = [(arm, "grpo") for arm in r.arms(family) if arm not in ("grpo", "sdar", "grpo_opsd")]
    extra += [(arm, "sdar") for arm in r.arms(family) if arm.startswith("sdar_")]
    for a, b in list(pairs) + extra:
        rows += _paired_rows(a, b, sorted(set(r.seeds(family, a)) & set(r.seeds(family, b))), evals)
    for arm in r.arms(family):
        rows += _paired_rows(arm, WARM, [s for s in r.seeds(family, arm) if (family, s) in r.warm], evals)
    return rows


def _warm_seeds(r: Runs, base: Runs, family: str) -> list[int]:
    """The seeds at which both studies evaluated a warm start of `family`."""
    return sorted(s for f, s in r.warm if f == family and (family, s) in base.warm)


def against_rows(r: Runs, base: Runs, family: str) -> list[dict[str, Any]]:
    """This study against `base`, the study it varies in one setting (the spec's `against`): first the warm starts'
    students at step 0 (0 unless the warm starts or their evaluation differ), then each arm minus the same arm at the
    same seed there, at every eval step both reached, paired by seed and task over the seeds both ran. A study without
    a grpo run of its own (one arm rerun with another setting, e.g. hint-alpha's grpo_hint) also has each arm minus
    `base`'s grpo, the baseline `difference_rows` would have paired it with. Each row also has the per-seed
    differences of success ("per_seed") and whether it pairs two different arms ("cross_arm")."""
    evals_of: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for study in (r, base):
        for (f, seed), rec in study.warm.items():
            if f == family:
                evals_of[(f"{WARM} ({study.name})", seed)] = {"0": rec["student"]}
        for (f, seed, arm), rec in study.runs.items():
            if f == family:
                evals_of[(f"{arm} ({study.name})", seed)] = rec["evals"]

    def evals(who: str, seed: int) -> dict[str, dict[str, Any]]:
        return evals_of[(who, seed)]

    def there(mine: str, theirs: str) -> tuple[str, str, list[int], bool]:
        a, b = f"{mine} ({r.name})", f"{theirs} ({base.name})"
        return a, b, [s for s in r.seeds(family, mine) if (b, s) in evals_of], mine != theirs

    pairs = [(f"{WARM} ({r.name})", f"{WARM} ({base.name})", _warm_seeds(r, base, family), False)]
    pairs += [there(arm, arm) for arm in r.arms(family)]
    if "grpo" not in r.arms(family):
        pairs += [there(arm, "grpo") for arm in r.arms(family)]
    rows = []
    for a, b, seeds, cross_arm in pairs:
        try:
            got = _paired_rows(a, b, seeds, evals)
        except ValueError as exc:
            raise ValueError(f"studies {r.name} and {base.name} evaluated {family} on different held-out tasks, so "
                             f"their runs cannot be paired: `against` names a study with the same eval tasks, "
                             f"eval split and seeds ({exc})") from None
        for row in got:
            step = str(row["step"])
            row["per_seed"] = [evals(a, s)[step]["success"] - evals(b, s)[step]["success"] for s in seeds]
            row["cross_arm"] = cross_arm
        rows += got
    return rows


def against_lines(r: Runs, base: Runs, family: str) -> list[str]:
    """`against_rows` as markdown, with whether the two studies' warm starts are the same weights."""
    rows = against_rows(r, base, family)
    if not rows:
        return []
    seeds = _warm_seeds(r, base, family)
    digests = [(r.warm[(family, s)].get("warm_start_digest"), base.warm[(family, s)].get("warm_start_digest"))
               for s in seeds]
    differ = [s for s, (a, b) in zip(seeds, digests) if a != b]
    if any(a is None or b is None for a, b in digests):
        same = "whether the warm starts are the same weights is unknown: a record names no digest"
    elif differ:
        same = f"different warm starts at seed(s) {', '.join(map(str, differ))}"
    else:
        same = f"the same warm start at every seed both evaluated ({', '.join(map(str, seeds))})"
    # said only when the table has such rows (none when `base` ran no grpo either)
    grpo = (f", and minus {base.name}'s grpo, which this study did not run" if any(d["cross_arm"] for d in rows)
            else "")
    lines = ["", f"Against study `{base.name}` (each run minus the same arm at the same seed there{grpo}, paired by "
                 f"seed and held-out task; {same}):", "",
             "| difference | step | seeds | tasks | mean [95% CI] | per seed |", "|---|---:|---:|---:|---|---|"]
    for d in rows:
        lines.append(f"| {d['a']} - {d['b']} | {d['step']} | {d['seeds']} | {d['tasks']} | {_ci(*d['ci'], sign=True)} "
                     f"| " + ", ".join(f"{x:+.3f}" for x in d["per_seed"]) + " |")
    return lines


def gap_drift(r: Runs, family: str, arm: str = "grpo_opsd", window: int = 5) -> dict[str, Any] | None:
    """Mean free-token gap of the first and last `window` steps of `arm` (over seeds), with the paper's figure."""
    hists = [r.runs[(family, s, arm)].get("history", []) for s in r.seeds(family, arm)]
    hists = [[h["teacher/gap_free_tokens"] for h in hist if "teacher/gap_free_tokens" in h] for hist in hists]
    hists = [h for h in hists if len(h) >= window]
    if not hists:
        return None
    first = float(np.mean([np.mean(h[:window]) for h in hists]))
    last = float(np.mean([np.mean(h[-window:]) for h in hists]))
    return {"arm": arm, "seeds": len(hists), "first": first, "last": last, "paper": PAPER_NAIVE_GAP}


def wall_times(r: Runs, family: str) -> dict[str, Any]:
    """Compute spent: wall seconds per run (mean, total) and the warm starts' evaluation."""
    runs = [rec.get("wall_s", {}).get("total") for (f, _, _), rec in r.runs.items() if f == family]
    runs = [x for x in runs if x is not None]
    warm = [rec.get("wall_s", {}) for (f, _), rec in r.warm.items() if f == family]
    return {"runs": len(runs), "mean_run_s": float(np.mean(runs)) if runs else math.nan,
            "total_run_s": float(np.sum(runs)) if runs else 0.0,
            "warm_eval_s": float(np.sum([w.get("eval", 0.0) for w in warm])),
            "warm_build_s": float(np.sum([w.get("warm_start_build_or_load", 0.0) for w in warm]))}


def plot_curves(r: Runs, family: str, path: str | Path) -> Path | None:
    """One PNG per family: the CURVES panels, a line per arm (mean over seeds) with a min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = r.arms(family)
    if not arms:
        return None
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (key, title) in zip(axes.flat, CURVES):
        for arm in arms:
            series = defaultdict(list)
            for s in r.seeds(family, arm):
                for h in r.runs[(family, s, arm)].get("history", []):
                    if key in h and h[key] is not None and not math.isnan(h[key]):
                        series[h["step"] + 1].append(h[key])
            if not series:
                continue
            x = sorted(series)
            mean = [np.mean(series[i]) for i in x]
            ax.plot(x, mean, label=f"{arm} ({len(r.seeds(family, arm))} seeds)")
            ax.fill_between(x, [min(series[i]) for i in x], [max(series[i]) for i in x], alpha=0.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if axes.flat[0].get_legend_handles_labels()[0]:  # no line where no run logged the panel's figure
        axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"{r.name}: {family} (mean over seeds, band = min..max)")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def report_markdown(r: Runs, figures: dict[str, str] | None = None, base: Runs | None = None) -> str:
    """The study's tables as markdown (what `sdar study report` writes into docs/results.md); with `base`, the study
    it varies, also each run against the same arm and seed there (`against_lines`)."""
    intro = (f"Study `{r.name}`: {r.spec.get('steps')} RL steps per run, evaluated at steps "
             f"{', '.join(map(str, r.spec.get('eval_steps', [])))}. Intervals: bootstrap 95% over seeds and tasks "
             f"({BOOTSTRAP} resamples); differences paired by seed and task.")
    lines = [intro, ""]
    for family in r.families():
        lines += [f"### {family}", "", "| arm | step | seeds | tasks | success [95% CI] | per seed |",
                  "|---|---:|---:|---:|---|---|"]
        for row in success_rows(r, family):
            lines.append(f"| {row['arm']} | {row['step']} | {row['seeds']} | {row['tasks']} | {_ci(*row['ci'])} | "
                         + ", ".join(_fmt(x) for x in row["per_seed"]) + " |")
        diffs = difference_rows(r, family)
        if diffs:
            lines += ["", "| difference | step | seeds | tasks | mean [95% CI] |", "|---|---:|---:|---:|---|"]
            for d in diffs:
                lines.append(f"| {d['a']} - {d['b']} | {d['step']} | {d['seeds']} | {d['tasks']} | "
                             f"{_ci(*d['ci'], sign=True)} |")
        if base is not None:
            lines += against_lines(r, base, family)
        drift = gap_drift(r, family)
        if drift:
            text = (f"Naive arm's free-token gap, first 5 -> last 5 steps ({drift['seeds']} seeds): "
                    f"{drift['first']:+.3f} -> {drift['last']:+.3f} (paper: {drift['paper'][0]:+.2f} -> "
                    f"{drift['paper'][1]:+.2f}).")
            lines += ["", text]
        lines += transfer_lines(r, family)
        w = wall_times(r, family)
        text = (f"Compute: {w['runs']} runs, {_fmt(w['mean_run_s'] / 60, 1)} min per run on average "
                f"(train + evaluations), {_fmt(w['total_run_s'] / 3600, 2)} h in all; warm-start evaluations "
                f"{_fmt(w['warm_eval_s'] / 60, 1)} min.")
        lines += ["", text]
        if figures and family in figures:
            lines += ["", f"![{family} curves]({figures[family]})"]
        lines.append("")
    return "\n".join(lines)


def transfer_lines(r: Runs, family: str) -> list[str]:
    """The real-engine evaluation (study transfer) as a table: pooled over seeds, per task type, failures."""
    whos = list(dict.fromkeys(w for f, _, w in r.transfer if f == family))
    if not whos:
        return []
    any_rec = next(rec for (f, _, _), rec in r.transfer.items() if f == family)
    types = sorted({t for (f, _, _), rec in r.transfer.items() if f == family for t in rec["student"]["per_type"]})
    lines = ["", f"On the real engine ({any_rec['backend']} {any_rec['split']}; games: those the policy played at every "
             "seed; pooled over seeds):", "",
             "| policy | seeds | games | student [95% CI] | per seed | teacher | " + " | ".join(types)
             + " | failed: never took / took, never placed / placed, lost | refused turns |",
             "|---|---:|---:|---|---|---|" + "---:|" * len(types) + "---|---:|"]
    for who in whos:
        recs = [rec for (f, _, w), rec in sorted(r.transfer.items()) if f == family and w == who]
        tasks = common_tasks([rec["student"] for rec in recs])
        student = bootstrap_mean(outcome_matrix([rec["student"] for rec in recs], tasks))
        teacher = float(np.mean([rec["teacher"]["success"] for rec in recs]))
        per_type = []
        for t in types:
            wins = sum(rec["student"]["per_type"].get(t, {}).get("success", 0) * rec["student"]["per_type"].get(t, {})
                       .get("n", 0) for rec in recs)
            n = sum(rec["student"]["per_type"].get(t, {}).get("n", 0) for rec in recs)
            per_type.append(_fmt(wins / n if n else math.nan, 2))
        fails = {k: sum(rec["student"]["failures"][k] for rec in recs)
                 for k in ("failed", "never_took", "took_never_placed", "placed_not_won")}
        refused = float(np.mean([rec["student"]["failures"]["refused_turn_share"] for rec in recs]))
        name = "warm start" if who == "warmstart" else who
        per_seed = ", ".join(_fmt(rec["student"]["success"]) for rec in recs)
        lines.append(f"| {name} | {len(recs)} | {len(tasks)} | {_ci(*student)} | {per_seed} | {_fmt(teacher)} | "
                     + " | ".join(per_type) + f" | {fails['never_took']} / {fails['took_never_placed']} / "
                     f"{fails['placed_not_won']} of {fails['failed']} | {_fmt(refused, 2)} |")
    diffs = transfer_difference_rows(r, family)
    if diffs:
        lines += ["", "On the real engine, each trained policy against its own warm start (student; paired by seed "
                  "and game, over the seeds both were played):", "",
                  "| difference | seeds | games | mean [95% CI] |", "|---|---:|---:|---|"]
        lines += [f"| {d['a']} - {d['b']} | {d['seeds']} | {d['tasks']} | {_ci(*d['ci'], sign=True)} |" for d in diffs]
    return lines


def transfer_difference_rows(r: Runs, family: str) -> list[dict[str, Any]]:
    """Each trained policy's real-engine student minus its warm start's, paired by seed and game, over the
    seeds at which both were played (does what the sim taught carry over to the real engine?)."""
    rows = []
    for policy in dict.fromkeys(w for f, _, w in sorted(r.transfer) if f == family and w != "warmstart"):
        seeds = sorted(s for f, s, w in r.transfer if f == family and w == policy and (f, s, "warmstart") in r.transfer)

        def evals(who: str, seed: int, policy: str = policy) -> dict[str, dict[str, Any]]:
            # one real-engine evaluation each, keyed by the policy's step so that the pair lines up
            step = str(r.transfer[(family, seed, policy)]["step"])
            return {step: r.transfer[(family, seed, "warmstart" if who == WARM else who)]["student"]}

        rows += _paired_rows(policy, WARM, seeds, evals)
    return rows


BEGIN, END = "<!-- study:{name}:begin -->", "<!-- study:{name}:end -->"


def against_missing(results_dir: str | Path, against: str | None = None) -> str | None:
    """Why the study at `results_dir` cannot be paired with the study it names (`against`, default its spec's), or
    None: it names none, or that study's results are beside it."""
    spec_file = Path(results_dir) / "spec.json"
    spec = json.loads(spec_file.read_text()) if spec_file.is_file() else {}
    against = against or spec.get("against")
    there = Path(results_dir).parent / str(against)
    if not against or (there / "spec.json").is_file():
        return None
    return (f"study {spec.get('study', Path(results_dir).name)} is compared against study {against}, whose results "
            f"are not in {there}: run that study first (its results go beside this one's), or drop `against`")


def write_report(results_dir: str | Path, doc: str | Path, figure_dir: str | Path | None = None,
                 against: str | None = None, without_missing: bool = False) -> str:
    """Regenerate the study's block in `doc` (between its markers, the rest kept) and its figures. against: the
    study this one is compared with (default: its spec's `against`), read from beside `results_dir`; when its
    results are not there, an error, or with `without_missing` the report without that table."""
    r = load_results(results_dir)
    against = against or r.spec.get("against")
    base = None
    missing = against_missing(results_dir, against)
    if missing and not without_missing:
        raise FileNotFoundError(missing)
    if against and not missing:
        base = load_results(Path(results_dir).parent / against)
    doc = Path(doc)
    figure_dir = Path(figure_dir or Path(results_dir) / "figures")
    figures = {}
    for family in r.families():
        png = plot_curves(r, family, figure_dir / f"{family}.png")
        if png is not None:
            figures[family] = _relative(png, doc.parent)
    block = report_markdown(r, figures, base)
    begin, end = BEGIN.format(name=r.name), END.format(name=r.name)
    text = doc.read_text() if doc.is_file() else f"# Results\n\n{begin}\n{end}\n"
    if begin not in text or end not in text:
        text = text.rstrip("\n") + f"\n\n{begin}\n{end}\n"
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    text = f"{head}{begin}\n{block}\n{end}{tail}"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    return block


def _relative(path: str | Path, start: str | Path) -> str:
    import os

    return os.path.relpath(Path(path).resolve(), Path(start).resolve())
