"""Data-parallel RL under torchrun: the process group from torchrun's environment, which task
groups each rank rolls out, one gradient all-reduce per update, and per-step metric reduction.

Alone (WORLD_SIZE unset or 1) every helper is the identity, so a single process trains unchanged.

Why not `DistributedDataParallel`: ranks hold different numbers of turn-samples (episodes end at
different turns), so a rank can hold no row of a mini-batch and would skip the forward/backward
that DDP's hooks wait for; the reference pass runs the same peft module with its adapter
disabled, which DDP's parameter bookkeeping does not expect; and a LoRA's gradients are a few MB,
so one flat all-reduce per update costs little next to DDP's bucketed overlap. Instead every rank
backpropagates its share of the mini-batch's loss, scaled so the shares add up to the loss one
process would compute on the whole mini-batch, and the gradients are summed (see `RowSplit.share`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch

# how long a collective waits for a slow rank (rank 0 evaluates and checkpoints alone)
DEFAULT_TIMEOUT_S = 3600


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job. A single process is rank 0 of world_size 1."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None  # gloo | nccl; None when alone
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the only rank that writes checkpoints, MLflow and the final policy."""
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer; torchrun sets it, do not set it by hand") from None


def _group_of_one(device: torch.device | None) -> DistContext:
    """A process group of this process alone (FSDP needs one to shard over, even at one rank): on a free loopback
    port, gloo on the CPU, nccl on CUDA."""
    import socket

    import torch.distributed as dist

    dev = torch.device(device) if device is not None else torch.device("cpu")
    backend = os.environ.get("SDAR_DIST_BACKEND") or ("nccl" if dev.type == "cuda" else "gloo")
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                                timeout=timedelta(seconds=_env_int("SDAR_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S)))
    return DistContext(backend=backend, device=dev)


def init_from_env(group_alone: bool = False, device: torch.device | None = None) -> DistContext:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT).

    Backend: SDAR_DIST_BACKEND if set, else nccl when CUDA is available (each rank on
    cuda:LOCAL_RANK), else gloo (CPU). SDAR_DIST_TIMEOUT_S bounds how long a collective waits.
    Idempotent: a second call returns the same context. group_alone: a single process (no torchrun) still
    gets a process group of one, on `device` (FSDP shards over it); its context stays rank 0 of 1.
    """
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        return _group_of_one(device) if group_alone else DistContext()
    import torch.distributed as dist

    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    backend = os.environ.get("SDAR_DIST_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"SDAR_DIST_BACKEND={backend!r}; choose gloo (CPU) or nccl (GPU)")
    device = torch.device("cpu")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("the nccl backend needs CUDA; set SDAR_DIST_BACKEND=gloo to train on CPU")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    if not dist.is_initialized():
        timeout = timedelta(seconds=_env_int("SDAR_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S))
        dist.init_process_group(backend, timeout=timeout)
    if dist.get_world_size() != world or dist.get_rank() != rank:
        raise RuntimeError(f"process group is rank {dist.get_rank()}/{dist.get_world_size()} but the "
                           f"environment says {rank}/{world}")
    return DistContext(rank=rank, world_size=world, local_rank=local_rank, backend=backend, device=device)


def shutdown(ctx: DistContext) -> None:
    """Wait for every rank, then leave the process group (no-op alone)."""
    if ctx.enabled:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def group_range(n_groups: int, ctx: DistContext) -> range:
    """The task groups this rank rolls out: a contiguous block, the first n % world ranks one more.

    Whole groups stay on one rank, because GRPO normalises rewards within a group; and blocks in
    rank order concatenate to the single-process order, which the row split relies on.
    """
    if n_groups < ctx.world_size:
        raise ValueError(f"tasks_per_step={n_groups} is smaller than the {ctx.world_size} ranks; every rank "
                         f"needs at least one task group: raise tasks_per_step or use fewer processes")
    base, extra = divmod(n_groups, ctx.world_size)
    start = ctx.rank * base + min(ctx.rank, extra)
    return range(start, start + base + (1 if ctx.rank < extra else 0))


def _all_gather_object(obj, ctx: DistContext) -> list:
    if not ctx.enabled:
        return [obj]
    import torch.distributed as dist

    out: list = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


@dataclass
class RowSplit:
    """The step's turn-samples of all ranks, in single-process order (rank 0's rows, then rank 1's...).

    tokens: response tokens per global row; offset/count: this rank's rows. Mini-batches are drawn
    over global row indices, so every rank runs the same number of updates on the same samples
    as one process holding all of them would.
    """

    tokens: list[int]
    offset: int
    count: int

    @property
    def n(self) -> int:
        return len(self.tokens)

    def local(self, rows: list[int]) -> list[int]:
        """This rank's rows of a global mini-batch, as local indices, in mini-batch order."""
        return [i - self.offset for i in rows if self.offset <= i < self.offset + self.count]

    def share(self, rows: list[int], agg: str, within: list[int] | None = None) -> float:
        """The factor for this rank's loss on its rows so that the ranks' scaled losses add up to the
        loss of the whole mini-batch: its part of the aggregation's denominator.

        token-mean: my tokens / all tokens (token counts differ between ranks, so averaging the
        ranks' token means would weight a rank's tokens by how few it has); seq-mean-*: my non-empty
        sequences / all of them; seq-mean-token-sum-norm: my rows / all rows (its denominator counts every row);
        token-sum: 1 (sums add up as they are). Alone it is exactly 1.0.
        within: the rows whose loss is being formed, when `rows` is only a part of them (a micro-batch
        of a mini-batch normalised as a whole): the denominator is then over `within`.
        """
        mine = [i for i in rows if self.offset <= i < self.offset + self.count]
        every = rows if within is None else within
        if agg == "token-sum":
            return 1.0
        if agg == "token-mean":
            num, den = sum(self.tokens[i] for i in mine), sum(self.tokens[i] for i in every)
        elif agg in ("seq-mean-token-mean", "seq-mean-token-sum"):
            num, den = sum(self.tokens[i] > 0 for i in mine), sum(self.tokens[i] > 0 for i in every)
        elif agg == "seq-mean-token-sum-norm":
            num, den = len(mine), len(every)
        else:
            raise ValueError(f"unknown aggregation {agg!r}; no distributed weighting for it")
        return num / den if den else 0.0


def split_rows(tokens: list[int], ctx: DistContext) -> RowSplit:
    """Gather every rank's per-row token counts (one small collective per step): the step's rows
    split over the ranks."""
    parts = _all_gather_object([int(t) for t in tokens], ctx)
    offset = sum(len(p) for p in parts[: ctx.rank])
    return RowSplit(tokens=[t for p in parts for t in p], offset=offset, count=len(tokens))


def sync_update(params: list[torch.nn.Parameter], metrics: dict[str, torch.Tensor | float], share: float,
                finite: bool, ctx: DistContext) -> tuple[bool, dict[str, float]]:
    """Sum the ranks' gradients (already scaled by their share), their share-weighted mini-batch
    metrics, and their non-finite flags, in one all-reduce. Returns (every rank's loss was finite,
    the mini-batch's metrics as one process would have computed them).

    A rank without rows, or whose loss was not finite, contributes zeros; when any rank's loss was
    not finite, every rank skips the update, so the replicas never diverge. params=[]: the gradients are
    summed already (FSDP's reduce-scatter, sdar.train.fsdp); only the metrics and the flags are.
    """
    if not ctx.enabled:
        return finite, {k: float(v) for k, v in metrics.items()}
    import torch.distributed as dist

    keys = sorted(metrics)
    device = params[0].device if params else ctx.device
    grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params]
    extra = [share * float(metrics[k]) if finite else 0.0 for k in keys] + [0.0 if finite else 1.0]
    flat = torch.cat(grads + [torch.tensor(extra, dtype=torch.float32, device=device)])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    at = 0
    for p in params:
        n = p.numel()
        p.grad = flat[at : at + n].view_as(p).to(p.dtype).clone()
        at += n
    tail = flat[at:].tolist()
    return tail[-1] == 0.0, dict(zip(keys, tail[:-1]))


