"""How the ranks hold the policy: whole on every rank (one process, or ddp replicas that sum their gradients) or
sharded (fsdp). The trainer, the update and the checkpoints call a `Strategy` and never ask which one it is."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import ContextManager, Iterator

import torch

from sdar.train import distributed
from sdar.train.distributed import DistContext

WEIGHTS_FILE = "trainable.pt"  # a whole-weights checkpoint's trainable weights (name -> tensor)


class Strategy:
    """Whole weights on every rank: one process, or ddp replicas that all-reduce their gradients once per update
    (`sdar.train.distributed.sync_update`). Rank 0 alone writes checkpoints and the final policy."""

    sharded = False

    def __init__(self, dist: DistContext) -> None:
        self.dist = dist

    @classmethod
    def of(cls, name: str, device: torch.device | None) -> Strategy:
        """The strategy `distributed.strategy` names, with its process group joined (torchrun's, or for fsdp outside
        any launcher a group of one on this process: FSDP shards over one)."""
        if name == "fsdp":
            return Sharded(distributed.init_from_env(group_alone=True, device=device))
        return cls(distributed.init_from_env(device=device))

    # ---- the phases ---------------------------------------------------------------------------------------------
    def prepare(self, policy) -> None:
        """Make the policy this strategy's (the replicas start from rank 0's trainable weights: LoRA draws at init)."""
        distributed.broadcast_params([p for p in policy.model.parameters() if p.requires_grad], self.dist)

    def gathered(self, policy, reference: bool = False) -> ContextManager:
        """The policy's weights whole on this rank for the block (and the full fine-tune's frozen reference copy when
        `reference`): nothing to do when they are whole already."""
        return contextlib.nullcontext()

    def finish_backward(self, model, pad_id: int) -> None:
        """Inside `gathered`, after every micro-batch's backward: nothing (sharded: reduce-scatter the gradients)."""

    def reduce(self, params: list, metrics: dict[str, float], finite: bool) -> tuple[bool, dict[str, float]]:
        """Sum the ranks' (share-weighted) gradients and metrics, and their non-finite flags."""
        return distributed.sync_update(params, metrics, 1.0, finite, self.dist)

    def clip(self, params: list, max_norm: float) -> torch.Tensor:
        """Clip the gradients to `max_norm` over all of them; their norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def all_finite(self, params: list) -> bool:
        """The trainable weights are finite (every rank's replicas are the same: this rank's say)."""
        return all(bool(torch.isfinite(_local(p.detach())).all()) for p in params)

    # ---- checkpoints ----------------------------------------------------------------------------------------------
    @property
    def writes_checkpoints(self) -> bool:
        """Whether this rank writes into a checkpoint (the replicas hold the same weights: rank 0 alone)."""
        return self.dist.is_main

    def staging(self, out: Path, step: int) -> ContextManager[str]:
        """Where a checkpoint is assembled before rank 0 writes it to the store: a temporary directory."""
        return tempfile.TemporaryDirectory()

    def save_weights(self, model, optimizer, directory: Path) -> dict | None:
        """Write the trainable weights into `directory`; the optimizer's state for the trainer's state file."""
        trainable = {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}
        torch.save(trainable, directory / WEIGHTS_FILE)
        return optimizer.state_dict()

    def load_whole(self, model, optimizer, weights: dict[str, torch.Tensor], optim_state: dict | None, where: str) -> None:
        """Load a whole-weights checkpoint (a ddp run's, at any number of ranks) into the model and the optimizer."""
        load_trainable(model, weights, where)
        if optim_state is not None:
            optimizer.load_state_dict(optim_state)

    def save_final(self, policy, final: Path, cfg) -> None:
        """Rank 0 writes the final policy (`Policy.save`)."""
        if self.dist.is_main:
            policy.save(final)


class Sharded(Strategy):
    """FSDP2 (`sdar.train.fsdp`): the weights, gradients and optimizer state sharded over the ranks; each phase
    gathers the weights whole once, the update reduce-scatters the accumulated gradients, and every rank writes its
    shard of a checkpoint."""

    sharded = True

    def prepare(self, policy) -> None:
        from sdar.train import fsdp

        super().prepare(policy)
        fsdp.shard_policy(policy)

    def gathered(self, policy, reference: bool = False) -> ContextManager:
        from sdar.train.fsdp import gathered

        return gathered(policy.model, policy._reference if reference else None)

    def finish_backward(self, model, pad_id: int) -> None:
        from sdar.train.fsdp import sync_gradients

        sync_gradients(model, pad_id, next(model.parameters()).device)

    def reduce(self, params: list, metrics: dict[str, float], finite: bool) -> tuple[bool, dict[str, float]]:
        return distributed.sync_update([], metrics, 1.0, finite, self.dist)  # the gradients are summed already

    def clip(self, params: list, max_norm: float) -> torch.Tensor:
        from sdar.train.fsdp import full

        return full(torch.nn.utils.clip_grad_norm_(params, max_norm))  # the norm over every rank's shards

    def all_finite(self, params: list) -> bool:
        return distributed.all_true(super().all_finite(params), self.dist)  # each rank sees its shards only

    @property
    def writes_checkpoints(self) -> bool:
        return True  # every rank its shard

    @contextlib.contextmanager
    def staging(self, out: Path, step: int) -> Iterator[str]:
        """<output_dir>/checkpoint-staging/step-N, which every rank writes its shard into and so must see (one node:
        any local path; several: a volume they all mount); alone, a temporary directory."""
        if not self.dist.enabled:
            with tempfile.TemporaryDirectory() as tmp:
                yield tmp
            return
        staging = out / "checkpoint-staging" / f"step-{step}"
        token = uuid.uuid4().hex if self.dist.is_main else None
        if self.dist.is_main:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            (staging / ".ranks-share-this").write_text(token)
        token = distributed.broadcast_object(token, self.dist)
        mark = staging / ".ranks-share-this"
        shared = distributed.all_true(mark.is_file() and mark.read_text() == token, self.dist)
        if self.dist.is_main:
            mark.unlink(missing_ok=True)  # every rank has looked (the all-reduce above): not part of the checkpoint
        if not shared:
            raise RuntimeError(f"distributed.strategy fsdp writes every rank's shard of a checkpoint into {staging}, "
                               "which not every rank sees: put output_dir on a volume all nodes mount")
        try:
            # torch.distributed.checkpoint.save returns on rank 0 after every rank's files are written
            yield str(staging)
        finally:
            distributed.barrier(self.dist)  # rank 0 has uploaded (or failed) before the directory goes
            if self.dist.is_main:
                shutil.rmtree(staging, ignore_errors=True)

    def save_weights(self, model, optimizer, directory: Path) -> dict | None:
        from sdar.train.fsdp import SHARDS_DIR, save_sharded

        save_sharded(model, optimizer, directory / SHARDS_DIR)
        return None  # the optimizer's state is in the shards

    def load_whole(self, model, optimizer, weights: dict[str, torch.Tensor], optim_state: dict | None, where: str) -> None:
        from sdar.train.fsdp import load_full

        names = [n for n, p in model.named_parameters() if p.requires_grad]
        load_full(model, optimizer, weights, optim_state, names)

    def save_final(self, policy, final: Path, cfg) -> None:
        """The trainable weights gathered whole on rank 0 (a collective) into a plain copy of the starting policy,
        the frozen weights being the start's own."""
        from sdar.train.fsdp import whole_trainable
        from sdar.train.warm_cache import load_warm_policy

        weights = whole_trainable(policy.model)
        if self.dist.is_main:
            plain = load_warm_policy(cfg)
            named = dict(plain.model.named_parameters())  # a tied weight (lm_head = embeddings) comes under both names
            load_trainable(plain.model, {k: v for k, v in weights.items() if k in named}, "the gathered fsdp weights")
            plain.save(final)
        distributed.barrier(self.dist)


def _local(t: torch.Tensor) -> torch.Tensor:
    from sdar.train.fsdp import local

    return local(t)


def load_trainable(model, weights: dict[str, torch.Tensor], where: str) -> None:
    """Copy a checkpoint's trainable weights (name -> tensor) into `model`; a name the model lacks is an error."""
    named = dict(model.named_parameters())
    unknown = [k for k in weights if k not in named]
    if unknown:
        raise ValueError(f"the checkpoint at {where} does not match the model (unknown parameters {unknown[:3]}): "
                         "was it trained from another model or LoRA setting?")
    with torch.no_grad():
        for k, v in weights.items():
            named[k].copy_(v)
