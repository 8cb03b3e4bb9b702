"""No deprecation warning that our own calls cause (issue 44): a training run (three arms, activation checkpointing
on and off) and an evaluation record every deprecation warning with the stack that raised it, and none may come
from a call in sdar's own source. A library warns from its own file (transformers' `warnings.warn` points at
modeling_utils.py), so the test reads the stack at the moment of the warning: the first frame outside the package
that raised it is the caller, and a caller in src/ or envs/src/ is a call of ours that must change. Warnings that
one library's call into another causes (peft or TRL calling transformers) are theirs to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deprecations import deprecations_of_ours
from tests.train.conftest import make_trainer, small_config


def test_the_detector_names_a_deprecated_call_of_ours_and_not_a_librarys_own():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, vocab_size=64))
    from sdar.models import policy

    with deprecations_of_ours(skip=(Path(__file__).resolve(),)) as found:
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


def test_the_detector_watches_the_processes_a_command_starts(tmp_path):
    """What the pipeline test (tests/pipeline/test_local_run.py) arranges for a demo run: a subprocess with the
    sitecustomize on PYTHONPATH reports a deprecated call of ours to the log file, and only that."""
    import os
    import subprocess
    import sys

    from sdar.models import policy
    from tests.deprecations import sitecustomize_dir, watched

    log = tmp_path / "deprecations.log"
    env = {**os.environ, **sitecustomize_dir(tmp_path / "site", log)}
    fake = Path(policy.__file__).with_name("_deprecation_probe.py")
    fake.write_text("def call(model):\n    return model.is_gradient_checkpointing\n")
    code = ("from transformers import LlamaConfig, LlamaForCausalLM\n"
            "model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, "
            "num_attention_heads=2, num_key_value_heads=1, vocab_size=64))\n"
            "model.gradient_checkpointing_enable()\n"  # a call from outside our source: not reported
            "from sdar.models._deprecation_probe import call\n"
            "call(model)\n")  # ours: reported
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                              check=False)
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        fake.unlink()
    assert len(watched(log).read_text().splitlines()) == 1  # the process had the hook
    text = log.read_text()
    assert "_deprecation_probe.py:2" in text and "is_gradient_checkpointing" in text and len(text.splitlines()) == 1
