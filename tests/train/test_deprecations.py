"""No deprecation warning that our own calls cause (issue 44): a training run (three arms, activation checkpointing
on and off) and an evaluation record every deprecation warning with the stack that raised it, and none may come
from a call in sdar's own source. A library warns from its own file (transformers' `warnings.warn` points at
modeling_utils.py), so the test reads the stack at the moment of the warning: the first frame outside the package
that raised it is the caller, and a caller in src/ or envs/src/ is a call of ours that must change. Warnings that
one library's call into another causes (peft or TRL calling transformers) are theirs to fix."""

from __future__ import annotations

import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.train.conftest import make_trainer, small_config

ROOT = Path(__file__).resolve().parents[2]
OURS = ((ROOT / "src").resolve(), (ROOT / "envs" / "src").resolve())
DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
STDLIB_WARNINGS = Path(warnings.__file__).resolve()


def _package(filename: str) -> Path:
    """The top package directory a file belongs to (site-packages/<pkg>, or src/<pkg>), else its own folder."""
    p = Path(filename).resolve()
    for root in ("site-packages", "dist-packages", "src"):
        if root in p.parts[:-1]:
            i = len(p.parts) - 1 - p.parts[::-1].index(root)
            return Path(*p.parts[: i + 2]) if i + 2 < len(p.parts) else p.parent
    return p.parent


@contextmanager
def deprecations_of_ours():
    """Yields a list that collects, for each deprecation warning raised inside the block, 'caller: message' when the
    first frame outside the warning's own package is in our source."""
    found: list[str] = []
    real = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, DEPRECATIONS):
            return
        raiser = _package(filename)
        for frame in reversed(traceback.extract_stack()[:-1]):
            where = Path(frame.filename).resolve()
            if where.is_relative_to(raiser) or where == STDLIB_WARNINGS:
                continue
            if where == Path(__file__).resolve():
                return
            if any(where.is_relative_to(o) for o in OURS):
                found.append(f"{where.relative_to(ROOT)}:{frame.lineno} -> {category.__name__}: {message}")
            return

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        try:
            yield found
        finally:
            warnings.showwarning = real


def test_the_detector_names_a_deprecated_call_of_ours_and_not_a_librarys_own():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, vocab_size=64))
    from sdar.models import policy

    with deprecations_of_ours() as found:
        model.gradient_checkpointing_enable()  # called from this test: not ours (the test file is skipped)
    assert found == []
    src = "def call(model):\n    return model.is_gradient_checkpointing\n"
    fake = Path(policy.__file__).with_name("_deprecation_probe.py")  # a module inside src/sdar, written for the test
    fake.write_text(src)
    try:
        import importlib

        probe = importlib.import_module("sdar.models._deprecation_probe")
        with deprecations_of_ours() as found:
            probe.call(model)
    finally:
        fake.unlink()
    assert len(found) == 1 and "_deprecation_probe.py:2" in found[0] and "is_gradient_checkpointing" in found[0]


@pytest.mark.parametrize(("arm", "sets"), [("sdar", {}), ("composer", {}), ("grpo", {"model.gradient_checkpointing": True})])
def test_training_and_evaluation_cause_no_deprecation_warning_of_our_own(tiny_ckpt, tmp_path, arm, sets, mlflow_uri):
    with deprecations_of_ours() as found:
        trainer = make_trainer(small_config(tmp_path, arm=arm, steps=1, **{"eval.every": 1, "eval.tasks": 2, **sets}))
        trainer.run()
        trainer.evaluate(temperature=0.0, tasks=trainer.eval_tasks[:1])
    assert trainer.step == 1
    assert found == [], "\n".join(found)
