"""The on-policy RL step for one arm, in three phases that hand each other values (`sdar.train.batch`):

rollout: sample tasks -> G rollouts each -> GRPO advantages over turn-samples;
score: old, reference and privileged-teacher log-probs (no grad), the channels' inputs, the update's plan;
update: mini-batch updates with the arm's composed loss (`sdar.train.update`).

Beside the step: the distribution strategy (`strategy`: one process, ddp or fsdp), the checkpoints
(`checkpoint`), the update guard (`guards`), the step's metrics (`metrics`) and the run loop (`loop`), which
resumes, steps, evaluates, tracks and saves. Under torchrun each rank rolls out its share of the task groups and
the ranks train as one process would (`distributed`).
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable

import numpy as np
import torch

from sdar.agent.rollout import Trajectory, TurnBatch, rollout, turn_rewards
from sdar.algos import grpo_advantages
from sdar.config import ConfigError, TrainConfig
from sdar.console import make_console
from sdar.models.scored import pick
from sdar.models.scoring import ScoredBatch, free_token_mask
from sdar.train import distributed, loop
from sdar.train.batch import GroupCounts, Rollouts, StepBatch, StepResult, UpdateResult
from sdar.train.channels import HintChannel, PairChannel
from sdar.train.checkpoint import Checkpointer
from sdar.train.guards import TrainingFailed, UpdateGuard  # noqa: F401 - TrainingFailed: sdar train's exit 3
from sdar.train.metrics import step_metrics
from sdar.train.runtime import Runtime, Shortcuts, build_runtime, seed_everything, step_seed
from sdar.train.strategy import Strategy
from sdar.train.update import Updater


class Trainer:
    """Trains the runtime's policy with `cfg.arm`: the runtime's parts (`sdar.train.runtime`), an optimizer, the
    strategy the ranks hold the policy with, checkpoints (local or s3://, resumable at any rank count) and, for the
    Composer arms, their channels."""

    def __init__(self, cfg: TrainConfig, policy=None, env_factory: Callable[[], Any] | None = None,
                 console=None, train: bool = True, runtime: Runtime | None = None,
                 shortcuts: Shortcuts = Shortcuts()) -> None:
        """policy: default the config's model, loaded (the tiny model's warm start must have been built:
        `sdar.train.warmstart.ensure_warm_start`). runtime: parts already built (`build_runtime`). shortcuts: all
        but in checks and benchmarks (`sdar.train.runtime.Shortcuts`; a given runtime has its own)."""
        self.cfg, self.console = cfg, console or make_console(stderr=True)
        # rank 0 of 1 unless started by torchrun (fsdp: with a process group of one, to shard over)
        self.strategy = Strategy.of(cfg.distributed.strategy, cfg.resolved_device())
        self.dist = self.strategy.dist
        if cfg.tasks_per_step < self.dist.world_size:  # refused at start, not at the first step's rollout
            raise ConfigError(f"tasks_per_step={cfg.tasks_per_step} task groups cannot be split over {self.dist.world_size} "
                              f"ranks (each rolls out whole groups, at least one): raise tasks_per_step to >= "
                              f"{self.dist.world_size} or start fewer ranks")
        self.out = cfg.resolved_output_dir()
        self.out.mkdir(parents=True, exist_ok=True)
        rt = self.runtime = runtime or build_runtime(cfg, policy=policy, env_factory=env_factory, train=train,
                                                     device=self.dist.device if self.dist.enabled else None,
                                                     shortcuts=shortcuts)
        self.arm, self.policy, self.tokenizer, self.scorer, self.teacher = rt.arm, rt.policy, rt.tokenizer, rt.scorer, rt.teacher
        self.backend, self.builder, self.rollout_cfg, self.env_factory = rt.backend, rt.builder, rt.rollout_cfg, rt.env_factory
        self.train_pool, self.eval_tasks = rt.train_pool, rt.eval_tasks
        self.strategy.prepare(self.policy)  # fsdp: each rank keeps 1/N of every weight from here on
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the policy has no trainable parameters; enable LoRA or full fine-tuning")
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        self.checkpoints = Checkpointer(cfg.resolved_checkpoint_uri(), self.out, self.strategy,
                                        keep=cfg.checkpoint.keep, retry_s=cfg.checkpoint.retry_s, say=self.console.print)
        self.guard = UpdateGuard(cfg.optim.guard_updates, cfg.optim.max_skipped_update_frac)
        self.hints = HintChannel(cfg.env.family, self.tokenizer, self.scorer) if self.arm.hint_distill_coef else None
        self.replay = None  # Composer channel 3: the teacher pool replays each step; its pairs join the next step
        if train and self.arm.replay_coef != 0.0:
            self.replay = PairChannel(cfg.replay, family=cfg.env.family, builder=self.builder, tokenizer=self.tokenizer,
                                      constrained=self.rollout_cfg.constrained, out_dir=self.out, console=self.console,
                                      dist=self.dist)
        self.updater = Updater(cfg=cfg, arm=self.arm, policy=self.policy, scorer=self.scorer, optimizer=self.optimizer,
                               params=self.params, strategy=self.strategy, guard=self.guard, hints=self.hints,
                               say=self.console.print)
        self.step, self.run_id = 0, None
        self.history: list[dict[str, float]] = []
        self.phase = ""  # the phase of the step under way (rollout, score, update): what progress lines name

    @property
    def model(self):
        return self.policy.model

    @property
    def pad_id(self) -> int:
        return self.scorer.pad_id

    # ---- one RL step: rollout -> score -> update --------------------------------------------
    def sample_tasks(self, step: int, draw: int = 0) -> tuple[list[str], list[int]]:
        """The step's tasks, each repeated group_size times, and each row's group. draw > 0: the tasks
        rollout.filter_groups draws next, none of an earlier draw's while the pool has enough others (the same on
        every rank: the draws do not depend on outcomes)."""
        rng = random.Random(step_seed(self.cfg.seed, step))
        pool, n = self.train_pool, self.cfg.tasks_per_step
        tasks = rng.sample(pool, n)
        seen = set(tasks)
        for _ in range(draw):
            rest = [t for t in pool if t not in seen]
            tasks = rng.sample(rest if len(rest) >= n else pool, n)
            seen.update(tasks)
        ids = [t for t in tasks for _ in range(self.cfg.group_size)]
        groups = [g for g in range(len(tasks)) for _ in range(self.cfg.group_size)]
        return ids, groups

    def collect(self, step: int) -> list[Trajectory]:
        """This rank's task groups of the step (`collect_groups` without its counts): what the rollout phase trains
        on unless rollout.filter_groups (a subclass or a test may replace it). Unfiltered, the groups as played:
        the rollout phase counts them itself, from the advantages it computes once."""
        if self.cfg.rollout.filter_groups:
            return self.collect_groups(step)[0]
        return self._play(step, 0, self._mine())

    def collect_groups(self, step: int) -> tuple[list[Trajectory], GroupCounts]:
        """This rank's task groups, and how many it rolled out and how many of those had equal rewards. With
        rollout.filter_groups, the groups whose rewards differ from up to filter_max_draws draws (`_filtered`)."""
        mine = self._mine()
        trajs = self._play(step, 0, mine)
        if not self.cfg.rollout.filter_groups:
            batch, advantages = self._grpo(trajs)
            return trajs, _unfiltered_counts(trajs, batch.groups, advantages)
        return self._filtered(step, trajs, mine)

    def _mine(self) -> list[int]:
        """The task groups of a step this rank plays (alone: every one)."""
        return list(distributed.group_range(self.cfg.tasks_per_step, self.dist))

    def _grpo(self, trajs: list[Trajectory]) -> tuple[TurnBatch, torch.Tensor]:
        """The turn-samples of `trajs` and GRPO's advantage of each (their episode's reward, less the invalid-action
        penalty on the turns that pay it)."""
        rc, cfg = self.rollout_cfg, self.cfg
        batch = TurnBatch.of(trajs)
        rewards = [r for _, _, r in turn_rewards(trajs, rc.invalid_penalty, rc.penalize, cfg.env.family, cfg.reward)]
        return batch, grpo_advantages(rewards, batch.groups)

    def _play(self, step: int, draw: int, mine: list[int]) -> list[Trajectory]:
        """Draw `draw`'s groups `mine` (this rank's), in lock-step, or one group at a time under its own seed when
        cfg.rollout.group_seeded. Draw 0 is the step's (its seeds as before draws existed)."""
        ids, groups = self.sample_tasks(step, draw)
        shift = 1_000_003 * draw
        if self.cfg.rollout.group_seeded:
            chunks = [(step_seed(self.cfg.seed * 7_919 + g + 1, step) + shift, [g]) for g in mine]
        else:  # rank 0 (and a single process) keeps the step's seed
            chunks = [(step_seed(self.cfg.seed, step) + self.dist.rank + shift, list(mine))]
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

    def _filtered(self, step: int, trajs: list[Trajectory], mine: list[int]) -> tuple[list[Trajectory], GroupCounts]:
        """Dynamic sampling: the first len(mine) groups whose rewards differ, over draws of this rank's share of
        tasks_per_step tasks until that many are found or rollout.filter_max_draws draws are done; short of them,
        the first equal-reward groups fill the step (every rank trains the same number of groups). The kept groups
        are renumbered as `mine`, in the order they were found."""
        varied: list[list[Trajectory]] = []
        flat: list[list[Trajectory]] = []
        rolled = n_flat = 0
        for draw in range(self.cfg.rollout.filter_max_draws):
            if draw:
                trajs = self._play(step, draw, mine)
            batch, advantages = self._grpo(trajs)
            equal = _flat_groups(trajs, batch.groups, advantages)
            by_group: dict[int, list[Trajectory]] = {}
            for tr in trajs:
                by_group.setdefault(tr.group, []).append(tr)
            for g, members in by_group.items():
                (flat if g in equal else varied).append(members)
            rolled, n_flat = rolled + len(by_group), n_flat + len(equal)
            if len(varied) >= len(mine):
                break
        kept = (varied + flat)[:len(mine)]
        out = []
        for g, members in zip(mine, kept):
            for tr in members:
                tr.group = g
                out.append(tr)
        return out, GroupCounts(rolled, n_flat, len(kept) - min(len(varied), len(kept)))

    def train_step(self, step: int) -> StepResult:
        """One RL step: the rollout phase, the score phase (old, reference and teacher log-probs, no gradient),
        the update phase (the arm's composed loss, mini-batch by mini-batch); every forward in the Scorer's scope."""
        with self.scorer.scope():
            t0 = time.perf_counter()
            self.phase = "rollout"
            with self.strategy.gathered(self.policy):
                rollouts = self.rollout_phase(step)
            self.phase = "score"
            with self.strategy.gathered(self.policy, reference=True):
                batch = self.score_phase(step, rollouts)
            self.phase = "update"
            update = self.update_phase(step, batch)
            self.phase = ""
            return StepResult(step, step_metrics(self.cfg, batch, update, time.perf_counter() - t0, teacher=self.teacher,
                                                 skipped=self.guard.skipped, replay=self.replay, dist=self.dist))

    def rollout_phase(self, step: int) -> Rollouts:
        """This rank's episodes of the step, their turn-samples, and GRPO's advantage of each."""
        t0 = time.perf_counter()
        trajs, counts = self.collect_groups(step) if self.cfg.rollout.filter_groups else (self.collect(step), None)
        if self.replay is not None:  # the teacher pool replays these frozen trajectories in the background
            self.replay.submit(trajs)
        batch, advantages = self._grpo(trajs)
        if counts is None:
            counts = _unfiltered_counts(trajs, batch.groups, advantages)
        return Rollouts(trajs, batch, advantages, time.perf_counter() - t0, counts)

    def score_phase(self, step: int, r: Rollouts) -> StepBatch:
        """Every score the update reads, taken before any weight moves: old_logp (except the rows the update's own
        first forward gives, and those the sampler reported), the reference's (for the KL term), the privileged
        teacher's (for the arms that distil, and for every arm's gap metrics), the error sites' hinted prompts and
        the due DPO pairs with their reference scores."""
        t0, cfg, arm, batch = time.perf_counter(), self.cfg, self.arm, r.batch
        # the tokens that carry a choice: every loss term and per-token statistic is over these
        free = free_token_mask(batch.allowed, batch.response_mask(), forced_free=not self.rollout_cfg.mask_forced_tokens)
        hinted = self.hints.sites(batch) if self.hints is not None else {}
        pairs = self.replay.due(self.policy, self.scorer) if self.replay is not None else None
        # mini-batches are drawn over every rank's rows (alone: this process's), so N ranks make the same updates on
        # the same samples as one process; each rank scores only its own rows. The hint channel's tokens and the
        # DPO pairs are counted over the ranks too: each of those terms is weighted by its own share
        tokens = [int(x) for x in free.sum(dim=1).tolist()]
        split = distributed.split_rows(tokens, self.dist, hint_tokens=[t if i in hinted else 0 for i, t in enumerate(tokens)],
                                       pairs=len(pairs) if pairs is not None else 0)
        gen = torch.Generator().manual_seed(step_seed(cfg.seed, step))
        orders = tuple(tuple(torch.randperm(split.n, generator=gen).tolist() if cfg.ppo.shuffle_mini_batches
                             else range(split.n)) for _ in range(cfg.ppo.epochs))
        old, reuse = self._old_logp(batch, split, list(orders[0]))
        ref = None
        if arm.kl_coef != 0.0:  # LoRA: the same module with the adapter disabled; full fine-tuning: the frozen copy
            with self.policy.reference() as ref_model:
                ref = self.scorer.score(ref_model, batch.prompts, batch.responses, batch.allowed, groups=batch.task_ids)
        # the teacher is theta_old with the skills in context; scored for every arm so the teacher-student gap
        # can be compared across arms, used in the loss only by SDAR/OPSD
        teacher = None
        if arm.needs_teacher or cfg.teacher.for_all_arms:
            teacher = self.teacher.score(self.policy.inference_model(), batch)
        return StepBatch(r, free, old, ref, teacher, split, orders, frozenset(reuse), hinted, pairs,
                         time.perf_counter() - t0)

    def _old_logp(self, batch: TurnBatch, split, first_order: list[int]) -> tuple[ScoredBatch, set[int]]:
        """old_logp [B, T], and the rows left for the update's first forward to fill (the first mini-batch's: the
        weights have not moved yet, so that forward is old_logp). Rows whose sampler reported its log-probs (the
        trainer's own model sampled them: the transformers backend, no weights moved since, top_p 1) need no pass."""
        cfg, n, mask, shortcuts = self.cfg, len(batch), batch.response_mask(), self.runtime.shortcuts
        from sdar.agent.backends import TransformersBackend

        sampled = {}
        if shortcuts.old_logp_from_sampler and isinstance(self.backend, TransformersBackend) \
                and self.backend.model is self.model and self.rollout_cfg.top_p == 1.0:
            sampled = {i: t.logprobs for i, t in enumerate(batch.turns)
                       if t.logprobs is not None and len(t.logprobs) == len(t.response_ids)}
        reused = set(split.local(first_order[: cfg.ppo.mini_batch_size])) if shortcuts.reuse_old_logp else set()
        reused -= set(sampled)
        scored = [i for i in range(n) if i not in reused and i not in sampled]
        old_logp = torch.zeros(n, mask.shape[1], device=self.runtime.device)
        if scored:
            part = self.scorer.score(self.policy.inference_model(), pick(batch.prompts, scored),
                                     pick(batch.responses, scored), pick(batch.allowed, scored))
            old_logp[torch.tensor(scored), : part.logp.shape[1]] = part.logp.to(old_logp.device)
        for i, lp in sampled.items():
            old_logp[i, : len(lp)] = torch.tensor(lp, dtype=old_logp.dtype)
        return ScoredBatch(logp=old_logp, entropy=None, mask=mask.to(old_logp.device)), reused

    def update_phase(self, step: int, b: StepBatch) -> UpdateResult:
        """The optimizer steps of this step: ppo.epochs passes over the step's rows, a mini-batch each."""
        return self.updater.run(step, b)

    # ---- what a checkpoint keeps of the trainer -----------------------------------------------
    def save_checkpoint(self, step: int) -> None:
        """The trainable weights and the optimizer (as the strategy holds them) and the trainer's state, to the spool
        or the store (`Checkpointer.save`). A collective: every rank calls it."""
        pending = self.replay.pending() if self.replay is not None else None  # every rank's pairs not yet in a loss
        self.checkpoints.save(step, self.model, self.optimizer, self.params, {
            "run_id": self.run_id, "skipped_updates": self.guard.skipped, "attempted_updates": self.guard.attempted,
            "history": self.history, "arm": self.arm.name, "config": self.cfg.to_dict(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
            "skills_seen": self.teacher.skills_seen, "replay_pending": pending})

    def resume(self) -> bool:
        """Continue from the newest good checkpoint (`Checkpointer.resume`), whatever the rank count or strategy that
        wrote it; False when there is none."""
        state = self.checkpoints.resume(self.model, self.optimizer, self.params)
        if state is None:
            return False
        if state.get("arm") != self.arm.name:
            raise ValueError(f"checkpoint at {state['where']} is of arm {state.get('arm')!r}, not "
                             f"{self.arm.name!r}; use another output_dir/checkpoint.uri")
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        self.step, self.run_id, self.history = state["step"], state.get("run_id"), state.get("history", [])
        self.guard.skipped, self.guard.attempted = state.get("skipped_updates", 0), state.get("attempted_updates", 0)
        self.teacher.skills_seen = state.get("skills_seen", {})
        if self.replay is not None:
            self.replay.restore(state.get("replay_pending"), self.step)
        self.console.print(f"resumed from {state['where']} at step {self.step}")
        return True

    # ---- evaluation and the run ----------------------------------------------------------------
    def evaluate(self, temperature: float | None = None, tasks: list[str] | None = None, privileged: bool = False):
        """Success on the held-out tasks with the current weights (see `Runtime.evaluate`)."""
        return self.runtime.evaluate(temperature, tasks, privileged)

    def teacher_gap(self, trajs: list[Trajectory]) -> float:
        """Teacher - student token-mean gap on `trajs` (see `Runtime.teacher_gap`)."""
        return self.runtime.teacher_gap(trajs)

    def run(self) -> dict[str, Any]:
        """Train to cfg.steps, resuming from the newest good checkpoint (`sdar.train.loop.run`)."""
        return loop.run(self)


def train(cfg: TrainConfig, policy=None, env_factory=None, console=None) -> dict[str, Any]:
    """Build a Trainer and run it to cfg.steps (resuming from the latest checkpoint)."""
    return Trainer(cfg, policy=policy, env_factory=env_factory, console=console).run()


def _flat_groups(trajs: list[Trajectory], groups: list[int], advantages: torch.Tensor) -> set[int]:
    """The groups of `trajs` whose turn-samples (row i of group groups[i]) all got GRPO advantage 0: their rewards
    were all equal, or they have no turn-samples."""
    moved = dict.fromkeys((tr.group for tr in trajs), False)
    for g, a in zip(groups, advantages.tolist()):
        moved[g] = moved[g] or a != 0.0
    return {g for g, m in moved.items() if not m}


def _unfiltered_counts(trajs: list[Trajectory], groups: list[int], advantages: torch.Tensor) -> GroupCounts:
    """The group counts of a step that trains on every group it rolled out."""
    flat = len(_flat_groups(trajs, groups, advantages))
    return GroupCounts(len({tr.group for tr in trajs}), flat, flat)
