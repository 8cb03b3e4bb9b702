"""The warm start of a pretrained checkpoint (SmolLM2, a local directory, a hub id): supervised on the family's expert
episodes, in exactly the prompt and response format that training and evaluation use, before RL.

Why: RL learns from the differences between a group's rollouts; an untrained SmolLM2-135M wins none of the household
tasks, so every advantage is 0 and GRPO has nothing to learn from. The recipe is the tiny warm start's
(`sdar.train.imitation`: the expert's turns, half of them with the privileged skills and a skills-following expert,
so the teacher starts out ahead of the student as SDAR assumes), with three differences a pretrained model asks for:
- the model keeps its own tokenizer and chat template (no tokenizer is trained);
- the loss is the full-vocabulary negative log-likelihood of the expert's response (what TRL's SFTTrainer computes),
  not the tiny model's constrained choice among the admissible actions, so the result also acts when sampled freely
  (the way TRL and vLLM users sample), not only under constrained decoding;
- LoRA by default (`warmstart.lora`; full fine-tuning on request). The adapter is kept, not merged, in the cache
  (a few MB beside a base the name reloads); `load_policy` merges it into its base when training or evaluation
  loads the warm start, so the RL reference is the warm start and RL trains a fresh adapter on it.

Before and after, the checkpoint is evaluated on the same `warmstart.eval_tasks` held-out tasks (each episode with its
own sampling seed, so the two are paired draw for draw), constrained and sampled freely; the figures are printed,
kept in the entry's `warmstart.json` and logged to MLflow (a run `warmstart-<model>` in the config's experiment).
Cached by a hash of everything that changes the weights (`pretrained_key`); built once under a lock
(`sdar.models.cache.build_once`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from sdar.agent.prompts import PromptBuilder
from sdar.config import TrainConfig
from sdar.tracking import Tracker
from sdar.train.imitation import (
    expert_turns,
    sft,
    sft_examples,
    warmstart_config,
)
from sdar.train.warm_cache import (  # noqa: F401 - re-exported: the pretrained warm start's key and path
    MARKER,
    base_identity,
    pretrained_key,
    pretrained_path,
    wants_pretrained_warm_start,
    warm_dtype,
    warm_seed,
)


def pretrained_warm_start(cfg: TrainConfig, console=None) -> Path:
    """The cached warm start of `cfg`'s pretrained model, built on first use (under a lock: a concurrent command waits
    for the builder and is told which process builds it)."""
    from sdar.models.cache import build_once

    target = pretrained_path(cfg)
    if not (target / MARKER).is_file():
        if console is None:
            from sdar.console import make_console

            console = make_console(stderr=True)
        console.print(f"warm-starting {cfg.model.name_or_path} on the {cfg.env.family} experts' episodes "
                      f"(cached at {target}) ...", soft_wrap=True, highlight=False)
    say = (lambda msg: console.print(msg, soft_wrap=True, highlight=False)) if console is not None else None
    return build_once(target, lambda tmp: build_pretrained(cfg, tmp, console), MARKER, say=say)


def build_pretrained(cfg: TrainConfig, out_dir: Path, console=None) -> dict[str, Any]:
    """Supervise `cfg.model` on expert turns and save the result (the adapter, or every weight) into `out_dir`, with
    the held-out success before and after (`held_out`) in `out_dir/warmstart.json`, written last."""
    import torch

    from sdar.models import ModelSpec, load_policy
    from sdar.train.runtime import seed_everything

    t0 = time.perf_counter()
    wcfg = warmstart_config(cfg)
    ws, m = wcfg.warmstart, wcfg.model
    seed = warm_seed(cfg)
    seed_everything(seed)  # the adapter's initialisation draws from the global RNG
    dtype = warm_dtype(cfg)
    # the SFT runs as it was built and cached (cpu_mixed_precision is not in the cache key)
    policy = load_policy(ModelSpec.from_config(m, m.name_or_path, dtype=dtype, lora=ws.lora, cpu_mixed_precision=False))
    device = cfg.resolved_device()
    policy.to(device)
    before = held_out(cfg, policy, console, "untrained") if ws.eval_tasks else {}
    turns = expert_turns(wcfg, ws.episodes, seed=seed + 1, progress="warm start: expert episodes", console=console)
    builder = PromptBuilder(wcfg.env.family, history=wcfg.rollout.history, show_admissible=wcfg.rollout.show_admissible)
    tok = policy.tokenizer
    examples = sft_examples(wcfg, tok, builder, turns, constrained=False)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    stats = sft(policy.model, examples, pad_id=pad, epochs=ws.epochs, lr=ws.lr, batch_size=ws.batch_size,
                seed=seed, console=console, prompt_lm=ws.prompt_lm_weight)
    after = held_out(cfg, policy, console, "warm start") if ws.eval_tasks else {}
    policy.to("cpu").save(out_dir)
    info = {"model": m.name_or_path, "base": base_identity(m.name_or_path), "dtype": dtype, "lora": ws.lora,
            "device": str(device), "examples": len(examples), "episodes": ws.episodes,
            "privileged_examples": sum(t["privileged"] for t in turns),
            "trainable_parameters": policy.parameter_counts()["trainable"],
            "seconds": round(time.perf_counter() - t0, 1), "before": before, "after": after, **stats}
    del policy
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    report(cfg, info, console)
    _log(cfg, info)
    (out_dir / MARKER).write_text(json.dumps(info, indent=2))
    return info


def held_out(cfg: TrainConfig, policy, console=None, label: str = "") -> dict[str, Any]:
    """`policy` on the first `warmstart.eval_tasks` held-out tasks of `cfg`, at the eval temperature with the eval
    sampling seed (paired draw for draw with any other policy evaluated so): {constrained: ..., free: ...}, each
    {success, ci95, n, invalid_rate, well_formed_rate (free: the share of turns whose response held a well-formed
    action), admissible_rate (the share whose action was admissible), won (each task's 0/1, in the held-out order: what
    a paired difference with another policy reads)}."""
    from sdar.train.runtime import build_runtime

    out = {}
    for mode, constrained in (("constrained", True), ("free", False)):
        c = replace(cfg, rollout=replace(cfg.rollout, constrained=constrained))
        rt = build_runtime(c, policy=policy, train=False)
        tasks = rt.eval_tasks[: cfg.warmstart.eval_tasks]
        if console is not None:
            console.print(f"{label}: held-out success on {len(tasks)} tasks, {mode} decoding", highlight=False)
        res = rt.evaluate(tasks=tasks)
        turns = [t for tr in res.trajectories for t in tr.turns]
        n = max(len(turns), 1)
        won = {tr.task_id: int(tr.won) for tr in res.trajectories}  # one episode per task
        out[mode] = {"success": res.success, "ci95": list(res.ci95), "n": res.n, "invalid_rate": res.invalid_rate,
                     "well_formed_rate": sum(t.format_valid for t in turns) / n,
                     "admissible_rate": sum(t.valid for t in turns) / n, "turns": len(turns),
                     "won": [won[t] for t in tasks]}
    return out


def summary_rows(info: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(policy, constrained success [CI], free success [CI], free well-formed rate) for the untrained checkpoint and
    the warm start, from a `warmstart.json`."""
    def cell(r: dict | None) -> str:
        return f"{r['success']:.3f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]" if r else "-"

    rows = []
    for name, key in (("untrained", "before"), ("warm start", "after")):
        res = info.get(key) or {}
        free = res.get("free")
        rows.append((name, cell(res.get("constrained")), cell(free), f"{free['well_formed_rate']:.3f}" if free else "-"))
    return rows


