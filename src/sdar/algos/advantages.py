"""Group-relative advantages (GRPO): each sample's reward normalised within its group.

A group is the G rollouts of one task; with multi-turn training every turn-sample of a
trajectory carries the trajectory's reward, and statistics run over all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _group_index(group_ids: torch.Tensor | Sequence) -> torch.Tensor:
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids must be 1-D [N], got shape {tuple(group_ids.shape)}")
        _, index = torch.unique(group_ids, return_inverse=True)
        return index
    lookup: dict = {}
    return torch.tensor([lookup.setdefault(g, len(lookup)) for g in group_ids], dtype=torch.long)


def grpo_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_ids: torch.Tensor | Sequence,
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> torch.Tensor:
    """GRPO advantages `A = (r - mean_g) / (std_g + eps)`.

    rewards: [N] scalar reward per sample (a turn or a trajectory).
    group_ids: [N] ints or strings; samples with the same id form one group.
    norm_by_std: False gives `r - mean_g` (Dr. GRPO style, no std scaling).
    Returns [N] float32. The std is the unbiased sample std (as torch.std, as in verl).
    Groups of one sample and groups with equal rewards get advantage 0, never NaN.
    """
    r = torch.as_tensor(rewards, dtype=torch.float32)
    if r.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(r.shape)}")
    index = _group_index(group_ids).to(r.device)
    if index.numel() != r.numel():
        raise ValueError(f"rewards has {r.numel()} entries but group_ids has {index.numel()}; give one group id per reward")
    if r.numel() == 0:
        return r.clone()
    if not torch.isfinite(r).all():
        raise ValueError("rewards contain NaN or inf; check the environment's reward before computing advantages")
    n_groups = int(index.max()) + 1
    count = torch.zeros(n_groups).index_add_(0, index, torch.ones_like(r))
    total = torch.zeros(n_groups).index_add_(0, index, r)
    mean = total / count
    centered = r - mean[index]
    sq = torch.zeros(n_groups).index_add_(0, index, centered**2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1.0))
    singleton = count[index] < 2
    adv = centered / (std[index] + eps) if norm_by_std else centered
    return torch.where(singleton, torch.zeros_like(adv), adv)
