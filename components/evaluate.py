"""KFP component evaluate: a policy's held-out success rate (sdar.pipeline.evaluation.evaluate_policy)."""

from typing import List, NamedTuple, Optional

from kfp import dsl
from kfp.dsl import Artifact, Input, Metrics, Model, Output

from components._image import COMPONENT_OPTIONS, base_image


@dsl.component(base_image=base_image(), **COMPONENT_OPTIONS)
def evaluate(
    config_path: str,
    overrides: str,
    job_id: str,
    metrics: Output[Metrics],
    result: Output[Artifact],
    checkpoint: Optional[Input[Model]] = None,
    endpoints: Optional[Input[Artifact]] = None,
    label: str = "",
    arm: str = "grpo",
    seed: int = 0,
    seeds: List[int] = [],
    run_id: str = "",
    family: str = "",
    model: str = "",
    eval_tasks: int = 0,
    episodes_per_task: int = 1,
    temperature: float = 0.4,
    greedy: bool = False,
    experiment: str = "sdar-comparison",
    tracking: bool = True,
    tracking_uri: str = "",
    output_root: str = "runs/kfp",
) -> NamedTuple("EvalOutputs", [("success", float), ("ci_low", float), ("ci_high", float)]):
    """Success rate of `checkpoint` (None: the warm start of each of `seeds`, the baseline) on the fixed held-out tasks,
    the same for every arm and seed, per task type with a 95% Wilson interval: KFP Metrics, the JSON `result`, and the
    numbers in the arm's MLflow run `run_id` (else the parent run, under `<label>/`). Parameters:
    sdar.pipeline.evaluation.evaluate_policy (`experiment` is not used: the run ids say where to log)."""
    from collections import namedtuple

    from sdar.pipeline.evaluation import evaluate_policy
    out = evaluate_policy(
        config_path, overrides, job_id, result.path, checkpoint=checkpoint.path if checkpoint is not None else "",
        endpoints=endpoints.path if endpoints is not None else "", label=label, arm=arm, seed=seed, seeds=seeds,
        run_id=run_id, family=family, model=model, eval_tasks=eval_tasks, episodes_per_task=episodes_per_task,
        temperature=temperature, greedy=greedy, tracking=tracking, tracking_uri=tracking_uri, output_root=output_root)
    for name, value in out["metrics"].items():
        metrics.log_metric(name, value)
    return namedtuple("EvalOutputs", ["success", "ci_low", "ci_high"])(out["success"], out["ci_low"], out["ci_high"])
