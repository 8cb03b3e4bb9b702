"""KFP component gated_train: trains one arm for one seed with `sdar.train.train` (rollout ->
teacher scoring -> update inside one process, no reloads), or, when the config's `launch` section
asks for more than one GPU (or `launcher: torchx`), as a TorchX job of torchrun workers that this
step submits and waits for (sdar.launch); outputs the final checkpoint, the per-step history and
the arm's MLflow child run id."""

from typing import NamedTuple, Optional

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components._image import COMPONENT_OPTIONS, base_image


@dsl.component(base_image=base_image(), **COMPONENT_OPTIONS)
def gated_train(
    arm: str,
    seed: int,
    config_path: str,
    overrides: str,
    job_id: str,
    checkpoint: Output[Model],
    history: Output[Artifact],
    endpoints: Optional[Input[Artifact]] = None,
    pairs: Optional[Input[Dataset]] = None,
    replay_round: int = 0,
    replay_rounds: int = 1,
    family: str = "",
    model: str = "",
    steps: int = 0,
    group_size: int = 0,
    tasks_per_step: int = 0,
    eval_tasks: int = 0,
    experiment: str = "sdar-comparison",
    tracking: bool = True,
    tracking_uri: str = "",
    output_root: str = "runs/kfp",
    checkpoint_root: str = "",
) -> NamedTuple("TrainOutputs", [("run_id", str), ("final_dir", str)]):
    """Train `arm` with `seed` on the config plus `overrides`, a JSON object of dotted config keys
    (e.g. '{"rollout.max_turns": 8}'; JSON, because KFP turns the numbers of a dict parameter into floats).

    steps / group_size / tasks_per_step / eval_tasks: 0 keeps the config's value.
    family / model: "" keeps the config's env.family / model.name_or_path.
    endpoints: launch_envs' JSON; its url is the env server to play on (None: in-process envs) and its
    parent_run_id makes this run an MLflow child of the pipeline's run.
    output_root: run directory root (<output_root>/<job_id>/<arm>-seed<seed>); a retried step resumes
    from its latest checkpoint there. checkpoint_root: put checkpoints under this URI instead
    (s3://bucket/prefix on a cluster). checkpoint: the final policy (LoRA adapter + tokenizer).
    pairs: teacher_replay's DPO pairs (Composer channel 3), added to the first step's loss of an arm with a
    replay weight; its metadata (the pool's accounting) is logged to this arm's MLflow run as dag_replay/*.
    replay_round / replay_rounds: round r of R trains up to step ceil(steps * (r + 1) / R), resuming the
    previous round's run (same output directory, optimizer state, reference and MLflow run).
    A TorchX job (launch.* in the config or overrides, e.g. '{"launch.nodes": 2, "launch.gpus_per_node": 4}')
    gets the same config and overrides, and runs launch.image, else SDAR_IMAGE (the cluster pipeline
    sets it to its own image); on Kubernetes it needs checkpoint_root (s3://), through which its
    rank 0 hands the result back. This pod then only waits: compile with `sdar compile --gpus 0`.
    """
    import json
    import os
    import shutil
    import time
    from collections import namedtuple
    from pathlib import Path

    from sdar.config import load_config, parse_overrides
    from sdar.train import train

    info = json.loads(Path(endpoints.path).read_text()) if endpoints is not None else {}
    ov = parse_overrides(overrides)
    ov.update({"arm": arm, "seed": int(seed), "experiment": experiment, "tracking": bool(tracking),
               "output_dir": str(Path(output_root) / job_id / f"{arm}-seed{int(seed)}")})
    for key, value in (("steps", steps), ("group_size", group_size), ("tasks_per_step", tasks_per_step),
                       ("eval.tasks", eval_tasks)):
        if value:
            ov[key] = int(value)
    if family:
        ov["env.family"] = family
    if model:
        ov["model.name_or_path"] = model
    if info.get("url"):
        ov["env.url"] = info["url"]
    if info.get("parent_run_id"):
        ov["parent_run_id"] = info["parent_run_id"]
    if pairs is not None:
        ov["replay.pairs_path"] = pairs.path
    if replay_rounds < 1 or not 0 <= replay_round < replay_rounds:
        raise ValueError(f"replay_round={replay_round} of replay_rounds={replay_rounds}: need 0 <= round < rounds")
    if replay_rounds > 1:
        import math

        total = load_config(config_path, ov).steps
        ov["steps"] = math.ceil(total * (replay_round + 1) / replay_rounds)
    if checkpoint_root:
        ov["checkpoint.uri"] = f"{checkpoint_root.rstrip('/')}/{job_id}/{arm}-seed{int(seed)}"
    if tracking:
        from sdar.tracking import default_tracking_uri

        # every arm logs into one store: the pipeline's, else the one under output_root
        os.environ["MLFLOW_TRACKING_URI"] = (tracking_uri or info.get("tracking_uri")
                                             or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(output_root))
    cfg = load_config(config_path, ov)
    t0 = time.perf_counter()
    if cfg.launch.wants_torchx():
        from sdar.launch import launch_training

        summary = launch_training(cfg, config_path, ov)
    else:
        from sdar.train.warmstart import ensure_warm_start

        ensure_warm_start(cfg)  # the tiny model's warm start (cached: the baseline evaluation built it)
        summary = train(cfg)
    seconds = time.perf_counter() - t0
    if tracking and pairs is not None and summary.get("run_id"):
        from sdar.eval.compare import log_to_run

        acct = {f"dag_{k}": float(v) for k, v in pairs.metadata.items() if isinstance(v, (int, float))}
        if acct:
            log_to_run(summary["run_id"], acct, tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"))

    dst = Path(checkpoint.path)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(summary["final_dir"], dst)
    checkpoint.metadata.update({"arm": arm, "seed": int(seed), "run_id": summary.get("run_id") or "",
                                "steps": summary["steps"]})
    Path(history.path).parent.mkdir(parents=True, exist_ok=True)
    Path(history.path).write_text(json.dumps({
        "arm": arm, "seed": int(seed), "run_id": summary.get("run_id") or "", "steps": summary["steps"],
        "train_seconds": seconds, "output_dir": summary["output_dir"], "history": summary["history"],
    }, indent=1))
    last = summary["history"][-1] if summary["history"] else {}
    print(f"{arm}/seed{seed}: {summary['steps']} steps in {seconds:.0f} s; last step success "
          f"{last.get('success', float('nan')):.3f}, gap {last.get('sdar/gap_mean', float('nan')):+.3f}")
    return namedtuple("TrainOutputs", ["run_id", "final_dir"])(summary.get("run_id") or "", str(dst))
