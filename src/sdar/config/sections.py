"""The sections of a training config (rollout, env, model, ..., checkpoint): typed dataclasses whose fields carry
their help and, where a number has a range, its bound in their metadata; TrainConfig (sdar.config.schema) roots them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sdar.config.secrets import MLFLOW_SECRET, S3_SECRET

# choices checked at load (TrainConfig.validate); the code that uses them imports them from here, so
# that reading and checking a config needs neither torch nor transformers
PLACEMENTS = ("prefix", "user")  # rollout.privileged_placement (sdar.agent.prompts)
PENALIZE = ("format", "invalid")  # rollout.penalize (sdar.agent.rollout.penalized)
REWARDS = ("reference", "env")  # reward (sdar.agent.rollout.episode_reward)
PRETOKENIZERS = ("qwen2", "punct_space")  # warmstart.pretokenizer (sdar.models.tokenizer.PRETOKENIZERS)
STRATEGIES = ("ddp", "fsdp")  # distributed.strategy (sdar.train.distributed, sdar.train.fsdp)
SAMPLERS = ("auto", "batched", "lookahead")  # rollout.sampler: the one sampler's layout (sdar.agent.decoding)


def _groups_unfiltered(d: dict[str, Any]) -> bool:
    """Config `d` (asdict, whole) trains on every group it rolls out: filter_max_draws changes nothing."""
    rollout = d.get("rollout") if isinstance(d.get("rollout"), dict) else {}
    return not rollout.get("filter_groups", False)


@dataclass
class RolloutConfig:
    """How episodes are played. Defaults follow the paper where it has one."""

    family: str = field(default="household", metadata={
        "help": "The environment family; the trainer sets it from env.family."})
    max_turns: int = field(default=50, metadata={
        "help": "Turns an episode may last (paper: 50 household, 15 shop, 4 search; FAMILY_DEFAULTS).",
        "bound": ">= 1"})
    history: int = field(default=2, metadata={
        "help": "Past (observation, action) pairs in the prompt (paper: 2; 4 for search).", "bound": ">= 0"})
    max_prompt_tokens: int = field(default=1024, metadata={
        "help": "The student's prompt budget; history pairs are dropped first to fit it.", "bound": ">= 1"})
    max_response_tokens: int = field(default=64, metadata={
        "help": "Tokens a response may have at most.", "bound": ">= 1"})
    temperature: float = field(default=1.0, metadata={
        "help": "Sampling temperature of the rollouts, at which they are also scored; must be > 0 "
                "(paper: 1.0; evaluation decodes at eval.temperature).", "bound": "> 0"})
    top_p: float = field(default=1.0, metadata={
        "help": "Nucleus sampling of the rollouts (1 = off; ppo.old_logp_from_sampler needs 1).", "bound": "(0, 1]"})
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
    env_workers: int = field(default=8, metadata={
        "help": "Threads stepping remote sessions concurrently.", "bound": ">= 1"})
    constrained: bool = field(default=False, metadata={
        "help": "Decode only admissible actions (families that list them)."})
    sampler: str = field(default="auto", metadata={
        "help": "Sampling (transformers backend): one sampler (sdar.agent.decoding.constrained_sample) draws every "
                "row's token from its own generator, every live row of a step in one batched pass (the vocabulary "
                "processed once, constrained rows at their allowed tokens only); this picks its forward layout. "
                "auto (the default): lookahead on a CUDA device, batched elsewhere (TrainConfig.resolved_sampler; the "
                "measured rule in docs/benchmarks.md, `sdar config show` prints the choice). batched: a decode step "
                "per decision on a KV cache; lookahead: a turn's constrained rows run their prompt and every "
                "admissible response in ONE packed forward (sdar.agent.lookahead, rows of scoring.pack_tokens "
                "positions), so a turn needs no decode step. The same samples and log-probs up to float rounding. "
                "The retired value rows (a softmax per row) loads as batched.",
        "added": True})
    group_seeded: bool = field(default=False, metadata={
        "help": "Roll out each task group under its own seed (seed, step, group): the trajectories then do not depend "
                "on how groups are split over torchrun ranks, at the cost of lock-step batching across groups."})
    filter_groups: bool = field(default=False, metadata={
        "added": True,
        "help": "Dynamic sampling (DAPO; verl's algorithm.filter_groups): train on the task groups whose rollouts "
                "got different rewards, drawing more tasks for the step (up to filter_max_draws draws of "
                "tasks_per_step) while fewer than tasks_per_step such groups were found; a group whose rewards are "
                "all equal gives every turn-sample advantage 0 (groups/zero_std_frac counts them). The step keeps "
                "tasks_per_step groups: when the draws run out it is filled with equal-reward groups."})
    filter_max_draws: int = field(default=4, metadata={
        "added": True, "inert_when": _groups_unfiltered,
        "help": "With filter_groups: the most draws of tasks_per_step tasks a step rolls out (the first included).",
        "bound": ">= 1"})


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


def _not_bfloat16_on_a_cpu(d: dict[str, Any]) -> bool:
    """Config `d` (asdict, whole) runs its model in float32 or on a GPU: a CPU bfloat16 switch changes nothing."""
    model = d.get("model") if isinstance(d.get("model"), dict) else {}
    return model.get("dtype", "float32") != "bfloat16" or str(d.get("device", "auto")).startswith("cuda")


@dataclass
class ModelConfig:
    """The policy."""

    name_or_path: str = field(default="tiny", metadata={
        "help": "tiny (built and warm-started locally), smollm2, a local checkpoint directory, or a hub id where "
                "a network exists."})
    dtype: str = field(default="float32", metadata={"help": "Weights and forward dtype: float32 | bfloat16."})
    lora: bool = field(default=True, metadata={
        "help": "Train a LoRA adapter (peft); the reference is the base with it disabled. false = full fine-tuning."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank.", "bound": ">= 1"})
    lora_alpha: int = field(default=32, metadata={
        "help": "LoRA alpha (the adapter is scaled by alpha / r).", "bound": "> 0"})
    lora_dropout: float = field(default=0.0, metadata={
        "help": "Dropout on the LoRA adapter's input.", "bound": "[0, 1)"})
    gradient_checkpointing: bool = field(default=False, metadata={
        "help": "Recompute activations in the backward pass: less memory, slower updates."})
    cpu_mixed_precision: bool = field(default=True, metadata={
        "added": True, "before": False, "inert_when": _not_bfloat16_on_a_cpu,
        "help": "bfloat16 on a CPU: the LoRA adapter's matmuls under autocast, transformers' eager attention in "
                "grad forwards and the flash kernel's attention as bfloat16-rate matmuls in no-grad ones "
                "(sdar.models.precision): its update the closer to float32's of the two bfloat16 paths in "
                "every batch measured (benchmarks/bench_precision.py, docs/training.md); its speed against plain "
                "bfloat16 varies by run (docs/benchmarks.md). false: peft's own path. No effect on float32 or off "
                "the CPU."})
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
        "help": "GPU share vLLM takes (weights + KV cache); 0.35 leaves room for the trainer.", "bound": "(0, 1]"})
    enable_lora: bool = field(default=True, metadata={
        "help": "Serve the trained adapter (must stay true while training a LoRA policy)."})
    max_lora_rank: int = field(default=0, metadata={
        "help": "Largest adapter rank vLLM reserves for; 0 = model.lora_r.", "bound": ">= 0"})
    dtype: str = field(default="bfloat16", metadata={
        "help": "vLLM's weights and activations: bfloat16 | float16 | float32 | auto."})
    max_model_len: int = field(default=0, metadata={
        "help": "Longest prompt + response; 0 = the model's own limit.", "bound": ">= 0"})
    enforce_eager: bool = field(default=False, metadata={"help": "No CUDA graphs: faster start, slower decoding."})
    logprobs_mode: str = field(default="processed_logprobs", metadata={
        "help": "Log-probs vLLM reports for sampled tokens: processed_logprobs = after the trie mask and temperature "
                "(what was sampled); \"\" = vLLM's default (raw). Diagnostic: the trainer recomputes old_logp itself."})
    teacher_topk: int = field(default=20, metadata={
        "help": "teacher.engine vllm: prompt log-probs per position for constrained turns; a turn is scored in vLLM "
                "only when all its allowed tokens are among them, else by the training-side forward.", "bound": ">= 1"})
    engine_kwargs: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "Passed to vllm.LLM as is (e.g. seed, max_num_seqs)."})


@dataclass
class WarmStartConfig:
    """Supervised warm start on the family's expert episodes, in the prompt and response format training and evaluation
    use: always for the tiny model (built from scratch), for a pretrained checkpoint with `pretrained: true`."""

    episodes: int = field(default=400, metadata={"help": "Expert episodes to imitate.", "bound": ">= 0"})
    tokenizer_episodes: int = field(default=400, metadata={
        "help": "Expert episodes whose text trains the tokenizer (cheap).", "bound": ">= 0"})
    vocab_size: int = field(default=4096, metadata={"help": "The tiny model's tokenizer vocabulary.", "bound": ">= 1"})
    privileged_fraction: float = field(default=0.5, metadata={
        "help": "Share of examples whose prompt carries the skills.", "bound": "[0, 1]"})
    epochs: int = field(default=2, metadata={"help": "Passes over the imitation examples.", "bound": ">= 0"})
    lr: float = field(default=2e-3, metadata={"help": "AdamW learning rate of the warm start.", "bound": ">= 0"})
    batch_size: int = field(default=16, metadata={"help": "Examples per warm-start update.", "bound": ">= 1"})
    prompt_lm_weight: float = field(default=0.0, metadata={
        "help": "Weight of a language-modelling loss on the prompt tokens (0 = imitation only): the same forward "
                "gives a model trained from scratch far more signal per update.", "bound": ">= 0"})
    noise: float = field(default=0.0, metadata={
        "help": "DART-style noise: with this probability an expert episode executes a random admissible action "
                "instead of the expert's (not imitated); the expert's recovery from the states that leads to is. "
                "A student trained only on expert states never sees its own mistakes and compounds them.",
                "bound": "[0, 1]"})
    decision_repeats: int = field(default=1, metadata={
        "help": "Repeat the examples that decide episodes this many times in the SFT data (`warmstart.is_decision`). "
                "Household: \"go to\" turns that do not follow the memory's search frontier (appliance, target, a seen "
                "object) and \"take\" turns, ~15% of the examples, which a tiny model got right a quarter to half of the "
                "time. Shop: option-value clicks (~30%; a tiny model copied the right value 36% of the time).",
                "bound": ">= 1"})
    pretokenizer: str = field(default="qwen2", metadata={
        "help": "How the tiny tokenizer splits text before its merges: qwen2 (Qwen2's pattern: a word carries the "
                "character before it, \" nude\" in \"color: nude,\" but \"[nude\" in \"click[nude]\": two ids a model "
                "trained from scratch must pair value by value) or punct_space (punctuation carries the space after it and a "
                "word nothing but a space before it: \"nude\" in both, so copying a value from the instruction into an "
                "action is one id to match; about as many tokens). Measured on shop-tiny: option clicks no better "
                "(configs/shop-tiny.yaml), so every config keeps qwen2.", "added": True})
    pretrained: bool = field(default=False, metadata={
        "help": "Warm-start a pretrained model.name_or_path (smollm2, a local directory, a hub id) too: supervise it on "
                "the expert episodes before RL (sdar.train.warm_pretrained), cached like the tiny warm start, and train "
                "and evaluate from the result. false: RL starts from the checkpoint as it is.", "added": True})
    lora: bool = field(default=True, metadata={
        "help": "Pretrained warm start: train a LoRA adapter (model.lora_r, model.lora_alpha; the adapter is kept in the "
                "cache and merged into its base when training loads it) or, false, every weight (full fine-tuning).",
        "added": True})
    eval_tasks: int = field(default=24, metadata={
        "help": "Pretrained warm start: held-out tasks (the first of the eval set) on which the checkpoint is evaluated "
                "before and after, constrained and sampled freely; 0 = none. Does not change the warm start's weights "
                "(not in its cache key).", "bound": ">= 0", "added": True})
    seed: int | None = field(default=None, metadata={
        "help": "Pretrained warm start: the seed of its expert episodes, adapter initialisation and batch order; null = "
                "the run's seed. A fixed value lets the runs of several seeds share one warm start (a study then "
                "measures RL's seed variance, not the warm start's).", "added": True})
    dtype: str | None = field(default=None, metadata={
        "help": "Pretrained warm start: the dtype it is trained in (float32 | bfloat16); null = model.dtype. Set, one "
                "warm start serves runs in either precision (training loads it in model.dtype: the base in that dtype, "
                "the adapter merged in).", "added": True})


@dataclass
class LaunchConfig:
    """Where `gated_train` runs the training: in its own process (the default), or as a job of `nodes` x
    `gpus_per_node` torchrun workers (see sdar.train.distributed): a Kubeflow Trainer TrainJob
    (sdar.launch.trainjob) or a TorchX job (sdar.launch.torchx_job). Secrets (MLflow, S3) reach the job's pods from
    Kubernetes Secrets, never from this config."""

    launcher: str = field(default="auto", metadata={
        "help": "auto | inprocess | trainjob | torchx; auto = a job when nodes * gpus_per_node > 1 (trainjob with "
                "scheduler kubernetes, torchx with local_cwd), else inprocess."})
    scheduler: str = field(default="kubernetes", metadata={
        "help": "kubernetes | local_cwd (TorchX on this machine); a TrainJob always runs on Kubernetes, a TorchX "
                "job there is a Volcano Job, gang-scheduled."})
    nodes: int = field(default=1, metadata={"help": "Nodes of the job.", "bound": ">= 1"})
    gpus_per_node: int = field(default=0, metadata={
        "help": "GPUs of each node, one torchrun worker per GPU; 0 = CPU workers.", "bound": ">= 0"})
    procs_per_node: int = field(default=0, metadata={
        "help": "torchrun workers per node; 0 = gpus_per_node (1 without GPUs).", "bound": ">= 0"})
    cpu: int = field(default=8, metadata={"help": "CPUs per node.", "bound": ">= 1"})
    memory_mb: int = field(default=32768, metadata={"help": "Memory per node, MB.", "bound": ">= 1"})
    image: str = field(default="", metadata={
        "help": "The workers' image; \"\" = $SDAR_IMAGE or the trainer image the pipeline uses."})
    queue: str = field(default="default", metadata={"help": "Volcano queue (TorchX)."})
    runtime: str = field(default="torch-distributed", metadata={
        "help": "The ClusterTrainingRuntime a TrainJob references (Kubeflow Trainer's torch-distributed).",
        "added": True})
    kueue_queue: str = field(default="", metadata={
        "help": "Kueue LocalQueue of a TrainJob (its kueue.x-k8s.io/queue-name label); \"\" = no label, no Kueue.",
        "added": True})
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
    secrets: list[str] = field(default_factory=lambda: [MLFLOW_SECRET, S3_SECRET], metadata={
        "help": "Secrets whose keys become the pods' environment (sdar.config.secrets: the same ones ClusterSettings "
                "gives the pipeline)."})
    pod_labels: dict[str, str] = field(default_factory=lambda: {"app.kubernetes.io/part-of": "sdar-pipeline"}, metadata={
        "help": "Labels of the job's pods: ClusterSettings.pod_labels, which k8s/ NetworkPolicies admit to the env "
                "services, MLflow and MinIO (the workers play episodes and log like the pipeline's pods)."})

    def resolved_launcher(self) -> str:
        """inprocess, trainjob (sdar.launch.trainjob) or torchx (sdar.launch.torchx_job): what `launcher` means here."""
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
        """Whether training runs as a TorchX job (sdar.launch.torchx_job)."""
        return self.resolved_launcher() == "torchx"

    def wants_trainjob(self) -> bool:
        """Whether training runs as a Kubeflow Trainer TrainJob (sdar.launch.trainjob)."""
        return self.resolved_launcher() == "trainjob"

    LAUNCHERS = ("auto", "inprocess", "trainjob", "torchx")  # not a field: no annotation


@dataclass
class DistributedConfig:
    """How torchrun's ranks share the model (one process alone: `ddp` is the plain single-process path)."""

    strategy: str = field(default="ddp", metadata={
        "help": "ddp: every rank holds the whole model and the ranks' gradients are summed in one all-reduce per "
                "update (sdar.train.distributed); fsdp: FSDP2 (torch.distributed.fsdp.fully_shard) shards the "
                "weights, gradients and optimizer state over the ranks, each decoder layer a unit, for LoRA and full "
                "fine-tuning alike; checkpoints are sharded (torch.distributed.checkpoint). Under fsdp every rank "
                "gathers the full weights for its rollouts and scoring passes (as verl's hybrid engine does) and "
                "only the update's state stays sharded (sdar.train.fsdp).", "added": True})


