"""A one-step `sdar train` raises no deprecation warning from the calls this project makes: a dependency's next
release must not break training (transformers 5.40 removes `past_key_values`, which sdar.models.kv_cache keeps
us off). Every FutureWarning and DeprecationWarning the run prints (Python's warnings, shown always, and the
libraries' logged "deprecated" notices) fails the test unless THIRD_PARTY lists it: a warning raised inside a
library about the library's own code, with the reason we cannot act on it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.reliability.train_runs import small_overrides

# (pattern in the warning line, why it is not ours to fix)
THIRD_PARTY = [
    (r"SADeprecationWarning: The ``noload`` loader strategy is deprecated",
     "MLflow's own SQLAlchemy store (sqlalchemy_store.py) configures its mappers with it; no call of ours passes it"),
]
WARNING_LINE = re.compile(r"(\w*(?:Deprecation|Future)Warning)\b|\bdeprecated\b", re.IGNORECASE)


def test_a_one_step_train_prints_no_deprecation_warning_from_our_calls(tiny_ckpt, tmp_path):
    overrides = small_overrides(1, **{"tracking": True, "checkpoint.every": 1})
    cmd = [sys.executable, "-W", "always::DeprecationWarning", "-W", "always::FutureWarning", "-m", "sdar.cli", "train",
           "--config", "configs/household-tiny.yaml", "--output", str(tmp_path / "run")]
    for key, value in overrides.items():
        cmd += ["--set", f"{key}={json.dumps(value)}"]
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "COLUMNS": "200"}
    import os

    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if WARNING_LINE.search(line)]
    ours = [line for line in lines if not any(re.search(p, line) for p, _ in THIRD_PARTY)]
    assert ours == [], "deprecation warnings from our calls:\n" + "\n".join(ours[:20])


def test_the_cache_argument_is_the_one_this_transformers_takes():
    import inspect

    from transformers.models.qwen2.modeling_qwen2 import Qwen2ForCausalLM, Qwen2Model

    from sdar.models.kv_cache import CACHE_KEY

    for cls in (Qwen2Model, Qwen2ForCausalLM):
        params = inspect.signature(cls.forward).parameters
        assert CACHE_KEY in params, (cls.__name__, CACHE_KEY, list(params))
        # where both names exist, the other is the deprecated one
        assert "cache" not in params or CACHE_KEY == "cache"
