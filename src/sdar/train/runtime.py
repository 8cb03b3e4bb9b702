"""The parts every role of a run needs, built once from a config and going down the layers: the policy
(model, tokenizer), the arm, the rollout settings, the prompt builder, the generation backend, the
privileged teacher, the env factory and the held-out tasks.

The trainer adds an optimizer, checkpoints and tracking on top of a `Runtime`; evaluation (`sdar eval`)
and the pipeline components use one alone. Nothing here builds a warm start: the tiny model's is its
own explicit step (`sdar warmstart`, or `ensure_warm_start` at the top of a command), loaded here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
import torch
from sdar_envs import make_env

from sdar.agent.backends import GenerationBackend, make_backend
from sdar.agent.prompts import PromptBuilder
from sdar.agent.rollout import RolloutConfig, Trajectory, TurnBatch
from sdar.algos import ArmConfig
from sdar.config import TrainConfig
from sdar.models.policy import Policy
from sdar.models.scorer import Scorer
from sdar.models.scoring import free_token_mask
from sdar.teacher import TeacherScorer
from sdar.teacher.vllm_scoring import select_teacher_engine

EVAL_SEED_STEP = 10**6  # evaluation draws its sampling noise from (seed, this step): the same for every caller


def step_seed(seed: int, step: int) -> int:
    """The seed of step `step`: every step draws its randomness from (seed, step) alone, so a resumed run
    replays it exactly."""
    return (seed * 1_000_003 + step * 7919) % (2**31 - 1)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def make_env_factory(cfg: TrainConfig) -> Callable[[], Any]:
    """In-process environments by default; a client of a running server when env.url is set."""
    if cfg.env.url:
        from sdar_envs.client import RemoteEnv

        return lambda: RemoteEnv(cfg.env.url, family=cfg.env.family)

    return lambda: make_env(cfg.env.family, **cfg.env.kwargs)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask.to(x.device)).sum() / mask.sum().clamp(min=1.0))


@dataclass(frozen=True)
class Shortcuts:
    """The shortcuts a run takes that keep its numbers (the same samples, statistics and update up to float rounding;
    tests/train/test_reference_parity.py checks each against its path without it). They are no settings: a run takes
    them all (their old config switches are retired, sdar.config.compat.RETIRED). `Shortcuts.none()` is the reference
    path, every shortcut off: what the checks compare with and the benchmarks measure the shortcuts against.

    jump_forward: constrained decoding appends a token the trie forces without a decode step. share_prefix: the
    prompt start a task's rollouts share is encoded once per turn. reuse_old_logp: old_logp of the first mini-batch's
    rows from the update's own first forward. old_logp_from_sampler: old_logp from the sampling pass (the trainer's own
    model, top_p 1). prefix_cache: the scoring passes and the update encode a group's prompt start once. dedup: a pass
    forwards each distinct row once (the update's too: equal rows' losses share one forward, its gradient the sum). merged_inference: with LoRA on a CPU, the no-grad forwards on plain modules
    with the adapter merged in. length_buckets: rows of similar length forwarded together. head_at_free_tokens: the
    output head only at the response tokens that are not forced. trim_forced_tails: no position forwarded for a
    row's forced response tokens after its last free one (`sdar.models.scorer.needed_lengths`)."""

    jump_forward: bool = True
    share_prefix: bool = True
    reuse_old_logp: bool = True
    old_logp_from_sampler: bool = True
    prefix_cache: bool = True
    dedup: bool = True
    merged_inference: bool = True
    length_buckets: bool = True
    head_at_free_tokens: bool = True
    trim_forced_tails: bool = True

    @classmethod
    def none(cls) -> Shortcuts:
        return cls(**{f: False for f in cls.__dataclass_fields__})


