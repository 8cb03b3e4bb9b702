"""Experiment configuration: one tree of dataclasses with a help text per field, loaded from YAML.

`load_config("configs/household-tiny.yaml", overrides={"steps": 3})` returns a TrainConfig; unknown keys
are errors that list the valid ones, and every setting is checked there, once. `sdar config show` prints
the result, `sdar config fields` the help. Light imports only: reading a config never pulls torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sdar.algos.arm_config import ARMS, OVERRIDABLE, ArmConfig, get_arm
from sdar.config.replay import ReplayConfig

if TYPE_CHECKING:  # annotations only: loading a config never imports torch
    import torch


# choices checked at load (TrainConfig.validate); the code that uses them imports them from here, so
# that reading and checking a config needs neither torch nor transformers
PLACEMENTS = ("prefix", "user")  # rollout.privileged_placement (sdar.agent.prompts)
PENALIZE = ("format", "invalid")  # rollout.penalize (sdar.agent.rollout.penalized)
REWARDS = ("reference", "env")  # reward (sdar.agent.rollout.episode_reward)
PRETOKENIZERS = ("qwen2", "punct_space")  # warmstart.pretokenizer (sdar.models.tokenizer.PRETOKENIZERS)

# Fields added after checkpoints and results were made with the behaviour of their default: at that default
# they are left out of every identity (the warm-start cache key, a study run's fingerprint), so what was built
# and recorded before they existed keeps its identity. "section.field" -> the default that changes nothing.
ADDED_DEFAULTS: dict[str, Any] = {"warmstart.pretokenizer": "qwen2", "distributed.strategy": "ddp"}


class ConfigError(ValueError):
    """A setting that cannot be used; the message names its key and what it may be. `sdar` prints it, no
    traceback, and exits with status 2."""


@dataclass(frozen=True)
class Bound:
    """The values a numeric setting may take: lo (inclusive unless lo_open) up to hi (same); None = no bound."""

    lo: float | None = None
    lo_open: bool = False
    hi: float | None = None
    hi_open: bool = False

    def holds(self, value: float) -> bool:
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)

    def __str__(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {self.lo:g}"
        if self.lo is None:
            return f"{'<' if self.hi_open else '<='} {self.hi:g}"
        return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"


POSITIVE, NON_NEGATIVE, AT_LEAST_1 = Bound(0, True), Bound(0), Bound(1)
FRACTION = Bound(0, False, 1, False)
# Every numeric setting must be a finite number (NaN and infinities are refused, naming the key); these must
# also lie in their range. Checked at load by TrainConfig.validate, before torch or a server sees them.
NUMBER_BOUNDS: dict[str, Bound] = {
    "steps": NON_NEGATIVE, "tasks_per_step": AT_LEAST_1, "group_size": AT_LEAST_1, "optim.lr": NON_NEGATIVE,
    "optim.weight_decay": NON_NEGATIVE, "ppo.mini_batch_size": AT_LEAST_1, "ppo.micro_batch_size": AT_LEAST_1, "ppo.epochs": AT_LEAST_1,
    "optim.max_skipped_update_frac": FRACTION, "optim.grad_clip": POSITIVE, "scoring.batch_size": AT_LEAST_1,
    "teacher.max_prompt_tokens": AT_LEAST_1, "eval.every": NON_NEGATIVE, "eval.tasks": NON_NEGATIVE,
    "eval.temperature": NON_NEGATIVE, "checkpoint.every": AT_LEAST_1, "checkpoint.keep": AT_LEAST_1,
    "checkpoint.retry_s": NON_NEGATIVE,
    "model.lora_r": AT_LEAST_1, "model.lora_alpha": POSITIVE, "model.lora_dropout": Bound(0, False, 1, True),
    "rollout.max_turns": AT_LEAST_1, "rollout.history": NON_NEGATIVE, "rollout.max_prompt_tokens": AT_LEAST_1,
    "rollout.max_response_tokens": AT_LEAST_1, "rollout.temperature": POSITIVE, "rollout.top_p": Bound(0, True, 1, False),
    "rollout.env_workers": AT_LEAST_1,
    "warmstart.episodes": NON_NEGATIVE, "warmstart.tokenizer_episodes": NON_NEGATIVE, "warmstart.vocab_size": AT_LEAST_1,
    "warmstart.privileged_fraction": FRACTION, "warmstart.epochs": NON_NEGATIVE, "warmstart.lr": NON_NEGATIVE,
    "warmstart.batch_size": AT_LEAST_1, "warmstart.prompt_lm_weight": NON_NEGATIVE, "warmstart.noise": FRACTION,
    "warmstart.decision_repeats": AT_LEAST_1,
    "launch.nodes": AT_LEAST_1, "launch.gpus_per_node": NON_NEGATIVE, "launch.procs_per_node": NON_NEGATIVE,
    "launch.cpu": AT_LEAST_1, "launch.memory_mb": AT_LEAST_1,
    "vllm.gpu_memory_utilization": Bound(0, True, 1, False), "vllm.max_lora_rank": NON_NEGATIVE,
    "vllm.max_model_len": NON_NEGATIVE, "vllm.teacher_topk": AT_LEAST_1,
    "arm_overrides.gate_beta": POSITIVE, "arm_overrides.clip_low": Bound(0, False, 1, True),
    "arm_overrides.clip_high": NON_NEGATIVE, "arm_overrides.dual_clip": Bound(1, True),
    "arm_overrides.jsd_beta": FRACTION, "arm_overrides.jsd_temperature": POSITIVE,
    "arm_overrides.jsd_top_k": AT_LEAST_1, "arm_overrides.dpo_beta": POSITIVE,
    "arm_overrides.sapo_temperature_pos": POSITIVE, "arm_overrides.sapo_temperature_neg": POSITIVE,
}  # fmt: skip


def _numbers(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every number in a config tree: dataclass fields, mappings (arm_overrides) and
    lists (replay.teachers, as key[i])."""
    if is_dataclass(obj):
        items = ((f.name, getattr(obj, f.name)) for f in fields(obj))
    elif isinstance(obj, Mapping):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = ((f"[{i}]", v) for i, v in enumerate(obj))
    else:
        return
    for name, value in items:
        key = f"{prefix}{name}" if str(name).startswith("[") or not prefix else f"{prefix}.{name}"
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            yield key, value
        else:
            yield from _numbers(value, key)


