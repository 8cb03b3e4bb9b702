"""Data-parallel training under a real `torchrun --nproc_per_node 2` (gloo, CPU) against one
process on the same data: with group-seeded rollouts both see the same trajectories, and because
each rank's loss is weighted by its share of the mini-batch's tokens before the gradients are
summed, the two runs must make the same updates (up to float summation order)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sdar.train import distributed
from sdar.train.distributed import DistContext, RowSplit

from .conftest import SMALL

REPO = Path(__file__).resolve().parents[2]

# 3 task groups over 2 ranks: rank 0 rolls out 2 groups, rank 1 one, so the ranks hold different
# numbers of turn-samples and tokens, and some mini-batches have no row of one rank. Responses cut at
# 6 tokens are sometimes unfinished, hence invalid and penalised: rewards differ within groups, so the
# policy-gradient term is not 0 (with SMALL's 12 tokens every episode of 3 turns scores 0)
RUN = {**SMALL, "arm": "sdar", "steps": 2, "tasks_per_step": 3, "group_size": 2, "ppo.mini_batch_size": 5,
       "checkpoint.every": 1, "rollout.group_seeded": True, "optim.lr": 1e-3, "rollout.max_response_tokens": 6}
COMPARED = ("loss/total", "loss/pg", "loss/kl", "loss/sdar", "loss/entropy", "sdar/gate_mean", "sdar/gap_mean",
            "pg/clipfrac", "pg/ratio_mean", "grad_norm", "teacher/gap_all_tokens")
EXACT = ("reward", "success", "episode_length", "invalid_action_rate", "turn_samples", "updates")


def _train(out: Path, nproc: int, tracking_uri: str) -> subprocess.CompletedProcess:
    args = ["train", "--config", "configs/household-tiny.yaml", "--output", str(out)]
    for key, value in RUN.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    if nproc == 1:
        cmd = [sys.executable, "-m", "sdar.cli", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               "-m", "sdar.cli", *args]
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "SDAR_DIST_BACKEND": "gloo", "OMP_NUM_THREADS": "1"}
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    proc = subprocess.run(cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def _summaries(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _adapter(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    (path,) = (out / "final").glob("adapter_model.safetensors")
    return load_file(path)


@pytest.mark.slow
def test_two_ranks_make_the_same_updates_as_one_process(tiny_ckpt, tmp_path):
    from mlflow.tracking import MlflowClient

    from sdar.tracking import prepare_sqlite_store

    uri1, uri2 = (prepare_sqlite_store(tmp_path / f"mlflow{n}.db") for n in (1, 2))
    one = _train(tmp_path / "one", 1, uri1)
    two = _train(tmp_path / "two", 2, uri2)

    # one summary per job, printed by rank 0 of a 2-process group
    (s1,), (s2,) = _summaries(one.stdout), _summaries(two.stdout)
    assert (s1["world_size"], s2["world_size"]) == (1, 2)

    h1 = json.loads((tmp_path / "one" / "history.json").read_text())
    h2 = json.loads((tmp_path / "two" / "history.json").read_text())
    assert [h["step"] for h in h1] == [h["step"] for h in h2] == [0, 1]
    report = []
    for a, b in zip(h1, h2):
        for key in EXACT:  # the same trajectories, gathered from both ranks
            assert a[key] == b[key], (a["step"], key, a[key], b[key])
        assert a["updates"] >= 2, "the comparison needs more than one mini-batch per step"
        assert abs(a["loss/pg"]) > 1e-4, "the comparison needs non-zero advantages"
        for key in COMPARED:
            report.append(f"step {a['step']} {key}: {a[key]:.8f} vs {b[key]:.8f}")
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
    print("\n".join(report))

    w1, w2 = _adapter(tmp_path / "one"), _adapter(tmp_path / "two")
    assert w1.keys() == w2.keys() and w1
    init = max(float(v.abs().max()) for k, v in w1.items() if "lora_B" in k)
    assert init > 0, "the adapter must have moved for the comparison to mean anything"
    diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    print(f"largest |lora_B| {init:.3e}; largest adapter difference one vs two ranks {diff:.3e}")
    assert diff <= 1e-5 * max(1.0, init)
    # only rank 0 wrote: one MLflow run, and checkpoints of both steps
    runs = MlflowClient(uri2).search_runs([e.experiment_id for e in MlflowClient(uri2).search_experiments()])
    assert len(runs) == 1 and runs[0].data.tags["arm"] == "sdar"
    from sdar.storage import latest_checkpoint, open_store

    assert latest_checkpoint(open_store(str(tmp_path / "two" / "checkpoints")))[0] == 2


def test_groups_are_split_into_contiguous_blocks_in_rank_order():
    blocks = [list(distributed.group_range(7, DistContext(rank=r, world_size=3))) for r in range(3)]
    assert blocks == [[0, 1, 2], [3, 4], [5, 6]]
    assert list(distributed.group_range(4, DistContext())) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="tasks_per_step=1 is smaller than the 2 ranks"):
        distributed.group_range(1, DistContext(rank=0, world_size=2))


def test_shares_weight_each_rank_by_its_part_of_the_loss_normaliser():
    # rows 0-2 on rank 0, rows 3-4 on rank 1; the mini-batch [4, 0, 3] holds 5 + 3 + 0 tokens
    tokens = [5, 1, 2, 3, 0]
    r0, r1 = RowSplit(tokens, offset=0, count=3), RowSplit(tokens, offset=3, count=2)
    rows = [4, 0, 3]
    assert r0.local(rows) == [0] and r1.local(rows) == [1, 0]
    assert r0.share(rows, "token-mean") == pytest.approx(5 / 8) and r1.share(rows, "token-mean") == pytest.approx(3 / 8)
    assert r0.share(rows, "seq-mean-token-mean") == pytest.approx(1 / 2)  # the empty row 4 does not count
    assert r0.share(rows, "token-sum") == r1.share(rows, "token-sum") == 1.0
    # Dr. GRPO's sum / (B * budget) counts every row, the empty one too
    assert r0.share(rows, "seq-mean-token-sum-norm") == pytest.approx(1 / 3)
    assert r1.share(rows, "seq-mean-token-sum-norm") == pytest.approx(2 / 3)
    # the shares make the ranks' token means add up to the mini-batch's token mean (seeded: an unseeded draw
    # whose mean fell near 0 once failed the relative tolerance)
    values = torch.randn(5, 6, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(5, 6)
    for i, t in enumerate(tokens):
        mask[i, :t] = 1

    def token_mean(idx):
        return float((values[idx] * mask[idx]).sum() / mask[idx].sum().clamp(min=1))

    local = [token_mean([0]), token_mean([4, 3])]
    combined = r0.share(rows, "token-mean") * local[0] + r1.share(rows, "token-mean") * local[1]
    assert combined == pytest.approx(token_mean(rows), rel=1e-6, abs=1e-7)
    from sdar.algos import aggregate

    def sum_norm(idx):
        return float(aggregate(values[idx], mask[idx], "seq-mean-token-sum-norm", budget=6))

    combined = r0.share(rows, "seq-mean-token-sum-norm") * sum_norm([0]) + \
        r1.share(rows, "seq-mean-token-sum-norm") * sum_norm([4, 3])
    assert combined == pytest.approx(sum_norm(rows), rel=1e-6, abs=1e-7)
    alone = RowSplit(tokens, offset=0, count=5)
    assert alone.share(rows, "token-mean") == 1.0 and alone.local(rows) == rows


def test_alone_everything_is_the_identity():
    ctx = distributed.init_from_env() if "WORLD_SIZE" not in os.environ else DistContext()
    assert not ctx.enabled and ctx.is_main
    p = torch.nn.Parameter(torch.ones(3))
    finite, metrics = distributed.sync_update([p], {"loss/total": torch.tensor(2.0)}, 1.0, True, ctx)
    assert finite and metrics == {"loss/total": 2.0} and p.grad is None
    m = {"reward": 0.5, "time/step_s": 1.0}
    assert distributed.reduce_step_metrics(m, {"trajectories": 4}, ctx) is m
