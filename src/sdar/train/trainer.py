"""The on-policy RL loop for one arm.

Per step: sample tasks -> G rollouts each (lock-step) -> old, reference and privileged-teacher
log-probs (no grad) -> GRPO advantages over turn-samples -> mini-batch updates with the arm's
composed loss. Checkpoints every K steps (local or s3://) make a killed run resume exactly.
Under torchrun each rank rolls out its share of the task groups and the ranks sum their gradients
(sdar.train.distributed); rank 0 alone writes checkpoints, MLflow and the final policy.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from sdar.agent.rollout import Trajectory, TurnBatch, episode_reward, rollout, turn_rewards
from sdar.algos import LossBatch, compose_loss, grpo_advantages
from sdar.algos.arms import LOSS_TERMS, metric_term
from sdar.config import TrainConfig
from sdar.models.scoring import ScoredBatch, _pick, free_token_mask
from sdar.train import distributed
from sdar.train.runtime import (  # noqa: F401 - make_env_factory, seed_everything, WEIGHTS_FILE: re-exported
    WEIGHTS_FILE,
    Runtime,
    build_runtime,
    load_trainable,
    make_env_factory,
    masked_mean as _masked_mean,
    seed_everything,
    step_seed as _step_seed,
)

STATE_FILE = "trainer_state.pt"


class CheckpointUnreadable(Exception):
    """A stored checkpoint that cannot be loaded; the message says which file and why."""


class TrainingFailed(RuntimeError):
    """The run ended without training: too many of its updates were skipped."""


@dataclass
class StepResult:
    step: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Rollouts:
    """The rollout phase's output: this rank's episodes, their turn-samples (row i of every [B, T] tensor of
    the step) and each row's GRPO advantage."""

    trajs: list[Trajectory]
    batch: TurnBatch
    advantages: torch.Tensor
    seconds: float


@dataclass
class StepBatch:
    """The score phase's output: the step's turn-samples with every score the update reads, and how the update
    walks them. The update fills `old` for the rows in `reuse` from its own first forward."""

    rollouts: Rollouts
    free: torch.Tensor  # [B, T] 1 on the response tokens that carry a choice: every loss term is over these
    old: ScoredBatch  # old_logp
    ref: ScoredBatch | None  # the reference's log-probs (arms with a KL term)
    teacher: ScoredBatch | None  # the privileged teacher's
    split: Any  # sdar.train.distributed.RowSplit: this rank's rows of every rank's
    orders: list[list[int]]  # per epoch, the global row order mini-batches are cut from
    reuse: set[int]  # rows whose old_logp the update's first forward gives
    hint_prompts: dict[int, list[int]]  # error-site row -> its hinted teacher prompt (channel 2)
    pairs: Any  # the DPO pairs due this step (channel 3), or None
    slots: dict[int, list[int]]  # micro-batch index (within an epoch) -> the pairs it carries
    seconds: float
    micro_index: int = 0  # the micro-batch the update is at, within an epoch

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


@dataclass
class UpdateResult:
    """The update phase's output: the summed metrics of the optimizer steps taken, and how many."""

    sums: dict[str, float] = field(default_factory=dict)
    updates: int = 0
    seconds: float = 0.0


# the parts a Trainer reads from its runtime (`sdar.train.runtime.Runtime`), where they live
_RUNTIME_PARTS = frozenset({"arm", "device", "policy", "model", "tokenizer", "pad_id", "rollout_cfg", "builder",
                            "backend", "scorer", "teacher", "env_factory", "train_pool", "eval_tasks"})


