"""Bootstrap intervals of held-out outcomes: a [seeds, tasks] matrix of wins resampled by seed and by task. Used by
the comparison report (sdar.eval.compare) and a study's analysis (sdar.study.analysis)."""

from __future__ import annotations

import math

import numpy as np

BOOTSTRAP = 2000


def bootstrap_mean(m: np.ndarray, n: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float, float]:
    """Mean of the [seeds, tasks] matrix `m` and its 95% percentile interval, resampling seeds and tasks."""
    if m.size == 0:
        return (math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    s, t = m.shape
    rows = rng.integers(0, s, size=(n, s))
    cols = rng.integers(0, t, size=(n, t))
    # mean over the resampled rows and columns: (1/st) * sum_i sum_j m[rows_i, cols_j]
    stats = np.array([m[np.ix_(r, c)].mean() for r, c in zip(rows, cols)])
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return float(m.mean()), float(lo), float(hi)


def paired_difference(a: np.ndarray, b: np.ndarray, n: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float, float]:
    """Mean of a - b ([seeds, tasks], paired by seed and task) with its bootstrap 95% interval."""
    if a.shape != b.shape:
        raise ValueError(f"paired outcomes must have one shape, got {a.shape} and {b.shape}")
    return bootstrap_mean(a - b, n, seed)
