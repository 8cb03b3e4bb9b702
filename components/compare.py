"""KFP component compare: the results table and plot of every arm, logged to the pipeline's MLflow parent run
(sdar.pipeline.steps.compare_arms)."""

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
    """Pair every arm's evaluation JSON with its training history (by arm and seed) and write `table`
    (markdown), `plot` (PNG of success and teacher-student gap over steps) and `report` (a directory:
    comparison.md/.png/.json), with the `baseline` (the warm start's evaluation) as the first row; the files
    and per-arm metrics go to the MLflow parent run of `endpoints`. Parameters: sdar.pipeline.steps.compare_arms."""
    from collections import namedtuple

    from sdar.pipeline.steps import compare_arms

    out = compare_arms(
        [a.path for a in evaluations], [a.path for a in histories], table.path, plot.path, report.path,
        baseline=baseline.path if baseline is not None else "", title=title,
        endpoints=endpoints.path if endpoints is not None else "", tracking=tracking, tracking_uri=tracking_uri,
        output_root=output_root, report_dir=report_dir)
    for name, value in out["metrics"].items():
        metrics.log_metric(name, value)
    return namedtuple("CompareOutputs", ["best_arm", "table_md"])(out["best_arm"], out["table_md"])
