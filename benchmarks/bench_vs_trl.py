"""TRL's GRPOTrainer and `sdar train --arm grpo` side by side on the same work: one warm-started checkpoint, the same
tasks step by step, group size, turn limit, learning rate, LoRA rank and number of steps, the two interleaved a step
at a time in one process (a drifting machine slows both alike). Per side: seconds per step, trained tokens per step
(tokens a loss term reads: TRL's completion tokens less tool results; sdar's response tokens less, with
rollout.mask_forced_tokens, the ones constrained decoding forced) and trained tokens per second, the training
episodes' success, then held-out success of the warm start and of each side after the same steps, on the same tasks
with the same sampling seed (paired draw for draw), under constrained decoding and sampled freely; and of sdar at
TRL's wall-clock: sdar's further steps (on its own next tasks) while its total seconds stay within TRL's.

TRL trains through sdar's adapter (`sdar.integrations.trl`: our prompts token for token, `<action>X</action>` replies
as `act` calls, in-process envs built from the config's env kwargs), on a copy of the very policy sdar trains (the warm
start merged into the base, a fresh LoRA adapter of the config's rank on the same modules, the same dtype); TRL keeps
one growing conversation per episode and samples freely, sdar a fresh prompt per turn, constrained when the config
says so. Every setting that maps across is printed beside its counterpart; the ones that do not are listed.
The first step of each side warms up and is not in the medians. Run:
  .venv/bin/python benchmarks/bench_vs_trl.py [--config configs/household-smollm2.yaml] [--steps 3]
      [--tasks-per-step 2] [--group-size 4] [--eval-tasks 24] [--set KEY=VALUE] [--json OUT] [--smoke]
      [--no-equal-time] [--equal-time-max-steps N]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is experimental in TRL 1.16

# --smoke: the training tests' miniature of household-tiny (tests/train/conftest.py, the same cached warm start)
SMOKE = {"tasks_per_step": 1, "group_size": 2, "ppo.mini_batch_size": 8, "scoring.batch_size": 16,
         "teacher.max_prompt_tokens": 1536, "rollout.max_turns": 3, "rollout.max_prompt_tokens": 1024,
         "rollout.max_response_tokens": 12, "rollout.env_workers": 2, "warmstart.episodes": 24,
         "warmstart.tokenizer_episodes": 120, "warmstart.epochs": 1, "warmstart.eval_tasks": 2,
         "model.tiny_overrides": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                  "num_attention_heads": 2, "num_key_value_heads": 1}}


def parse_sets(items: list[str]) -> dict:
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE, e.g. --set optim.lr=1e-4")
        out[key] = yaml.safe_load(value)
    return out


def step_tasks(trainer, steps: int) -> list[list[str]]:
    """The distinct tasks of each of sdar's steps, in its order (TRL plays them in the same order, one row per task)."""
    return [list(dict.fromkeys(trainer.sample_tasks(s)[0])) for s in range(steps)]


