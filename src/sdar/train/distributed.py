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

# How long a rendezvous or a collective waits before the run ends with an error naming the rank, the backend and the
# address (SDAR_DIST_TIMEOUT_S). The longest wait by design is the other ranks' while rank 0 alone evaluates on the
# held-out tasks (eval.every) and writes a checkpoint: at the paper's sizes (128 tasks x 50 turns of a 7B) that is
# minutes, so 30 minutes leaves it room several times over while a job whose rank died or never came bills at most
# half an hour of its GPUs. Raise it for longer evaluations; lower it to fail fast in tests.
DEFAULT_TIMEOUT_S = 1800


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job. A single process is rank 0 of world_size 1."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None  # gloo | nccl; None when alone
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    address: str = ""  # where the ranks met: MASTER_ADDR:MASTER_PORT (torchrun), or the group of one's tcp:// address

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the only rank that writes checkpoints, MLflow and the final policy."""
        return self.rank == 0


class DistributedFailure(RuntimeError):
    """A rendezvous or a collective that could not complete: the message names the rank, the backend, the address
    the ranks meet at and the timeout."""


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer; torchrun sets it, do not set it by hand") from None


def timeout_s() -> int:
    """SDAR_DIST_TIMEOUT_S, else DEFAULT_TIMEOUT_S: the longest a rendezvous or a collective waits."""
    value = _env_int("SDAR_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S)
    if value <= 0:
        raise ValueError(f"SDAR_DIST_TIMEOUT_S={value} must be a positive number of seconds (default {DEFAULT_TIMEOUT_S})")
    return value


def launched() -> bool:
    """Started by torchrun (or a launcher that sets what it sets: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), at any
    world size, 1 included: the process group is then the launcher's (env://), never one of our own."""
    return "TORCHELASTIC_RUN_ID" in os.environ or all(
        os.environ.get(v) for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _backend(device: torch.device | None) -> str:
    """SDAR_DIST_BACKEND, else nccl when the ranks train on CUDA, else gloo."""
    cuda = torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")
    backend = os.environ.get("SDAR_DIST_BACKEND") or ("nccl" if cuda else "gloo")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"SDAR_DIST_BACKEND={backend!r}; choose gloo (CPU) or nccl (GPU)")
    if backend == "nccl" and not torch.cuda.is_available():
        raise RuntimeError("the nccl backend needs CUDA; set SDAR_DIST_BACKEND=gloo to train on CPU")
    return backend


def _join(backend: str, me: int, world: int, address: str, **kw) -> None:
    """init_process_group, bounded by the timeout; a rendezvous that cannot complete is a DistributedFailure."""
    import torch.distributed as dist

    limit = timeout_s()
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=limit), **kw)
    except Exception as exc:  # noqa: BLE001 - DistStoreError, DistNetworkError, RuntimeError from the backends
        raise DistributedFailure(
            f"rank {me} of {world} ({backend}) could not join the process group at {address} within {limit} s "
            f"(SDAR_DIST_TIMEOUT_S): {type(exc).__name__}: {str(exc).splitlines()[0][:300]}. Every rank must start "
            "and reach that address: check that the other ranks' pods run, MASTER_ADDR/MASTER_PORT, and the "
            "NetworkPolicies between them") from None


def _group_of_one(device: torch.device | None) -> DistContext:
    """A process group of this process alone, outside any launcher (FSDP needs one to shard over, even at one rank):
    gloo on the CPU, nccl on CUDA, meeting in an in-memory store. No port: a port found free and bound a moment later
    can be taken in between (by another job's ranks on the same machine) and fail the run at start."""
    import torch.distributed as dist

    dev = torch.device(device) if device is not None else torch.device("cpu")
    backend = _backend(dev)
    address = "an in-memory store (one process)"
    if dist.is_initialized():  # joined already (a second Trainer in this process)
        return DistContext(backend=dist.get_backend(), device=dev, address=address)
    _join(backend, 0, 1, address, store=dist.HashStore(), rank=0, world_size=1)
    return DistContext(backend=backend, device=dev, address=address)


