"""Kubeflow Pipelines components of the sdar comparison pipeline, one per module: each parses its inputs,
calls one sdar.pipeline function and writes its outputs. The DAG lives in pipelines/."""

from types import SimpleNamespace

from components._image import DEFAULT_ENV_IMAGE, DEFAULT_IMAGE, base_image, env_image, with_image
from components.compare import compare
from components.evaluate import evaluate
from components.gated_train import gated_train
from components.launch_envs import launch_envs
from components.rollout import rollout
from components.run_matrix import run_matrix
from components.teacher_replay import teacher_replay
from components.teardown_envs import teardown_envs

ALL = (run_matrix, launch_envs, evaluate, gated_train, compare, teardown_envs, rollout, teacher_replay)


def for_image(image: str | None):
    """Every component by name (`.evaluate`, ...), built for `image`; None: as imported (SDAR_IMAGE or the
    trainer image)."""
    return SimpleNamespace(**{c.python_func.__name__: with_image(c, image) if image else c for c in ALL})


__all__ = [
    "ALL", "DEFAULT_ENV_IMAGE", "DEFAULT_IMAGE", "base_image", "compare", "env_image", "evaluate", "for_image",
    "gated_train", "launch_envs", "rollout", "run_matrix", "teacher_replay", "teardown_envs", "with_image",
]
