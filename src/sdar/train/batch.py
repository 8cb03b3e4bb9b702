"""What the phases of a step hand each other, as values: the rollout phase's episodes and advantages, the score
phase's scores and plan of the update, the update phase's result. Each is frozen: a phase reads the one before it
and never changes it (what the update computes lives in its own state, `sdar.train.update.UpdateState`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import torch

from sdar.agent.rollout import Trajectory, TurnBatch
from sdar.models.scoring import ScoredBatch
from sdar.train.distributed import RowSplit
from sdar.train.replay import PairSet


@dataclass(frozen=True)
class GroupCounts:
    """This rank's task groups in a step: rolled out (every draw of rollout.filter_groups), those of them whose
    rewards were all equal (every turn-sample's advantage 0), and those equal-reward groups the step trains on."""

    rolled: int
    flat: int
    flat_trained: int


@dataclass(frozen=True)
class Rollouts:
    """The rollout phase's output: this rank's episodes, their turn-samples (row i of every [B, T] tensor of
    the step), each row's GRPO advantage [B] and the groups' counts."""

    trajs: list[Trajectory]
    batch: TurnBatch
    advantages: torch.Tensor
    seconds: float
    groups: GroupCounts


@dataclass(frozen=True)
class StepBatch:
    """The score phase's output: the step's turn-samples with every score the update reads, and how the update
    walks them."""

    rollouts: Rollouts
    free: torch.Tensor  # [B, T] 1 on the response tokens that carry a choice: every loss term is over these
    old: ScoredBatch  # old_logp, but for the rows in `reuse`
    ref: ScoredBatch | None  # the reference's log-probs (arms with a KL term)
    teacher: ScoredBatch | None  # the privileged teacher's
    split: RowSplit  # this rank's rows of every rank's
    orders: tuple[tuple[int, ...], ...]  # per epoch, the global row order mini-batches are cut from
    reuse: frozenset[int]  # rows whose old_logp the update's first forward gives
    hint_prompts: Mapping[int, list[int]]  # error-site row -> its hinted teacher prompt (channel 2)
    pairs: PairSet | None  # the DPO pairs due this step (channel 3), their reference scores taken
    seconds: float

    @property
    def prompts(self) -> list[list[int]]:
        return self.rollouts.batch.prompts

    @property
    def responses(self) -> list[list[int]]:
        return self.rollouts.batch.responses

    @property
    def allowed(self) -> list:
        return self.rollouts.batch.allowed

    @property
    def groups(self) -> list[str]:
        """Each row's task: the rows of a task share their prompt start (the scorer's prefix cache)."""
        return self.rollouts.batch.task_ids


@dataclass(frozen=True)
class UpdateResult:
    """The update phase's output: the summed metrics of the optimizer steps taken, and how many."""

    sums: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    updates: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class StepResult:
    step: int
    metrics: dict[str, float] = field(default_factory=dict)