def init_from_env(group_alone: bool = False, device: torch.device | None = None) -> DistContext:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) through env://, at
    any world size (1 included: torchrun's agent store is the one its environment names).

    Backend: SDAR_DIST_BACKEND if set, else nccl when CUDA is available and `device` is not the CPU (each rank on
    cuda:LOCAL_RANK), else gloo (CPU). SDAR_DIST_TIMEOUT_S bounds how long the rendezvous and every collective wait
    (`timeout_s`). Idempotent: a second call returns the same context. group_alone: a process outside any launcher
    still gets a process group of one, on `device` (FSDP shards over it); its context stays rank 0 of 1.
    """
    if not launched():
        if _env_int("WORLD_SIZE", 1) > 1:
            raise DistributedFailure(f"WORLD_SIZE={os.environ['WORLD_SIZE']} but RANK, MASTER_ADDR or MASTER_PORT is "
                                     "not set: start the ranks with torchrun (or unset WORLD_SIZE to train alone)")
        return _group_of_one(device) if group_alone else DistContext()
    import torch.distributed as dist

    world, rank, local_rank = _env_int("WORLD_SIZE", 1), _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    backend = _backend(device)
    dev = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    address = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    if not dist.is_initialized():
        _join(backend, rank, world, address, init_method="env://")
    if dist.get_world_size() != world or dist.get_rank() != rank:
        raise RuntimeError(f"process group is rank {dist.get_rank()}/{dist.get_world_size()} but the "
                           f"environment says {rank}/{world}")
    return DistContext(rank=rank, world_size=world, local_rank=local_rank, backend=backend, device=dev, address=address)


def current() -> DistContext:
    """The context of the process group this process has joined (rank 0 of 1 when none), without joining one."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return DistContext()
    addr = f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ.get('MASTER_PORT', '?')}"
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=_env_int("LOCAL_RANK", 0),
                       backend=dist.get_backend(), address=addr)


def explain_failure(exc: BaseException, ctx: DistContext | None = None) -> str | None:
    """A collective's failure as a sentence naming the rank, the backend, the address and the timeout (None when
    `exc` is not one): what a rank blocked on a dead or stuck peer raises once SDAR_DIST_TIMEOUT_S has passed."""
    import torch.distributed as dist

    if isinstance(exc, DistributedFailure):
        return str(exc)
    text = str(exc)
    # the backends' own errors only (gloo's and NCCL's name themselves): an unrelated timeout stays what it is
    collective = isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and any(
        marker in text for marker in ("gloo", "Gloo", "NCCL", "nccl", "Connection closed by peer")))
    if not collective:
        return None
    ctx = ctx or current()
    if not ctx.backend or not ctx.enabled:  # a group of one has no peer to wait for
        return None
    first = text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__
    return (f"rank {ctx.rank} of {ctx.world_size} ({ctx.backend}, process group at {ctx.address}) stopped in a "
            f"collective: {first}. Another rank died or stayed away for longer than {timeout_s()} s "
            "(SDAR_DIST_TIMEOUT_S); its own log names why. A restart resumes from the last checkpoint")