def trl_side(cfg, policy, tasks: list[list[str]], out_dir: str, max_completion: int, micro: int):
    """TRL's GRPOTrainer over `policy` (trained in place), its dataset the tasks of each step in order, and the
    GRPOConfig mapped from `cfg`; returns (trainer, factory, config)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from sdar.integrations.trl import SdarEnvFactory, prepare_tokenizer

    arm, r = cfg.resolved_arm(), cfg.rollout
    rollout = replace(r, constrained=False, skills_in_prompt=False)  # TRL samples freely, never with the skills
    ids = [t for step in tasks for t in step]
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * len(ids), "task_id": ids})
    config = GRPOConfig(
        output_dir=out_dir, max_steps=len(tasks), num_generations=cfg.group_size,
        # one optimizer step per RL step over all its episodes, the loss `micro` episodes at a time: a whole
        # episode's logits are [tokens x vocabulary] in float32 (SmolLM2: 2,800 x 49,152 x 4 bytes = 0.55 GB a row)
        per_device_train_batch_size=micro, gradient_accumulation_steps=cfg.tasks_per_step * cfg.group_size // micro,
        shuffle_dataset=False, max_completion_length=max_completion, max_tool_calling_iterations=r.max_turns,
        temperature=r.temperature, top_p=1.0, top_k=0, learning_rate=cfg.optim.lr, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=cfg.optim.weight_decay, max_grad_norm=cfg.optim.grad_clip, beta=arm.kl_coef,
        epsilon=arm.clip_low, epsilon_high=arm.clip_high, num_iterations=cfg.ppo.epochs, loss_type="bnpo",
        scale_rewards="group", activation_checkpointing=cfg.model.gradient_checkpointing, use_cpu=True, bf16=False,
        report_to="none", logging_steps=1, save_strategy="no", seed=cfg.seed, dataloader_num_workers=0,
        disable_tqdm=True,  # the figures are this script's to print; TRL's log lines go nowhere (PrinterCallback removed)
    )
    tokenizer = prepare_tokenizer(copy.deepcopy(policy.tokenizer), cfg.env.family)
    tokenizer.padding_side = "left"
    factory = SdarEnvFactory(None, rollout, reward=cfg.reward, **cfg.env.kwargs)
    trainer = GRPOTrainer(policy.model, args=config, processing_class=tokenizer, train_dataset=dataset,
                          environment_factory=factory)
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    return trainer, factory, config


def settings_rows(cfg, config, max_completion: int) -> list[tuple[str, str, str]]:
    """(setting, sdar, TRL) for everything both sides are given."""
    arm, r, m = cfg.resolved_arm(), cfg.rollout, cfg.model
    return [
        ("model", f"{m.name_or_path} warm start, {m.dtype}", "the same module (a copy of sdar's policy)"),
        ("LoRA", f"r{m.lora_r}, alpha {m.lora_alpha}, fresh adapter", "the same adapter (peft), trained in place"),
        ("tasks x group per step", f"{cfg.tasks_per_step} x {cfg.group_size}",
         f"{config.generation_batch_size // config.num_generations} x {config.num_generations}"),
        ("micro-batch", f"{cfg.ppo.micro_batch_size} turn-samples",
         f"{config.per_device_train_batch_size} episodes ({config.gradient_accumulation_steps} accumulated)"),
        ("tasks", "sdar's sample_tasks(step)", "the same ids in the same order (shuffle_dataset false)"),
        ("turn limit", f"rollout.max_turns {r.max_turns}", f"max_tool_calling_iterations {config.max_tool_calling_iterations}"),
        ("response limit", f"{r.max_response_tokens} tokens a turn", f"{max_completion} tokens an episode (replies and tool results)"),
        ("prompt", f"fresh each turn, history {r.history}, <= {r.max_prompt_tokens} tokens",
         "one growing conversation (turn 1 identical)"),
        ("decoding", "constrained" if r.constrained else "free", "free"),
        ("temperature", f"{r.temperature}", f"{config.temperature} (top_p {config.top_p}, top_k {config.top_k})"),
        ("learning rate", f"{cfg.optim.lr:g} constant", f"{config.learning_rate:g} {getattr(config.lr_scheduler_type, 'value', config.lr_scheduler_type)}"),
        ("weight decay, grad clip", f"{cfg.optim.weight_decay:g}, {cfg.optim.grad_clip:g}",
         f"{config.weight_decay:g}, {config.max_grad_norm:g}"),
        ("KL to the warm start", f"{arm.kl_coef:g} (low-var KL)", f"beta {config.beta:g} (k3)"),
        ("clip", f"{arm.clip_low:g} / {arm.clip_high:g}, dual clip {arm.dual_clip}",
         f"{config.epsilon:g} / {config.epsilon_high:g}"),
        ("entropy bonus", f"{arm.entropy_coef:g}", "none"),
        ("loss aggregation", f"{arm.agg}, micro-batches of {cfg.ppo.micro_batch_size}", f"{config.loss_type}"),
        ("optimizer steps per step", f"turn-samples / {cfg.ppo.mini_batch_size} mini-batch, {cfg.ppo.epochs} epoch",
         f"1 ({config.num_iterations} iteration)"),
        ("advantage", "episode reward, group-normalised (GRPO), every turn", f"episode reward, scale_rewards {config.scale_rewards}"),
        ("reward", cfg.reward, cfg.reward),
    ]


def held_out(cfg, policy, console, label: str) -> dict:
    from sdar.train.warm_pretrained import held_out as evaluate

    return evaluate(cfg, policy, console, label=label)


def held_out_rows(cfg, policies: dict, console) -> dict:
    return {name: held_out(cfg, policy, console, label=name) for name, policy in policies.items()}


def run(args) -> dict:
    import torch

    from sdar.config import load_config
    from sdar.console import make_console
    from sdar.train import Trainer
    from sdar.train.warmstart import ensure_warm_start, load_warm_policy

    console = make_console(stderr=True)
    sets = {**(SMOKE if args.smoke else {}), **parse_sets(args.set)}
    if args.tasks_per_step:
        sets["tasks_per_step"] = args.tasks_per_step
    if args.group_size:
        sets["group_size"] = args.group_size
    if args.eval_tasks is not None:
        sets["warmstart.eval_tasks"] = args.eval_tasks
    steps = args.steps + 1  # the first step of each side warms up
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(args.config, {**sets, "arm": "grpo", "tracking": False, "output_dir": f"{tmp}/sdar",
                                        "teacher.for_all_arms": False, "eval.every": 0, "steps": steps})
        if cfg.resolved_device().type != "cpu":
            raise SystemExit("bench_vs_trl runs both sides on the CPU (TRL's use_cpu); set device: cpu")
        ensure_warm_start(cfg, console)
        torch.manual_seed(cfg.seed)
        ours = Trainer(cfg, console=console)
        torch.manual_seed(cfg.seed)
        theirs = load_warm_policy(cfg)  # the same module: warm start merged, a fresh adapter (B = 0: the same function)
        tasks = step_tasks(ours, steps)
        max_completion = args.max_completion or cfg.rollout.max_turns * (cfg.rollout.max_response_tokens + 256)
        from transformers import TrainerCallback

        rows = {"sdar": [], "trl": []}
        generations: list[dict] = []

        class Interleave(TrainerCallback):
            """After each TRL optimizer step, one sdar step on the same tasks; TRL's clock pauses meanwhile."""

            def on_train_begin(self, *a, **k):
                self.t0 = time.perf_counter()

            def on_step_end(self, a, state, control, **k):
                gen = generations[-1] if generations else {}
                rows["trl"].append({"step_s": time.perf_counter() - self.t0, **gen})
                step = state.global_step - 1
                t0 = time.perf_counter()
                res = ours.train_step(step)
                m = res.metrics
                rows["sdar"].append({"step_s": time.perf_counter() - t0, "trained_tokens": m["tokens/free"],
                                     "success": m["success"], "episodes": cfg.tasks_per_step * cfg.group_size,
                                     "turns": m["turn_samples"], "tasks": played[-1]})
                console.print(f"step {step + 1}/{steps}{' (warm-up)' if step == 0 else ''}: TRL {rows['trl'][-1]['step_s']:.1f} s, "
                              f"sdar {rows['sdar'][-1]['step_s']:.1f} s", highlight=False)
                self.t0 = time.perf_counter()

        played: list[list[str]] = []  # the tasks sdar's rollout played, step by step
        real_rollout = ours.rollout_phase

        def rollout_phase(step):
            r = real_rollout(step)
            played.append(list(dict.fromkeys(t.task_id for t in r.trajs)))
            return r

        ours.rollout_phase = rollout_phase
        batch = cfg.tasks_per_step * cfg.group_size
        micro = max(m for m in range(1, min(args.trl_micro, batch) + 1) if batch % m == 0)
        trl_trainer, factory, config = trl_side(cfg, theirs, tasks, f"{tmp}/trl", max_completion, micro)
        real = trl_trainer._generate_and_score_completions

        def counted(inputs):  # the tokens TRL's loss reads: completion tokens less tool results (its tool_mask)
            out = real(inputs)
            mask = out["completion_mask"] * out["tool_mask"] if out.get("tool_mask") is not None else out["completion_mask"]
            envs = factory.envs[-len(inputs):]
            generations.append({"trained_tokens": float(mask.sum()), "episodes": len(inputs),
                                "success": sum(e.won for e in envs) / max(len(envs), 1),
                                "turns": float(sum(e.turn for e in envs)),
                                "tasks": list(dict.fromkeys(row.get("task_id") for row in inputs))})
            return out

        trl_trainer._generate_and_score_completions = counted
        trl_trainer.add_callback(Interleave())
        try:
            trl_trainer.train()
        finally:
            factory.close()
        if len(rows["sdar"]) != steps:
            raise SystemExit(f"TRL ran {len(rows['trl'])} of {steps} steps; sdar {len(rows['sdar'])}")
        evals, extra = {}, []
        if cfg.warmstart.eval_tasks:
            torch.manual_seed(cfg.seed)
            evals = held_out_rows(cfg, {"warm start": load_warm_policy(cfg), "sdar": ours.policy, "trl": theirs},
                                  console)
            if args.equal_time:  # sdar goes on, on its own tasks, while its clock stays within TRL's
                extra = equal_time_steps(ours, rows, steps, cap=args.equal_time_max_steps, console=console)
                if extra:
                    evals[EQUAL_TIME] = held_out(cfg, ours.policy, console, label=EQUAL_TIME)
        return {"config": args.config, "steps": args.steps, "settings": settings_rows(cfg, config, max_completion),
                "rows": rows, "evals": evals, "tasks_per_step": cfg.tasks_per_step, "group_size": cfg.group_size,
                "model": cfg.model.name_or_path, "dtype": cfg.model.dtype, "eval_tasks": cfg.warmstart.eval_tasks,
                "equal_time": extra, "equal_time_cap": args.equal_time_max_steps}


