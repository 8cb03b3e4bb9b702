"""FSDP2 sharded training (`distributed.strategy: fsdp`): torch.distributed.fsdp.fully_shard over the policy.

Each decoder layer (the model's `_no_split_modules`, as transformers and verl's FSDP workers wrap them) is one
FSDP unit, and the root another; the full fine-tune's frozen reference copy is sharded the same way. Between
phases the weights, the gradients and AdamW's state are sharded over the ranks (1/N each).

The trainer's phases are rank-local: a rank plays its own task groups and scores its own rows, so ranks make
different numbers of forwards (episodes end at different turns, a rank may hold no row of a micro-batch, the
scorer splits by length and prefix). FSDP's per-forward all-gathers need lock-step forwards, so every phase runs
inside `gathered`: each unit is all-gathered once on entry and kept whole (no reshard after a forward or a
backward, no gradient reduction), the rank computes freely, and on exit the units are sharded again. The update
accumulates each rank's gradients whole and `sync_gradients` ends it with one lock-step zero-loss forward and
backward per rank, whose backward reduce-scatters (sums) the accumulated gradients into each rank's shard: every
rank then holds its shard of the mini-batch's gradient, summed as `sdar.train.distributed` sums it for ddp.
This is verl's hybrid-engine trade (full weights for generation, shards for the optimizer): the weights are whole
on every rank during a phase, and the gradients and optimizer state are sharded where they are largest.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


def fsdp_modules(module: torch.nn.Module | None) -> list:
    """The FSDP units inside `module` (outermost first); [] for a module that is not sharded."""
    from torch.distributed.fsdp import FSDPModule

    if module is None:
        return []
    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def _layer_classes(model: torch.nn.Module) -> set[str]:
    """The class names of the model's decoder layers: the `_no_split_modules` of the transformers model inside
    (a peft PeftModel wraps it), e.g. {"Qwen2DecoderLayer"}."""
    for m in model.modules():
        names = getattr(m, "_no_split_modules", None)
        if names:
            return set(names)
    raise ValueError(f"{type(model).__name__} names no decoder-layer class (_no_split_modules); FSDP needs one "
                     "to shard by layer: use a transformers causal LM, or distributed.strategy: ddp")


def shard_module(model: torch.nn.Module, mesh=None) -> list:
    """fully_shard each decoder layer, then the root; gradients are summed over the ranks (divide factor 1, plain
    sum reductions: gloo has no pre-multiplied sum). Returns the units."""
    from torch.distributed.fsdp import fully_shard

    layers = _layer_classes(model)
    for m in list(model.modules()):
        if type(m).__name__ in layers:
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    units = fsdp_modules(model)
    for u in units:
        u.set_gradient_divide_factor(1.0)
        u.set_force_sum_reduction_for_comms(True)
    return units


def shard_policy(policy, mesh=None) -> None:
    """Shard the policy's trainable model and, for full fine-tuning, its frozen reference copy. The merged plain
    inference modules share the base's tensors, which FSDP swaps between shards and whole copies: they are off."""
    if getattr(policy, "_reference", None) is not None:
        shard_module(policy._reference, mesh)
    shard_module(policy.model, mesh)
    policy.plain_inference = False


def _set(units, *, whole: bool) -> None:
    for u in units:
        u.set_reshard_after_forward(not whole, recurse=False)
        u.set_reshard_after_backward(not whole, recurse=False)
        u.set_requires_gradient_sync(not whole, recurse=False)


@contextlib.contextmanager
def gathered(*modules: torch.nn.Module | None) -> Iterator[None]:
    """Every FSDP unit of `modules` whole on this rank for the block (one all-gather each, a collective: every rank
    enters together), so that the rank's forwards and backwards need no collective; gradients accumulate whole
    until `sync_gradients`. Sharded again on exit. A no-op for modules that are not sharded."""
    units = [u for m in modules for u in fsdp_modules(m)]
    if not units:
        yield
        return
    _set(units, whole=True)
    for u in units:
        u.unshard()
    try:
        yield
    finally:
        _set(units, whole=False)
        for u in units:
            u.reshard()


def sync_gradients(model: torch.nn.Module, pad_id: int, device: torch.device) -> None:
    """Inside `gathered(model)`: reduce-scatter the gradients every rank accumulated (summed over ranks) into each
    rank's shard, through one lock-step forward and backward of a zero loss per rank (FSDP reduces a unit's
    gradients in its post-backward hook, so every rank must run the same backwards here)."""
    units = fsdp_modules(model)
    if not units:
        return
    for u in units:
        u.set_requires_gradient_sync(True, recurse=False)
    try:
        ids = torch.full((1, 1), int(pad_id), dtype=torch.long, device=device)
        out = model(input_ids=ids)
        logits = out.logits if hasattr(out, "logits") else out[0]
        (logits.float().sum() * 0.0).backward()
    finally:
        for u in units:
            u.set_requires_gradient_sync(False, recurse=False)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded tensor (a DTensor); the tensor itself otherwise."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole of a sharded tensor (a collective: every rank calls it); the tensor itself otherwise."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


# ---- sharded checkpoints (torch.distributed.checkpoint) ------------------------------------------------------

SHARDS_DIR = "shards"  # a sharded checkpoint's torch.distributed.checkpoint directory (.metadata + one file per rank)


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, **kw)  # the trainable weights: a LoRA's adapter alone


def whole_trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable weights whole, on rank 0's CPU ({} on the other ranks): a collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=True))


def save_sharded(model: torch.nn.Module, optimizer, directory) -> None:
    """Every rank writes its shard of the trainable weights and of the optimizer state into `directory` (a
    collective; rank 0 writes the metadata). A process alone writes whole tensors the same way."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer, options=_options())
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(directory))


def load_sharded(model: torch.nn.Module, optimizer, directory) -> None:
    """Read a `save_sharded` directory into the model's trainable weights and (unless None) the optimizer, each rank
    its own shard, whatever the number of ranks that wrote it (a collective under a process group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict, set_model_state_dict, \
        set_state_dict

    if optimizer is None:
        msd = get_model_state_dict(model, options=_options())
        state = {"model": msd}
        dcp.load(state, checkpoint_id=str(directory))
        # strict=False: the frozen weights are not in a checkpoint; every trainable one is (dcp.load raises otherwise)
        set_model_state_dict(model, state["model"], options=_options(strict=False))
        return
    msd, osd = get_state_dict(model, optimizer, options=_options())
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=_options(strict=False))


def load_full(model: torch.nn.Module, optimizer, weights: dict[str, torch.Tensor], optim_state: dict | None,
              names: list[str]) -> None:
    """Load a whole-tensor checkpoint (written by a ddp run: `name -> tensor`, and AdamW's state keyed by the
    position of each trainable parameter, `names` giving their names in that order) into a sharded model: every
    rank keeps its shard."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(model, weights, options=_options(full_state_dict=True, strict=False))
    if optim_state is not None:
        by_name = {"state": {names[i]: v for i, v in optim_state["state"].items()},
                   "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in optim_state["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, by_name, options=_options(full_state_dict=True))