def shutdown(ctx: DistContext) -> None:
    """Wait for every rank, then leave the process group (a launcher's group of one too; no-op alone)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and launched():
        if ctx.enabled:
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
    return contiguous_block(n_groups, ctx)


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

    tokens: response tokens in the loss per global row; offset/count: this rank's rows. Mini-batches are drawn
    over global row indices, so every rank runs the same number of updates on the same samples
    as one process holding all of them would.
    hint_tokens: per global row, the hint channel's tokens (an error-site row's tokens in the loss; 0 elsewhere).
    pairs: per rank, the DPO pairs it brings to the step (channel 3); a pair's global index is its rank's
    `pair_offset` plus its place there, which is the single-process order of the step's pairs.
    """

    tokens: list[int]
    offset: int
    count: int
    hint_tokens: list[int] = field(default_factory=list)
    pairs: list[int] = field(default_factory=lambda: [0])
    rank: int = 0

    @property
    def n(self) -> int:
        return len(self.tokens)

    @property
    def pair_offset(self) -> int:
        return sum(self.pairs[: self.rank])

    @property
    def n_pairs(self) -> int:
        return sum(self.pairs)

    def local(self, rows: list[int]) -> list[int]:
        """This rank's rows of a global mini-batch, as local indices, in mini-batch order."""
        return [i - self.offset for i in rows if self.offset <= i < self.offset + self.count]

    def share(self, rows: list[int], agg: str, within: list[int] | None = None, counts: str = "tokens") -> float:
        """The factor for this rank's loss on its rows so that the ranks' scaled losses add up to the
        loss of the whole mini-batch: its part of the aggregation's denominator.

        token-mean: my tokens / all tokens (token counts differ between ranks, so averaging the
        ranks' token means would weight a rank's tokens by how few it has); seq-mean-*: my non-empty
        sequences / all of them; seq-mean-token-sum-norm: my rows / all rows (its denominator counts every row);
        token-sum: 1 (sums add up as they are). Alone it is exactly 1.0.
        within: the rows whose loss is being formed, when `rows` is only a part of them (a micro-batch
        of a mini-batch normalised as a whole): the denominator is then over `within`.
        counts: "tokens" (the policy's terms) or "hint_tokens" (the hint channel, whose loss is aggregated over its
        own tokens: a rank's share of them, not of the policy's).
        """
        mine = [i for i in rows if self.offset <= i < self.offset + self.count]
        return self._ratio(mine, rows if within is None else within, agg, getattr(self, counts))

    def fraction(self, rows: list[int], within: list[int], agg: str, counts: str = "tokens") -> float:
        """Every rank's part of `rows` in the denominator over `within` (the same number on every rank): a
        micro-batch's weight in a mini-batch normalised as a whole."""
        return self._ratio(rows, within, agg, getattr(self, counts))

    @staticmethod
    def _ratio(num_rows: list[int], den_rows: list[int], agg: str, tokens: list[int]) -> float:
        if agg == "token-sum":
            return 1.0
        if agg == "token-mean":
            num, den = sum(tokens[i] for i in num_rows), sum(tokens[i] for i in den_rows)
        elif agg in ("seq-mean-token-mean", "seq-mean-token-sum"):
            num, den = sum(tokens[i] > 0 for i in num_rows), sum(tokens[i] > 0 for i in den_rows)
        elif agg == "seq-mean-token-sum-norm":
            num, den = len(num_rows), len(den_rows)
        else:
            raise ValueError(f"unknown aggregation {agg!r}; no distributed weighting for it")
        return num / den if den else 0.0


def split_rows(tokens: list[int], ctx: DistContext, hint_tokens: list[int] | None = None, pairs: int = 0) -> RowSplit:
    """Gather every rank's per-row token counts, hint-token counts and DPO pair count (one small collective per
    step): the step's rows split over the ranks."""
    hint = [int(t) for t in hint_tokens] if hint_tokens is not None else [0] * len(tokens)
    parts = _all_gather_object(([int(t) for t in tokens], hint, int(pairs)), ctx)
    offset = sum(len(p[0]) for p in parts[: ctx.rank])
    return RowSplit(tokens=[t for p in parts for t in p[0]], offset=offset, count=len(tokens),
                    hint_tokens=[t for p in parts for t in p[1]], pairs=[p[2] for p in parts], rank=ctx.rank)


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

    # the union of the ranks' metric names (a term only some ranks computed, e.g. replay pairs of one rank): every
    # rank all-reduces the same vector, a name it lacks counting 0
    keys = sorted(set().union(*_all_gather_object(sorted(metrics), ctx)))
    metrics = {k: metrics.get(k, 0.0) for k in keys}
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
    "env_reward": "trajectories", "groups/zero_std_frac": "groups", "invalid_action_rate": "turns",
    "format_error_rate": "turns", "no_progress_rate": "turns", "hint/error_site_rate": "rows",
    "teacher/gap_all_tokens": "tokens", "teacher/gap_free_tokens": "free_tokens", "tokens/forced_frac": "tokens",
    "teacher/vllm_fallback_frac": "teacher_turns",
    # the replay whose pairs this step took (each rank replays its own trajectories with its own pool)
    "replay/agreement_rate": "replay_turns", "replay/teacher_valid_rate": "replay_turns",
    "replay/student_agrees_rate": "replay_agreed", "replay/pairs_per_trajectory": "replay_trajectories",
    "replay/cost_per_trajectory_usd": "replay_trajectories_total",
}
SUMMED = ("turn_samples", "groups/rolled_out", "groups/zero_std_trained", "tokens_per_s", "tokens/free",
          "hint/error_sites", "replay/pairs_in_loss",
          "replay/turns", "replay/pairs", "replay/trajectories", "replay/cost_usd", "replay/calls", "replay/cache_hits", "replay/budget_skipped",
          "replay/retries", "replay/failures", "replay/tokens_in", "replay/tokens_out")  # totals over the job