EQUAL_TIME = "sdar at TRL's time"


def equal_time_steps(ours, rows: dict, done: int, cap: int, console, clock=time.perf_counter) -> list[dict]:
    """sdar's steps after the `done` interleaved ones while its wall-clock stays within TRL's: another step is taken
    only when the last step's seconds still fit in what is left of TRL's (so sdar ends within one step's variation of
    TRL's clock, not a step beyond it), at most `cap` of them (0: no cap); each {step, step_s, success}."""
    budget = sum(r["step_s"] for r in rows["trl"])
    spent = sum(r["step_s"] for r in rows["sdar"])
    last = rows["sdar"][-1]["step_s"]
    extra: list[dict] = []
    while (not cap or len(extra) < cap) and spent + last <= budget:
        t0 = clock()
        res = ours.train_step(done + len(extra))
        last = clock() - t0
        spent += last
        extra.append({"step": done + len(extra), "step_s": last, "success": res.metrics["success"]})
        console.print(f"sdar step {done + len(extra)} within TRL's time: {last:.1f} s ({spent:.0f} of {budget:.0f} s)",
                      highlight=False)
    return extra


def med(rows: list[dict], key: str, timed: slice) -> float:
    return statistics.median(r[key] for r in rows[timed])


def report(out: dict) -> str:
    import numpy as np

    from sdar.eval.stats import paired_difference

    total = len(out["rows"]["sdar"])
    timed = slice(1, None) if total > 1 else slice(None)
    n = len(out["rows"]["sdar"][timed])
    lines = [(f"model {out['model']} ({out['dtype']}), {out['config']}; {out['tasks_per_step']} tasks x "
              f"{out['group_size']} rollouts a step; " + (f"median of {n} timed step(s) after a warm-up" if
                                                          timed.start else "one step, no warm-up (the first step)")), "",
             "| setting | sdar train --arm grpo | TRL GRPOTrainer |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in out["settings"]]
    lines += ["", "| side | s / step | trained tokens / step | trained tokens / s | turns / step | train success |",
              "|---|---:|---:|---:|---:|---:|"]
    per = {}
    for side in ("sdar", "trl"):
        rows = out["rows"][side]
        s, tok = med(rows, "step_s", timed), med(rows, "trained_tokens", timed)
        per[side] = s
        succ = sum(r["success"] * r["episodes"] for r in rows[timed]) / max(sum(r["episodes"] for r in rows[timed]), 1)
        lines.append(f"| {side} | {s:.2f} | {tok:,.0f} | {tok / s:,.1f} | {med(rows, 'turns', timed):,.0f} | {succ:.3f} |")
    lines.append(f"\nsdar / TRL seconds per step: **{per['sdar'] / per['trl']:.2f}x**; wall-clock of the {total} steps: "
                 f"sdar {sum(r['step_s'] for r in out['rows']['sdar']):.1f} s, TRL {sum(r['step_s'] for r in out['rows']['trl']):.1f} s")
    extra = out.get("equal_time") or []
    if extra:
        trl_s = sum(r["step_s"] for r in out["rows"]["trl"])
        sdar_s = sum(r["step_s"] for r in out["rows"]["sdar"]) + sum(r["step_s"] for r in extra)
        capped = out.get("equal_time_cap") and len(extra) == out["equal_time_cap"] and sdar_s + extra[-1]["step_s"] <= trl_s
        lines.append(f"\nWithin TRL's wall-clock of {trl_s:.1f} s sdar took {len(extra)} more step(s) "
                     f"({total + len(extra)} in all, {sdar_s:.1f} s, {sdar_s / trl_s:.0%} of TRL's): the row "
                     f"'{EQUAL_TIME}' below" + (f"; stopped by --equal-time-max-steps {len(extra)} before TRL's "
                                                "clock ran out" if capped else ""))
    if out["evals"]:
        lines += ["", (f"Held-out success on {out['eval_tasks']} tasks after {total} steps"
                       + (f" ({EQUAL_TIME}: {total + len(extra)})" if extra else "")
                       + " (the same tasks and sampling seed for every policy), [95% Wilson interval]:"), "",
                  "| policy | constrained | sampled freely | well-formed (free) |", "|---|---:|---:|---:|"]
        for name, ev in out["evals"].items():
            c, f = ev["constrained"], ev["free"]
            lines.append(f"| {name} | {c['success']:.3f} [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}] | {f['success']:.3f} "
                         f"[{f['ci95'][0]:.2f}, {f['ci95'][1]:.2f}] | {f['well_formed_rate']:.3f} |")
        lines += ["", "| paired difference (same tasks, same draws) | constrained | sampled freely |", "|---|---:|---:|"]
        pairs = [("sdar", "trl"), ("sdar", "warm start"), ("trl", "warm start")]
        if EQUAL_TIME in out["evals"]:
            pairs.insert(1, (EQUAL_TIME, "trl"))
        for a, b in pairs:
            cells = []
            for mode in ("constrained", "free"):
                d, lo, hi = paired_difference(np.array([out["evals"][a][mode]["won"]], float),
                                              np.array([out["evals"][b][mode]["won"]], float))
                cells.append(f"{d:+.3f} [{lo:+.2f}, {hi:+.2f}]")
            lines.append(f"| {a} - {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/household-smollm2.yaml")
    p.add_argument("--steps", type=int, default=3, help="timed steps per side, after one warm-up step")
    p.add_argument("--tasks-per-step", type=int, default=None, help="default: the config's")
    p.add_argument("--group-size", type=int, default=None, help="default: the config's")
    p.add_argument("--eval-tasks", type=int, default=None,
                   help="held-out tasks for the after-training success (default: the config's warmstart.eval_tasks; 0: none)")
    p.add_argument("--max-completion", type=int, default=None,
                   help="TRL's max_completion_length, an episode's tokens (default: max_turns x (max_response_tokens + 256))")
    p.add_argument("--trl-micro", type=int, default=2,
                   help="episodes per TRL loss forward (its per_device_train_batch_size; the rest accumulated)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides, repeatable")
    p.add_argument("--smoke", action="store_true", help="the tests' miniature: tiny model, 1 task x 2, 3 turns")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--no-equal-time", dest="equal_time", action="store_false",
                   help="skip sdar's further steps within TRL's wall-clock and their evaluation")
    p.add_argument("--equal-time-max-steps", type=int, default=0,
                   help="at most this many further sdar steps within TRL's wall-clock (default 0: no cap, TRL's "
                        "clock alone stops them)")
    args = p.parse_args()
    if args.smoke and args.config == "configs/household-smollm2.yaml":
        args.config = "configs/household-tiny.yaml"
    out = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    print(report(out))


if __name__ == "__main__":
    main()
