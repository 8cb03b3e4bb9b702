"""Experiment configuration: dataclasses with documented defaults, loaded from YAML.

`load_config("configs/household-tiny.yaml", overrides={"steps": 3})` returns a TrainConfig;
unknown keys are errors that list the valid ones, so a typo never silently does nothing.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from sdar.replay.config import ReplayConfig


# choices checked at load (TrainConfig.validate); the code that uses them imports them from here, so
# that reading and checking a config needs neither torch nor transformers
PLACEMENTS = ("prefix", "user")  # rollout.privileged_placement (sdar.agent.prompts)
PENALIZE = ("format", "invalid")  # rollout.penalize (sdar.agent.rollout.penalized)
REWARDS = ("reference", "env")  # reward (sdar.agent.rollout.episode_reward)


@dataclass
class RolloutConfig:
    """How episodes are played. Defaults follow the paper where it has one."""

    family: str = "household"
    max_turns: int = 50  # paper: 50 household, 15 shop, 4 search
    history: int = 2  # past (observation, action) pairs in the prompt (4 for search)
    max_prompt_tokens: int = 1024
    max_response_tokens: int = 64
    temperature: float = 1.0  # 1.0 for training, 0.4 for evaluation
    top_p: float = 1.0
    invalid_penalty: float = 0.1  # subtracted from the turn's reward on an invalid action
    # which turns pay invalid_penalty: "format" = the response has no well-formed action block (or no
    # <think> when require_think), as the reference's projection functions decide; "invalid" = also an
    # action that is inadmissible, rejected by the environment, or a response cut off unfinished
    penalize: str = "format"
    # where the privileged text goes in the teacher's prompt (and in a prompt that acts with the skills):
    # "prefix" = before the chat-templated prompt (the reference), "user" = in the user message
    privileged_placement: str = "prefix"
    # leave tokens that constrained decoding forced (one allowed token: no choice was made) out of every
    # loss term and every per-token statistic; false scores them like free tokens (log-prob 0 for all)
    mask_forced_tokens: bool = True
    require_think: bool = False
    show_admissible: bool = True
    use_memory: bool = True  # the household's compact memory of what was seen
    skills_in_prompt: bool = False  # the student itself sees the skills (skill_grpo)
    env_workers: int = 8  # threads stepping remote sessions concurrently
    constrained: bool = False  # decode only admissible actions (families that list them)
    # constrained decoding (transformers backend): a token the trie forces is appended without a decode
    # step and a run of them goes through the model in one forward; false = one token per forward (the
    # same samples and log-probs, for benchmarks and checks)
    jump_forward: bool = True



@dataclass
class EnvConfig:
    """Where episodes come from."""

    family: str = "household"  # household | shop | searchqa
    url: str | None = None  # a running env server (http://host:port); None = in-process env
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to make_env (e.g. backend, difficulty)
    train_split: str = "train"
    eval_split: str = "test"


@dataclass
class ModelConfig:
    """The policy. `name_or_path`: "tiny" (built and warm-started locally), "smollm2", a local
    checkpoint directory, or a hub id where a network exists."""

    name_or_path: str = "tiny"
    dtype: str = "float32"  # float32 | bfloat16
    lora: bool = True  # LoRA adapter via peft; the reference is the base with it disabled
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    gradient_checkpointing: bool = False
    generation_backend: str = "transformers"  # transformers | vllm (CUDA; options under `vllm:`)
    tiny_overrides: dict[str, Any] = field(default_factory=dict)  # TinyModelConfig fields (tests shrink it)


@dataclass
class VLLMConfig:
    """The vLLM rollout engine, used when model.generation_backend is vllm (CUDA only:
    `pip install -e '.[gpu]'`). It loads the base weights once and the policy's LoRA adapter,
    re-exported whenever the weights changed, under a fresh id."""

    gpu_memory_utilization: float = 0.35  # GPU share vLLM takes (weights + KV cache); 0.35 leaves room for the trainer
    enable_lora: bool = True  # serve the trained adapter (must stay true while training a LoRA policy)
    max_lora_rank: int = 0  # largest adapter rank vLLM reserves for; 0 = model.lora_r
    dtype: str = "bfloat16"  # vLLM's weights and activations: bfloat16 | float16 | float32 | auto
    max_model_len: int = 0  # longest prompt + response; 0 = the model's own limit
    enforce_eager: bool = False  # no CUDA graphs: faster start, slower decoding
    # log-probs vLLM reports for sampled tokens: processed_logprobs = after the trie mask and temperature
    # (what was sampled); "" = vLLM's default (raw). Diagnostic: the trainer recomputes old_logp itself
    logprobs_mode: str = "processed_logprobs"
    # teacher_engine vllm: prompt log-probs per position for constrained turns; a turn is scored in vLLM only
    # when all its allowed tokens are among them, else by the training-side forward
    teacher_topk: int = 20
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # passed to vllm.LLM as is (e.g. seed, max_num_seqs)


@dataclass
class WarmStartConfig:
    """Supervised warm-start of the tiny model on expert trajectories (skipped for real models)."""

    episodes: int = 400  # expert episodes to imitate
    tokenizer_episodes: int = 400  # expert episodes whose text trains the tokenizer (cheap)
    vocab_size: int = 4096
    privileged_fraction: float = 0.5  # share of examples whose prompt carries the skills
    epochs: int = 2
    lr: float = 2e-3
    batch_size: int = 16
    # weight of a language-modelling loss on the prompt tokens (0 = imitation only): the same
    # forward gives a model trained from scratch far more signal per update
    prompt_lm_weight: float = 0.0
    # DART-style noise: with this probability an expert episode executes a random admissible action
    # instead of the expert's (not imitated); the expert's recovery from the states that leads to is.
    # A student trained only on expert states never sees its own mistakes and compounds them.
    noise: float = 0.0
    # repeat the examples that decide episodes this many times in the SFT data: "go to" turns that do
    # not follow the memory's search frontier (appliance, target, a seen object) and "take" turns.
    # They are ~15% of the examples, and a tiny model got them right a quarter to half of the time
    decision_repeats: int = 1


@dataclass
class LaunchConfig:
    """Where `gated_train` runs the training: in its own process (the default), or as a TorchX job
    of `nodes` x `gpus_per_node` torchrun workers (data-parallel LoRA, see sdar.train.distributed).
    Secrets (MLflow, S3) reach the job's pods from Kubernetes Secrets, never from this config."""

    launcher: str = "auto"  # auto | inprocess | torchx; auto = torchx when nodes * gpus_per_node > 1
    scheduler: str = "kubernetes"  # kubernetes (a Volcano Job, gang-scheduled) | local_cwd (this machine)
    nodes: int = 1
    gpus_per_node: int = 0  # GPUs of each node, one torchrun worker per GPU; 0 = CPU workers
    procs_per_node: int = 0  # torchrun workers per node; 0 = gpus_per_node (1 without GPUs)
    cpu: int = 8  # per node
    memory_mb: int = 32768  # per node
    image: str = ""  # "" = $SDAR_IMAGE or the trainer image the pipeline uses
    queue: str = "default"  # Volcano queue
    namespace: str = ""  # "" = the namespace of the pod that launches (its service account's), else default
    # the job's pods' service account: the pipeline's pipeline-runner (whose IRSA role reaches the bucket on
    # EKS, and which the env chart's admission policy requires of pods wearing the pipeline label); "" = the
    # namespace's default
    service_account: str = "pipeline-runner"
    node_selector: dict[str, str] = field(default_factory=lambda: {"eks.amazonaws.com/nodegroup": "gpu"})
    tolerations: list[dict[str, str]] = field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    # Secrets whose keys become the pods' environment (the same ones ClusterSettings gives the pipeline)
    secrets: list[str] = field(default_factory=lambda: ["sdar-mlflow", "sdar-s3"])
    # labels of the job's pods: ClusterSettings.pod_labels, which k8s/ NetworkPolicies admit to the
    # env services, MLflow and MinIO (the workers play episodes and log like the pipeline's pods)
    pod_labels: dict[str, str] = field(default_factory=lambda: {"app.kubernetes.io/part-of": "sdar-pipeline"})

    def wants_torchx(self) -> bool:
        """Whether training runs as a TorchX job (sdar.launch) rather than in this process."""
        if self.launcher not in ("auto", "inprocess", "torchx"):
            raise ValueError(f"unknown launcher {self.launcher!r}; choose one of auto, inprocess, torchx")
        if self.launcher == "auto":
            return self.nodes * self.gpus_per_node > 1
        return self.launcher == "torchx"