def check_numbers(cfg: Any) -> None:
    """Every number in `cfg` is finite and inside its NUMBER_BOUNDS; the error names the key and its range."""
    for key, value in _numbers(cfg):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{key}={value} is not a finite number; give a number"
                             + (f" {NUMBER_BOUNDS[key]}" if key in NUMBER_BOUNDS else "")
                             + f" (`sdar config fields {key.split('[')[0]}` shows its default and meaning)")
        bound = NUMBER_BOUNDS.get(key)
        if bound is not None and not bound.holds(value):
            raise ValueError(f"{key}={value} is out of range: it must be {bound} "
                             f"(`sdar config fields {key}` shows its default and meaning)")


def flat_layout(d: dict[str, Any]) -> dict[str, Any]:
    """`d` (asdict of a TrainConfig) in the flat layout configs had before the sections (MOVED_KEYS backwards):
    what every identity is computed from (the warm-start cache key, a study run's fingerprint), so a run
    recorded before the sections has the same identity after them."""
    d = {k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items()}
    for old, new in MOVED_KEYS.items():
        head, _, name = new.partition(".")
        if isinstance(d.get(head), dict) and name in d[head]:
            d[old] = d[head].pop(name)
    for head in {new.partition(".")[0] for new in MOVED_KEYS.values()}:
        if d.get(head) == {}:
            del d[head]
    return d


def drop_added_defaults(d: dict[str, Any], section: str = "") -> dict[str, Any]:
    """`d` (asdict of a TrainConfig, or of its `section`) without the ADDED_DEFAULTS fields at their default."""
    for key, default in ADDED_DEFAULTS.items():
        head, _, name = key.rpartition(".")
        if section:  # d is that section alone
            sub = d if head == section else None
        else:  # d is the whole config
            sub = d.get(head) if head else d
        if isinstance(sub, dict) and name in sub and sub[name] == default:
            del sub[name]
            if not section and head and not sub:  # a section added whole (distributed), at its defaults
                del d[head]
    return d


@dataclass
class RolloutConfig:
    """How episodes are played. Defaults follow the paper where it has one."""

    family: str = field(default="household", metadata={
        "help": "The environment family; the trainer sets it from env.family."})
    max_turns: int = field(default=50, metadata={
        "help": "Turns an episode may last (paper: 50 household, 15 shop, 4 search; FAMILY_DEFAULTS)."})
    history: int = field(default=2, metadata={
        "help": "Past (observation, action) pairs in the prompt (paper: 2; 4 for search)."})
    max_prompt_tokens: int = field(default=1024, metadata={
        "help": "The student's prompt budget; history pairs are dropped first to fit it."})
    max_response_tokens: int = field(default=64, metadata={"help": "Tokens a response may have at most."})
    temperature: float = field(default=1.0, metadata={
        "help": "Sampling temperature of the rollouts, at which they are also scored; must be > 0 "
                "(paper: 1.0; evaluation decodes at eval.temperature)."})
    top_p: float = field(default=1.0, metadata={
        "help": "Nucleus sampling of the rollouts (1 = off; ppo.old_logp_from_sampler needs 1)."})
    invalid_penalty: float = field(default=0.1, metadata={
        "help": "Subtracted from the turn's reward on an invalid action (paper: 0.1; 0.01 for search)."})
    penalize: str = field(default="format", metadata={
        "help": "Which turns pay invalid_penalty: format = the response has no well-formed action block (or no "
                "<think> when require_think), as the reference's projection functions decide; invalid = also an "
                "action that is inadmissible, rejected by the environment, or a response cut off unfinished."})
    privileged_placement: str = field(default="prefix", metadata={
        "help": "Where the privileged text goes in the teacher's prompt (and in a prompt that acts with the "
                "skills): prefix = before the chat-templated prompt (the reference), user = in the user message."})
    mask_forced_tokens: bool = field(default=True, metadata={
        "help": "Leave tokens that constrained decoding forced (one allowed token: no choice was made) out of every "
                "loss term and every per-token statistic; false scores them like free tokens (log-prob 0 for all)."})
    require_think: bool = field(default=False, metadata={
        "help": "A response without a <think> block is invalid (the reference's household and shop projections)."})
    show_admissible: bool = field(default=True, metadata={
        "help": "List the admissible actions in the prompt (families that have them)."})
    use_memory: bool = field(default=True, metadata={"help": "The household's compact memory of what was seen."})
    skills_in_prompt: bool = field(default=False, metadata={
        "help": "The student itself sees the skills; the trainer sets it from the arm (skill_grpo)."})
    env_workers: int = field(default=8, metadata={"help": "Threads stepping remote sessions concurrently."})
    constrained: bool = field(default=False, metadata={
        "help": "Decode only admissible actions (families that list them)."})
    jump_forward: bool = field(default=True, metadata={
        "help": "Constrained decoding (transformers backend): a token the trie forces is appended without a decode "
                "step and a run of them goes through the model in one forward; false = one token per forward "
                "(the same samples and log-probs, for benchmarks and checks)."})
    share_prefix: bool = field(default=True, metadata={
        "help": "Constrained decoding (transformers backend): the prompt start that rows of a chunk share (a task's "
                "rollouts at one turn: system prompt, task and step lines) is encoded once per group and every row "
                "continues from its KV cache, and the prefill computes the last position's logits only; false = "
                "every prompt whole, as before (the same samples and log-probs up to float rounding)."})
    group_seeded: bool = field(default=False, metadata={
        "help": "Roll out each task group under its own seed (seed, step, group): the trajectories then do not depend "
                "on how groups are split over torchrun ranks, at the cost of lock-step batching across groups."})


