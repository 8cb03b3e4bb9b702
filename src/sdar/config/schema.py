"""TrainConfig: one training run of one arm, the root of the config's sections, and its check at load (choices,
arm_overrides, every number finite and inside the bound its field declares)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sdar.algos.arm_config import ARMS, OVERRIDABLE, ArmConfig, get_arm
from sdar.config.bounds import check_numbers, field_bounds
from sdar.config.replay import ReplayConfig
from sdar.config.sections import (
    PENALIZE,
    PLACEMENTS,
    PRETOKENIZERS,
    REWARDS,
    SAMPLERS,
    STRATEGIES,
    CheckpointConfig,
    DistributedConfig,
    EnvConfig,
    EvalConfig,
    LaunchConfig,
    ModelConfig,
    OptimConfig,
    PPOConfig,
    RolloutConfig,
    ScoringConfig,
    TeacherConfig,
    VLLMConfig,
    WarmStartConfig,
)
from sdar.config.values import check_arm_overrides
from sdar.tracking.loggers import REPORT_TO

if TYPE_CHECKING:  # annotations only: loading a config never imports torch
    import torch


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
    steps: int = field(default=150, metadata={"help": "RL steps (paper: 150).", "bound": ">= 0"})
    tasks_per_step: int = field(default=16, metadata={
        "help": "Tasks sampled per step (paper: 16; 128 for search).", "bound": ">= 1"})
    group_size: int = field(default=8, metadata={"help": "G rollouts per task (paper: 8).", "bound": ">= 1"})
    reward: str = field(default="reference", metadata={
        "help": "The reward trained on: reference = 10 on a win for household and shop (shop: WebShop score 1), "
                "exact match for search; env = the environment's own reward."})
    output_dir: str = field(default="runs/{experiment}/{arm}-seed{seed}", metadata={
        "help": "Where the run writes (history, final policy, checkpoints by default); {experiment}, {arm} and "
                "{seed} are filled in."})
    tracking: bool = field(default=True, metadata={
        "help": "Log to MLflow (SQLite under output_dir unless MLFLOW_TRACKING_URI is set)."})
    report_to: list[str] = field(default_factory=lambda: ["mlflow"], metadata={
        "help": "Where the numbers go besides the console (TRL's report_to): any of mlflow (when tracking is on), "
                "jsonl (<output_dir>/metrics.jsonl) and tensorboard (<output_dir>/tensorboard; pip install "
                "'sdar[tensorboard]')."})
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
                   "rollout.sampler": (self.rollout.sampler, SAMPLERS),
                   "warmstart.pretokenizer": (self.warmstart.pretokenizer, PRETOKENIZERS)}
        for key, (value, valid) in choices.items():
            if value not in valid:
                raise ValueError(f"{key}={value!r} is not one of {', '.join(valid)}")
        if isinstance(self.report_to, str):  # --set report_to=jsonl
            self.report_to = [self.report_to]

        if unknown := [r for r in self.report_to if r not in REPORT_TO]:
            raise ValueError(f"report_to={self.report_to!r}: {', '.join(map(repr, unknown))} is not one of "
                             f"{', '.join(REPORT_TO)}")
        if not (isinstance(self.scoring.packed, bool) or self.scoring.packed == "auto"):
            raise ValueError(f"scoring.packed={self.scoring.packed!r} is not one of true, false, auto")
        # every command that reads it samples or scores at it (sdar eval's teacher gap too); evaluation
        # decodes at eval.temperature
        if self.rollout.temperature <= 0:
            raise ValueError(f"rollout.temperature={self.rollout.temperature}: RL samples its rollouts and "
                             "scores them at that temperature, so it must be > 0 (paper: 1.0); greedy decoding "
                             "is for evaluation (eval.temperature: 0)")
        check_numbers(self, NUMBER_BOUNDS)
        try:  # the arm's own checks (loss_type, importance_sampling_level, agg), after its numbers'
            self.resolved_arm()
        except ValueError as e:
            raise ValueError(f"arm_overrides: {e}") from None

    def resolved_arm(self) -> ArmConfig:
        """The arm the loss uses: `arm` with `arm_overrides` applied."""
        return get_arm(self.arm, **self.arm_overrides)

    def resolved_output_dir(self) -> Path:
        return Path(self.output_dir.format(experiment=self.experiment, arm=self.arm, seed=self.seed))

    def resolved_sampler(self, device: torch.device | str | None = None) -> str:
        """rollout.sampler, with auto decided for `device` (default: resolved_device()): lookahead on CUDA (one packed
        forward per turn: 2.9-3.1x faster RL steps at the Qwen2.5-0.5B shape on an H200), batched elsewhere (on 2 CPU
        cores the lookahead's packed forward of every admissible response does not pay: it forwards 5-7x the
        positions decoding does). docs/benchmarks.md has the figures."""
        if self.rollout.sampler != "auto":
            return self.rollout.sampler
        return "lookahead" if _device_type(device or self.resolved_device()) == "cuda" else "batched"

    def resolved_packed(self, device: torch.device | str | None = None) -> bool:
        """scoring.packed, with auto decided for `device` as resolved_sampler decides: packed on CUDA."""
        if self.scoring.packed != "auto":
            return bool(self.scoring.packed)
        return _device_type(device or self.resolved_device()) == "cuda"

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
        """The store the run's checkpoints live in (each under its `checkpoints/` prefix): checkpoint.uri, else the
        output directory, so that they are <output_dir>/checkpoints/step-NNNNNN. A run written before 0.9 kept them one
        level deeper (<output_dir>/checkpoints/checkpoints/...): its store stays <output_dir>/checkpoints, so that
        it resumes where it was."""
        if self.checkpoint.uri:
            return self.checkpoint.uri
        out = self.resolved_output_dir()
        return str(out / "checkpoints") if (out / "checkpoints" / "checkpoints").is_dir() else str(out)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)



# The bound of every numeric setting that has one, as its field declares it (arm_overrides.*: the ArmConfig fields
# a config may set): what TrainConfig.validate checks each number against.
NUMBER_BOUNDS = {**field_bounds(TrainConfig), **field_bounds(ArmConfig, "arm_overrides.", OVERRIDABLE)}


def _device_type(device) -> str:
    """"cuda" for a CUDA device (a torch.device or its name, "cuda:1" too), else its type."""
    return str(getattr(device, "type", device)).split(":")[0]
