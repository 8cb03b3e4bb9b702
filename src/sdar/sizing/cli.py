"""The `sdar size` command (alias `sdar plan`, its name before the sizing package): the settings
from flags and a training config, the sizing as tables or JSON, and the exit status."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sdar.console import make_console
from sdar.sizing.fit import Sizing, size_run
from sdar.sizing.prices import INSTANCE_BY_NAME
from sdar.sizing.render import render
from sdar.sizing.settings import (
    CONFIG_KEYS,
    ConfigSettings,
    SizingSettings,
    resolve_config_model,
    settings_from_config,
)
from sdar.sizing.units import SizingError


def register(sub: argparse._SubParsersAction) -> None:
    d = SizingSettings()
    p = sub.add_parser(
        "size",
        aliases=["plan"],
        help="GPU memory per model role and the cost of a run (sizing a cluster)",
        description="Memory per GPU of the four model roles of the SDAR loop (actor, reference, "
        "vLLM rollout engine, teacher), whether they fit, the AWS instance to rent and the cost.",
        epilog="Exit status: 0 fits, 1 does not fit (the sizing and what would fit are printed), "
        "2 bad input.",
    )
    _add_model_arguments(p)
    _add_gpu_arguments(p, d)
    _add_batch_arguments(p, d)
    _add_rollout_arguments(p, d)
    _add_cost_arguments(p, d)
    _add_output_arguments(p)
    p.set_defaults(func=_cmd_size)


def _cmd_size(args: argparse.Namespace) -> int:
    flags = {f: getattr(args, f) for f in SizingSettings.__dataclass_fields__
             if getattr(args, f, None) is not None}
    try:
        from_config = settings_from_config(args.config) if args.config else None
        sizing = _size(args, flags, from_config)
    except SizingError as exc:
        print(f"sdar {getattr(args, 'command', None) or 'size'}: error: {exc}", file=sys.stderr)
        return 2
    config_info = None if from_config is None else _config_info(from_config, flags, args.model)
    if args.json:
        data = sizing.to_dict()
        if config_info is not None:
            data["config"] = config_info
        print(json.dumps(data, indent=2))
    else:
        console = make_console(width=args.width) if args.width else make_console(min_width=120)
        if config_info is not None:
            _render_config(config_info, console)
        render(sizing, console)
    return 0 if sizing.fits else 1


def _size(args: argparse.Namespace, flags: dict[str, Any],
          from_config: ConfigSettings | None) -> Sizing:
    """The sizing of --model (or the config's model) with the config's settings, overridden by the
    flags given explicitly; --gpu-mem defaults to the --instance's cards, else 80 GiB."""
    settings: dict[str, Any] = dict(from_config.settings) if from_config is not None else {}
    settings.update(flags)  # an explicit flag wins over the config
    if args.gpu_mem is None:
        inst = INSTANCE_BY_NAME.get(args.instance)
        settings["gpu_mem"] = inst.gpu_mem if inst else 80.0
    if args.model is not None:
        return size_run(args.model, **settings)
    if from_config is None:
        raise SizingError("give --model (a name, a size or a config.json path) or --config "
                          "(a training config, e.g. configs/paper/alfworld-qwen2.5-7b.yaml)")
    arch, source = resolve_config_model(from_config.model, from_config.path)
    sizing = size_run(arch, **settings)
    sizing.memory.source = source
    return sizing


def _config_info(from_config: ConfigSettings, flags: dict[str, Any],
                 model: str | None) -> dict[str, Any]:
    """The JSON `config` block: each value read from the config and its key, and what flags
    overrode."""
    return {
        "path": from_config.path,
        "model": from_config.model,
        "model_used": model is None,
        "read": {k: {"value": v, "from": CONFIG_KEYS[k]}
                 for k, v in from_config.settings.items() if k not in flags},
        "overridden_by_flags": sorted(k for k in from_config.settings if k in flags)
        + (["model"] if model is not None else []),
        "not_read": from_config.skipped,
    }


def _render_config(info: dict[str, Any], console) -> None:
    """One line: the settings taken from the training config (JSON `config.read` says from which
    keys), and those that flags overrode."""
    read = ", ".join(f"{k} {v['value']}" for k, v in info["read"].items())
    model = f"model.name_or_path {info['model']}"
    if not info["model_used"]:
        model += ", not used: --model"
    console.print(f"settings from [bold]{info['path']}[/bold] ({model}): {read}")
    if info["overridden_by_flags"]:
        console.print(f"flags override the config's: {', '.join(info['overridden_by_flags'])}")
    for key, why in info["not_read"].items():
        console.print(f"[dim]{key} not read: {why}[/dim]")


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The model and the training config it may come from."""
    p.add_argument(
        "--config",
        default=None,
        help="a training config (e.g. configs/paper/alfworld-qwen2.5-7b.yaml): the model, LoRA "
        "or full, GPUs (launch.nodes x launch.gpus_per_node), group size, tasks per step, "
        "micro-batch, sequence length (rollout.max_prompt_tokens + max_response_tokens), "
        "teacher extra tokens (teacher.max_prompt_tokens - rollout.max_prompt_tokens) and steps "
        "come from it; a flag given explicitly overrides it",
    )
    p.add_argument(
        "--model",
        default=None,
        help="Qwen2.5-0.5B/1.5B/3B/7B/14B (Qwen/Qwen2.5-7B-Instruct works too), SmolLM2-135M, "
        "tiny; a size (7b, 7e9); or a config.json path. Required unless --config gives "
        "model.name_or_path (this flag then overrides it)",
    )


def _add_gpu_arguments(p: argparse.ArgumentParser, d: SizingSettings) -> None:
    """The GPUs and what the training state holds on them."""
    p.add_argument("--gpus", type=int, default=None, help=f"GPUs in the run (default {d.gpus})")
    p.add_argument(
        "--gpu-mem",
        type=float,
        default=None,
        help="GiB per GPU, the card's nominal size (default 80, or the --instance's)",
    )
    p.add_argument(
        "--lora",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="LoRA adapter on a frozen base; --no-lora: a full fine-tune (default: full)",
    )
    p.add_argument("--lora-r", type=int, default=None, help=f"LoRA rank (default {d.lora_r})")
    p.add_argument(
        "--shard",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="FSDP sharding of weights, grads and Adam over the training GPUs as sdar.train.fsdp does it (default: "
             "a config's distributed.strategy, else on)",
    )
    p.add_argument(
        "--checkpointing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="gradient checkpointing (default on)",
    )


def _add_batch_arguments(p: argparse.ArgumentParser, d: SizingSettings) -> None:
    """The sequences of one RL step."""
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help=f"tokens per turn-sample, prompt + response (default {d.seq_len} = 2048 + 512)",
    )
    p.add_argument(
        "--teacher-extra-tokens",
        type=int,
        default=None,
        help=f"skills tokens prepended to the teacher's prompt (default {d.teacher_extra_tokens})",
    )
    p.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help=f"sequences per GPU per forward/backward (default {d.micro_batch})",
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=None,
        help=f"G rollouts per task (default {d.group_size})",
    )
    p.add_argument(
        "--tasks-per-step",
        type=int,
        default=None,
        help=f"tasks per RL step (default {d.tasks_per_step})",
    )


def _add_rollout_arguments(p: argparse.ArgumentParser, d: SizingSettings) -> None:
    """Where vLLM runs and how much of each card it and the rest may take."""
    p.add_argument(
        "--colocate",
        action=argparse.BooleanOptionalAction,
        default=d.colocate,
        help="vLLM on the training GPUs, asleep while scoring/updating, as verl does (default); "
        "--no-colocate splits the GPUs",
    )
    p.add_argument(
        "--rollout-gpus",
        type=int,
        default=None,
        help="with --no-colocate: GPUs for vLLM (default half)",
    )
    p.add_argument(
        "--rollout-tp",
        type=int,
        default=None,
        help="vLLM tensor-parallel size (default: the smallest whose KV pool holds the batch)",
    )
    p.add_argument(
        "--vllm-mem-util",
        type=float,
        default=None,
        help="vLLM gpu_memory_utilization (default 0.35 colocated, 0.85 on dedicated GPUs)",
    )
    p.add_argument(
        "--headroom",
        type=float,
        default=d.headroom,
        help=f"share of each card kept free for CUDA context and fragmentation "
        f"(default {d.headroom})",
    )


def _add_cost_arguments(p: argparse.ArgumentParser, d: SizingSettings) -> None:
    """What a run costs: its length, the instance and its price."""
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"RL steps per run (default {d.steps}, the paper's)",
    )
    p.add_argument(
        "--step-seconds",
        type=float,
        default=d.step_seconds,
        help=f"wall seconds per RL step: your input (default {d.step_seconds:g}, a placeholder "
        "for a 16-task x 8-rollout household step of up to 50 turns on 8 A100/H100; "
        "measure a few steps with `sdar train` and pass the number)",
    )
    p.add_argument(
        "--runs", type=int, default=d.runs, help="training runs priced, arms x seeds (default 1)"
    )
    p.add_argument(
        "--instance",
        default=None,
        help="price this instance type instead of the cheapest that fits",
    )
    p.add_argument(
        "--price",
        type=float,
        default=None,
        help="on-demand USD per instance hour (overrides the table)",
    )
    p.add_argument(
        "--spot", action="store_true", help="rank instances and headline the cost by spot price"
    )
    p.add_argument(
        "--spot-discount",
        type=float,
        default=d.spot_discount,
        help=f"spot = on-demand x (1 - discount) (default {d.spot_discount}; "
        "check the spot price history)",
    )
    p.add_argument(
        "--spot-price",
        type=float,
        default=None,
        help="spot USD per instance hour (overrides the discount)",
    )
    p.add_argument(
        "--spot-overhead",
        type=float,
        default=d.spot_overhead,
        help=f"extra wall time on spot for interruptions and restarts (default {d.spot_overhead})",
    )


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    """Tables or JSON."""
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--width", type=int, default=None, help=argparse.SUPPRESS)