@dataclass
class EnvConfig:
    """Where episodes come from."""

    family: str = field(default="household", metadata={"help": "The environment family: household | shop | searchqa."})
    url: str | None = field(default=None, metadata={
        "help": "A running env server (http://host:port); null = in-process environments."})
    kwargs: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "Passed to make_env (e.g. backend, difficulty)."})
    train_split: str = field(default="train", metadata={"help": "The split training tasks are drawn from."})
    eval_split: str = field(default="test", metadata={"help": "The split the held-out evaluation tasks come from."})


@dataclass
class ModelConfig:
    """The policy."""

    name_or_path: str = field(default="tiny", metadata={
        "help": "tiny (built and warm-started locally), smollm2, a local checkpoint directory, or a hub id where "
                "a network exists."})
    dtype: str = field(default="float32", metadata={"help": "Weights and forward dtype: float32 | bfloat16."})
    lora: bool = field(default=True, metadata={
        "help": "Train a LoRA adapter (peft); the reference is the base with it disabled. false = full fine-tuning."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha (the adapter is scaled by alpha / r)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA adapter's input."})
    gradient_checkpointing: bool = field(default=False, metadata={
        "help": "Recompute activations in the backward pass: less memory, slower updates."})
    generation_backend: str = field(default="transformers", metadata={
        "help": "What samples the rollouts: transformers | vllm (CUDA; options under `vllm:`)."})
    tiny_overrides: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "TinyModelConfig fields of the tiny model (tests shrink it)."})


@dataclass
class VLLMConfig:
    """The vLLM rollout engine, used when model.generation_backend is vllm (CUDA only:
    `pip install -e '.[gpu]'`). It loads the base weights once and the policy's LoRA adapter,
    re-exported whenever the weights changed, under a fresh id."""

    gpu_memory_utilization: float = field(default=0.35, metadata={
        "help": "GPU share vLLM takes (weights + KV cache); 0.35 leaves room for the trainer."})
    enable_lora: bool = field(default=True, metadata={
        "help": "Serve the trained adapter (must stay true while training a LoRA policy)."})
    max_lora_rank: int = field(default=0, metadata={
        "help": "Largest adapter rank vLLM reserves for; 0 = model.lora_r."})
    dtype: str = field(default="bfloat16", metadata={
        "help": "vLLM's weights and activations: bfloat16 | float16 | float32 | auto."})
    max_model_len: int = field(default=0, metadata={"help": "Longest prompt + response; 0 = the model's own limit."})
    enforce_eager: bool = field(default=False, metadata={"help": "No CUDA graphs: faster start, slower decoding."})
    logprobs_mode: str = field(default="processed_logprobs", metadata={
        "help": "Log-probs vLLM reports for sampled tokens: processed_logprobs = after the trie mask and temperature "
                "(what was sampled); \"\" = vLLM's default (raw). Diagnostic: the trainer recomputes old_logp itself."})
    teacher_topk: int = field(default=20, metadata={
        "help": "teacher.engine vllm: prompt log-probs per position for constrained turns; a turn is scored in vLLM "
                "only when all its allowed tokens are among them, else by the training-side forward."})
    engine_kwargs: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "Passed to vllm.LLM as is (e.g. seed, max_num_seqs)."})


@dataclass
class WarmStartConfig:
    """Supervised warm-start of the tiny model on expert trajectories (skipped for real models)."""

    episodes: int = field(default=400, metadata={"help": "Expert episodes to imitate."})
    tokenizer_episodes: int = field(default=400, metadata={
        "help": "Expert episodes whose text trains the tokenizer (cheap)."})
    vocab_size: int = field(default=4096, metadata={"help": "The tiny model's tokenizer vocabulary."})
    privileged_fraction: float = field(default=0.5, metadata={"help": "Share of examples whose prompt carries the skills."})
    epochs: int = field(default=2, metadata={"help": "Passes over the imitation examples."})
    lr: float = field(default=2e-3, metadata={"help": "AdamW learning rate of the warm start."})
    batch_size: int = field(default=16, metadata={"help": "Examples per warm-start update."})
    prompt_lm_weight: float = field(default=0.0, metadata={
        "help": "Weight of a language-modelling loss on the prompt tokens (0 = imitation only): the same forward "
                "gives a model trained from scratch far more signal per update."})
    noise: float = field(default=0.0, metadata={
        "help": "DART-style noise: with this probability an expert episode executes a random admissible action "
                "instead of the expert's (not imitated); the expert's recovery from the states that leads to is. "
                "A student trained only on expert states never sees its own mistakes and compounds them."})
    decision_repeats: int = field(default=1, metadata={
        "help": "Repeat the examples that decide episodes this many times in the SFT data (`warmstart.is_decision`). "
                "Household: \"go to\" turns that do not follow the memory's search frontier (appliance, target, a seen "
                "object) and \"take\" turns, ~15% of the examples, which a tiny model got right a quarter to half of the "
                "time. Shop: option-value clicks (~30%; a tiny model copied the right value 36% of the time)."})
    pretokenizer: str = field(default="qwen2", metadata={
        "help": "How the tiny tokenizer splits text before its merges: qwen2 (Qwen2's pattern: a word carries the "
                "character before it, \" nude\" in \"color: nude,\" but \"[nude\" in \"click[nude]\": two ids a model "
                "trained from scratch must pair value by value) or punct_space (punctuation carries the space after it and a "
                "word nothing but a space before it: \"nude\" in both, so copying a value from the instruction into an "
                "action is one id to match; about as many tokens). Measured on shop-tiny: option clicks no better "
                "(configs/shop-tiny.yaml), so every config keeps qwen2."})