@dataclass
class OptimConfig:
    """The optimizer (AdamW, constant learning rate) and the guards on its steps."""

    lr: float = field(default=1e-6, metadata={"help": "AdamW learning rate, constant (paper: 1e-6).", "bound": ">= 0"})
    weight_decay: float = field(default=0.01, metadata={
        "help": "AdamW weight decay (the reference's verl actor optimizer default).", "bound": ">= 0"})
    grad_clip: float = field(default=1.0, metadata={
        "help": "Gradient-norm clip of each optimizer step (paper: 1.0).", "bound": "> 0"})
    guard_updates: bool = field(default=True, metadata={
        "help": "After every optimizer step, check the trainable weights are finite and the policy still scores one "
                "of the step's samples (the mini-batch's shortest) to finite log-probs; otherwise restore the "
                "weights and optimizer state of before the step and count the update as skipped. Costs a copy of "
                "the trainable weights and their optimizer state (small with LoRA); turn off for full fine-tuning "
                "of a model whose copy does not fit."})
    max_skipped_update_frac: float = field(default=0.5, metadata={
        "help": "A run in which more than this share of its updates was skipped (non-finite loss, gradient or "
                "weights) fails with a message at its end instead of reporting success; 1.0 never fails.",
                "bound": "[0, 1]"})


