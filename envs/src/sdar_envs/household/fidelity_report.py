"""What the sim-vs-engine fidelity check records and reports: one compared step (`StepCompare`), one problem's
steps and differences (`ProblemResult`), and the agreement rates over all problems (`aggregate` -> `FidelityReport`,
with its printed summary). Playing both backends is in household/fidelity.py."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class StepCompare:
    """One compared step: which parts agree (the action was taken in both)."""

    path: str
    action: str
    admissible: bool
    observation: bool
    observation_norm: bool
    won: bool
    valid: bool
    error_kind: bool
    sim_valid: bool = True
    sim_error_kind: str | None = None


@dataclass
class ProblemResult:
    """All compared steps of one problem, plus per-path final wins and differences seen."""

    task_id: str
    task_type: str
    steps: list[StepCompare] = field(default_factory=list)
    final_won: dict[str, tuple[bool, bool]] = field(default_factory=dict)  # path -> (sim, engine)
    diffs: list[dict[str, Any]] = field(default_factory=list)
    engine_reset_s: float = 0.0
    engine_step_s: float = 0.0
    engine_steps: int = 0
    error: str | None = None


@dataclass
class FidelityReport:
    """Agreement rates over every compared step (intro included) and per-path episode wins."""

    problems: int
    steps: int
    admissible_agreement: float
    observation_agreement: float
    observation_norm_agreement: float
    won_agreement: float
    valid_agreement: float
    error_kind_agreement: float
    episode_win_agreement: float
    sim_gold_win_rate_sim: float
    sim_gold_win_rate_engine: float
    engine_gold_win_rate_engine: float
    engine_gold_win_rate_sim: float
    by_path: dict[str, dict[str, float]]
    diff_kinds: dict[str, int]
    verbs: dict[str, int]  # compared steps per verb of a valid action ("<invalid>": the rest)
    # compared steps per error kind the sim marked, refused actions and accepted no-progress ones alike
    # (`progress.NO_PROGRESS_KINDS`), so the report shows which kinds the error-kind agreement covers
    error_kinds: dict[str, int]
    examples: list[dict[str, Any]]
    errors: list[str]
    wall_s: float
    engine_reset_s: float
    engine_steps_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        lines = [
            f"sim vs ALFWorld engine: {self.problems} problems, {self.steps} compared steps, {self.wall_s:.1f} s",
            f"  admissible sets equal   {self.admissible_agreement:.3f}",
            f"  observation exact       {self.observation_agreement:.3f}",
            f"  observation normalised  {self.observation_norm_agreement:.3f}",
            f"  won flag equal          {self.won_agreement:.3f}",
            f"  valid flag equal        {self.valid_agreement:.3f}   error kind equal {self.error_kind_agreement:.3f}",
            f"  episode win equal       {self.episode_win_agreement:.3f}",
            f"  sim gold path wins      sim {self.sim_gold_win_rate_sim:.3f}  engine {self.sim_gold_win_rate_engine:.3f}",
            f"  planner path wins       engine {self.engine_gold_win_rate_engine:.3f}  sim {self.engine_gold_win_rate_sim:.3f}",
            f"  engine reset {self.engine_reset_s:.2f} s/problem, {self.engine_steps_per_s:.1f} steps/s",
        ]
        lines.append(
            "  actions compared: " + ", ".join(f"{k} {v}" for k, v in sorted(self.verbs.items()))
        )
        lines.append(
            "  error kinds compared: "
            + (", ".join(f"{k} {v}" for k, v in sorted(self.error_kinds.items())) or "none")
        )
        if self.diff_kinds:
            lines.append(
                "  differences: "
                + ", ".join(f"{k}={v}" for k, v in sorted(self.diff_kinds.items()))
            )
        for ex in self.examples:
            lines.append(
                f"    [{ex['kind']}] {ex['task_id']} after {ex['action']!r}: sim={ex['sim']!r} engine={ex['engine']!r}"
            )
        lines += [f"  error: {e}" for e in self.errors]
        return "\n".join(lines)


def aggregate(results: list[ProblemResult], wall_s: float) -> FidelityReport:
    """Agreement rates and the most telling differences over all problem results."""
    steps = [s for r in results for s in r.steps]
    n = len(steps)

    def rate(items: list[StepCompare], attr: str) -> float:
        return sum(getattr(s, attr) for s in items) / len(items) if items else 0.0

    by_path: dict[str, dict[str, float]] = {}
    for path in sorted({s.path.rstrip("0123456789") for s in steps}):
        items = [s for s in steps if s.path.rstrip("0123456789") == path]
        by_path[path] = {
            "steps": float(len(items)),
            **{
                a: rate(items, a)
                for a in (
                    "admissible",
                    "observation",
                    "observation_norm",
                    "won",
                    "valid",
                    "error_kind",
                )
            },
        }
    finals = [(p, w) for r in results for p, w in r.final_won.items()]

    def win_rate(path: str, which: int) -> float:
        ws = [w[which] for p, w in finals if p == path]
        return sum(ws) / len(ws) if ws else 0.0

    kinds: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    seen_kinds: Counter[str] = Counter()
    for r in results:
        for d in r.diffs:
            if d["kind"] == "_counts":
                kinds.update({k: v for k, v in d.items() if k != "kind"})
            elif seen_kinds[d["kind"]] < 3:
                seen_kinds[d["kind"]] += 1
                examples.append(d)
    reset_s = sum(r.engine_reset_s for r in results)
    resets = sum(1 for s in steps if s.action == "<reset>")
    step_s = sum(r.engine_step_s for r in results)
    return FidelityReport(
        problems=len(results),
        steps=n,
        admissible_agreement=rate(steps, "admissible"),
        observation_agreement=rate(steps, "observation"),
        observation_norm_agreement=rate(steps, "observation_norm"),
        won_agreement=rate(steps, "won"),
        valid_agreement=rate(steps, "valid"),
        error_kind_agreement=rate(steps, "error_kind"),
        episode_win_agreement=sum(w[0] == w[1] for _, w in finals) / len(finals) if finals else 0.0,
        sim_gold_win_rate_sim=win_rate("sim_gold", 0),
        sim_gold_win_rate_engine=win_rate("sim_gold", 1),
        engine_gold_win_rate_engine=win_rate("engine_gold", 1),
        engine_gold_win_rate_sim=win_rate("engine_gold", 0),
        by_path=by_path,
        diff_kinds=dict(kinds),
        verbs=dict(
            Counter(
                s.action.split(" ", 1)[0] if s.sim_valid else "<invalid>"
                for s in steps
                if s.action != "<reset>"
            )
        ),
        error_kinds=dict(Counter(s.sim_error_kind for s in steps if s.sim_error_kind)),
        examples=examples,
        errors=[r.error for r in results if r.error],
        wall_s=wall_s,
        engine_reset_s=reset_s / resets if resets else 0.0,
        engine_steps_per_s=sum(r.engine_steps for r in results) / step_s if step_s else 0.0,
    )