@dataclass
class LaunchConfig:
    """Where `gated_train` runs the training: in its own process (the default), or as a job of `nodes` x
    `gpus_per_node` torchrun workers (see sdar.train.distributed): a Kubeflow Trainer TrainJob
    (sdar.launch_trainjob) or a TorchX job (sdar.launch). Secrets (MLflow, S3) reach the job's pods from
    Kubernetes Secrets, never from this config."""

    launcher: str = field(default="auto", metadata={
        "help": "auto | inprocess | trainjob | torchx; auto = a job when nodes * gpus_per_node > 1 (trainjob with "
                "scheduler kubernetes, torchx with local_cwd), else inprocess."})
    scheduler: str = field(default="kubernetes", metadata={
        "help": "kubernetes | local_cwd (TorchX on this machine); a TrainJob always runs on Kubernetes, a TorchX "
                "job there is a Volcano Job, gang-scheduled."})
    nodes: int = field(default=1, metadata={"help": "Nodes of the job."})
    gpus_per_node: int = field(default=0, metadata={
        "help": "GPUs of each node, one torchrun worker per GPU; 0 = CPU workers."})
    procs_per_node: int = field(default=0, metadata={
        "help": "torchrun workers per node; 0 = gpus_per_node (1 without GPUs)."})
    cpu: int = field(default=8, metadata={"help": "CPUs per node."})
    memory_mb: int = field(default=32768, metadata={"help": "Memory per node, MB."})
    image: str = field(default="", metadata={
        "help": "The workers' image; \"\" = $SDAR_IMAGE or the trainer image the pipeline uses."})
    queue: str = field(default="default", metadata={"help": "Volcano queue (TorchX)."})
    runtime: str = field(default="torch-distributed", metadata={
        "help": "The ClusterTrainingRuntime a TrainJob references (Kubeflow Trainer's torch-distributed)."})
    kueue_queue: str = field(default="", metadata={
        "help": "Kueue LocalQueue of a TrainJob (its kueue.x-k8s.io/queue-name label); \"\" = no label, no Kueue."})
    namespace: str = field(default="", metadata={
        "help": "\"\" = the namespace of the pod that launches (its service account's), else default."})
    service_account: str = field(default="pipeline-runner", metadata={
        "help": "The job's pods' service account: the pipeline's pipeline-runner (whose IRSA role reaches the bucket "
                "on EKS, and which the env chart's admission policy requires of pods wearing the pipeline label); "
                "\"\" = the namespace's default."})
    node_selector: dict[str, str] = field(default_factory=lambda: {"eks.amazonaws.com/nodegroup": "gpu"}, metadata={
        "help": "Node selector of GPU workers."})
    tolerations: list[dict[str, str]] = field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        metadata={"help": "Tolerations of GPU workers."})
    secrets: list[str] = field(default_factory=lambda: ["sdar-mlflow", "sdar-s3"], metadata={
        "help": "Secrets whose keys become the pods' environment (the same ones ClusterSettings gives the pipeline)."})
    pod_labels: dict[str, str] = field(default_factory=lambda: {"app.kubernetes.io/part-of": "sdar-pipeline"}, metadata={
        "help": "Labels of the job's pods: ClusterSettings.pod_labels, which k8s/ NetworkPolicies admit to the env "
                "services, MLflow and MinIO (the workers play episodes and log like the pipeline's pods)."})

    def resolved_launcher(self) -> str:
        """inprocess, trainjob (sdar.launch_trainjob) or torchx (sdar.launch): what `launcher` means here."""
        if self.launcher not in self.LAUNCHERS:
            raise ValueError(f"unknown launcher {self.launcher!r}; choose one of {', '.join(self.LAUNCHERS)}")
        if self.launcher == "trainjob" and self.scheduler != "kubernetes":
            raise ValueError(f"a TrainJob runs on Kubernetes; scheduler {self.scheduler!r} is TorchX's: "
                             "set launch.launcher=torchx or launch.scheduler=kubernetes")
        if self.launcher != "auto":
            return self.launcher
        if self.nodes * self.gpus_per_node <= 1:
            return "inprocess"
        return "trainjob" if self.scheduler == "kubernetes" else "torchx"

    def wants_torchx(self) -> bool:
        """Whether training runs as a TorchX job (sdar.launch)."""
        return self.resolved_launcher() == "torchx"

    def wants_trainjob(self) -> bool:
        """Whether training runs as a Kubeflow Trainer TrainJob (sdar.launch_trainjob)."""
        return self.resolved_launcher() == "trainjob"

    LAUNCHERS = ("auto", "inprocess", "trainjob", "torchx")  # not a field: no annotation
    # the fields newer than the results recorded before them, at the default that changes nothing: left out
    # of every identity (ADDED_DEFAULTS)
    ADDED_DEFAULTS.update({"launch.runtime": "torch-distributed", "launch.kueue_queue": ""})


STRATEGIES = ("ddp", "fsdp")


@dataclass
class DistributedConfig:
    """How torchrun's ranks share the model (one process alone: `ddp` is the plain single-process path)."""

    strategy: str = field(default="ddp", metadata={
        "help": "ddp: every rank holds the whole model and the ranks' gradients are summed in one all-reduce per "
                "update (sdar.train.distributed); fsdp: FSDP2 (torch.distributed.fsdp.fully_shard) shards the "
                "weights, gradients and optimizer state over the ranks, each decoder layer a unit, for LoRA and full "
                "fine-tuning alike; checkpoints are sharded (torch.distributed.checkpoint). Under fsdp every rank "
                "gathers the full weights for its rollouts and scoring passes (as verl's hybrid engine does) and "
                "only the update's state stays sharded (sdar.train.fsdp)."})


@dataclass
class OptimConfig:
    """The optimizer (AdamW, constant learning rate) and the guards on its steps."""

    lr: float = field(default=1e-6, metadata={"help": "AdamW learning rate, constant (paper: 1e-6)."})
    weight_decay: float = field(default=0.01, metadata={
        "help": "AdamW weight decay (the reference's verl actor optimizer default)."})
    grad_clip: float = field(default=1.0, metadata={"help": "Gradient-norm clip of each optimizer step (paper: 1.0)."})
    guard_updates: bool = field(default=True, metadata={
        "help": "After every optimizer step, check the trainable weights are finite and the policy still scores one "
                "of the step's samples to finite log-probs; otherwise restore the weights and optimizer state of "
                "before the step and count the update as skipped. Costs a copy of the trainable weights and their "
                "optimizer state (small with LoRA); turn off for full fine-tuning of a model whose copy does not fit."})
    max_skipped_update_frac: float = field(default=0.5, metadata={
        "help": "A run in which more than this share of its updates was skipped (non-finite loss, gradient or "
                "weights) fails with a message at its end instead of reporting success; 1.0 never fails."})


