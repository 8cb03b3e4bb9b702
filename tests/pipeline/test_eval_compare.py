"""The comparison table, plot and MLflow logging of src/sdar/eval/compare.py, and the compare
component called directly on synthetic arm results."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from sdar.eval import wilson_interval
from sdar.eval.compare import ArmRun, results_table, summarize, write_comparison
from sdar.tracking.comparison import log_comparison


def _eval(arm: str, seed: int, wins: int, n: int, per_type: dict[str, tuple[int, int]]) -> dict:
    lo, hi = wilson_interval(wins, n)
    return {"arm": arm, "seed": seed, "label": f"{arm}-seed{seed}", "run_id": "", "success": wins / n,
            "ci95": [lo, hi], "n": n, "mean_reward": wins / n, "mean_length": 5.0, "invalid_rate": 0.1,
            "per_type": {t: {"success": w / k, "n": k, "ci95": list(wilson_interval(w, k))} for t, (w, k) in per_type.items()}}


def _history(arm: str, seed: int, steps: int, start: float, slope: float, gap0: float, gap_slope: float) -> dict:
    rows = []
    for s in range(steps):
        rows.append({"step": s, "success": min(1.0, start + slope * s), "reward": start + slope * s,
                     "sdar/gap_mean": gap0 + gap_slope * s, "sdar/gate_mean": 0.5 + 0.01 * s,
                     **({"eval/success": start + slope * s} if (s + 1) % 5 == 0 else {})})
    return {"arm": arm, "seed": seed, "run_id": f"run-{arm}-{seed}", "steps": steps, "history": rows}


@pytest.fixture
def runs() -> list[ArmRun]:
    # grpo: 5/10 and 7/10 -> pooled 12/20; sdar: 8/10 and 9/10 -> 17/20; grpo_opsd: 4/10 and 4/10 -> 8/20
    spec = {"grpo": [(5, 0.2, -0.10), (7, 0.3, -0.12)], "grpo_opsd": [(4, 0.2, -0.13), (4, 0.1, -0.20)],
            "sdar": [(8, 0.3, -0.10), (9, 0.3, -0.09)]}
    out = []
    for arm, seeds in spec.items():
        for seed, (wins, start, gap0) in enumerate(seeds):
            ev = _eval(arm, seed, wins, 10, {"clean": (wins // 2, 5), "heat": (wins - wins // 2, 5)})
            out.append(ArmRun.from_dicts(ev, _history(arm, seed, 12, start, 0.02, gap0, -0.005)))
    return out


def test_summarize_pools_seeds_with_a_wilson_interval(runs):
    by_arm = {s.arm: s for s in summarize(runs)}
    assert list(by_arm) == ["grpo", "grpo_opsd", "sdar"]
    g = by_arm["grpo"]
    assert g.n == 20 and g.seeds == [0, 1]
    assert g.success == pytest.approx(12 / 20)
    assert g.ci95 == pytest.approx(wilson_interval(12, 20))
    assert g.seed_success == pytest.approx([0.5, 0.7])
    # per type pools episodes: clean 2/5 + 3/5, heat 3/5 + 4/5
    assert g.per_type == pytest.approx({"clean": 5 / 10, "heat": 7 / 10})
    assert g.steps == 12
    assert g.train_success_first == pytest.approx((0.2 + 0.3) / 2)
    assert g.train_success_last == pytest.approx((0.2 + 0.3) / 2 + 0.02 * 11)
    assert g.gap_last == pytest.approx((-0.10 - 0.12) / 2 - 0.005 * 11)
    assert g.gate_last == pytest.approx(0.61)
    assert g.run_ids == ["run-grpo-0", "run-grpo-1"]


def test_results_table_has_a_row_per_arm_the_baseline_and_bolds_the_best(runs):
    baseline = _eval("grpo", 0, 4, 20, {"clean": (2, 10), "heat": (2, 10)})
    table = results_table(summarize(runs), baseline)
    lines = table.strip().splitlines()
    assert lines[0].startswith("| arm | seeds | success (95% CI) | vs own warm start (paired, 95% CI) | clean | heat |")
    assert len(lines) == 2 + 1 + 3  # header, rule, baseline, three arms
    assert lines[2].startswith("| warm start (no RL) | - | 0.200 [")
    sdar = next(line for line in lines if line.startswith("| sdar "))
    lo, hi = wilson_interval(17, 20)
    assert f"**0.850 [{lo:.3f}, {hi:.3f}] (n=20)**" in sdar
    assert "| +0.650 |" in sdar  # 0.85 - 0.20
    opsd = next(line for line in lines if line.startswith("| grpo_opsd "))
    assert "**" not in opsd and "| +0.200 |" in opsd
    # a tie for the best has no bold winner
    tied = [s for s in summarize(runs) if s.arm != "grpo_opsd"]
    tied[0].success = tied[1].success
    assert "**" not in results_table(tied)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    return struct.unpack(">II", data[16:24])


def test_write_comparison_writes_table_plot_and_json(runs, tmp_path):
    baseline = _eval("grpo", 0, 4, 20, {"clean": (2, 10), "heat": (2, 10)})
    comp = write_comparison(runs, tmp_path / "out", baseline=baseline, title="synthetic")
    assert comp.table_path.read_text().startswith("# synthetic\n\n| arm |")
    w, h = _png_size(comp.plot_path)
    assert (w, h) == (1320, 495)  # 12 x 4.5 inches at 110 dpi
    assert comp.plot_path.stat().st_size > 20_000  # two panels with lines, not an empty canvas
    data = json.loads(comp.json_path.read_text())
    assert [a["arm"] for a in data["arms"]] == ["grpo", "grpo_opsd", "sdar"]
    assert len(data["runs"]) == 6
    m = comp.metrics()
    assert m["sdar/success"] == pytest.approx(0.85) and m["grpo_opsd/episodes"] == 20
    assert m["sdar/gap_last"] == pytest.approx((-0.10 - 0.09) / 2 - 0.055)


def test_mismatched_history_and_missing_fields_are_clear_errors():
    ev = _eval("sdar", 0, 5, 10, {})
    with pytest.raises(ValueError, match="history of grpo/seed 0 paired with the evaluation of sdar/seed 0"):
        ArmRun.from_dicts(ev, _history("grpo", 0, 3, 0.1, 0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="lacks 'arm'"):
        ArmRun.from_dicts({"success": 0.5, "n": 4})
    with pytest.raises(ValueError, match="no arm results"):
        write_comparison([], "/tmp/unused")


def test_the_comparison_is_computed_without_mlflow(tmp_path):
    """sdar.eval.compare is statistics, table and plot: a fresh interpreter writes a comparison and its view's rows
    and has not imported MLflow (its writes are sdar.tracking.comparison's)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from sdar.eval.compare import ArmRun, view_rows, write_comparison\n"
        "ev = {'arm': 'sdar', 'seed': 0, 'success': 0.5, 'ci95': [0.1, 0.9], 'n': 4, 'run_id': 'r1', "
        "'outcomes': [['t', 0, 1], ['u', 0, 0]]}\n"
        "runs = [ArmRun.from_dicts(ev, {'arm': 'sdar', 'seed': 0, 'history': [{'step': 1, 'success': 0.5, "
        "'sdar/gap_mean': -0.1, 'sdar/gate_mean': 0.4}]})]\n"
        f"write_comparison(runs, {str(tmp_path)!r})\n"
        "rows = view_rows(runs, None)\n"
        "assert [(r.run_id, r.step) for r in rows] == [('r1', 0), ('r1', 1)], rows\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mlflow'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert (tmp_path / "comparison.md").is_file() and (tmp_path / "comparison.png").is_file()


def test_log_comparison_attaches_files_and_metrics_to_a_running_parent(runs, tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    from sdar.tracking import Tracker

    parent = Tracker("cmp-test", run_name="parent", tracking_uri=mlflow_uri).start()
    comp = write_comparison(runs, tmp_path / "out")
    log_comparison(comp.metrics(), comp.files, parent_run_id=parent.run_id, tracking_uri=mlflow_uri)
    client = MlflowClient(tracking_uri=mlflow_uri)
    run = client.get_run(parent.run_id)
    assert run.info.status == "RUNNING"  # the exit handler, not compare, ends the parent run
    assert run.data.metrics["compare/sdar/success"] == pytest.approx(0.85)
    assert run.data.metrics["compare/grpo/success_ci_low"] == pytest.approx(wilson_interval(12, 20)[0])
    names = sorted(f.path for f in client.list_artifacts(parent.run_id, "comparison"))
    assert names == ["comparison/comparison.json", "comparison/comparison.md", "comparison/comparison.png"]


def test_compare_component_pairs_results_by_arm_and_seed(runs, tmp_path, mlflow_uri):
    from kfp.dsl import Artifact, Markdown, Metrics
    from mlflow.tracking import MlflowClient

    from components.compare import compare
    from sdar.tracking import Tracker

    def art(cls, name, payload=None):
        a = cls(name=name, uri=str(tmp_path / name))
        if payload is not None:
            Path(a.path).write_text(json.dumps(payload))
        return a

    # histories arrive in another order than evaluations: compare pairs them by (arm, seed)
    evals = [art(Artifact, f"ev{i}", r.evaluation) for i, r in enumerate(runs)]
    hists = [art(Artifact, f"h{i}", {"arm": r.arm, "seed": r.seed, "run_id": r.run_id, "history": r.history})
             for i, r in reversed(list(enumerate(runs)))]
    parent = Tracker("cmp-component", run_name="parent", tracking_uri=mlflow_uri).start()
    endpoints = art(Artifact, "endpoints", {"family": "household", "parent_run_id": parent.run_id,
                                             "tracking_uri": mlflow_uri})
    baseline = art(Artifact, "baseline", _eval("grpo", 0, 4, 20, {"clean": (2, 10), "heat": (2, 10)}))
    table, plot, report, metrics = (art(Markdown, "table"), art(Artifact, "plot"), art(Artifact, "report"),
                                    art(Metrics, "metrics"))
    out = compare.python_func(evaluations=evals, histories=hists, table=table, plot=plot, report=report,
                              metrics=metrics, baseline=baseline, endpoints=endpoints,
                              report_dir=str(tmp_path / "published"))
    assert out.best_arm == "sdar"
    assert "| sdar | 0,1 |" in Path(table.path).read_text()
    assert _png_size(Path(plot.path)) == (1320, 495)
    assert sorted(p.name for p in (tmp_path / "published").iterdir()) == ["comparison.json", "comparison.md", "comparison.png"]
    assert metrics.metadata["sdar/success"] == pytest.approx(0.85)
    assert MlflowClient(tracking_uri=mlflow_uri).get_run(parent.run_id).data.metrics["compare/grpo/success"] == pytest.approx(0.6)
    # an evaluation without its history is named in the error
    with pytest.raises(ValueError, match="no training history for sdar/seed 1"):
        compare.python_func(evaluations=evals, histories=hists[1:], table=table, plot=plot, report=report,
                            metrics=metrics, tracking=False)