SUMMED_PREFIXES = ("replay/calls/", "replay/failures/")  # per teacher: every rank's pool's calls
SLOWEST = ("time/rollout_s", "time/score_s", "time/update_s", "time/step_s",  # a step waits for the slowest rank
           "replay/latency_p50_s", "replay/latency_p99_s", "replay/budget_exhausted")  # the worst rank's pool


def combine_metrics(parts: list[tuple[dict[str, float], dict[str, float]]]) -> dict[str, float]:
    """What `reduce_step_metrics` computes over the ranks, from (metrics, counts) pairs at hand (e.g. the ranks' parts
    of a checkpoint): count-weighted means, totals, and the largest of the rest."""
    out: dict[str, float] = {}
    for k in sorted(set().union(*(m for m, _ in parts))):
        if k in WEIGHTED_BY:
            num = sum(float(m[k]) * float(c.get(WEIGHTED_BY[k], 0.0)) for m, c in parts
                      if k in m and not math.isnan(float(m[k])))
            den = sum(float(c.get(WEIGHTED_BY[k], 0.0)) for m, c in parts if k in m and not math.isnan(float(m[k])))
            out[k] = num / den if den > 0 else float("nan")
        elif k in SUMMED or k.startswith(SUMMED_PREFIXES):
            out[k] = sum(float(m.get(k, 0.0)) for m, _ in parts)
        else:
            out[k] = max(float(m[k]) for m, _ in parts if k in m)
    return out


def contiguous_block(n: int, ctx: DistContext) -> range:
    """This rank's contiguous block of n items split over the ranks in order (the first n % world ranks one more);
    blocks in rank order concatenate to the whole (what `group_range` does for task groups, allowing empty blocks)."""
    base, extra = divmod(n, ctx.world_size)
    start = ctx.rank * base + min(ctx.rank, extra)
    return range(start, start + base + (1 if ctx.rank < extra else 0))


def all_gather(obj, ctx: DistContext) -> list:
    """Every rank's `obj`, in rank order (alone: [obj]); a collective."""
    return _all_gather_object(obj, ctx)


def reduce_step_metrics(metrics: dict[str, float], counts: dict[str, float], ctx: DistContext) -> dict[str, float]:
    """The step's metrics over all ranks: count-weighted means, totals and the slowest rank's times.

    counts: this rank's count of what each mean of WEIGHTED_BY is over ("trajectories", "turns", "rows", "tokens",
    "free_tokens", "teacher_turns", and the replay's); a missing count is 0. A mean whose total count is 0 (or that
    is NaN on every rank, e.g. no teacher) stays NaN. Every rank must hold the same metric names (the trainer's
    step metrics are formed alike on every rank); per-teacher names are gathered first, since a rank's pool may have
    called a teacher another's has not.
    """
    if not ctx.enabled:
        return metrics
    import torch.distributed as dist

    metrics = dict(metrics)
    for k in set().union(*_all_gather_object(sorted(metrics), ctx)) - set(metrics):
        metrics[k] = 0.0 if k in SUMMED or k.startswith(SUMMED_PREFIXES) else float("nan")
    out = dict(metrics)
    weighted = [k for k in WEIGHTED_BY if k in metrics]
    summed = [k for k in sorted(metrics) if k in SUMMED or k.startswith(SUMMED_PREFIXES)]
    vec = []
    for k in weighted:
        v, w = float(metrics[k]), float(counts.get(WEIGHTED_BY[k], 0.0))
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