class Trainer:
    """Trains the runtime's policy with `cfg.arm`: the runtime (`sdar.train.runtime`) plus an optimizer,
    checkpoints (local or s3://, resumable), MLflow tracking and, for the replay arms, the teacher pool."""

    def __init__(self, cfg: TrainConfig, policy=None, env_factory: Callable[[], Any] | None = None,
                 console=None, train: bool = True, runtime: Runtime | None = None) -> None:
        """policy: default the config's model, loaded (the tiny model's warm start must have been built:
        `sdar.train.warmstart.ensure_warm_start`). runtime: parts already built (`build_runtime`)."""
        from rich.console import Console

        self.cfg = cfg
        self.console = console or Console(stderr=True)
        self.fsdp = cfg.distributed.strategy == "fsdp"
        # rank 0 of 1 unless started by torchrun (fsdp: with a process group of one, to shard over)
        self.dist = distributed.init_from_env(group_alone=self.fsdp, device=cfg.resolved_device())
        self.out = cfg.resolved_output_dir()
        self.out.mkdir(parents=True, exist_ok=True)
        self.runtime = runtime or build_runtime(cfg, policy=policy, env_factory=env_factory, train=train,
                                                device=self.dist.device if self.dist.enabled else None)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the policy has no trainable parameters; enable LoRA or full fine-tuning")
        if cfg.tasks_per_step < self.dist.world_size:  # refused at start, not at the first step's rollout
            from sdar.config import ConfigError

            raise ConfigError(f"tasks_per_step={cfg.tasks_per_step} task groups cannot be split over {self.dist.world_size} "
                             f"ranks (each rolls out whole groups, at least one): raise tasks_per_step to >= "
                             f"{self.dist.world_size} or start fewer ranks")
        distributed.broadcast_params(self.params, self.dist)
        if self.fsdp:  # each rank keeps 1/N of every weight from here on (sdar.train.fsdp)
            from sdar.train import fsdp

            fsdp.shard_policy(self.policy)
            self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        from sdar.storage import ArtifactStore

        from sdar.storage import BucketNotFoundError, CredentialsError, StorageError

        uri = cfg.checkpoint.uri or str(self.out / "checkpoints")
        try:
            self.store = ArtifactStore.for_uri(uri)
        except (BucketNotFoundError, CredentialsError):
            raise  # a wrong name or missing credentials: no retry fixes those
        except StorageError as exc:  # unreachable now: checkpoints are spooled until it is back
            self.console.print(f"[yellow]the checkpoint store {uri} is unreachable now ({str(exc)[:200]}); "
                               "checkpoints wait in the local spool[/yellow]")
            self.store = ArtifactStore.for_uri(uri, check=False)
        # a remote store (s3://) gets every checkpoint through a local spool: written there first, uploaded
        # with retries; an outage shorter than cfg.checkpoint.retry_s costs nothing, and resume reads both
        from sdar.storage import LocalStore

        self.spool = None if isinstance(self.store, LocalStore) else LocalStore(self.out / "checkpoint-spool")
        self._pending: int | None = None  # newest spooled step not yet in the store
        self._outage_since: float | None = None
        self.outages: list[float] = []  # seconds each storage outage lasted (reported in the step metrics)
        self.step = 0
        self.run_id: str | None = None
        self.skipped_updates = 0
        self.attempted_updates = 0
        self.history: list[dict[str, float]] = []
        # Composer channel 3: the teacher pool replays each step's trajectories; its DPO pairs enter the loss
        # a step later. Pairs handed in from outside (the DAG's teacher_replay step) join the first step's
        self.replay = None
        self._given_pairs = None
        if train and self.arm.replay_coef != 0.0:
            from sdar.train.replay import ReplayChannel, read_pair_set

            self.replay = ReplayChannel(cfg.replay, family=cfg.env.family, builder=self.builder, tokenizer=self.tokenizer,
                                        constrained=self.rollout_cfg.constrained, out_dir=self.out, console=self.console,
                                        lag=cfg.replay.lag)
            if cfg.replay.pairs_path:
                self._given_pairs = read_pair_set(cfg.replay.pairs_path)
                self.console.print(f"replay: {len(self._given_pairs)} DPO pairs from {cfg.replay.pairs_path} join "
                                   "the first step's loss")

    def _gathered(self, reference: bool = False):
        """fsdp: the policy's weights whole on every rank for the block (`sdar.train.fsdp.gathered`, a collective:
        every rank enters), and the full fine-tune's reference copy too when `reference`; otherwise nothing."""
        if not self.fsdp:
            return contextlib.nullcontext()
        from sdar.train.fsdp import gathered

        return gathered(self.model, self.policy._reference if reference else None)

    def __getattr__(self, name: str) -> Any:
        if name in _RUNTIME_PARTS and "runtime" in self.__dict__:
            return getattr(self.__dict__["runtime"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ---- one RL step: rollout -> score -> update --------------------------------------------
    def sample_tasks(self, step: int) -> tuple[list[str], list[int]]:
        rng = random.Random(_step_seed(self.cfg.seed, step))
        tasks = rng.sample(self.train_pool, self.cfg.tasks_per_step)
        ids = [t for t in tasks for _ in range(self.cfg.group_size)]
        groups = [g for g in range(len(tasks)) for _ in range(self.cfg.group_size)]
        return ids, groups

    def collect(self, step: int) -> list[Trajectory]:
        """This rank's task groups (all of them alone), in lock-step, or one group at a time under
        its own seed when cfg.rollout.group_seeded."""
        ids, groups = self.sample_tasks(step)
        mine = distributed.group_range(self.cfg.tasks_per_step, self.dist)
        if self.cfg.rollout.group_seeded:
            chunks = [(_step_seed(self.cfg.seed * 7_919 + g + 1, step), [g]) for g in mine]
        else:  # rank 0 (and a single process) keeps the step's seed
            chunks = [(_step_seed(self.cfg.seed, step) + self.dist.rank, list(mine))]
        trajs: list[Trajectory] = []
        for seed, chunk in chunks:
            seed_everything(seed)
            sel = [i for i, g in enumerate(groups) if g in chunk]
            envs = [self.env_factory() for _ in sel]
            try:
                trajs += rollout(self.backend, self.tokenizer, envs, [ids[i] for i in sel], [groups[i] for i in sel],
                                 self.rollout_cfg)
            finally:
                for e in envs:
                    e.close()
        return trajs

    def train_step(self, step: int) -> StepResult:
        """One RL step: the rollout phase, the score phase (old, reference and teacher log-probs, no gradient),
        the update phase (the arm's composed loss, mini-batch by mini-batch); every forward in the Scorer's scope."""
        with self.scorer.scope():
            t0 = time.perf_counter()
            with self._gathered():
                rollouts = self.rollout_phase(step)
            with self._gathered(reference=True):
                batch = self.score_phase(step, rollouts)
            update = self.update_phase(step, batch)
            return StepResult(step, self.step_metrics(batch, update, time.perf_counter() - t0))

    def rollout_phase(self, step: int) -> Rollouts:
        """This rank's episodes of the step, their turn-samples, and GRPO's advantage of each."""
        t0 = time.perf_counter()
        trajs = self.collect(step)
        if self.replay is not None:  # the teacher pool replays these frozen trajectories in the background
            self.replay.submit(trajs)
        rc, cfg = self.rollout_cfg, self.cfg
        batch = TurnBatch.of(trajs)
        rewards = [r for _, _, r in turn_rewards(trajs, rc.invalid_penalty, rc.penalize, cfg.env.family, cfg.reward)]
        return Rollouts(trajs, batch, grpo_advantages(rewards, batch.groups), time.perf_counter() - t0)

    def score_phase(self, step: int, r: Rollouts) -> StepBatch:
        """Every score the update reads, taken before any weight moves: old_logp (except the rows the update's own
        first forward gives, and those the sampler reported), the reference's (for the KL term), the privileged
        teacher's (for the arms that distil, and for every arm's gap metrics), and the due DPO pairs'."""
        t0, cfg, arm, batch = time.perf_counter(), self.cfg, self.arm, r.batch
        # the tokens that carry a choice: every loss term and per-token statistic is over these
        free = free_token_mask(batch.allowed, batch.response_mask(), forced_free=not self.rollout_cfg.mask_forced_tokens)
        hint_prompts = self._hint_prompts(batch)
        pairs = self._due_pairs()
        # mini-batches are drawn over every rank's rows (alone: this process's), so N ranks make the same updates on
        # the same samples as one process; each rank scores only its own rows. The hint channel's tokens and the
        # DPO pairs are counted over the ranks too: each of those terms is weighted by its own share
        tokens = [int(x) for x in free.sum(dim=1).tolist()]
        split = distributed.split_rows(tokens, self.dist, hint_tokens=[t if i in hint_prompts else 0
                                                                       for i, t in enumerate(tokens)],
                                       pairs=len(pairs) if pairs is not None else 0)
        gen = torch.Generator().manual_seed(_step_seed(cfg.seed, step))
        orders = [torch.randperm(split.n, generator=gen).tolist() if cfg.ppo.shuffle_mini_batches else list(range(split.n))
                  for _ in range(cfg.ppo.epochs)]
        old, reuse = self._old_logp(batch, split, orders[0])
        ref = None
        if arm.kl_coef != 0.0:  # LoRA: the same module with the adapter disabled; full fine-tuning: the frozen copy
            with self.policy.reference() as ref_model:
                ref = self.scorer.score(ref_model, batch.prompts, batch.responses, batch.allowed, groups=batch.task_ids)
        # the teacher is theta_old with the skills in context; scored for every arm so the teacher-student gap
        # can be compared across arms, used in the loss only by SDAR/OPSD
        teacher = None
        if arm.needs_teacher or cfg.teacher.for_all_arms:
            teacher = self.teacher.score(self.policy.inference_model(), batch)
        return StepBatch(r, free, old, ref, teacher, split, orders, reuse, hint_prompts, pairs,
                         self._pair_slots(split, orders[0]), time.perf_counter() - t0)

    def _old_logp(self, batch: TurnBatch, split, first_order: list[int]) -> tuple[ScoredBatch, set[int]]:
        """old_logp [B, T], and the rows left for the update's first forward to fill (the first mini-batch's: the
        weights have not moved yet, so that forward is old_logp). Rows whose sampler reported its log-probs (the
        trainer's own model sampled them) need no pass at all."""
        cfg, n, mask = self.cfg, len(batch), batch.response_mask()
        sampled = self._sampler_rows(batch) if cfg.ppo.old_logp_from_sampler else {}
        reused = set(split.local(first_order[: cfg.ppo.mini_batch_size])) if cfg.ppo.reuse_old_logp else set()
        reused -= set(sampled)
        scored = [i for i in range(n) if i not in reused and i not in sampled]
        old_logp = torch.zeros(n, mask.shape[1], device=self.device)
        if scored:
            part = self.scorer.score(self.policy.inference_model(), _pick(batch.prompts, scored),
                                     _pick(batch.responses, scored), _pick(batch.allowed, scored))
            old_logp[torch.tensor(scored), : part.logp.shape[1]] = part.logp.to(old_logp.device)
        for i, lp in sampled.items():
            old_logp[i, : len(lp)] = torch.tensor(lp, dtype=old_logp.dtype)
        return ScoredBatch(logp=old_logp, entropy=None, mask=mask.to(old_logp.device)), reused

    def _hint_prompts(self, batch: TurnBatch) -> dict[int, list[int]]:
        """Composer channel 2: error-site row (a step the environment marked with a hint template) -> its teacher
        context, the student's prompt with the rendered hint inserted at that turn ({} for arms without it)."""
        if self.arm.hint_distill_coef == 0.0:
            return {}
        from sdar.teacher.hints import hint_prompt_ids, render_hint

        flat, family = batch.turns, self.cfg.env.family
        return {i: hint_prompt_ids(self.tokenizer, batch.prompts[i], render_hint(family, t.hint_template_key, t.error_args))
                for i, t in enumerate(flat) if t.hint_template_key}

    def _pair_slots(self, split, first_order: list[int]) -> dict[int, list[int]]:
        """Channel 3: the step's pair g (its global index over the ranks, `RowSplit.pair_offset`) rides in micro-batch
        g mod M of every epoch (M micro-batches per epoch); this rank's pairs by micro-batch, as local indices."""
        if not split.n_pairs:
            return {}
        n_micro = max(self._micro_batches_per_epoch(split, first_order), 1)
        slots: dict[int, list[int]] = {}
        for p in range(split.pairs[split.rank]):
            slots.setdefault((split.pair_offset + p) % n_micro, []).append(p)
        return slots

    def _slot_pairs(self, split, first_order: list[int]) -> dict[int, int]:
        """Micro-batch index -> how many of the step's pairs (every rank's) ride in it."""
        n_micro = max(self._micro_batches_per_epoch(split, first_order), 1)
        counts: dict[int, int] = {}
        for g in range(split.n_pairs):
            counts[g % n_micro] = counts.get(g % n_micro, 0) + 1
        return counts

    def _micro_batches_per_epoch(self, split, order: list[int]) -> int:
        cfg = self.cfg
        return sum(len(micro_batches(split, order[s : s + cfg.ppo.mini_batch_size], cfg.ppo.micro_batch_size,
                                     self.arm.aggregation, self.arm.normalisation(cfg.ppo.loss_normalisation)))
                   for s in range(0, split.n, cfg.ppo.mini_batch_size))

    def update_phase(self, step: int, b: StepBatch) -> UpdateResult:
        """The optimizer steps of this step: ppo.epochs passes over the step's rows, a mini-batch each."""
        t0, cfg = time.perf_counter(), self.cfg
        result = UpdateResult()
        for order in b.orders:
            b.micro_index = 0  # pairs ride in micro-batch p mod M of every epoch
            for start in range(0, b.split.n, cfg.ppo.mini_batch_size):
                metrics = self._mini_batch_update(step, b, order[start : start + cfg.ppo.mini_batch_size])
                if metrics is not None:
                    result.updates += 1
                    for k, v in metrics.items():
                        result.sums[k] = result.sums.get(k, 0.0) + float(v)
        result.seconds = time.perf_counter() - t0
        return result

    def _mini_batch_update(self, step: int, b: StepBatch, rows: list[int]) -> dict[str, float] | None:
        """One optimizer step on mini-batch `rows` (global ids): its micro-batches' losses and gradients, then the
        update; its metrics (weighted means over the mini-batch), or None when the update was skipped."""
        self.optimizer.zero_grad(set_to_none=True)
        with self._gathered():  # fsdp: the gradients accumulate whole, then one reduce-scatter shards them
            metrics, finite = self._accumulate(b, rows)
            if self.fsdp:
                from sdar.train.fsdp import sync_gradients

                sync_gradients(self.model, self.pad_id, self.policy.device)
        return self._apply_update(step, b, rows, metrics, finite)

    def _accumulate(self, b: StepBatch, rows: list[int]) -> tuple[dict[str, float], bool]:
        """The gradients of mini-batch `rows`, micro-batch by micro-batch (this rank's share of each), and its
        weighted metrics; False when a micro-batch's loss was not finite (the update is then skipped).

        Each loss term is weighted by this rank's share of its own denominator: the policy's terms by the rank's
        part of the micro-batch's policy tokens, the hint channel by its part of the hint tokens, the replay DPO by
        its part of the micro-batch's pairs; summed over the ranks, the weighted losses are one process's. The
        metrics carry, per name, the weight they were summed with (`PRESENT`), for `_finish_metrics`."""
        finite, metrics = True, {}
        cfg, arm, split = self.cfg, self.arm, b.split
        normalisation = arm.normalisation(cfg.ppo.loss_normalisation)
        parts = micro_batches(split, rows, cfg.ppo.micro_batch_size, arm.aggregation, normalisation)
        slot_pairs = self._slot_pairs(split, b.orders[0]) if split.n_pairs else {}
        for part, weight in parts:
            mb = split.local(part)
            pair_idx = b.slots.get(b.micro_index, [])
            base = 1.0 / len(parts) if normalisation == "micro_batch" else split.fraction(part, rows, arm.aggregation)
            scales = {}
            if sum(split.hint_tokens[i] for i in part):  # error sites in this micro-batch, on some rank
                scales["hint_jsd"] = base * split.share(part, arm.aggregation, counts="hint_tokens")
            if slot_pairs.get(b.micro_index):  # pairs ride in this micro-batch, on some rank
                scales["replay_dpo"] = base * len(pair_idx) / slot_pairs[b.micro_index]
            # a rank with no rows of this micro-batch still forms its (empty) loss: every rank then reports the
            # same metric names to sync_update, whose all-reduce needs equal sizes
            total, part_metrics = self._micro_loss(b, mb, pair_idx, scales, weight)
            b.micro_index += 1
            if not bool(torch.isfinite(total)):
                finite = False  # the update is skipped; the other micro-batches still report metrics
            elif (mb or pair_idx) and finite and total.requires_grad:
                total.backward()
            for k, (v, w) in part_metrics.items():  # (the weighted value, the weight it carries)
                metrics[k] = metrics.get(k, 0.0) + v
                metrics[PRESENT + k] = metrics.get(PRESENT + k, 0.0) + w
        if b.reuse:  # a micro-batch never ran (non-finite loss): score its rows now, unmoved
            rest = sorted(b.reuse)
            got = self.scorer.score(self.model, _pick(b.prompts, rest), _pick(b.responses, rest), _pick(b.allowed, rest))
            b.old.logp[torch.tensor(rest), : got.logp.shape[1]] = got.logp
            b.reuse = set()
        return metrics, finite

    def _apply_update(self, step: int, b: StepBatch, rows: list[int], metrics: dict[str, float], finite: bool
                      ) -> dict[str, float] | None:
        """Sum the ranks' gradients, clip and step; skip the update (None) when the loss, the gradient or the
        weights after it are not finite, restoring the weights of before it."""
        self.attempted_updates += 1
        if not finite:
            self.optimizer.zero_grad(set_to_none=True)
        # metrics are already weighted: summed over ranks they are the mini-batch's
        finite, metrics = distributed.sync_update([] if self.fsdp else self.params, metrics, 1.0, finite, self.dist)
        metrics = _finish_metrics(metrics)
        why = None if finite else "non-finite loss, update skipped"
        gn = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.grad_clip) if finite else None
        if gn is not None and self.fsdp:
            from sdar.train.fsdp import full

            gn = full(gn)  # the norm over every rank's shards
        if gn is not None and not torch.isfinite(gn):
            why = "non-finite gradient, update skipped"
        if why is None:
            before = self._snapshot() if self.cfg.optim.guard_updates else None
            self.optimizer.step()
            if before is not None and not distributed.all_true(self._healthy_now(b, b.split.local(rows)[:1]), self.dist):
                self._restore(before)
                why = "the update made the weights or the policy's log-probs non-finite; restored the weights of before it"
        if why is not None:
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped_updates += 1
            self.console.print(f"[yellow]step {step}: {why}[/yellow]")
            return None
        return {**metrics, "grad_norm": gn}

    def step_metrics(self, b: StepBatch, u: UpdateResult, step_s: float) -> dict[str, float]:
        """The step's metrics, summed over ranks (`distributed.reduce_step_metrics`)."""
        cfg, trajs, turns, allowed, n = self.cfg, b.rollouts.trajs, b.rollouts.batch.turns, b.allowed, len(b.prompts)
        sites = sum(1 for t in turns if t.hint_template_key)
        choice = free_token_mask(allowed, b.old.mask)  # the tokens constrained decoding left a choice at
        gap = None if b.teacher is None else b.teacher.logp - b.old.logp
        out = {k: v / max(u.updates, 1) for k, v in u.sums.items()}
        out.update({
            "reward": sum(episode_reward(tr, cfg.env.family, cfg.reward) for tr in trajs) / len(trajs),
            "env_reward": sum(tr.reward for tr in trajs) / len(trajs),
            "success": sum(tr.won for tr in trajs) / len(trajs),
            "episode_length": sum(tr.length for tr in trajs) / len(trajs),
            "invalid_action_rate": sum(not (t.valid and t.env_valid) for t in turns) / max(len(turns), 1),
            "format_error_rate": sum(not t.format_valid for t in turns) / max(len(turns), 1),
            # accepted actions the environment marked as making no progress (revisits, non-task objects, ...)
            "no_progress_rate": sum(t.env_valid and bool(t.error_kind) and t.valid for t in turns) / max(len(turns), 1),
            "turn_samples": float(n), "tokens_per_s": sum(map(len, b.responses)) / max(b.rollouts.seconds, 1e-9),
            "time/rollout_s": b.rollouts.seconds, "time/score_s": b.seconds, "time/update_s": u.seconds,
            "time/step_s": step_s,
            # forced: response tokens constrained decoding allowed no alternative to (left out of the loss and of
            # every sdar/*, pg/* and loss/* statistic when rollout.mask_forced_tokens)
            "tokens/forced_frac": 1.0 - float(choice.sum()) / max(float(b.old.mask.sum()), 1.0),
            "tokens/free": float(b.free.sum()),
            "teacher/gap_free_tokens": float("nan") if gap is None else _masked_mean(gap, choice),
            "teacher/gap_all_tokens": float("nan") if gap is None else _masked_mean(gap, b.old.mask),
            "teacher/vllm_fallback_frac": self.teacher.fallback_frac,
            "updates": float(u.updates), "skipped_updates": float(self.skipped_updates),
            # turn-samples at error sites (marked by the environment with a hint template), every arm
            "hint/error_sites": float(sites), "hint/error_site_rate": sites / max(n, 1),
        })
        if self.replay is not None:
            out.update(self.replay.metrics())
            out["replay/pairs_in_loss"] = float(len(b.pairs) if b.pairs is not None else 0)
        counts = {"trajectories": len(trajs), "turns": len(turns), "rows": n, "tokens": float(b.old.mask.sum()),
                  "free_tokens": float(choice.sum()), "teacher_turns": self.teacher.scored_turns}
        if self.replay is not None:  # what the replay this step took counted (its means are over these)
            counts.update({**_replay_counts(out), "replay_trajectories_total": float(self.replay.replayed)})
        return distributed.reduce_step_metrics(out, counts, self.dist)

    def _sampler_rows(self, batch: TurnBatch) -> dict[int, list[float]]:
        """Turn-sample row -> the sampler's log-probs, where they are the trainer's old_logp: the transformers
        backend on the trainer's own model (or its merged inference module: the same weights), no weights moved
        since, top_p 1, every token reported."""
        from sdar.agent.backends import TransformersBackend

        if not isinstance(self.backend, TransformersBackend) or self.backend.model is not self.model \
                or self.rollout_cfg.top_p != 1.0:
            return {}
        return {i: t.logprobs for i, t in enumerate(batch.turns)
                if t.logprobs is not None and len(t.logprobs) == len(t.response_ids)}

    def _snapshot(self) -> tuple[list[torch.Tensor], dict]:
        """The trainable weights and the optimizer state, to restore after an update that broke them."""
        import copy

        return [p.detach().clone() for p in self.params], copy.deepcopy(self.optimizer.state_dict())

    def _restore(self, snapshot) -> None:
        weights, opt_state = snapshot
        with torch.no_grad():
            for p, w in zip(self.params, weights):
                p.copy_(w)
        self.optimizer.load_state_dict(opt_state)
        self.optimizer.zero_grad(set_to_none=True)

    def _healthy_now(self, b: StepBatch, rows: list[int]) -> bool:
        with self._gathered():
            return self._healthy(b, rows)

    def _healthy(self, b: StepBatch, rows: list[int]) -> bool:
        """The trainable weights are finite and the policy scores `rows` (local) to finite log-probs: weights
        that are finite but huge (lr far too high) overflow in the forward, and would fail the next rollout."""
        if not self._finite_weights():
            return False
        if not rows:
            return True
        scored = self.scorer.score(self.model, _pick(b.prompts, rows), _pick(b.responses, rows), _pick(b.allowed, rows))
        return bool(torch.isfinite(scored.logp).all())

    def _finite_weights(self) -> bool:
        """This rank's trainable weights (its shards under fsdp) are finite."""
        from sdar.train.fsdp import local

        return all(bool(torch.isfinite(local(p.detach())).all()) for p in self.params)

    def _micro_loss(self, b: StepBatch, mb: list[int], pair_idx, scales: dict[str, float], weight: float):
        """The arm's composed loss on local rows `mb` (one forward with grad), over their free tokens, plus
        the DPO term on the replay pairs `pair_idx` of this step when this micro-batch carries some, each term
        weighted for this rank: the policy's terms by `weight`, the terms named in `scales` by theirs. Returns the
        weighted loss and each metric with the weight it counts with."""
        cur = self.scorer.with_grad(self.model, _pick(b.prompts, mb), _pick(b.responses, mb), _pick(b.allowed, mb),
                                    groups=_pick(b.groups, mb))
        T = cur.logp.shape[1]
        idx = torch.tensor(mb, dtype=torch.long)
        fill = [j for j, i in enumerate(mb) if i in b.reuse]
        if fill:  # first forward on unchanged weights: it is old_logp (exact), no separate pass needed
            rows = torch.tensor([mb[j] for j in fill], dtype=torch.long)
            b.old.logp[rows, :T] = cur.logp.detach()[torch.tensor(fill)].to(b.old.logp.device)
            b.reuse = b.reuse - {mb[j] for j in fill}
        batch = LossBatch(
            logp=cur.logp, old_logp=b.old.logp[idx, :T], advantages=b.rollouts.advantages[idx].to(cur.logp.device),
            mask=cur.mask * b.free[idx, :T].to(cur.mask.device),
            ref_logp=None if b.ref is None else b.ref.logp[idx, :T],
            teacher_logp=None if b.teacher is None else b.teacher.logp[idx, :T],
            entropy=cur.entropy, budget=self.cfg.rollout.max_response_tokens,
        )
        if self.arm.hint_distill_coef != 0.0:
            self._hint_inputs(batch, b, mb)
        if pair_idx and self.arm.replay_coef != 0.0:
            sel, pairs = list(pair_idx), b.pairs
            for side in ("chosen", "rejected"):
                lp = self.scorer.summed(self.model, _pick(pairs.prompts, sel), _pick(getattr(pairs, side), sel),
                                        _pick(getattr(pairs, f"{side}_allowed"), sel), grad=True)
                setattr(batch, f"dpo_{side}_logp", lp)
                setattr(batch, f"dpo_ref_{side}_logp", getattr(pairs, f"ref_{side}")[torch.tensor(sel)].to(lp.device))
        if all(v == weight for v in scales.values()):  # every term weighted alike (always alone): one product
            total, metrics = compose_loss(self.arm, batch)
            return total * weight, {k: (weight * float(v), weight) for k, v in metrics.items()}
        total, metrics = compose_loss(self.arm, batch, scales={**{t: weight for t in LOSS_TERMS}, **scales})
        out = {}
        for k, v in metrics.items():
            w = weight if k == "loss/total" else scales.get(metric_term(k), weight)
            # loss/total comes weighted term by term already; its presence counts as the policy's
            out[k] = (float(v) if k == "loss/total" else w * float(v), w)
        return total, out

    def _due_pairs(self):
        """This step's DPO pairs (the previous step's replay, plus pairs handed in for the first step), with
        the frozen reference's summed log-probs computed once."""
        if self.replay is None:
            return None
        pairs = self.replay.take()
        if self._given_pairs is not None:
            given, self._given_pairs = self._given_pairs, None
            if not self.dist.is_main:  # the pairs handed in join the step once: rank 0 brings them (first, as alone)
                given = None
            elif pairs is not None:
                given.extend(pairs)
            pairs = given if given is not None else pairs
        if pairs is None or not len(pairs):
            return None
        with self.policy.reference() as ref_model:
            for side in ("chosen", "rejected"):
                setattr(pairs, f"ref_{side}", self.scorer.summed(ref_model, pairs.prompts, getattr(pairs, side),
                                                                 getattr(pairs, f"{side}_allowed")))
        return pairs

    def _hint_inputs(self, batch: LossBatch, b: StepBatch, mb: list[int]) -> None:
        """Channel 2's inputs for the error-site rows of `mb`: the student's logits (with grad) and the
        hinted teacher's (no grad, same weights, eval mode) on that turn's response tokens; the JSD is
        over their free tokens only. A micro-batch without error sites gets an empty mask (JSD 0)."""
        from sdar.teacher.hints import response_logits

        err = [i for i in mb if i in b.hint_prompts]
        if not err:
            z = torch.zeros(1, 1, 1, device=batch.logp.device)
            batch.hint_student_logits, batch.hint_teacher_logits, batch.hint_mask = z, z, torch.zeros(1, 1, device=z.device)
            return
        resp, allow = _pick(b.responses, err), _pick(b.allowed, err)
        pad = self.scorer.pad_id
        s_logits, hmask = response_logits(self.model, _pick(b.prompts, err), resp, pad_id=pad, allowed=allow, grad=True)
        was_training = self.model.training
        self.model.eval()
        try:
            t_logits, _ = response_logits(self.model, [b.hint_prompts[i] for i in err], resp, pad_id=pad, allowed=allow,
                                          grad=False)
        finally:
            self.model.train(was_training)
        T = hmask.shape[1]
        batch.hint_student_logits, batch.hint_teacher_logits = s_logits, t_logits
        batch.hint_mask = hmask * b.free[torch.tensor(err), :T].to(hmask.device)

    # ---- evaluation ---------------------------------------------------------------------
    def evaluate(self, temperature: float | None = None, tasks: list[str] | None = None, privileged: bool = False):
        """Success on the held-out tasks with the current weights (see `Runtime.evaluate`)."""
        return self.runtime.evaluate(temperature, tasks, privileged)

    def teacher_gap(self, trajs: list[Trajectory]) -> float:
        """Teacher - student token-mean gap on `trajs` (see `Runtime.teacher_gap`)."""
        return self.runtime.teacher_gap(trajs)

    # ---- checkpoints --------------------------------------------------------------------
    def save_checkpoint(self, step: int) -> None:
        """Rank 0 writes the trainable weights (ddp: whole; fsdp: every rank's shards, `sdar.train.fsdp`), the
        optimizer and the trainer's state to the spool or the store."""
        from sdar.storage import write_checkpoint

        # unreachable with optim.guard_updates; a bad checkpoint would poison resume
        finite = distributed.all_true(self._finite_weights(), self.dist) if self.fsdp else self._finite_weights()
        replay_pending = self._replay_pending()  # a collective: every rank's pairs not yet in a loss
        if not self.dist.is_main and not self.fsdp:  # the replicas hold the same weights; one writer
            return
        if not finite:
            if self.dist.is_main:
                self.console.print(f"[red]step {step}: the weights are not finite; checkpoint not written (the last "
                                   "good one stays the one to resume from)[/red]")
            return
        with self._checkpoint_dir(step) as tmp:
            if self.fsdp:
                from sdar.train.fsdp import SHARDS_DIR, save_sharded

                save_sharded(self.model, self.optimizer, Path(tmp) / SHARDS_DIR)
                if not self.dist.is_main:
                    return
            else:
                trainable = {n: p.detach().cpu().clone() for n, p in self.model.named_parameters() if p.requires_grad}
                torch.save(trainable, Path(tmp) / WEIGHTS_FILE)
            torch.save({
                "step": step, "optimizer": None if self.fsdp else self.optimizer.state_dict(), "run_id": self.run_id,
                "sharded": self.fsdp,
                "skipped_updates": self.skipped_updates, "attempted_updates": self.attempted_updates,
                "history": self.history,
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
                "arm": self.arm.name, "config": self.cfg.to_dict(), "skills_seen": self.teacher.skills_seen,
                "replay_pending": replay_pending,
            }, Path(tmp) / STATE_FILE)
            write_checkpoint(self.spool or self.store, step, tmp, keep_last=self.cfg.checkpoint.keep)
        if self.spool is not None:
            self._pending = step  # an older pending step is superseded: resume wants the newest
            self.flush_checkpoints(wait=False)

    def _replay_pending(self) -> list[dict[str, Any]] | None:
        """Channel 3's replays not yet in a loss (lag 1: the last step's), every rank's pairs in rank order (the
        single-process order) with each rank's statistics; None for arms without the channel."""
        if self.replay is None:
            return None
        mine = [(pairs.to_records(), stats) for pairs, stats in self.replay.pending()]
        ranks = distributed.all_gather(mine, self.dist)
        return [{"records": [r for rank in ranks for r in rank[e][0]], "stats": [rank[e][1] for rank in ranks]}
                for e in range(len(mine))]

    def _restore_replay(self, pending: list[dict[str, Any]] | None) -> None:
        """Queue the checkpoint's pending replays, each rank a contiguous block of their pairs (at any number of
        ranks: blocks in rank order are the saved order); rank 0 reports their statistics, combined over the ranks
        that wrote them."""
        if self.replay is None or not pending:
            return
        from sdar.train.replay import PairSet

        entries = []
        for entry in pending:
            block = distributed.contiguous_block(len(entry["records"]), self.dist)
            stats = {}
            if self.dist.is_main:
                stats = distributed.combine_metrics([(st, _replay_counts(st)) for st in entry["stats"]])
                stats.pop("replay/cost_per_trajectory_usd", None)  # of the pools that wrote it: the new pool's is due
            entries.append((PairSet.from_records([entry["records"][i] for i in block]), stats))
        self.replay.restore(entries)

    @contextlib.contextmanager
    def _checkpoint_dir(self, step: int):
        """Where a checkpoint is assembled before rank 0 uploads it: a temporary directory; under fsdp one that
        every rank writes its shard into, <output_dir>/checkpoint-staging/step-N, which must be shared by the ranks
        (one node: any local path; several: a volume they all mount)."""
        if not self.fsdp or not self.dist.enabled:
            with tempfile.TemporaryDirectory() as tmp:
                yield tmp
            return
        import shutil
        import uuid

        staging = self.out / "checkpoint-staging" / f"step-{step}"
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

    def flush_checkpoints(self, wait: bool = True) -> bool:
        """Upload the newest spooled checkpoint to the store; True when nothing is pending any more.

        A failure starts (or continues) an outage, reported once; wait=False tries once (the run goes on
        and the next step tries again), wait=True retries with backoff. An outage longer than
        cfg.checkpoint.retry_s ends the run with an error naming the spool, from which a rerun resumes."""
        from sdar.storage import COMPLETE_FILE, StorageError, checkpoint_path, write_checkpoint

        delay = 1.0
        while self._pending is not None:
            step = self._pending
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    self.spool.get_dir(checkpoint_path(step), tmp)
                    (Path(tmp) / COMPLETE_FILE).unlink(missing_ok=True)
                    write_checkpoint(self.store, step, tmp, keep_last=self.cfg.checkpoint.keep)
            except Exception as exc:  # noqa: BLE001 - botocore raises many kinds; all mean "not stored yet"
                now = time.monotonic()
                if self._outage_since is None:
                    self._outage_since = now
                    self.console.print(f"[yellow]checkpoint of step {step} could not reach {self.store.uri} "
                                       f"({type(exc).__name__}: {str(exc)[:200]}); kept in {self.spool.uri}, "
                                       f"retrying for up to {self.cfg.checkpoint.retry_s:.0f} s[/yellow]")
                waited = now - self._outage_since
                if waited > self.cfg.checkpoint.retry_s:
                    raise StorageError(
                        f"the checkpoint store {self.store.uri} has been unreachable for {waited:.0f} s "
                        f"(checkpoint.retry_s={self.cfg.checkpoint.retry_s:.0f}); the checkpoint of step {step} is kept "
                        f"in {self.spool.uri}: rerun the same command once the store is back, it resumes from there"
                    ) from exc
                if not wait:
                    return False
                time.sleep(min(delay, max(0.0, self.cfg.checkpoint.retry_s - waited) + 0.01))
                delay = min(delay * 2, 30.0)
                continue
            self._pending = None
            if self._outage_since is not None:
                self.console.print(f"checkpoint store {self.store.uri} reachable again after "
                                   f"{time.monotonic() - self._outage_since:.0f} s; step {step} uploaded")
                self.outages.append(time.monotonic() - self._outage_since)
                self._outage_since = None
        return True

    def maybe_resume(self) -> bool:
        """Load the newest complete checkpoint that loads and holds finite weights; False when there is none.

        A checkpoint that cannot be loaded (a file missing or cut short, a torch file that does not open) is
        reported, moved aside to checkpoints/damaged/ (never deleted: `quarantine_checkpoint`) and passed
        over; one with non-finite weights is reported and passed over. An unreadable latest.json is reported
        and the newest complete checkpoint is used instead."""
        from sdar.storage import BucketNotFoundError, CredentialsError, StorageError, latest_checkpoint, list_checkpoints

        warn = lambda message: self.console.print(f"[yellow]{message}[/yellow]", markup=True, highlight=False)  # noqa: E731
        candidates = []  # (step, store, rel), newest first: the store's, then the spool's (an outage's)
        for store in (self.store, self.spool):
            if store is None:
                continue
            try:
                found = latest_checkpoint(store, warn=warn)
            except (BucketNotFoundError, CredentialsError):
                raise
            except StorageError as exc:  # an outage: what this output directory spooled is still here
                if self.spool is None:
                    raise
                warn(f"cannot read {store.uri} now ({str(exc)[:160]}); resuming from the local spool {self.spool.uri}")
                continue
            if found is not None:
                candidates += [(found[0], store, found[1])]
                candidates += [(s, store, r) for s, r in reversed(list_checkpoints(store)) if s < found[0]]
        if not candidates:
            return False
        candidates.sort(key=lambda c: -c[0])  # stable: the store before the spool at equal steps
        passed_over = []
        for step, store, rel in candidates:
            try:
                weights, state = self._load_checkpoint(store, rel)
            except CheckpointUnreadable as exc:
                passed_over.append(f"{store.uri_for(rel)}: {exc}")
                where = ""
                if self.dist.is_main:  # one mover; the replicas pass over it too
                    from sdar.storage import quarantine_checkpoint

                    with contextlib.suppress(FileNotFoundError):  # a replica got there first
                        where = f"; moved to {store.uri_for(quarantine_checkpoint(store, rel, str(exc)))} (kept, not deleted)"
                warn(f"checkpoint {store.uri_for(rel)} cannot be loaded ({exc}){where}; trying an older one")
                continue
            finite = self._finite_weights() if weights is None else all(bool(torch.isfinite(v).all())
                                                                          for v in weights.values())
            if distributed.all_true(finite, self.dist) if self.fsdp else finite:
                break
            passed_over.append(f"{store.uri_for(rel)}: non-finite weights")
            warn(f"checkpoint {store.uri_for(rel)} holds non-finite weights; looking for an older one")
        else:
            raise RuntimeError(f"no checkpoint under {self.store.uri_for('checkpoints')} can be resumed from ("
                               + "; ".join(passed_over) + "): delete them (or use another output_dir) to start over")
        if state.get("arm") != self.arm.name:
            raise ValueError(f"checkpoint at {store.uri_for(rel)} is of arm {state.get('arm')!r}, not "
                             f"{self.arm.name!r}; use another output_dir/checkpoint.uri")
        if weights is not None:  # a whole-tensor checkpoint (a sharded one is in the model and optimizer already)
            self._load_whole(weights, state["optimizer"], store.uri_for(rel))
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        self.step = state["step"]
        self.run_id = state.get("run_id")
        self.skipped_updates = state.get("skipped_updates", 0)
        self.attempted_updates = state.get("attempted_updates", 0)
        self.history = state.get("history", [])
        self.teacher.skills_seen = state.get("skills_seen", {})
        self._restore_replay(state.get("replay_pending"))
        if self.step > 0:
            self._given_pairs = None  # they joined the first step's loss, before the checkpoint
        self.console.print(f"resumed from {store.uri_for(rel)} at step {self.step}")
        return True

    def _load_whole(self, weights: dict[str, torch.Tensor], optim_state: dict, where: str) -> None:
        if not self.fsdp:
            load_trainable(self.model, weights, where)
            self.optimizer.load_state_dict(optim_state)
            return
        from sdar.train.fsdp import load_full

        names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        load_full(self.model, self.optimizer, weights, optim_state, names)

    def _load_checkpoint(self, store, rel: str) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        """(trainable weights, trainer state) of checkpoint `rel`; `CheckpointUnreadable` naming what is wrong
        when a file is missing, not its recorded size, or does not load. An unreachable store still raises
        its own StorageError (an outage is not damage). A sharded checkpoint (fsdp) is read straight into the
        model and the optimizer, each rank its shards, and its weights come back as None."""
        from sdar.storage import DamagedCheckpointError, fetch_checkpoint

        with tempfile.TemporaryDirectory() as tmp:
            try:
                fetch_checkpoint(store, rel, tmp)
            except DamagedCheckpointError as exc:
                raise CheckpointUnreadable(exc.detail) from exc
            except FileNotFoundError as exc:  # moved aside meanwhile (by another replica), or never whole
                raise CheckpointUnreadable(f"its files are gone ({exc})") from exc
            from sdar.train.fsdp import SHARDS_DIR

            sharded = (Path(tmp) / SHARDS_DIR).is_dir()
            loaded = []
            for name, weights_only in ((STATE_FILE, False),) if sharded else ((WEIGHTS_FILE, True), (STATE_FILE, False)):
                try:
                    loaded.append(torch.load(Path(tmp) / name, weights_only=weights_only))
                except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, EOFError, UnpicklingError, ...
                    raise CheckpointUnreadable(f"{name} does not load: {type(exc).__name__}: {str(exc)[:200]}") from exc
            if sharded:
                self._load_shards(Path(tmp) / SHARDS_DIR)
                loaded.insert(0, None)
        weights, state = loaded
        if not (weights is None or isinstance(weights, dict)) or not isinstance(state, dict) or "step" not in state:
            raise CheckpointUnreadable(f"{WEIGHTS_FILE} or {STATE_FILE} does not hold what a checkpoint holds")
        return weights, state

    def _load_shards(self, directory: Path) -> None:
        from sdar.train.fsdp import load_sharded

        try:
            load_sharded(self.model, self.optimizer, directory)
        except Exception as exc:  # noqa: BLE001 - torch.distributed.checkpoint raises CheckpointException and others
            raise CheckpointUnreadable(f"its shards do not load: {type(exc).__name__}: {str(exc)[:200]}") from exc

    # ---- the run --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train to cfg.steps, resuming from the newest good checkpoint; holds the output directory's lock."""
        main = self.dist.is_main
        with contextlib.ExitStack() as stack:
            if main:  # one run per output directory at a time: the replicas of a torchrun job share it
                stack.enter_context(output_dir_lock(self.out))
            if self.replay is not None:  # the teacher pool (and a local pool's server) ends with the run
                stack.callback(self.replay.close)
            return self._run(main)

    def _run(self, main: bool) -> dict[str, Any]:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from sdar.tracking import Tracker, close_crashed_runs

        cfg = self.cfg
        self.maybe_resume()
        distributed.assert_same(self.step, "the step to resume at", self.dist)
        tracking = None if cfg.tracking and main else False
        tags = {"arm": self.arm.name, "family": cfg.env.family, "sdar.output_dir": str(self.out.resolve())}
        if self.run_id is None and main and Tracker(cfg.experiment, enabled=tracking).enabled:
            # a run killed before its first checkpoint left its MLflow run RUNNING: nothing resumes it
            crashed = close_crashed_runs(cfg.experiment, {"sdar.output_dir": tags["sdar.output_dir"]},
                                         tracking_uri=None, output_dir=str(self.out))
            if crashed:
                self.console.print(f"marked {len(crashed)} earlier run(s) in {self.out} that died before their "
                                   f"first checkpoint as KILLED: {', '.join(crashed)}")
        tracker = Tracker(cfg.experiment, run_name=f"{self.arm.name}-seed{cfg.seed}", parent_run_id=cfg.parent_run_id,
                          tags=tags, resume_run_id=self.run_id, resume_step=self.step,
                          enabled=tracking, output_dir=str(self.out))
        summary: dict[str, Any] = {}
        with tracker:
            self.run_id = tracker.run_id
            if self.step == 0:
                tracker.log_params({"arm": self.arm.name, **self.cfg.to_dict(), "arm_settings": vars(self.arm)})
                tracker.log_text(json.dumps(cfg.to_dict(), indent=2), "config.json")
            with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                          TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=self.console,
                          disable=not main) as progress:
                bar = progress.add_task(f"train {self.arm.name}", total=cfg.steps, completed=self.step, info="")
                while self.step < cfg.steps:
                    if self._pending is not None:  # a storage outage: try the upload again
                        self.flush_checkpoints(wait=False)
                    step = self.step
                    result = self.train_step(step)
                    m = result.metrics
                    if cfg.eval.every and (step + 1) % cfg.eval.every == 0 and (main or self.fsdp):
                        with self._gathered():  # fsdp: every rank gathers, rank 0 evaluates
                            if main:
                                m.update(self.evaluate().metrics())
                    self.history.append({"step": step, **m})
                    tracker.log_metrics(_tracked(m), step=step)
                    self.step = step + 1
                    if self.step % cfg.checkpoint.every == 0 or self.step == cfg.steps:
                        self.save_checkpoint(self.step)
                        # the exact privileged texts the teacher saw so far, per task type and task
                        tracker.log_dict(self.teacher.skills_seen, "privileged_skills.json")
                    info = (f"success {m['success']:.2f} reward {m['reward']:.2f} "
                            f"gap {m.get('sdar/gap_mean', float('nan')):+.3f} {m['time/step_s']:.1f}s/step")
                    progress.update(bar, completed=self.step, info=info)
                    if main and not self.console.is_terminal:  # logs get one line per step
                        extra = f" eval {m['eval/success']:.2f}" if "eval/success" in m else ""
                        # markup=False: rich would read "[grpo]" as a style tag and drop the arm's name
                        self.console.print(f"[{self.arm.name}] step {self.step}/{cfg.steps}: {info}{extra}", markup=False,
                                           highlight=False)
            self.flush_checkpoints(wait=True)  # the run ends with its last checkpoint in the store
            final = self.out / "final"
            self._save_final(final)
            if main:
                tracker.log_artifacts(str(final), "final_adapter")
                (self.out / "history.json").write_text(json.dumps(self.history, indent=1))
                tracker.log_artifact(str(self.out / "history.json"))
            summary = {"arm": self.arm.name, "steps": self.step, "run_id": self.run_id, "output_dir": str(self.out),
                       "final_dir": str(final), "history": self.history}
            self._check_skipped()  # inside the tracker: a failing run is marked FAILED in MLflow
        return summary

    def _save_final(self, final: Path) -> None:
        """Rank 0 writes the final policy (`Policy.save`). fsdp: the trainable weights gathered whole on rank 0 (a
        collective) into a plain copy of the starting policy, the frozen weights being the start's own."""
        if not self.fsdp:
            if self.dist.is_main:
                self.policy.save(final)
            return
        from sdar.train.fsdp import whole_trainable
        from sdar.train.warmstart import load_warm_policy

        weights = whole_trainable(self.model)
        if self.dist.is_main:
            plain = load_warm_policy(self.cfg)
            named = dict(plain.model.named_parameters())  # a tied weight (lm_head = embeddings) comes under both names
            load_trainable(plain.model, {k: v for k, v in weights.items() if k in named}, "the gathered fsdp weights")
            plain.save(final)
        distributed.barrier(self.dist)

    def _check_skipped(self) -> None:
        frac = self.skipped_updates / self.attempted_updates if self.attempted_updates else 0.0
        if frac > self.cfg.optim.max_skipped_update_frac:
            raise TrainingFailed(
                f"{self.skipped_updates} of {self.attempted_updates} updates were skipped (non-finite loss, gradient "
                f"or weights), more than optim.max_skipped_update_frac={self.cfg.optim.max_skipped_update_frac}: this run did "
                "not train. Check lr, the arm's coefficients (arm_overrides) and the model's dtype; the last "
                f"finite checkpoint is kept in {self.store.uri_for('checkpoints')}")