@dataclass
class Runtime:
    """What acting, scoring and evaluating with `cfg`'s policy takes (see the module docstring)."""

    cfg: TrainConfig
    arm: ArmConfig
    device: torch.device
    policy: Policy
    rollout_cfg: RolloutConfig  # cfg.rollout with the env's family and the arm's student prompt
    builder: PromptBuilder
    backend: GenerationBackend
    scorer: Scorer  # every forward's scoring: the rollout temperature, the `scoring:` section and the shortcuts
    teacher: TeacherScorer
    env_factory: Callable[[], Any]
    train_pool: list[str]  # the train split's task ids ([] for evaluation)
    eval_tasks: list[str]  # the held-out tasks, stratified over task types unless cfg says otherwise
    shortcuts: Shortcuts = Shortcuts()  # what the run takes (all, but in checks and benchmarks)

    @property
    def model(self):
        return self.policy.model

    @property
    def tokenizer(self):
        return self.policy.tokenizer

    @property
    def pad_id(self) -> int:
        return self.scorer.pad_id

    def evaluate(self, temperature: float | None = None, tasks: list[str] | None = None, privileged: bool = False):
        """Success on the held-out tasks; privileged=True acts with the skills in the prompt (the teacher's
        view), which is how the teacher's own success rate is measured."""
        from sdar.eval import evaluate

        seed_everything(step_seed(self.cfg.seed, EVAL_SEED_STEP))
        rc = replace(self.rollout_cfg, skills_in_prompt=privileged or self.rollout_cfg.skills_in_prompt)
        if privileged:
            rc = replace(rc, max_prompt_tokens=self.cfg.teacher.max_prompt_tokens)
        return evaluate(self.backend, self.tokenizer, self.env_factory, tasks or self.eval_tasks, rc,
                        temperature=self.cfg.eval.temperature if temperature is None else temperature)

    def teacher_gap(self, trajs: list[Trajectory]) -> float:
        """Token-mean log-prob gap (teacher with skills minus student) on given trajectories, at the rollout
        temperature, over the tokens that carried a choice (all response tokens with mask_forced_tokens off)."""
        batch = TurnBatch.of(trajs)
        model = self.policy.inference_model()
        old = self.scorer.score(model, batch.prompts, batch.responses, batch.allowed)
        teacher = self.teacher.score(model, batch)
        free = free_token_mask(batch.allowed, old.mask, forced_free=not self.rollout_cfg.mask_forced_tokens)
        return masked_mean(teacher.logp - old.logp, free)

    def load_weights(self, uri: str) -> int:
        """Load the trainable weights of the newest complete checkpoint under `uri` (a run's output or
        checkpoint directory, or s3://...) into the policy: weights only (`sdar.train.checkpoint.load_weights`).
        Returns the checkpoint's step."""
        from sdar.train.checkpoint import load_weights

        return load_weights(self.model, uri)


def build_runtime(cfg: TrainConfig, *, policy=None, env_factory: Callable[[], Any] | None = None,
                  train: bool = True, device: torch.device | None = None, shortcuts: Shortcuts = Shortcuts()) -> Runtime:
    """The runtime of `cfg`. policy: an `sdar.models.Policy` (default: loaded from cfg.model; the tiny model's
    warm start must exist, see `sdar.train.warmstart.ensure_warm_start`). train=False: evaluation only, the
    train split is never read (a data tree may hold just the eval split). device: where the policy goes
    (default cfg.device). shortcuts: all of them but in checks and benchmarks (`Shortcuts`)."""
    from sdar.eval.tasks import eval_task_set

    arm = cfg.resolved_arm()
    seed_everything(cfg.seed)  # LoRA's initialisation draws from the global RNG
    if policy is None:
        from sdar.train.warm_cache import load_warm_policy

        policy = load_warm_policy(cfg)
    device = device or cfg.resolved_device()
    if policy.device != device:
        policy.to(device)
    # sampling, teacher and reference on plain modules with LoRA on a CPU, where peft's per-layer wrappers cost 15-20%
    # of a small model's forward; on a GPU the copy of the adapted layers (~13 GB at 7B) costs more than it saves
    policy.plain_inference = shortcuts.merged_inference and torch.device(device).type == "cpu"
    rollout_cfg = replace(cfg.rollout, family=cfg.env.family, skills_in_prompt=arm.skills_in_student_prompt)
    builder = PromptBuilder(cfg.env.family, history=rollout_cfg.history, show_admissible=rollout_cfg.show_admissible)
    # vLLM serves the current LoRA adapter, re-exported when the weights change (checked per call)
    backend = make_backend(cfg.model.generation_backend, policy, vllm=cfg.vllm, jump_forward=shortcuts.jump_forward,
                           share_prefix=shortcuts.share_prefix, sampler=cfg.resolved_sampler(device),
                           pack_tokens=cfg.scoring.pack_tokens)
    tok = policy.tokenizer
    scorer = Scorer.of(cfg, pad_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
                       device=device, prefix_cache=shortcuts.prefix_cache, dedup=shortcuts.dedup,
                       length_buckets=shortcuts.length_buckets, head_at_free_tokens=shortcuts.head_at_free_tokens,
                       trim_forced_tails=shortcuts.trim_forced_tails)
    teacher = TeacherScorer(builder, tok, scorer=scorer, max_prompt_tokens=cfg.teacher.max_prompt_tokens,
                            engine=select_teacher_engine(cfg.teacher.engine, backend), engine_topk=cfg.vllm.teacher_topk,
                            placement=rollout_cfg.privileged_placement, student_has_skills=rollout_cfg.skills_in_prompt)
    env_factory = env_factory or make_env_factory(cfg)
    probe = env_factory()
    try:
        train_pool = probe.task_ids(cfg.env.train_split) if train else []
        eval_tasks = eval_task_set(probe, cfg)  # stratified over task types unless cfg.eval.task_order is "first"
    finally:
        probe.close()
    if train and len(train_pool) < cfg.tasks_per_step:
        raise ValueError(f"the {cfg.env.train_split!r} split has {len(train_pool)} tasks, fewer than "
                         f"tasks_per_step={cfg.tasks_per_step}")
    return Runtime(cfg=cfg, arm=arm, device=device, policy=policy, rollout_cfg=rollout_cfg, builder=builder,
                   backend=backend, scorer=scorer, teacher=teacher, env_factory=env_factory, train_pool=list(train_pool),
                   eval_tasks=list(eval_tasks), shortcuts=shortcuts)
