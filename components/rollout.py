"""KFP component rollout: plays episodes with a policy, as JSONL trajectories (sdar.pipeline.steps.play_rollouts)."""

from typing import NamedTuple, Optional

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components._image import COMPONENT_OPTIONS, base_image


@dsl.component(base_image=base_image(), **COMPONENT_OPTIONS)
def rollout(
    config_path: str,
    overrides: str,
    trajectories: Output[Dataset],
    checkpoint: Optional[Input[Model]] = None,
    endpoints: Optional[Input[Artifact]] = None,
    arm: str = "grpo",
    episodes: int = 16,
    split: str = "train",
    temperature: float = 1.0,
    seed: int = 0,
    replay_round: int = 0,
    family: str = "",
    model: str = "",
    output_root: str = "runs/kfp",
    job_id: str = "standalone",
) -> NamedTuple("RolloutOutputs", [("episodes", int), ("success", float)]):
    """`episodes` episodes of `checkpoint` (None: the config's model) on tasks of `split` (shuffled by `seed` and
    the round, cycled if the split is smaller), on the env server of `endpoints` (None: in-process environments),
    written as JSONL `trajectories` (the shared trajectory format plus the token ids a teacher replay needs).
    Parameters: sdar.pipeline.steps.play_rollouts."""
    from collections import namedtuple

    from sdar.pipeline.steps import play_rollouts

    out = play_rollouts(
        config_path, overrides, trajectories.path, checkpoint=checkpoint.path if checkpoint is not None else "",
        endpoints=endpoints.path if endpoints is not None else "", arm=arm, episodes=episodes, split=split,
        temperature=temperature, seed=seed, replay_round=replay_round, family=family, model=model,
        output_root=output_root, job_id=job_id)
    trajectories.metadata.update(out["metadata"])
    return namedtuple("RolloutOutputs", ["episodes", "success"])(out["episodes"], out["success"])
