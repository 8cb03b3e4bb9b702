"""The knobs of a sizing (SizingSettings, with their defaults and checks), and reading them from a
training config (`sdar size --config`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdar.sizing.arch import Arch, resolve_model
from sdar.sizing.prices import INSTANCE_BY_NAME, INSTANCES
from sdar.sizing.units import GiB, SizingError


@dataclass
class SizingSettings:
    """Every knob of a sizing, with its default. Paper defaults (../shared/ALGORITHM.md) where the
    paper gives one; the sequence lengths follow verl-agent's ALFWorld script."""

    gpus: int = 8  # GPUs in the run
    gpu_mem: float = 80.0  # GiB per GPU (nominal card size)
    lora: bool = False  # LoRA adapter (base frozen) instead of a full fine-tune
    lora_r: int = 16  # LoRA rank on q, k, v, o, gate, up, down
    shard: bool = True  # FSDP (distributed.strategy fsdp): weights, grads and Adam sharded over the training GPUs
    checkpointing: bool = True  # gradient checkpointing: keep only each layer's input
    seq_len: int = 2560  # tokens of one turn-sample: prompt 2048 + response 512
    teacher_extra_tokens: int = 1024  # privileged skills prepended to the teacher's prompt
    micro_batch: int = 2  # sequences per forward/backward on one GPU (training and scoring)
    group_size: int = 8  # G rollouts per task (paper)
    tasks_per_step: int = 16  # tasks per RL step (paper; 128 for search)
    colocate: bool = True  # vLLM on the training GPUs, asleep during scoring/update (as verl does)
    rollout_gpus: int | None = None  # split mode: GPUs that only run vLLM (default: half)
    rollout_tp: int | None = None  # vLLM tensor parallel (default: smallest holding the batch)
    vllm_mem_util: float | None = None  # vLLM gpu_memory_utilization (0.35 colocated, 0.85 split)
    headroom: float = 0.10  # share of each card kept free: CUDA context, NCCL, fragmentation
    steps: int = 150  # RL steps per run (paper)
    step_seconds: float = 600.0  # wall seconds per RL step: a user input (--step-seconds help)
    runs: int = 1  # training runs priced (arms x seeds)
    instance: str | None = None  # force an instance type (default: the cheapest that fits)
    price: float | None = None  # override the on-demand USD/hour of the instance
    spot: bool = False  # rank and headline by spot price
    spot_discount: float = 0.6  # spot price = on-demand * (1 - discount); check the spot history
    spot_price: float | None = None  # USD/hour of one spot instance (overrides the discount)
    spot_overhead: float = 0.10  # extra wall time on spot: interruptions, restarts from checkpoints

    def validate(self) -> None:
        def positive(name: str, value: float | None, allow_none: bool = False) -> None:
            if value is None and allow_none:
                return
            if value is None or value <= 0:
                raise SizingError(f"--{name.replace('_', '-')} must be > 0, got {value}")

        for name in ("gpus", "gpu_mem", "lora_r", "seq_len", "micro_batch", "group_size",
                     "tasks_per_step", "steps", "step_seconds", "runs"):
            positive(name, getattr(self, name))
        for name in ("rollout_gpus", "rollout_tp", "price", "spot_price"):
            positive(name, getattr(self, name), allow_none=True)
        if self.teacher_extra_tokens < 0:
            raise SizingError(
                f"--teacher-extra-tokens must be >= 0, got {self.teacher_extra_tokens}"
            )
        if self.vllm_mem_util is not None and not 0 < self.vllm_mem_util < 1:
            raise SizingError(f"--vllm-mem-util must be in (0, 1), got {self.vllm_mem_util}")
        if not 0 <= self.headroom < 1:
            raise SizingError(f"--headroom must be in [0, 1), got {self.headroom}")
        if not 0 <= self.spot_discount < 1:
            raise SizingError(f"--spot-discount must be in [0, 1), got {self.spot_discount}")
        if self.spot_overhead < 0:
            raise SizingError(f"--spot-overhead must be >= 0, got {self.spot_overhead}")
        if not self.colocate:
            if self.gpus < 2:
                raise SizingError(
                    "a split (--no-colocate) needs at least 2 GPUs: one for vLLM, one to train; "
                    "use --colocate on a single GPU"
                )
            k = self.split_rollout_gpus
            if not 1 <= k < self.gpus:
                raise SizingError(
                    f"--rollout-gpus must leave at least one training GPU: 1 <= {k} < {self.gpus}"
                )
        if self.instance is not None and self.instance not in INSTANCE_BY_NAME:
            raise SizingError(
                f"unknown instance {self.instance!r}; choose one of "
                + ", ".join(i.name for i in INSTANCES)
            )

    @property
    def split_rollout_gpus(self) -> int:
        return self.rollout_gpus if self.rollout_gpus is not None else self.gpus // 2

    @property
    def train_gpus(self) -> int:
        return self.gpus if self.colocate else self.gpus - self.split_rollout_gpus

    @property
    def n_rollout_gpus(self) -> int:
        return self.gpus if self.colocate else self.split_rollout_gpus

    @property
    def util(self) -> float:
        if self.vllm_mem_util is not None:
            return self.vllm_mem_util
        # colocated: sdar's VLLMBackend default; dedicated GPUs: below vLLM's own 0.9, so that
        # the card keeps the same headroom as the training GPUs and a little more
        return 0.35 if self.colocate else 0.85

    @property
    def rollout_sequences(self) -> int:
        return self.group_size * self.tasks_per_step

    @property
    def usable_bytes(self) -> float:
        return self.gpu_mem * GiB * (1 - self.headroom)