@dataclass
class PPOConfig:
    """How a step's turn-samples become optimizer steps: mini- and micro-batches, epochs, old_logp."""

    mini_batch_size: int = field(default=256, metadata={
        "help": "Turn-samples per optimizer step (reference: ppo_mini_batch_size 256; 64 for shop, a family default).",
        "bound": ">= 1"})
    micro_batch_size: int = field(default=32, metadata={
        "help": "Turn-samples per forward/backward inside a mini-batch (reference: ppo_micro_batch_size_per_gpu 32).",
        "bound": ">= 1"})
    epochs: int = field(default=1, metadata={"help": "Passes over a step's samples (paper: 1).", "bound": ">= 1"})
    loss_normalisation: str = field(default="micro_batch", metadata={
        "help": "micro_batch: each micro-batch's loss is aggregated (agg, e.g. token-mean) over its own tokens and "
                "the mini-batch's gradient is the mean over its micro-batches (the reference: verl dp_actor divides "
                "each micro-batch's loss by gradient_accumulation); mini_batch: aggregated over the whole "
                "mini-batch's tokens."})
    shuffle_mini_batches: bool = field(default=False, metadata={
        "help": "Draw mini-batches in a random order; false takes them in rollout order (the reference: batch.split)."})


@dataclass
class ScoringConfig:
    """How the forwards of a step run (the no-grad scoring passes and the update's): settings that change speed and
    memory, never the numbers beyond float rounding (tests/train/test_reference_parity.py). build_runtime reads them
    once into the runtime's `Scorer`, which takes every shortcut that keeps the numbers by itself (sdar.train.runtime
    .Shortcuts: a group's prompt start encoded once, each distinct row scored once, rows of similar length together,
    the head at the free tokens only, merged LoRA layers on a CPU)."""

    batch_size: int = field(default=16, metadata={
        "help": "At most this many sequences per no-grad scoring forward (rows of similar length go together, so "
                "one long row pads only its own group).", "bound": ">= 1"})
    packed: bool | str = field(default="auto", metadata={
        "help": "auto (the default): true on a CUDA device, false elsewhere (TrainConfig.resolved_packed; the measured "
                "rule in docs/training.md). true: every scoring pass (old_logp, reference, teacher) and each update "
                "micro-batch runs as ONE forward of "
                "its rows' prefix trees (sdar.models.packing): each position the rows share (a task's prompt start, "
                "identical turns) is computed once, in rows of scoring.pack_tokens positions with a tree attention mask "
                "(sdpa or eager attention; other models keep the plain path). The same log-probs up to float rounding; "
                "fewer, larger forwards (what a GPU wants). false = grouped forwards of rows of similar length, each group's prompt start encoded once.",
        "added": True})
    pack_tokens: int = field(default=2048, metadata={
        "help": "Positions per packed row (scoring.packed): attention costs each row its length squared, so rows of "
                "a few thousand positions keep it small beside the layers; a pass forwards all its rows at once.",
        "bound": ">= 1", "added": True})


