"""`sdar demo`: the product's main job on the embedded local default.

Until the comparison pipeline lands, the demo is the algorithm self-check: the three arms
train a toy token-level policy against a privileged teacher, with the real loss code.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from sdar.console import make_console
from sdar.pipeline.settings import arms_at_once


@dataclass
class ToyConfig:
    """A contextual token bandit: T positions, V tokens each, reward = share of correct tokens."""

    vocab: int = 8
    length: int = 6
    group_size: int = 8  # G rollouts per task, as in the paper
    tasks_per_step: int = 4
    steps: int = 60
    lr: float = 0.05
    teacher_boost: float = 2.0  # how much the privileged context favours the right token
    misleading_positions: int = 1  # positions where the skills point at a wrong token
    seed: int = 0


def run_arm(arm_name: str, cfg: ToyConfig) -> list[dict[str, float]]:
    """Train one arm; returns per-step metrics (reward, gap, gate)."""
    import torch

    from sdar.algos import LossBatch, compose_loss, entropy_per_token, get_arm, grpo_advantages

    g = torch.Generator().manual_seed(cfg.seed)
    target = torch.randint(0, cfg.vocab, (cfg.length,), generator=g)
    skill = target.clone()
    skill[: cfg.misleading_positions] = (target[: cfg.misleading_positions] + 1) % cfg.vocab
    logits = torch.zeros(cfg.length, cfg.vocab, requires_grad=True)
    ref_logits = logits.detach().clone()
    opt = torch.optim.Adam([logits], lr=cfg.lr)
    arm = get_arm(arm_name)
    history = []
    n = cfg.group_size * cfg.tasks_per_step
    for _ in range(cfg.steps):
        with torch.no_grad():
            old = torch.log_softmax(logits, -1)
            tokens = torch.multinomial(old.exp(), n, replacement=True, generator=g).T  # [n, T]
            teacher_logits = logits + cfg.teacher_boost * torch.nn.functional.one_hot(skill, cfg.vocab)
            teacher = torch.log_softmax(teacher_logits, -1)
            ref = torch.log_softmax(ref_logits, -1)
            rewards = (tokens == target).float().mean(-1)
            groups = torch.arange(n) // cfg.group_size
        pick = lambda lp: lp.gather(-1, tokens.T).T  # noqa: E731 - [n, T] log-probs of the samples
        cur = torch.log_softmax(logits, -1)
        batch = LossBatch(
            logp=pick(cur), old_logp=pick(old), advantages=grpo_advantages(rewards, groups),
            mask=torch.ones(n, cfg.length), ref_logp=pick(ref), teacher_logp=pick(teacher),
            entropy=entropy_per_token(logits).expand(n, -1),
        )
        total, metrics = compose_loss(arm, batch)
        opt.zero_grad()
        total.backward()
        opt.step()
        history.append({
            "reward": rewards.mean().item(),
            "gap": metrics["sdar/gap_mean"].item(),
            "gate": metrics["sdar/gate_mean"].item(),
        })
    return history


# `make demo`: the comparison pipeline at a size that fits about 15 minutes on 2 cores
# (a smaller warm start than configs/household-tiny.yaml, a few RL steps per arm). 300 expert
# episodes (~630 SFT updates, ~3.5 min): the student wins ~20% of held-out tasks; 120 won none.
# Each held-out task is played at 2 sampling draws (the same draws for every policy of a seed), so the paired
# differences from the warm start have an interval over tasks and draws.
DEMO_SIZES = {
    "steps": 4,
    "tasks_per_step": 2,
    "group_size": 4,
    "eval_tasks": 24,
    "episodes_per_task": 2,
    "overrides": {"warmstart.episodes": 300, "warmstart.epochs": 2, "eval.every": 2, "checkpoint.every": 2},
}


# `make demo DEMO=smollm2`: the same comparison on a real pretrained model, SmolLM2-135M-Instruct warm-started on the
# experts' episodes (configs/household-smollm2.yaml; its warm start is built once, cached, before the arms train), at a
# size that fits about 30 minutes on 2 cores once that warm start is cached (measured at fa943cc: 53.8 minutes from an
# empty cache, 31.5 of them the warm start's build, README): 4 RL steps per arm of 2 tasks x 4 rollouts in bfloat16,
# each policy on the same 24 held-out tasks.
SMOLLM2_SIZES = {
    "config_path": "configs/household-smollm2.yaml",
    "experiment": "sdar-comparison-smollm2",
    "steps": 4,
    "tasks_per_step": 2,
    "group_size": 4,
    "eval_tasks": 24,
    "episodes_per_task": 1,
    "overrides": {"eval.every": 2, "checkpoint.every": 2},
}


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.selfcheck:
        return _selfcheck(args)
    from sdar.pipeline.cli import run_comparison

    arms = args.arms.split(",")
    if args.mode == "quick":
        res = run_comparison(arms=arms, quick=True, parallelism=args.parallel)
    else:
        res = run_comparison(arms=arms, parallelism=args.parallel,
                             **(SMOLLM2_SIZES if args.mode == "smollm2" else DEMO_SIZES))
    return 0 if res.get("status") == "SUCCEEDED" else 1


def _selfcheck(args: argparse.Namespace) -> int:
    from rich.table import Table

    from sdar.algos import get_arm

    console = make_console()
    cfg = ToyConfig(steps=30 if args.mode == "quick" else 60)
    console.print(
        "[bold]sdar algorithm self-check[/bold]: a toy token policy trained by each arm with the real loss code."
    )
    table = Table(title=f"toy bandit, {cfg.steps} steps, G={cfg.group_size}, {cfg.tasks_per_step} tasks/step")
    for col in ("arm", "reward first 5", "reward last 5", "gap (teacher - student) last", "gate mean last"):
        table.add_column(col, justify="right")
    failures = []
    for name in args.arms.split(","):
        h = run_arm(name, cfg)
        first = sum(x["reward"] for x in h[:5]) / 5
        last = sum(x["reward"] for x in h[-5:]) / 5
        table.add_row(name, f"{first:.3f}", f"{last:.3f}", f"{h[-1]['gap']:+.3f}", f"{h[-1]['gate']:.3f}")
        if not last > first + 0.15:
            failures.append(f"{name}: reward did not improve ({first:.3f} -> {last:.3f})")
        if get_arm(name).gate_beta == 0.0 and abs(h[-1]["gate"] - 0.5) > 1e-6:
            failures.append(f"{name}: the naive gate should be exactly 0.5, got {h[-1]['gate']}")
    console.print(table)
    for f in failures:
        console.print(f"[red]FAILED[/red] {f}")
    if not failures:
        console.print("[green]self-check passed[/green]: every arm learns; the naive arm's gate is 0.5.")
    return 1 if failures else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the main job on the embedded local default")
    p.add_argument("--mode", choices=("full", "quick", "smollm2"), default="full",
                   help="quick = a smaller smoke run; smollm2 = the comparison on SmolLM2-135M-Instruct, a real "
                        "pretrained model, warm-started (about 22 min on 2 cores with its warm start cached, 54 from an empty "
                        "cache)")
    p.add_argument("--arms", default="grpo,grpo_opsd,sdar", help="comma-separated arms")
    p.add_argument("--parallel", type=arms_at_once, default=None, metavar="N",
                   help="arms trained at once (default 2; 1 = one at a time: one training process's memory "
                        "instead of two, slower; the SmolLM2 demo peaked at 22 GiB with two of its arms at once)")
    p.add_argument("--selfcheck", action="store_true",
                   help="only the algorithm self-check (a toy token policy per arm, seconds, no pipeline)")
    p.set_defaults(func=_cmd_demo)
