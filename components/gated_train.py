"""KFP component gated_train: trains one arm for one seed (sdar.pipeline.steps.train_arm)."""

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
    """Train `arm` with `seed` here, or as a TorchX job when the config's `launch` section asks for more GPUs, with
    teacher_replay's DPO `pairs` in its first step; round r of R trains to step ceil(steps (r + 1) / R) from round
    r-1's run. Outputs the final policy, the per-step history and the MLflow run id (sdar.pipeline.steps.train_arm)."""
    from collections import namedtuple

    from sdar.pipeline.steps import train_arm

    out = train_arm(arm, seed, config_path, overrides, job_id, checkpoint.path, history.path, family=family,
                    endpoints=endpoints.path if endpoints is not None else "", model=model, steps=steps,
                    pairs=pairs.path if pairs is not None else "", replay_round=replay_round, group_size=group_size,
                    pairs_accounting=dict(pairs.metadata) if pairs is not None else {}, replay_rounds=replay_rounds,
                    tasks_per_step=tasks_per_step, eval_tasks=eval_tasks, experiment=experiment, tracking=tracking,
                    tracking_uri=tracking_uri, output_root=output_root, checkpoint_root=checkpoint_root)
    checkpoint.metadata.update(out["metadata"])
    return namedtuple("TrainOutputs", ["run_id", "final_dir"])(out["run_id"], out["final_dir"])