@dataclass
class PPOConfig:
    """How a step's turn-samples become optimizer steps: mini- and micro-batches, epochs, old_logp."""

    mini_batch_size: int = field(default=256, metadata={
        "help": "Turn-samples per optimizer step (reference: ppo_mini_batch_size 256; 64 for shop, a family default)."})
    micro_batch_size: int = field(default=32, metadata={
        "help": "Turn-samples per forward/backward inside a mini-batch (reference: ppo_micro_batch_size_per_gpu 32)."})
    epochs: int = field(default=1, metadata={"help": "Passes over a step's samples (paper: 1)."})
    loss_normalisation: str = field(default="micro_batch", metadata={
        "help": "micro_batch: each micro-batch's loss is aggregated (agg, e.g. token-mean) over its own tokens and "
                "the mini-batch's gradient is the mean over its micro-batches (the reference: verl dp_actor divides "
                "each micro-batch's loss by gradient_accumulation); mini_batch: aggregated over the whole "
                "mini-batch's tokens."})
    shuffle_mini_batches: bool = field(default=False, metadata={
        "help": "Draw mini-batches in a random order; false takes them in rollout order (the reference: batch.split)."})
    reuse_old_logp: bool = field(default=True, metadata={
        "help": "Take old_logp of the first mini-batch's rows from the update's own first forward (the weights have "
                "not moved yet, so it is the same number) instead of a separate scoring pass; false scores every row "
                "first. With the reference's mini-batch (256) and a step of <= 256 turn-samples, no old_logp pass "
                "is left."})
    old_logp_from_sampler: bool = field(default=True, metadata={
        "help": "Take old_logp from the sampling pass itself when the sampler is the trainer's own model (the "
                "transformers backend's constrained sampler reports the log-prob of the distribution it drew from, "
                "which is the trainer's score: same weights, allowed set and temperature; top_p must be 1); vLLM "
                "and rows without sampler log-probs are scored as before. false = always score."})


@dataclass
class ScoringConfig:
    """How the forwards of a step run (the no-grad scoring passes and the update's): switches that
    change speed and memory, never the numbers beyond float rounding (tests/train/test_reference_parity.py).
    build_runtime reads them once into the runtime's `Scorer`."""

    batch_size: int = field(default=16, metadata={"help": "Sequences per no-grad scoring forward."})
    prefix_cache: bool = field(default=True, metadata={
        "help": "The teacher and reference passes encode the prompt start a task's turn-samples share (system "
                "prompt, task, skills in either placement) once per step and continue each turn-sample from its KV "
                "cache (the same log-probs as the plain forward); false = a plain forward per turn-sample."})
    dedup: bool = field(default=True, metadata={
        "help": "The no-grad scoring passes (old_logp, reference, teacher) forward each distinct turn-sample once: "
                "rows with the same prompt, response and allowed tokens (a task's rollouts often play the same first "
                "turns) take that forward's log-probs (the same numbers up to float rounding); false = every row."})
    merged_inference: bool = field(default=True, metadata={
        "help": "With LoRA, the no-grad forwards run on plain modules without peft's per-layer wrappers: sampling, "
                "the old_logp pass and the teacher on a copy of the adapted layers with the adapter merged in (base "
                "+ BA, refreshed after every weight change; the same log-probs up to float rounding, ~1e-6), the "
                "reference on the base weights themselves (shared, bit-identical). CPU only: there peft's wrappers "
                "cost 15-20% of a small model's forward; on a GPU the copy of the adapted layers (~13 GB for a 7B "
                "model) costs more memory than the launches it saves, and `sdar size` does not plan for it. "
                "false = the peft module (adapter disabled for the reference)."})
    length_buckets: bool = field(default=True, metadata={
        "help": "Forward rows of similar length together (scoring chunks and, inside each update micro-batch, groups "
                "of similar length: the micro-batch and its loss are unchanged, only padding goes); false = one "
                "padded forward per micro-batch and unsorted scoring chunks."})
    head_at_free_tokens: bool = field(default=True, metadata={
        "help": "Every forward of a step (scoring passes and the update) runs the output head and the softmax only "
                "at the response tokens that are not forced: a constrained step allowing just the sampled token has "
                "log-prob 0, entropy 0 and no gradient, and no prompt position is scored (the same numbers up to "
                "float rounding); false = the head over each forward's response span, forced tokens included."})


@dataclass
class TeacherConfig:
    """The privileged-context teacher: the policy with the skills in its prompt, no gradient."""

    max_prompt_tokens: int = field(default=2048, metadata={
        "help": "The teacher's prompt budget (skills + turn)."})
    for_all_arms: bool = field(default=True, metadata={
        "help": "Score the teacher for arms that do not need it (the gap metrics)."})
    engine: str = field(default="train", metadata={
        "help": "train: the trainer's own forward scores the teacher; vllm: the vLLM rollout engine's prompt "
                "log-probs (needs model.generation_backend vllm; constrained turns outside vllm.teacher_topk fall "
                "back to the forward)."})


@dataclass
class EvalConfig:
    """The held-out evaluation: during training and by `sdar eval`."""

    every: int = field(default=10, metadata={"help": "Steps between evaluations; 0 disables periodic evaluation."})
    tasks: int = field(default=50, metadata={"help": "Held-out tasks per evaluation."})
    task_order: str = field(default="stratified", metadata={
        "help": "How the eval.tasks ids are taken from env.eval_split: stratified = round-robin over task types "
                "(sdar.eval.tasks.select_tasks); first = the first N as the split lists them."})
    task_ids: list[str] = field(default_factory=list, metadata={
        "help": "Explicit eval tasks (then eval.tasks and eval.task_order are unused)."})
    temperature: float = field(default=0.4, metadata={
        "help": "Decoding temperature of evaluation (paper: 0.4; 0 = greedy)."})