LOCK_FILE = ".sdar-train.lock"


@contextlib.contextmanager
def output_dir_lock(out: Path):
    """An exclusive lock on the output directory for the life of a run (released when the process dies):
    two runs writing one directory's checkpoints and MLflow run would corrupt each other's resume."""
    path = Path(out) / LOCK_FILE
    fh = open(path, "a+")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise RuntimeError(f"{out} is in use by another training run ({holder}); wait for it to finish, "
                               "or give this run another output directory (--output / output_dir)") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        yield
    finally:
        fh.close()


def micro_batches(split, rows: list[int], size: int, agg: str, normalisation: str) -> list[tuple[list[int], float]]:
    """The micro-batches of mini-batch `rows` (global row ids, in order) and this rank's weight for the loss
    it computes on each, aggregated (`agg`) over that micro-batch's rows.

    micro_batch: the mini-batch's loss is the mean of its micro-batches' losses (the reference: verl's
        dp_actor.update_policy divides each micro-batch's token-mean by gradient_accumulation);
    mini_batch: one aggregation over the whole mini-batch's tokens, split for memory only.
    Summed over ranks (alone: as they are), the weighted losses give the mini-batch's loss exactly.
    """
    if normalisation not in ("micro_batch", "mini_batch"):
        raise ValueError(f"ppo.loss_normalisation={normalisation!r} is not one of micro_batch, mini_batch")
    parts = [rows[k : k + size] for k in range(0, len(rows), size)]
    if normalisation == "micro_batch":
        return [(part, split.share(part, agg) / len(parts)) for part in parts]
    return [(part, split.share(part, agg, within=rows)) for part in parts]


