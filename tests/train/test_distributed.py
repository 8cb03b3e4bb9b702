"""The data-parallel bookkeeping (sdar.train.distributed) by hand: how task groups, rows, hint tokens and DPO pairs
split over ranks, each rank's share of each loss term's denominator, and how per-rank metrics combine. The runs
themselves, under torchrun at 1, 2 and 3 ranks against one process: tests/train/test_launch_matrix.py."""

from __future__ import annotations

import os

import pytest
import torch

from sdar.train import distributed
from sdar.train.distributed import DistContext, RowSplit

from .conftest import SMALL

# The runs of tests/train/test_launch_matrix.py. 3 task groups over 2 ranks: rank 0 rolls out 2 groups, rank 1 one,
# so the ranks hold different numbers of turn-samples and tokens, and some mini-batches have no row of one rank. Responses cut at
# 6 tokens are sometimes unfinished, hence invalid and penalised: rewards differ within groups, so the
# policy-gradient term is not 0 (with SMALL's 12 tokens every episode of 3 turns scores 0)
RUN = {**SMALL, "arm": "sdar", "steps": 2, "tasks_per_step": 3, "group_size": 2, "ppo.mini_batch_size": 5,
       "checkpoint.every": 1, "rollout.group_seeded": True, "optim.lr": 1e-3, "rollout.max_response_tokens": 6}


def _mask(lengths: list[int], width: int) -> torch.Tensor:
    """[rows, width]: 1 on each row's first lengths[i] positions."""
    return (torch.arange(width) < torch.tensor(lengths).unsqueeze(1)).float()


def _token_mean(values: torch.Tensor, mask: torch.Tensor, rows: list[int]) -> float:
    """The mean of `values` over the masked tokens of `rows` (0 where they hold none)."""
    return float((values[rows] * mask[rows]).sum() / mask[rows].sum().clamp(min=1))


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
    mask = _mask(tokens, width=6)

    def token_mean(idx):
        return _token_mean(values, mask, idx)

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


def test_the_hint_channel_is_weighted_by_each_ranks_share_of_the_hint_tokens():
    """Rows 0-2 on rank 0, rows 3-4 on rank 1; error sites (hint rows) are 1 and 3. The hint JSD is a token mean
    over the hint tokens, so a rank's factor is its part of those (6 of 6 + 2), not of the policy's tokens."""
    tokens, hint = [5, 6, 2, 2, 1], [0, 6, 0, 2, 0]
    r0, r1 = (RowSplit(tokens, offset=o, count=c, hint_tokens=hint, pairs=[0, 0], rank=r)
              for r, (o, c) in enumerate(((0, 3), (3, 2))))
    rows = [0, 1, 3, 4]
    assert r0.share(rows, "token-mean", counts="hint_tokens") == pytest.approx(6 / 8)
    assert r1.share(rows, "token-mean", counts="hint_tokens") == pytest.approx(2 / 8)
    # the policy's share would have weighted rank 0's hint mean by 11/14 instead
    assert r0.share(rows, "token-mean") == pytest.approx(11 / 14)
    values = torch.rand(5, 6, generator=torch.Generator().manual_seed(1))
    mask = _mask(hint, width=6)

    def token_mean(idx):
        return _token_mean(values, mask, idx)

    combined = (r0.share(rows, "token-mean", counts="hint_tokens") * token_mean([0, 1])
                + r1.share(rows, "token-mean", counts="hint_tokens") * token_mean([3, 4]))
    assert combined == pytest.approx(token_mean(rows), rel=1e-6)
    # a micro-batch's weight in a mini-batch normalised as a whole is the same number on every rank
    assert r0.fraction([0, 3], rows, "token-mean") == r1.fraction([0, 3], rows, "token-mean") == pytest.approx(7 / 14)


def test_pairs_are_numbered_over_the_ranks_in_rank_order():
    split = RowSplit([1] * 4, offset=2, count=2, pairs=[3, 0, 2], rank=2)
    assert (split.pair_offset, split.n_pairs) == (3, 5)
    assert [list(distributed.contiguous_block(5, DistContext(rank=r, world_size=3))) for r in range(3)] == \
        [[0, 1], [2, 3], [4]]
    assert [list(distributed.contiguous_block(1, DistContext(rank=r, world_size=3))) for r in range(3)] == [[0], [], []]


def test_per_rank_metrics_combine_as_one_process_would_count_them():
    parts = [({"success": 0.5, "hint/error_sites": 3.0, "replay/agreement_rate": 1.0, "replay/turns": 2.0,
               "replay/calls/expert": 4.0, "replay/latency_p99_s": 0.2}, {"trajectories": 4, "replay_turns": 2.0}),
             ({"success": 1.0, "hint/error_sites": 1.0, "replay/agreement_rate": 0.0, "replay/turns": 6.0,
               "replay/latency_p99_s": 0.5}, {"trajectories": 2, "replay_turns": 6.0})]
    out = distributed.combine_metrics(parts)
    assert out["success"] == pytest.approx((0.5 * 4 + 1.0 * 2) / 6)
    assert out["hint/error_sites"] == 4.0 and out["replay/turns"] == 8.0 and out["replay/calls/expert"] == 4.0
    assert out["replay/agreement_rate"] == pytest.approx(2 / 8)
    assert out["replay/latency_p99_s"] == 0.5


def test_outside_a_launcher_a_world_size_alone_is_refused(monkeypatch):
    for var in ("RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(distributed.DistributedFailure, match="start the ranks with torchrun"):
        distributed.init_from_env()
    monkeypatch.setenv("SDAR_DIST_TIMEOUT_S", "0")
    with pytest.raises(ValueError, match="SDAR_DIST_TIMEOUT_S=0 must be a positive number"):
        distributed.timeout_s()


def test_only_a_backends_failure_in_a_group_of_several_is_told_as_a_collectives():
    ctx = DistContext(rank=1, world_size=2, backend="gloo", address="10.0.0.1:29500")
    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv")
    why = distributed.explain_failure(gloo, ctx)
    assert why.startswith("rank 1 of 2 (gloo, process group at 10.0.0.1:29500) stopped in a collective")
    assert "SDAR_DIST_TIMEOUT_S" in why
    assert distributed.explain_failure(RuntimeError("Timed out waiting for the env server"), ctx) is None
    assert distributed.explain_failure(gloo, DistContext(backend="gloo")) is None  # alone: nobody to wait for
    assert distributed.explain_failure(distributed.DistributedFailure("rank 0 of 2 (gloo) could not join"), ctx) \
        == "rank 0 of 2 (gloo) could not join"