def report(cfg: TrainConfig, info: dict[str, Any], console) -> None:
    """The before/after table of a build's `info` (its warmstart.json), on `console`."""
    if console is None or not (info.get("before") or info.get("after")):
        return
    from rich.table import Table

    n = (info.get("after") or info.get("before"))["constrained"]["n"]
    table = Table(title=f"{info['model']} warm start: held-out success on {n} tasks ({cfg.env.family}), "
                        f"{info['seconds'] / 60:.1f} min")
    for col in ("policy", "constrained", "sampled freely", "well-formed (free)"):
        table.add_column(col, justify="right")
    for row in summary_rows(info):
        table.add_row(*row)
    console.print(table)


def _log(cfg: TrainConfig, info: dict[str, Any]) -> None:
    """The build's figures as one MLflow run `warmstart-<model>` in the config's experiment (nothing with tracking
    off)."""
    tags = {"sdar.kind": "warmstart", "family": cfg.env.family, "sdar.warmstart": pretrained_path(cfg).name}
    metrics = {"warmstart/seconds": info["seconds"], "warmstart/sft_final_loss": info["sft_final_loss"],
               "warmstart/sft_updates": info["sft_updates"]}
    for when in ("before", "after"):
        for mode, r in (info.get(when) or {}).items():
            for k in ("success", "well_formed_rate", "admissible_rate"):
                metrics[f"warmstart/{when}/{mode}/{k}"] = r[k]
    slug = Path(str(info["model"]).rstrip("/")).name
    with Tracker(cfg.experiment, run_name=f"warmstart-{slug}", tags=tags, output_dir=cfg.output_dir,
                 enabled=None if cfg.tracking else False) as tracker:
        tracker.log_params({"model": info["model"], "lora": info["lora"], "dtype": info["dtype"],
                            **{f"warmstart.{k}": v for k, v in asdict(cfg.warmstart).items()}})
        tracker.log_metrics(metrics, step=0)
        tracker.log_dict(info, "warmstart.json")
