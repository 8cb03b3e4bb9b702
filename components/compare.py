"""KFP component compare: the results table (markdown) and the plot of success rate and
teacher-student gap over steps for every arm, logged to the pipeline's MLflow parent run."""

from typing import List, NamedTuple, Optional

from kfp import dsl
from kfp.dsl import Artifact, Input, Markdown, Metrics, Output

from components._image import COMPONENT_OPTIONS, base_image


@dsl.component(base_image=base_image(), **COMPONENT_OPTIONS)
def compare(
    evaluations: Input[List[Artifact]],
    histories: Input[List[Artifact]],
    table: Output[Markdown],
    plot: Output[Artifact],
    report: Output[Artifact],
    metrics: Output[Metrics],
    baseline: Optional[Input[Artifact]] = None,
    endpoints: Optional[Input[Artifact]] = None,
    title: str = "",
    tracking: bool = True,
    tracking_uri: str = "",
    output_root: str = "runs/kfp",
    report_dir: str = "",
) -> NamedTuple("CompareOutputs", [("best_arm", str), ("table_md", str)]):
    """Pair every arm's evaluation JSON with its training history (by arm and seed) and write
    `table` (markdown), `plot` (PNG) and `report` (a directory: comparison.md/.png/.json).

    baseline: the warm-started policy's evaluation, shown as the first row and a dashed line.
    endpoints: launch_envs' JSON; the files and per-arm metrics go to its MLflow parent run.
    report_dir: also copy the report files there (local runs: a stable place to open them).
    """
    import json
    import os
    import shutil
    from collections import namedtuple
    from pathlib import Path

    from sdar.eval.compare import ArmRun, log_comparison, write_comparison

    evals = [json.loads(Path(a.path).read_text()) for a in evaluations]
    hists = {}
    for a in histories:
        h = json.loads(Path(a.path).read_text())
        hists[(h["arm"], int(h["seed"]))] = h
    runs = []
    for ev in evals:
        key = (ev["arm"], int(ev["seed"]))
        if key not in hists:
            raise ValueError(f"no training history for {key[0]}/seed {key[1]}; have {sorted(hists)}")
        runs.append(ArmRun.from_dicts(ev, hists[key]))
    base = json.loads(Path(baseline.path).read_text()) if baseline is not None else None
    info = json.loads(Path(endpoints.path).read_text()) if endpoints is not None else {}
    result = write_comparison(runs, report.path, baseline=base, title=title or f"sdar comparison ({info.get('family', '')})".replace(" ()", ""))
    shutil.copyfile(result.table_path, table.path)
    shutil.copyfile(result.plot_path, plot.path)
    if report_dir:
        Path(report_dir).mkdir(parents=True, exist_ok=True)
        for p in (result.table_path, result.plot_path, result.json_path):
            shutil.copyfile(p, Path(report_dir) / p.name)
    for k, v in result.metrics().items():
        metrics.log_metric(k, float(v))
    parent = info.get("parent_run_id") or ""
    if tracking and parent:
        from sdar.tracking import default_tracking_uri

        uri = (tracking_uri or info.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
               or default_tracking_uri(output_root))
        log_comparison(result, parent_run_id=parent, tracking_uri=uri)
    print(result.table)
    print(f"plot: {result.plot_path}")
    best = max(result.summaries, key=lambda s: s.success).arm
    return namedtuple("CompareOutputs", ["best_arm", "table_md"])(best, result.table)