@dataclass
class CheckpointConfig:
    """Where and how often the run saves what resume needs."""

    every: int = field(default=10, metadata={"help": "Steps between checkpoints (and after the last step)."})
    keep: int = field(default=2, metadata={"help": "Newest checkpoints kept; older ones are deleted."})
    uri: str | None = field(default=None, metadata={
        "help": "Local dir or s3://bucket/prefix; null = <output_dir>/checkpoints."})
    retry_s: float = field(default=600.0, metadata={
        "help": "How long checkpoint uploads to a remote store (s3://) are retried, with backoff, before the run "
                "stops (the checkpoints wait in <output_dir>/checkpoint-spool meanwhile, and a rerun resumes from "
                "there)."})


@dataclass
class TrainConfig:
    """One training run of one arm. Paper defaults unless noted."""

    experiment: str = field(default="sdar", metadata={"help": "MLflow experiment, and {experiment} in output_dir."})
    arm: str = field(default="sdar", metadata={
        "help": "The registered arm to train (`sdar arms`): grpo | grpo_opsd | sdar | opsd | skill_grpo | ..."})
    arm_overrides: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "ArmConfig settings that replace the arm's own, e.g. {kl_coef: 0.001}; checked at load against "
                "the arm's fields (`sdar config fields arm_overrides`)."})
    seed: int = field(default=0, metadata={"help": "Seeds the run; every step's randomness comes from (seed, step)."})
    steps: int = field(default=150, metadata={"help": "RL steps (paper: 150)."})
    tasks_per_step: int = field(default=16, metadata={
        "help": "Tasks sampled per step (paper: 16; 128 for search)."})
    group_size: int = field(default=8, metadata={"help": "G rollouts per task (paper: 8)."})
    reward: str = field(default="reference", metadata={
        "help": "The reward trained on: reference = 10 on a win for household and shop (shop: WebShop score 1), "
                "exact match for search; env = the environment's own reward."})
    output_dir: str = field(default="runs/{experiment}/{arm}-seed{seed}", metadata={
        "help": "Where the run writes (history, final policy, checkpoints by default); {experiment}, {arm} and "
                "{seed} are filled in."})
    tracking: bool = field(default=True, metadata={
        "help": "Log to MLflow (SQLite under output_dir unless MLFLOW_TRACKING_URI is set)."})
    parent_run_id: str | None = field(default=None, metadata={"help": "MLflow parent run (the pipeline's run)."})
    device: str = field(default="auto", metadata={
        "help": "Where the policy runs when not under torchrun (which puts rank r on cuda:LOCAL_RANK): auto = the "
                "first CUDA device when one is visible, else the CPU; or cpu, cuda, cuda:N."})
    optim: OptimConfig = field(default_factory=OptimConfig, metadata={
        "help": "The optimizer and the guards on its steps."})
    ppo: PPOConfig = field(default_factory=PPOConfig, metadata={
        "help": "Mini- and micro-batches, epochs, and where old_logp comes from."})
    scoring: ScoringConfig = field(default_factory=ScoringConfig, metadata={
        "help": "Speed-ups of the forwards that keep the numbers."})
    teacher: TeacherConfig = field(default_factory=TeacherConfig, metadata={"help": "The privileged-context teacher."})
    eval: EvalConfig = field(default_factory=EvalConfig, metadata={"help": "The held-out evaluation."})
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig, metadata={
        "help": "Where and how often checkpoints are saved."})
    env: EnvConfig = field(default_factory=EnvConfig, metadata={"help": "Where episodes come from."})
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "The policy."})
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata={"help": "How episodes are played."})
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig, metadata={
        "help": "Supervised warm start of the tiny model."})
    distributed: DistributedConfig = field(default_factory=DistributedConfig, metadata={
        "help": "How torchrun's ranks share the model: ddp (replicas) or fsdp (sharded)."})
    launch: LaunchConfig = field(default_factory=LaunchConfig, metadata={
        "help": "In this process, or as a TorchX job of torchrun workers."})
    vllm: VLLMConfig = field(default_factory=VLLMConfig, metadata={
        "help": "The vLLM rollout engine (model.generation_backend vllm)."})
    replay: ReplayConfig = field(default_factory=ReplayConfig, metadata={
        "help": "Composer channel 3 (arms with replay_coef != 0): the N-teacher pool and how its votes become "
                "DPO pairs."})

    def validate(self) -> None:
        """Errors that name the setting and its valid values (called by load_config). Normalises
        arm_overrides: numbers as numbers, extra_coefs as (name, weight) pairs."""
        if self.arm not in ARMS:
            raise ValueError(f"unknown arm {self.arm!r}; choose one of {', '.join(ARMS)}")
        self.arm_overrides = check_arm_overrides(self.arm_overrides)
        choices = {"ppo.loss_normalisation": (self.ppo.loss_normalisation, ("micro_batch", "mini_batch")),
                   "distributed.strategy": (self.distributed.strategy, STRATEGIES),
                   "reward": (self.reward, REWARDS), "rollout.penalize": (self.rollout.penalize, PENALIZE),
                   "rollout.privileged_placement": (self.rollout.privileged_placement, PLACEMENTS),
                   "warmstart.pretokenizer": (self.warmstart.pretokenizer, PRETOKENIZERS)}
        for key, (value, valid) in choices.items():
            if value not in valid:
                raise ValueError(f"{key}={value!r} is not one of {', '.join(valid)}")
        # every command that reads it samples or scores at it (sdar eval's teacher gap too); evaluation
        # decodes at eval.temperature
        if self.rollout.temperature <= 0:
            raise ValueError(f"rollout.temperature={self.rollout.temperature}: RL samples its rollouts and "
                             "scores them at that temperature, so it must be > 0 (paper: 1.0); greedy decoding "
                             "is for evaluation (eval.temperature: 0)")
        check_numbers(self)
        try:  # the arm's own checks (loss_type, importance_sampling_level, agg), after its numbers'
            self.resolved_arm()
        except ValueError as e:
            raise ValueError(f"arm_overrides: {e}") from None

    def resolved_arm(self) -> ArmConfig:
        """The arm the loss uses: `arm` with `arm_overrides` applied."""
        return get_arm(self.arm, **self.arm_overrides)

    def resolved_output_dir(self) -> Path:
        return Path(self.output_dir.format(experiment=self.experiment, arm=self.arm, seed=self.seed))

    def resolved_device(self) -> torch.device:
        """`device` as a torch.device; `auto` picks CUDA when available."""
        import torch

        want = (self.device or "auto").strip().lower()
        if want == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            dev = torch.device(want)
        except RuntimeError as e:
            raise ValueError(f"device={self.device!r} is not a device; use auto, cpu, cuda or cuda:N") from e
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r}: only cpu and cuda are supported (or auto)")
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={self.device!r} but no CUDA device is visible; use device: cpu (or auto)")
        return dev

    def resolved_checkpoint_uri(self) -> str:
        """checkpoint.uri, else <output_dir>/checkpoints (where the trainer keeps its checkpoints)."""
        return self.checkpoint.uri or str(self.resolved_output_dir() / "checkpoints")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# TrainConfig's settings were one flat list of 50; they are grouped into sections now. A config (or an --set)