# SizingSettings field -> the training-config value it is read from (`sdar size --config`)
CONFIG_KEYS: dict[str, str] = {
    "gpus": "launch.nodes * launch.gpus_per_node",
    "lora": "model.lora",
    "shard": "distributed.strategy == fsdp",
    "lora_r": "model.lora_r",
    "checkpointing": "model.gradient_checkpointing",
    "seq_len": "rollout.max_prompt_tokens + rollout.max_response_tokens",
    "teacher_extra_tokens": "teacher.max_prompt_tokens - rollout.max_prompt_tokens",
    "micro_batch": "ppo.micro_batch_size",
    "group_size": "group_size",
    "tasks_per_step": "tasks_per_step",
    "steps": "steps",
}


@dataclass
class ConfigSettings:
    """What a training config (`sdar.config.load_config`) says about a sizing: the model's name as
    the config writes it, the SizingSettings read from it, and why a setting was not read."""

    path: str
    model: str
    settings: dict[str, Any]
    skipped: dict[str, str] = field(default_factory=dict)


def settings_from_config(path: str | Path) -> ConfigSettings:
    """The sizing settings a training config describes (the keys in CONFIG_KEYS): model, LoRA or
    full, GPUs (launch.nodes x launch.gpus_per_node), group size, tasks per step, micro-batch,
    sequence length (prompt + response), the teacher's extra tokens (its prompt budget beyond the
    student's) and steps. A config without GPUs (launch.gpus_per_node 0) leaves `gpus` to the
    default or --gpus."""
    from sdar.config import load_config

    try:
        cfg = load_config(path)
    except (OSError, ValueError, TypeError) as exc:
        raise SizingError(f"cannot read the training config {path}: {exc}") from None
    r, m = cfg.rollout, cfg.model
    out: dict[str, Any] = {
        "lora": m.lora,
        "shard": cfg.distributed.strategy == "fsdp",
        "checkpointing": m.gradient_checkpointing,
        "seq_len": r.max_prompt_tokens + r.max_response_tokens,
        "teacher_extra_tokens": max(0, cfg.teacher.max_prompt_tokens - r.max_prompt_tokens),
        "micro_batch": cfg.ppo.micro_batch_size,
        "group_size": cfg.group_size,
        "tasks_per_step": cfg.tasks_per_step,
        "steps": cfg.steps,
    }
    skipped: dict[str, str] = {}
    if m.lora:
        out["lora_r"] = m.lora_r
    gpus = cfg.launch.nodes * cfg.launch.gpus_per_node
    if gpus > 0:
        out["gpus"] = gpus
    else:
        skipped["gpus"] = (f"launch.gpus_per_node is {cfg.launch.gpus_per_node} (a CPU run): "
                           "the planner's default or --gpus")
    return ConfigSettings(str(path), m.name_or_path, out, skipped)


def resolve_config_model(name: str, path: str | Path) -> tuple[Arch, str]:
    """`resolve_model` for a config's model.name_or_path ("Qwen/Qwen2.5-7B-Instruct" is the table's
    Qwen2.5-7B), with an error that says the sizing does not know it and what to pass instead."""
    try:
        arch, source = resolve_model(name)
    except SizingError as exc:
        raise SizingError(
            f"the model of {path}, model.name_or_path {name!r}, is unknown to the planner ({exc}); "
            "pass --model with a known name, its size (e.g. 7b) or its config.json path"
        ) from None
    return arch, f"{source}; model.name_or_path {name} in {path}"
