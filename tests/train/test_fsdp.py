"""FSDP2 sharded training (`distributed.strategy: fsdp`) in one process: a sharded checkpoint read whole for
evaluation, and a ddp checkpoint resumed under fsdp. Under torchrun at 1, 2 and 3 ranks against one process, with
sharded checkpoints through S3 and resumes across rank counts: tests/train/test_launch_matrix.py."""

from __future__ import annotations

from pathlib import Path

import torch


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted((out / "final").glob("*.safetensors"))
    assert files, f"no final weights in {out / 'final'}"
    return {k: v for f in files for k, v in load_file(f).items()}


def test_a_sharded_checkpoint_loads_in_one_process_for_evaluation(tiny_ckpt, tmp_path):
    """An fsdp run's checkpoint (its shards) is read whole by a single process: `sdar eval`'s Runtime.load_weights."""
    from sdar.config import load_config
    from sdar.train import Trainer
    from sdar.train.runtime import build_runtime

    from .conftest import SMALL

    cfg = load_config("configs/household-tiny.yaml", {**SMALL, "steps": 1, "tracking": False,
                                                      "output_dir": str(tmp_path / "run"), "distributed.strategy": "fsdp"})
    Trainer(cfg).run()
    trained = _weights(tmp_path / "run")
    rt = build_runtime(load_config("configs/household-tiny.yaml", {**SMALL, "output_dir": str(tmp_path / "eval")}),
                       train=False)
    assert rt.load_weights(str(tmp_path / "run")) == 1
    from peft import get_peft_model_state_dict

    loaded = get_peft_model_state_dict(rt.model)  # the adapter under the names peft saves it with
    assert loaded.keys() == trained.keys()
    assert all(torch.equal(loaded[k].detach().cpu(), trained[k]) for k in trained)


def test_a_ddp_checkpoint_resumes_under_fsdp(tiny_ckpt, tmp_path):
    """A whole-tensor checkpoint (weights and AdamW's state by parameter position) resumes into a sharded model:
    one ddp step then one fsdp step ends where two ddp steps do."""
    from sdar.config import load_config
    from sdar.train import Trainer

    from .test_distributed import RUN

    def run(out, steps, strategy):
        cfg = load_config("configs/household-tiny.yaml", {**RUN, "steps": steps, "tracking": False,
                                                          "output_dir": str(out), "distributed.strategy": strategy})
        Trainer(cfg).run()

    run(tmp_path / "straight", 2, "ddp")
    run(tmp_path / "switched", 1, "ddp")
    run(tmp_path / "switched", 2, "fsdp")
    ws, wf = _weights(tmp_path / "straight"), _weights(tmp_path / "switched")
    scale = max(float(v.abs().max()) for v in ws.values())
    assert ws.keys() == wf.keys()
    assert max(float((ws[k] - wf[k]).abs().max()) for k in ws) <= 1e-6 * max(1.0, scale)