@dataclass
class TrainConfig:
    """One training run of one arm. Paper defaults unless noted."""

    experiment: str = "sdar"
    arm: str = "sdar"  # grpo | grpo_opsd | sdar | opsd | skill_grpo
    arm_overrides: dict[str, Any] = field(default_factory=dict)  # e.g. {kl_coef: 0.001}
    seed: int = 0
    steps: int = 150
    tasks_per_step: int = 16
    group_size: int = 8  # G rollouts per task
    lr: float = 1e-6  # constant
    weight_decay: float = 0.01  # AdamW (the reference's verl actor optimizer default)
    # turn-samples per optimizer step (reference: ppo_mini_batch_size 256; 64 for shop, a family default)
    mini_batch_size: int = 256
    # turn-samples per forward/backward inside a mini-batch (reference: ppo_micro_batch_size_per_gpu 32)
    micro_batch_size: int = 32
    # micro_batch: each micro-batch's loss is aggregated (agg, e.g. token-mean) over its own tokens and the
    # mini-batch's gradient is the mean over its micro-batches (the reference: verl dp_actor divides each
    # micro-batch's loss by gradient_accumulation); mini_batch: aggregated over the whole mini-batch's tokens
    loss_normalisation: str = "micro_batch"
    # draw mini-batches in a random order; false takes them in rollout order (the reference: batch.split)
    shuffle_mini_batches: bool = False
    ppo_epochs: int = 1
    # take old_logp of the first mini-batch's rows from the update's own first forward (the weights have not
    # moved yet, so it is the same number) instead of a separate scoring pass; false scores every row first.
    # With the reference's mini-batch (256) and a step of <= 256 turn-samples, no old_logp pass is left
    reuse_old_logp: bool = True
    # take old_logp from the sampling pass itself when the sampler is the trainer's own model (the
    # transformers backend's constrained sampler reports the log-prob of the distribution it drew from,
    # which is the trainer's score: same weights, allowed set and temperature; top_p must be 1); vLLM and
    # rows without sampler log-probs are scored as before. false = always score
    old_logp_from_sampler: bool = True
    # after every optimizer step, check the trainable weights are finite and the policy still scores one of
    # the step's samples to finite log-probs; otherwise restore the weights and optimizer state of before the
    # step and count the update as skipped. Costs a copy of the trainable weights and their optimizer state
    # (small with LoRA); turn off for full fine-tuning of a model whose copy does not fit
    guard_updates: bool = True
    # a run in which more than this share of its updates was skipped (non-finite loss, gradient or weights)
    # fails with a message at its end instead of reporting success; 1.0 never fails
    max_skipped_update_frac: float = 0.5
    # the reward trained on (sdar.agent.rollout.REWARDS): reference = 10 on a win for household and shop
    # (shop: WebShop score 1), exact match for search; env = the environment's own reward
    reward: str = "reference"
    grad_clip: float = 1.0
    score_batch_size: int = 16  # sequences per no-grad scoring forward
    teacher_max_prompt_tokens: int = 2048  # the teacher's prompt budget (skills + turn)
    # the teacher and reference passes encode the prompt start a task's turn-samples share (system prompt, task,
    # skills in either placement) once per step and continue each turn-sample from its KV cache (the same log-probs
    # as the plain forward); false = a plain forward per turn-sample
    prefix_cache: bool = True
    # forward rows of similar length together (scoring chunks and, inside each update micro-batch, groups of
    # similar length: the micro-batch and its loss are unchanged, only padding goes); false = one padded
    # forward per micro-batch and unsorted scoring chunks
    length_buckets: bool = True
    teacher_for_all_arms: bool = True  # score the teacher for arms that do not need it (gap metrics)
    # train: the trainer's own forward; vllm: the vLLM rollout engine's prompt log-probs (needs
    # model.generation_backend vllm; constrained turns outside vllm.teacher_topk fall back to the forward)
    teacher_engine: str = "train"
    eval_every: int = 10  # steps; 0 disables periodic evaluation
    eval_tasks: int = 50
    # how the eval_tasks ids are taken from env.eval_split: stratified = round-robin over task types
    # (sdar.eval.tasks.select_tasks); first = the first N as the split lists them
    eval_task_order: str = "stratified"
    eval_task_ids: list[str] = field(default_factory=list)  # explicit eval tasks (then eval_tasks/order are unused)
    eval_temperature: float = 0.4
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    output_dir: str = "runs/{experiment}/{arm}-seed{seed}"
    # how long checkpoint uploads to a remote store (s3://) are retried, with backoff, before the run stops
    # (the checkpoints wait in <output_dir>/checkpoint-spool meanwhile, and a rerun resumes from there)
    checkpoint_retry_s: float = 600.0
    checkpoint_uri: str | None = None  # local dir or s3://bucket/prefix; default <output_dir>/checkpoints
    tracking: bool = True  # MLflow (SQLite under output_dir unless MLFLOW_TRACKING_URI is set)
    parent_run_id: str | None = None  # MLflow parent run (the pipeline's run)
    # roll out each task group under its own seed (seed, step, group): the trajectories then do not
    # depend on how groups are split over torchrun ranks, at the cost of lock-step batching across groups
    group_seeded_rollouts: bool = False
    # where the policy runs when not under torchrun (which puts rank r on cuda:LOCAL_RANK):
    # auto = the first CUDA device when one is visible, else the CPU; or cpu, cuda, cuda:N
    device: str = "auto"
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    # Composer channel 3 (arms with replay_coef != 0): the N-teacher pool and how its votes become DPO pairs
    replay: ReplayConfig = field(default_factory=ReplayConfig)

    def validate(self) -> None:
        """Errors that name the setting and its valid values (called by load_config)."""
        choices = {"loss_normalisation": (self.loss_normalisation, ("micro_batch", "mini_batch")),
                   "reward": (self.reward, REWARDS), "rollout.penalize": (self.rollout.penalize, PENALIZE),
                   "rollout.privileged_placement": (self.rollout.privileged_placement, PLACEMENTS)}
        for key, (value, valid) in choices.items():
            if value not in valid:
                raise ValueError(f"{key}={value!r} is not one of {', '.join(valid)}")
        if not 0.0 <= self.max_skipped_update_frac <= 1.0:
            raise ValueError(f"max_skipped_update_frac={self.max_skipped_update_frac} must be in [0, 1]")
        for key in ("mini_batch_size", "micro_batch_size", "ppo_epochs"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 1")

    def resolved_output_dir(self) -> Path:
        return Path(self.output_dir.format(experiment=self.experiment, arm=self.arm, seed=self.seed))

    def resolved_device(self) -> "torch.device":
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
        """checkpoint_uri, else <output_dir>/checkpoints (where the trainer keeps its checkpoints)."""
        return self.checkpoint_uri or str(self.resolved_output_dir() / "checkpoints")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def from_dict(cls, data: dict[str, Any], where: str = "config"):
    """Build dataclass `cls` from a nested dict, rejecting unknown keys with the valid list."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
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


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    for p in parts[:-1]:
        data = data.setdefault(p, {})
    data[parts[-1]] = value


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
                  "mini_batch_size": 256},
    "shop": {"rollout.max_turns": 15, "rollout.history": 2, "rollout.invalid_penalty": 0.1, "mini_batch_size": 64},
    "searchqa": {"rollout.max_turns": 4, "rollout.history": 4, "arm_overrides.kl_coef": 0.001,
                 "rollout.invalid_penalty": 0.01, "mini_batch_size": 256},
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
    cfg = from_dict(TrainConfig, data, where=str(path or "config"))
    cfg.validate()
    return cfg
