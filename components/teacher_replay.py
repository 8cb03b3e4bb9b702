"""KFP component teacher_replay: the self-teacher's scores and the N-teacher pool's DPO pairs of a rollout's
trajectories (sdar.pipeline.steps.replay_teachers)."""

from typing import NamedTuple, Optional

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components._image import COMPONENT_OPTIONS, base_image


@dsl.component(base_image=base_image(), **COMPONENT_OPTIONS)
def teacher_replay(
    trajectories: Input[Dataset],
    config_path: str,
    overrides: str,
    scores: Output[Dataset],
    pairs: Output[Dataset],
    metrics: Output[Metrics],
    checkpoint: Optional[Input[Model]] = None,
    teacher_pool: str = "",
    arm: str = "sdar",
    seed: int = 0,
    replay_round: int = 0,
    family: str = "",
    model: str = "",
    output_root: str = "runs/kfp",
    job_id: str = "standalone",
) -> NamedTuple("ReplayOutputs", [("gap_mean", float), ("gate_mean", float), ("pairs", int)]):
    """Replay every turn of `trajectories`: the privileged self-teacher (the policy `checkpoint` with the task's
    skills in its prompt) scores each turn (gap, SDAR gate: `scores`); for an arm with a replay weight (Composer
    channel 3) the N-teacher pool (`teacher_pool` YAML, "" = the config's `replay` section) proposes an action at
    every turn and the turns it overrules the student on become the DPO `pairs` gated_train consumes, with the
    pool's accounting in their metadata. Parameters: sdar.pipeline.steps.replay_teachers."""
    from collections import namedtuple

    from sdar.pipeline.steps import replay_teachers

    out = replay_teachers(
        trajectories.path, config_path, overrides, scores.path, pairs.path, teacher_pool=teacher_pool, arm=arm,
        seed=seed, replay_round=replay_round, checkpoint=checkpoint.path if checkpoint is not None else "", family=family, model=model,
        output_root=output_root, job_id=job_id)
    for name, value in out["metrics"].items():
        metrics.log_metric(name, value)
    pairs.metadata.update(out["metadata"])
    outputs = namedtuple("ReplayOutputs", ["gap_mean", "gate_mean", "pairs"])
    return outputs(out["gap_mean"], out["gate_mean"], out["pairs"])