# that still names one of these is refused with its new place: old flat key -> its dotted key now.
MOVED_KEYS: dict[str, str] = {
    "lr": "optim.lr",
    "weight_decay": "optim.weight_decay",
    "grad_clip": "optim.grad_clip",
    "guard_updates": "optim.guard_updates",
    "max_skipped_update_frac": "optim.max_skipped_update_frac",
    "mini_batch_size": "ppo.mini_batch_size",
    "micro_batch_size": "ppo.micro_batch_size",
    "ppo_epochs": "ppo.epochs",
    "loss_normalisation": "ppo.loss_normalisation",
    "shuffle_mini_batches": "ppo.shuffle_mini_batches",
    "reuse_old_logp": "ppo.reuse_old_logp",
    "old_logp_from_sampler": "ppo.old_logp_from_sampler",
    "score_batch_size": "scoring.batch_size",
    "prefix_cache": "scoring.prefix_cache",
    "dedup_scoring": "scoring.dedup",
    "merged_inference": "scoring.merged_inference",
    "length_buckets": "scoring.length_buckets",
    "head_at_free_tokens": "scoring.head_at_free_tokens",
    "teacher_max_prompt_tokens": "teacher.max_prompt_tokens",
    "teacher_for_all_arms": "teacher.for_all_arms",
    "teacher_engine": "teacher.engine",
    "eval_every": "eval.every",
    "eval_tasks": "eval.tasks",
    "eval_task_order": "eval.task_order",
    "eval_task_ids": "eval.task_ids",
    "eval_temperature": "eval.temperature",
    "checkpoint_every": "checkpoint.every",
    "keep_checkpoints": "checkpoint.keep",
    "checkpoint_uri": "checkpoint.uri",
    "checkpoint_retry_s": "checkpoint.retry_s",
    "group_seeded_rollouts": "rollout.group_seeded",
}


