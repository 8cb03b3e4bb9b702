"""The shape the code keeps: no function in the library (src/) or the environments (envs/src/) is over 80 lines, so
each can be read at once (issue 32); the training step's phases stay under 60."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _functions(root: Path):
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(ROOT), node.name, node.end_lineno - node.lineno + 1


def test_no_function_is_over_80_lines():
    long = [f"{path}: {name} ({n} lines)" for root in ("src", "envs/src") for path, name, n in _functions(ROOT / root)
            if n > 80]
    assert long == [], "split these:\n" + "\n".join(long)


def test_the_training_steps_phases_are_short():
    from sdar.train.trainer import Trainer

    phases = ("train_step", "rollout_phase", "score_phase", "update_phase", "step_metrics")
    lengths = {name: n for path, name, n in _functions(ROOT / "src" / "sdar" / "train") if path.name == "trainer.py"}
    assert all(hasattr(Trainer, p) for p in phases)
    assert {p: lengths[p] for p in phases if lengths[p] > 60} == {}