@dataclass
class TeacherConfig:
    """The privileged-context teacher: the policy with the skills in its prompt, no gradient."""

    max_prompt_tokens: int = field(default=2048, metadata={
        "help": "The teacher's prompt budget (skills + turn).", "bound": ">= 1"})
    for_all_arms: bool = field(default=True, metadata={
        "help": "Score the teacher for arms that do not need it (the gap metrics)."})
    engine: str = field(default="train", metadata={
        "help": "train: the trainer's own forward scores the teacher; vllm: the vLLM rollout engine's prompt "
                "log-probs (needs model.generation_backend vllm; constrained turns outside vllm.teacher_topk fall "
                "back to the forward)."})


@dataclass
class EvalConfig:
    """The held-out evaluation: during training and by `sdar eval`."""

    every: int = field(default=10, metadata={
        "help": "Steps between evaluations; 0 disables periodic evaluation.", "bound": ">= 0"})
    tasks: int = field(default=50, metadata={"help": "Held-out tasks per evaluation.", "bound": ">= 0"})
    task_order: str = field(default="stratified", metadata={
        "help": "How the eval.tasks ids are taken from env.eval_split: stratified = round-robin over task types "
                "(sdar.eval.tasks.select_tasks); first = the first N as the split lists them."})
    task_ids: list[str] = field(default_factory=list, metadata={
        "help": "Explicit eval tasks (then eval.tasks and eval.task_order are unused)."})
    temperature: float = field(default=0.4, metadata={
        "help": "Decoding temperature of evaluation (paper: 0.4; 0 = greedy).", "bound": ">= 0"})


@dataclass
class CheckpointConfig:
    """Where and how often the run saves what resume needs."""

    every: int = field(default=10, metadata={
        "help": "Steps between checkpoints (and after the last step).", "bound": ">= 1"})
    keep: int = field(default=2, metadata={"help": "Newest checkpoints kept; older ones are deleted.", "bound": ">= 1"})
    uri: str | None = field(default=None, metadata={
        "help": "Local dir or s3://bucket/prefix whose checkpoints/ holds the run's checkpoints; null = the output "
                "directory (<output_dir>/checkpoints/step-NNNNNN)."})
    retry_s: float = field(default=600.0, metadata={
        "help": "How long checkpoint uploads to a remote store (s3://) are retried, with backoff, before the run "
                "stops (the checkpoints wait in <output_dir>/checkpoint-spool meanwhile, and a rerun resumes from "
                "there).", "bound": ">= 0"})