def from_dict(cls, data: dict[str, Any], where: str = "config"):
    """Build dataclass `cls` from a nested dict, rejecting unknown keys with the valid list (and a setting that
    moved into a section with its new place)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if cls is TrainConfig and (old := [k for k in unknown if k in MOVED_KEYS]):
        raise ValueError("; ".join(f"{k} is now {MOVED_KEYS[k]}" for k in old) + f" (in {where}: the settings were "
                         "grouped into sections optim, ppo, scoring, teacher, eval and checkpoint; write e.g. "
                         f"`{MOVED_KEYS[old[0]].split('.')[0]}: {{{MOVED_KEYS[old[0]].split('.')[1]}: ...}}` in YAML or "
                         f"--set {MOVED_KEYS[old[0]]}=...)")
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; valid keys: {', '.join(sorted(known))}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        tp = hints[name]
        if is_dataclass(tp):
            kwargs[name] = from_dict(tp, value or {}, f"{where}.{name}")
        else:
            kwargs[name] = _coerce_number(tp, value, f"{where}.{name}")
    return cls(**kwargs)


def _coerce_number(tp: Any, value: Any, where: str) -> Any:
    """Numbers for float/int fields: YAML 1.1 reads `2e-3` (no dot) as a string, and a KFP dict
    parameter turns ints into floats; anything else that is not a number is a clear error."""
    if tp is float and isinstance(value, (str, int)) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{where} must be a number, got {value!r}") from None
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if tp is int and isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{where} must be an integer, got {value!r}") from None
    return value


def _typed(tp: Any, value: Any, where: str) -> Any:
    """`value` as a setting of type `tp` (bool, int, float, str, `X | None`, or ArmConfig.extra_coefs'
    (name, weight) pairs, also written as a mapping); a value of another type is an error naming `where`."""
    args = typing.get_args(tp)
    if type(None) in args:  # X | None
        return None if value is None else _typed(next(a for a in args if a is not type(None)), value, where)
    if typing.get_origin(tp) is tuple:  # extra_coefs: tuple[tuple[str, float], ...]
        pairs = value.items() if isinstance(value, Mapping) else value
        try:
            return tuple((str(k), float(_coerce_number(float, w, where))) for k, w in pairs)
        except (TypeError, ValueError):
            raise ValueError(f"{where} must map loss-term weight names to numbers (e.g. {{sq_coef: 0.5}}), "
                             f"got {value!r}") from None
    value = _coerce_number(tp, value, where)
    if tp in (int, float) and (isinstance(value, bool) or not isinstance(value, tp)):
        raise ValueError(f"{where} must be {'an integer' if tp is int else 'a number'}, got {value!r}")
    if tp in (bool, str) and not isinstance(value, tp):
        raise ValueError(f"{where} must be {'true or false' if tp is bool else 'a string'}, got {value!r}")
    return value


RENAMED_ARM_SETTINGS = {"sdar_beta": "gate_beta"}  # old name -> new name, for a clear error


def check_arm_overrides(overrides: Any, where: str = "arm_overrides") -> dict[str, Any]:
    """`overrides` checked against the ArmConfig fields a config may set (every one but `name`) and
    their types; a misspelled setting is an error that names it and lists the valid ones."""
    if not isinstance(overrides, Mapping):
        raise ValueError(f"{where} must be a mapping of arm settings (e.g. {{kl_coef: 0.001}}), got {overrides!r}")
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    renamed = {old: new for old, new in RENAMED_ARM_SETTINGS.items() if old in unknown}
    if renamed:
        raise ValueError(f"{where}: " + "; ".join(f"{old!r} is now called {new!r}" for old, new in renamed.items())
                         + " (one name for each beta: gate_beta, jsd_beta, dpo_beta, and replay_coef)")
    if unknown:
        raise ValueError(f"unknown arm setting(s) {unknown} in {where}; valid settings: "
                         f"{', '.join(sorted(OVERRIDABLE))}")
    hints = typing.get_type_hints(ArmConfig)
    return {k: _typed(hints[k], v, f"{where}.{k}") for k, v in overrides.items()}


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    for p in parts[:-1]:
        data = data.setdefault(p, {})
    data[parts[-1]] = value


SET_HELP = "override a config key: a dotted KEY and a YAML VALUE, e.g. rollout.max_turns=10 (repeatable)"


def parse_set(item: str) -> tuple[str, Any]:
    """One `KEY=VALUE` of `--set` (the argparse type of every command's --set, and of `sdar submit
    --arg`): a dotted key and a YAML value, e.g. `rollout.max_turns=10`, `env.kwargs={backend: alfworld}`,
    `optim.lr=2e-3`, `checkpoint.uri=` (null)."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not all(part.strip() for part in key.split(".")):
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE, a dotted key and a YAML value (e.g. rollout.max_turns=10), got {item!r}")
    try:
        return key, yaml.safe_load(text)
    except yaml.YAMLError as exc:
        why = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise argparse.ArgumentTypeError(f"the value of {key} is not YAML ({why}): {text!r}") from None


def parse_overrides(text: str | None) -> dict[str, Any]:
    """Dotted config overrides from a JSON object (how pipeline components receive them: a KFP
    dict parameter would turn ints into floats)."""
    import json

    ov = json.loads(text or "{}")
    if not isinstance(ov, dict):
        raise ValueError("overrides must be a JSON object of dotted config keys, e.g. "
                         f"'{{\"rollout.max_turns\": 8}}', got {text!r}")
    return ov


# Settings that differ by task family in the reference's example scripts (ZJU-REAL/SDAR
# examples/sdar_trainer/run_{alfworld,webshop,search}_3b.sh: env.max_steps, env.history_length,
# actor.kl_loss_coef, actor.invalid_action_penalty_coef, actor.ppo_mini_batch_size). `load_config`
# fills each one the config file and the overrides leave unset.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    # KL 0.01 for household and shop is every arm's own default (ArmConfig.kl_coef)
    "household": {"rollout.max_turns": 50, "rollout.history": 2, "rollout.invalid_penalty": 0.1,
                  "ppo.mini_batch_size": 256},
    "shop": {"rollout.max_turns": 15, "rollout.history": 2, "rollout.invalid_penalty": 0.1, "ppo.mini_batch_size": 64},
    "searchqa": {"rollout.max_turns": 4, "rollout.history": 4, "arm_overrides.kl_coef": 0.001,
                 "rollout.invalid_penalty": 0.01, "ppo.mini_batch_size": 256},
}


def _has_dotted(data: dict[str, Any], key: str) -> bool:
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def apply_family_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the family's defaults (FAMILY_DEFAULTS) for every key it does not set itself."""
    family = (data.get("env") or {}).get("family", EnvConfig.family)
    for key, value in FAMILY_DEFAULTS.get(family, {}).items():
        if not _has_dotted(data, key):
            _set_dotted(data, key, value)
    return data


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """A TrainConfig from a YAML file (or the defaults) plus dotted overrides
    (`{"steps": 3, "rollout.max_turns": 10}`), with the family's defaults (FAMILY_DEFAULTS) for the
    keys neither sets. Settings are checked here, once."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"config file {p} not found; see configs/ for examples")
        data = yaml.safe_load(p.read_text()) or {}
    for k, v in (overrides or {}).items():
        _set_dotted(data, k, v)
    if isinstance(data, dict):
        apply_family_defaults(data)
    try:
        cfg = from_dict(TrainConfig, data, where=str(path or "config"))
        cfg.validate()
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:  # every check names its key: one kind of error for every caller
        raise ConfigError(str(exc)) from exc
    return cfg


def config_fields(cls: type = TrainConfig, prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """(dotted key, type, default, help) of every setting under `cls`, depth first; the default as JSON
    (which is YAML), or `required`. `arm_overrides.*` are the ArmConfig settings a config may set (default:
    the arm's own), `replay.teachers[].*` the fields of one teacher endpoint."""
    import json

    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        key, tp = f"{prefix}{f.name}", hints[f.name]
        if is_dataclass(tp):
            yield from config_fields(tp, f"{key}.")
            continue
        default = (json.dumps(f.default) if f.default is not dataclasses.MISSING else
                   json.dumps(f.default_factory()) if f.default_factory is not dataclasses.MISSING else "required")
        yield key, str(f.type), default, f.metadata.get("help", "")
        if cls is TrainConfig and f.name == "arm_overrides":
            arm_fields = {g.name: g for g in fields(ArmConfig)}
            for name in OVERRIDABLE:
                yield f"{key}.{name}", str(arm_fields[name].type), "the arm's", arm_fields[name].metadata["help"]
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        if is_dataclass(item):
            yield from config_fields(item, f"{key}[].")
