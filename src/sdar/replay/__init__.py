"""Composer channel 3: N-teacher trace replay to DPO pairs. `TeacherPool` asks OpenAI-compatible
teachers for each turn's action, `build_pairs` turns their agreement into (chosen, rejected) pairs,
and `serve_local_pool` (`sdar teachers serve`) runs a local pool of policies and rule experts.

`import sdar.replay` stays light (no torch); the server parts load on first use.
"""

from __future__ import annotations

from typing import Any

from sdar.replay.config import ReplayConfig
from sdar.replay.pairs import ReplayPair, build_pairs, normalize_action, read_pairs, vote, write_pairs
from sdar.replay.pool import TeacherEndpoint, TeacherPool

_LAZY = {"serve_local_pool": "sdar.replay.server", "LocalPool": "sdar.replay.server",
         "ServedPolicy": "sdar.replay.server", "open_teacher_pool": "sdar.replay.server"}

__all__ = ["LocalPool", "ReplayConfig", "ReplayPair", "ServedPolicy", "TeacherEndpoint", "TeacherPool",
           "build_pairs", "normalize_action", "open_teacher_pool", "read_pairs", "serve_local_pool", "vote",
           "write_pairs"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sdar.replay' has no attribute {name!r}")