def broadcast_object(obj, ctx: DistContext):
    """Rank 0's `obj` on every rank (alone: `obj`)."""
    if not ctx.enabled:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (alone: return)."""
    if ctx.enabled:
        import torch.distributed as dist

        dist.barrier()


def all_true(flag: bool, ctx: DistContext) -> bool:
    """Whether `flag` holds on every rank (alone: `flag`), so that ranks take the same decision."""
    if not ctx.enabled:
        return bool(flag)
    import torch.distributed as dist

    t = torch.tensor([0.0 if flag else 1.0], device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item()) == 0.0


def broadcast_params(params: list[torch.nn.Parameter], ctx: DistContext) -> None:
    """Make every rank start from rank 0's trainable weights (LoRA init draws random numbers)."""
    if not ctx.enabled:
        return
    import torch.distributed as dist

    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, src=0)


def assert_same(value: int, what: str, ctx: DistContext) -> None:
    """Raise on every rank when the ranks disagree on `value` (e.g. the step they resumed at)."""
    values = _all_gather_object(int(value), ctx)
    if len(set(values)) > 1:
        raise RuntimeError(f"ranks disagree on {what}: {values}; every rank must read the same checkpoint "
                           "store (a shared s3:// checkpoint_uri when nodes > 1)")


# How a per-step metric of the trainer combines over ranks. Per-update losses and statistics are
# reduced in `sync_update` already and are identical on every rank; what is listed here is per rank.
WEIGHTED_BY = {  # metric -> the count it is a mean over
    "reward": "trajectories", "success": "trajectories", "episode_length": "trajectories",
    "env_reward": "trajectories", "invalid_action_rate": "turns", "format_error_rate": "turns",
    "teacher/gap_all_tokens": "tokens", "teacher/gap_free_tokens": "free_tokens", "tokens/forced_frac": "tokens",
}
SUMMED = ("turn_samples", "tokens_per_s", "tokens/free")  # totals: the job's turn-samples and its generation throughput
SLOWEST = ("time/rollout_s", "time/score_s", "time/update_s", "time/step_s")  # a step waits for the slowest rank


