"""FSDP2 sharded training (`distributed.strategy: fsdp`) under a real `torchrun --nproc_per_node 2` (gloo, CPU)
against one process on the same data: one RL step of each main arm, LoRA and full fine-tuning, gives the same
losses and the same updated weights (float tolerance: 1e-4 relative on the losses, as the ddp test; 1e-6 of the
largest weight on the weights, summation order being the only difference); the sharded checkpoints of a run
(torch.distributed.checkpoint, one file per rank) go to S3 (moto) and a resume from them continues bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.train.fsdp_worker import CASES, case_dir

REPO = Path(__file__).resolve().parents[2]
COMPARED = ("loss/total", "loss/pg", "loss/kl", "loss/entropy", "loss/sdar", "loss/hint_jsd", "pg/clipfrac",
            "pg/ratio_mean", "sdar/gate_mean", "grad_norm")


def _worker(out: Path, nproc: int, strategy: str, resume_uri: str = "") -> None:
    args = ["-m", "tests.train.fsdp_worker", "--out", str(out), "--strategy", strategy]
    if resume_uri:
        args += ["--resume-uri", resume_uri]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), *args]
    else:
        cmd = [sys.executable, *args]
    env = {**os.environ, "SDAR_DIST_BACKEND": "gloo", "OMP_NUM_THREADS": "1"}
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted((out / "final").glob("*.safetensors"))
    assert files, f"no final weights in {out / 'final'}"
    return {k: v for f in files for k, v in load_file(f).items()}


@pytest.mark.slow
def test_fsdp_two_ranks_match_one_process_and_resume_bit_for_bit(tiny_ckpt, tmp_path, s3_server):
    bucket = s3_server.make_bucket()
    _worker(tmp_path / "one", 1, "ddp")
    _worker(tmp_path / "two", 2, "fsdp", resume_uri=f"s3://{bucket}/fsdp")
    assert json.loads((tmp_path / "two" / "done.json").read_text()) == {"world_size": 2}
    report = []
    for arm, lora in CASES:
        a_dir, b_dir = case_dir(tmp_path / "one", arm, lora), case_dir(tmp_path / "two", arm, lora)
        (a,), (b,) = (json.loads((d / "history.json").read_text()) for d in (a_dir, b_dir))
        assert a["updates"] == b["updates"] >= 2 and abs(a["loss/pg"]) > 1e-4, (arm, lora, a)
        for key in COMPARED:
            if key in a:
                report.append(f"{arm} lora={lora} {key}: {a[key]:.8f} vs {b[key]:.8f}")
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (arm, lora, key)
        wa, wb = _weights(a_dir), _weights(b_dir)
        assert wa.keys() == wb.keys() and wa
        scale = max(float(v.abs().max()) for v in wa.values())
        diff = max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)
        report.append(f"{arm} lora={lora}: largest weight difference {diff:.3e} (largest weight {scale:.3e})")
        assert diff <= 1e-6 * max(1.0, scale), (arm, lora, diff)
    print("\n".join(report))

    # both ranks' shards in the store, and the resumed run's weights bit for bit those of the straight run
    from sdar.storage import latest_checkpoint, open_store

    store = open_store(f"s3://{bucket}/fsdp/resumed")
    step, rel = latest_checkpoint(store)
    assert step == 2
    names = {k.rsplit("/", 1)[-1] for k in store.list(f"{rel}/shards")}
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= names, names
    ws, wr = _weights(tmp_path / "two" / "straight"), _weights(tmp_path / "two" / "resumed")
    assert ws.keys() == wr.keys() and all(torch.equal(ws[k], wr[k]) for k in ws)
    hs = json.loads((tmp_path / "two" / "straight" / "history.json").read_text())
    hr = json.loads((tmp_path / "two" / "resumed" / "history.json").read_text())
    assert [h["loss/total"] for h in hs] == [h["loss/total"] for h in hr]


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