def _replay_counts(stats: dict[str, float]) -> dict[str, float]:
    """What a replay's rates are means over (`distributed.WEIGHTED_BY`), from its own statistics."""
    turns = float(stats.get("replay/turns", 0.0))
    return {"replay_turns": turns, "replay_agreed": float(stats.get("replay/agreement_rate", 0.0)) * turns,
            "replay_trajectories": float(stats.get("replay/trajectories", 0.0))}


PRESENT = "present:"  # a mini-batch metric's companion: the summed weight of the micro-batches (and ranks) that had it


def _finish_metrics(summed: dict[str, float]) -> dict[str, float]:
    """The mini-batch's metrics from their weighted sums over micro-batches and ranks: a term only some micro-batches
    carry (replay pairs) is a mean over those (its sum scaled by the whole weight over the weight it had)."""
    whole = summed.get(PRESENT + "loss/total", 0.0)
    out = {}
    for k, v in summed.items():
        if k.startswith(PRESENT):
            continue
        had = summed.get(PRESENT + k, whole)
        out[k] = v * (whole / had) if 0.0 < had < whole else v
    return out


def _tracked(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}


def train(cfg: TrainConfig, policy=None, env_factory=None, console=None) -> dict[str, Any]:
    """Build a Trainer and run it to cfg.steps (resuming from the latest checkpoint)."""
    return Trainer(cfg, policy=policy, env_factory=env_factory, console=console).run()