def reduce_step_metrics(metrics: dict[str, float], counts: dict[str, float], ctx: DistContext) -> dict[str, float]:
    """The step's metrics over all ranks: count-weighted means, totals and the slowest rank's times.

    counts: this rank's {"trajectories", "turns", "tokens", "free_tokens", "teacher_turns"}. A mean whose total count is 0 (or
    that is NaN on every rank, e.g. no teacher) stays NaN.
    """
    if not ctx.enabled:
        return metrics
    import torch.distributed as dist

    out = dict(metrics)
    weighted = [k for k in WEIGHTED_BY if k in metrics]
    summed = [k for k in SUMMED if k in metrics]
    vec = []
    for k in weighted:
        v, w = float(metrics[k]), float(counts[WEIGHTED_BY[k]])
        vec += [0.0, 0.0] if math.isnan(v) else [v * w, w]
    vec += [float(metrics[k]) for k in summed]
    t = torch.tensor(vec, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    vals = t.tolist()
    for i, k in enumerate(weighted):
        num, den = vals[2 * i], vals[2 * i + 1]
        out[k] = num / den if den > 0 else float("nan")
    for i, k in enumerate(summed):
        out[k] = vals[2 * len(weighted) + i]
    slow = [k for k in SLOWEST if k in metrics]
    if slow:
        t = torch.tensor([float(metrics[k]) for k in slow], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out.update(zip(slow, t.tolist()))
    return out
