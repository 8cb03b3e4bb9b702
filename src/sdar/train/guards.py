"""What keeps a bad update out of the weights: an update whose loss, gradient or resulting weights are not finite is
skipped (the weights of before it restored), and a run that skipped too many of its updates ends as failed."""

from __future__ import annotations

import copy
from typing import Callable

import torch


class TrainingFailed(RuntimeError):
    """The run ended without training: too many of its updates were skipped."""


class UpdateGuard:
    """Counts the updates tried and skipped, and takes the snapshot an update that broke the weights is undone to.

    guard_updates (optim.guard_updates): snapshot the trainable weights and the optimizer before each step and check
    the weights (and the policy's log-probs on a row) after it; max_skipped_frac: the share of skipped updates above
    which the run fails."""

    def __init__(self, guard_updates: bool, max_skipped_frac: float) -> None:
        self.guard_updates, self.max_skipped_frac = guard_updates, max_skipped_frac
        self.skipped = 0
        self.attempted = 0

    def step(self, optimizer, params: list, healthy_after: Callable[[], bool]) -> bool:
        """`optimizer.step()`, undone when `healthy_after()` (a decision every rank takes alike) says the weights or
        the policy's log-probs became non-finite; whether the update stands."""
        before = self._snapshot(optimizer, params) if self.guard_updates else None
        optimizer.step()
        if before is not None and not healthy_after():
            self._restore(optimizer, params, before)
            return False
        return True

    def skip(self, optimizer) -> None:
        optimizer.zero_grad(set_to_none=True)
        self.skipped += 1

    def check(self, where: str) -> None:
        """`TrainingFailed` when more than max_skipped_frac of the updates were skipped (`where`: the checkpoints)."""
        frac = self.skipped / self.attempted if self.attempted else 0.0
        if frac > self.max_skipped_frac:
            raise TrainingFailed(
                f"{self.skipped} of {self.attempted} updates were skipped (non-finite loss, gradient "
                f"or weights), more than optim.max_skipped_update_frac={self.max_skipped_frac}: this run did "
                "not train. Check lr, the arm's coefficients (arm_overrides) and the model's dtype; the last "
                f"finite checkpoint is kept in {where}")

    @staticmethod
    def _snapshot(optimizer, params: list) -> tuple[list[torch.Tensor], dict]:
        return [p.detach().clone() for p in params], copy.deepcopy(optimizer.state_dict())

    @staticmethod
    def _restore(optimizer, params: list, snapshot) -> None:
        weights, opt_state = snapshot
        with torch.no_grad():
            for p, w in zip(params, weights):
                p.copy_(w)
        optimizer.load_state_dict(opt_state)
        optimizer.zero_grad(set_to_none=True)
