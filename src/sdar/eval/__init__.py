"""Evaluation on a fixed held-out task set, comparison tables and plots."""

from sdar.eval.evaluate import EvalResult, evaluate, wilson_interval

__all__ = ["EvalResult", "evaluate", "wilson_interval"]
