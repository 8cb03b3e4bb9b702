"""The on-policy trainer: rollout -> old/ref/teacher log-probs -> group advantages ->
mini-batch updates with the arm's loss, with checkpoints, resume and MLflow tracking.

Imports are lazy so that `sdar` commands that never train (env servers) stay light.
"""

__all__ = ["StepResult", "Trainer", "train"]


def __getattr__(name):
    if name in __all__:
        from sdar.train import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'sdar.train' has no attribute {name!r}")
