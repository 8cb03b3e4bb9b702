"""KFP component evaluate: success rate of a policy on the fixed held-out task set (the same task
ids for every arm and seed), per task type, with a 95% Wilson interval; KFP Metrics, a JSON
artifact, and the numbers in the arm's MLflow run (or the parent run for the warm start)."""

from typing import NamedTuple, Optional

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
    """Play `eval_tasks` tasks of the config's eval split (stratified over task types unless the
    config's eval_task_order is "first"; see sdar.eval.tasks) `episodes_per_task` times each.

    checkpoint: the policy to evaluate (a gated_train output); None evaluates the config's model
    as built (the warm-started tiny model by default), i.e. the baseline before RL.
    arm: decides the student's prompt (skill_grpo shows skills); grpo = the plain student prompt.
    temperature: the paper's 0.4; greedy=True decodes greedily instead (temperature 0).
    run_id: the arm's MLflow run; its metrics get a `final/` prefix there. Without one, the numbers
    go to the pipeline's parent run under `<label>/` (e.g. baseline/success).
    result: JSON {label, arm, seed, run_id, task_ids, success, ci95, n, per_type, ...}.
    """
    import json
    import os
    from collections import namedtuple
    from pathlib import Path

    from sdar.config import load_config, parse_overrides
    from sdar.eval import evaluate as run_eval
    from sdar.train.runtime import build_runtime, seed_everything
    from sdar.train.warmstart import ensure_warm_start

    info = json.loads(Path(endpoints.path).read_text()) if endpoints is not None else {}
    name = label or (f"{arm}-seed{int(seed)}" if checkpoint is not None else "baseline")
    ov = parse_overrides(overrides)
    ov.update({"arm": arm, "seed": int(seed), "tracking": False,
               "output_dir": str(Path(output_root) / job_id / f"eval-{name}")})
    if eval_tasks:
        ov["eval.tasks"] = int(eval_tasks)
    if family:
        ov["env.family"] = family
    if model:
        ov["model.name_or_path"] = model
    if checkpoint is not None:
        ov["model.name_or_path"] = checkpoint.path
    if info.get("url"):
        ov["env.url"] = info["url"]
    cfg = load_config(config_path, ov)
    if episodes_per_task < 1:
        raise ValueError(f"episodes_per_task must be >= 1, got {episodes_per_task}")
    ensure_warm_start(cfg)  # the tiny model's warm start: built once here, every later step loads it
    # the policy, the rollout settings of `arm` and the env factory
    rt = build_runtime(cfg, train=False)
    tasks = list(rt.eval_tasks)
    if len(tasks) < cfg.eval.tasks:
        print(f"note: the {cfg.env.eval_split!r} split has {len(tasks)} tasks, fewer than eval_tasks={cfg.eval.tasks}")
    temp = 0.0 if greedy else float(temperature)
    seed_everything(10_007 + int(seed))  # the same sampling noise for every arm of a seed
    res = run_eval(rt.backend, rt.tokenizer, rt.env_factory, tasks, rt.rollout_cfg,
                   temperature=temp, episodes_per_task=int(episodes_per_task))

    data = {"label": name, "arm": arm, "seed": int(seed), "run_id": run_id, "baseline": checkpoint is None,
            "temperature": temp, "episodes_per_task": int(episodes_per_task), "task_ids": tasks,
            "family": cfg.env.family, **res.to_dict()}
    Path(result.path).parent.mkdir(parents=True, exist_ok=True)
    Path(result.path).write_text(json.dumps(data, indent=1))
    flat = res.metrics(prefix="eval")
    for k, v in flat.items():
        metrics.log_metric(k.split("/", 1)[1], float(v))
    metrics.log_metric("episodes", float(res.n))

    parent = info.get("parent_run_id") or ""
    target_run = run_id or parent
    if tracking and target_run:
        from sdar.eval.compare import log_to_run
        from sdar.tracking import default_tracking_uri

        uri = (tracking_uri or info.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
               or default_tracking_uri(output_root))
        prefix = "final" if run_id else name
        log_to_run(target_run, {f"{prefix}/{k.split('/', 1)[1]}": v for k, v in flat.items()},
                   files={f"{prefix}_eval.json": Path(result.path)}, tracking_uri=uri)
    print(f"{name}: success {res.success:.3f} [{res.ci95[0]:.3f}, {res.ci95[1]:.3f}] over {res.n} episodes "
          f"({len(tasks)} tasks x {episodes_per_task}, temperature {temp:g})")
    return namedtuple("EvalOutputs", ["success", "ci_low", "ci_high"])(res.success, res.ci95[0], res.ci95[1])
