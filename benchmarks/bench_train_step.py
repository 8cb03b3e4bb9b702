"""Seconds per RL step of GRPO and SDAR side by side on the same tasks, per phase (rollout, score, update): the
phase's seconds, its forwards of the model, positions per forward, the share of them that is padding, the seconds
outside the model (host: Python, sampling, environments, the optimizer) and, for the rollout, the host seconds per
decode step. Then SDAR/GRPO per phase and per step.

The model: `tiny` (the config's own model, warm-started), `smollm2` (SmolLM2-135M-Instruct's real weights, warm-started
when the config says so: configs/household-smollm2.yaml), or a published shape with random weights
(`qwen2.5-0.5b`, `qwen2.5-1.5b`: the configs in benchmarks/_shared.py, the Qwen2.5 tokenizer sdar.models.qwen
builds, no download); `--layers N` keeps the first N decoder layers (the same width and vocabulary, for a CPU).
Forwards are counted by hooks on the decoder's class (benchmarks/_shared.py:ForwardMeter), whichever module
object and function runs them; a decode step is a rollout forward on a KV cache. Every arm plays the same tasks
from the same start (same seed); GRPO skips the teacher (teacher.for_all_arms false), as a production GRPO run
would. The arms run interleaved, a step at a time, so a drifting machine slows them alike; the first step of each
warms up and is not reported.

--compare-off runs every arm again with every speed-up off. --modes picks the runs by name: on (the defaults: the
sampler and the scoring layout chosen for the device, packed on CUDA), padded (the CPU's layouts anywhere: decode steps, padded rows), off
(--compare-off), batched (issue 40's fast paths but the lookahead: every live row's token decided in one pass per
decode step, rollout.sampler=batched, and every scoring pass and update micro-batch one packed forward,
scoring.packed) and packed (the same with rollout.sampler=lookahead: a turn's constrained rows sampled from one packed
forward of their prompts and tries, no decode step; its host seconds per decode step print as "-"). --limits also times, on the last step's own batch, the
phases' raw limits with a plain module (a LoRA adapter merged in):
  rollout: a plain prefill (every prompt whole, the last position's logits) + one KV-cached decode step per
           non-forced token, turn by turn (no env, no trie);
  score:   a plain no-grad forward over the sequences each needed pass reads, length-bucketed like the trainer;
  update:  plain forward + backward + AdamW over the update's sequences in the same micro-batches.
For the arms with a teacher it prints the teacher pass's positions (padding included) beside the exact minimum, the
nodes of its sequences' prefix trie (`sdar.models.scoring.prefix_trie_positions`), and the SDAR/GRPO floor that
minimum implies at the same seconds per position. --floor (on for smollm2) prints each phase's arithmetic floor: its
forwarded positions x the decoder's linear FLOPs per position (2N no-grad, 4N for a LoRA update, 6N full) at the
matrix-multiply rate measured at the start of the same run, in the config's dtype (a forward with gradients counts
4N or 6N, a no-grad one 2N, wherever it runs). --ops (on for smollm2, CPU only) runs one more update on the last step's
batch under torch.profiler and prints where its seconds go, by each op's own CPU time: the matmuls of the decoder's
linear layers, of the LoRA adapter and of the output head (told apart by their recorded shapes, each with its FLOPs
and its multiple of the measured rate), attention (batched matmuls, softmax, masking, fused kernels) and everything
else, its largest ops named. Run:
  .venv/bin/python benchmarks/bench_train_step.py [--model tiny|smollm2|qwen2.5-0.5b|qwen2.5-1.5b] [--layers N] [--steps 2]
      [--config configs/household-tiny.yaml] [--set KEY=VALUE] [--compare-off] [--modes on,batched,packed] [--limits]
      [--ops] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import (
    QWEN25_SHAPES,
    REAL,
    SHAPES,
    ForwardMeter,
    is_checkpoint_dir,
    linear_flops_per_position,
    matmul_rate,
    model_arg,
    op_attribution,
    random_policy,
)

# the modes that run without the shortcuts that keep the numbers (sdar.train.runtime.Shortcuts.none(): no settings, a
# run takes them all); --compare-off adds mode off
SHORTCUTS_OFF = ("off",)
# the sampler's and the Scorer's layouts (default auto: packed on CUDA, decode steps and padded rows elsewhere): what
# --modes batched and packed set, and padded the CPU's choice wherever the run is (on a GPU, "on" is the packed path)
FAST = {"batched": {"rollout.sampler": "batched", "scoring.packed": True},
        "packed": {"rollout.sampler": "lookahead", "scoring.packed": True},
        "padded": {"rollout.sampler": "batched", "scoring.packed": False}}
# the precision a real model runs in, each on the defaults: fp32 against bf16 side by side (the same warm start, trained
# in the config's warmstart.dtype, loaded in each)
PRECISION = {"fp32": {"model.dtype": "float32"}, "bf16": {"model.dtype": "bfloat16"}}
MODES = {"on": {}, "off": {}, **FAST, **PRECISION}
# the trainer's named phases, Trainer.<name>_phase: the meter attributes each forward to the one running
PHASES = ("rollout", "score", "update")
# --smoke: the training tests' miniature of household-tiny (tests/train/conftest.py, the same warm start), one task
SMOKE = {"tasks_per_step": 1, "group_size": 2, "ppo.mini_batch_size": 8, "scoring.batch_size": 16,
         "teacher.max_prompt_tokens": 1536, "rollout.max_turns": 3, "rollout.max_prompt_tokens": 1024,
         "rollout.max_response_tokens": 12, "rollout.env_workers": 2, "warmstart.episodes": 24,
         "warmstart.tokenizer_episodes": 120, "warmstart.epochs": 1,
         "model.tiny_overrides": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                  "num_attention_heads": 2, "num_key_value_heads": 1}}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _buckets(seqs: list[list[int]], size: int) -> list[list[list[int]]]:
    order = sorted(seqs, key=len)
    return [order[i : i + size] for i in range(0, len(order), size)]


def _padded(rows: list[list[int]], pad: int, device, left: bool = False):
    import torch

    L = max(len(r) for r in rows)
    ids = torch.full((len(rows), L), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        sl = slice(L - len(r), L) if left else slice(0, len(r))
        ids[i, sl] = torch.tensor(r)
        mask[i, sl] = 1
    return ids.to(device), mask.to(device)


def limits(trainer, trajs) -> dict[str, float]:
    """Raw limits of the three phases for this batch (seconds)."""
    import copy

    import torch

    from sdar.models.kv_cache import cache_of, with_cache
    from sdar.models.scoring import free_token_mask, length_groups

    trained, cfg, pad = trainer.model, trainer.cfg, trainer.pad_id
    # the no-grad limits run a plain module (a LoRA adapter merged in: no per-layer wrappers), whatever the flags
    model = copy.deepcopy(trained).merge_and_unload() if trainer.policy.is_lora else trained
    device = next(model.parameters()).device
    turns = [t for tr in trajs for t in tr.turns]
    student = [t.prompt_ids + t.response_ids for t in turns]
    teacher = [p + t.response_ids for p, t in zip(trainer.teacher.prompts(trajs), turns)]
    was = model.training
    model.eval()
    out: dict[str, float] = {}
    with torch.no_grad():
        def forward(seqs):
            for rows in _buckets(seqs, cfg.scoring.batch_size):
                ids, mask = _padded(rows, pad, device)
                model(input_ids=ids, attention_mask=mask)

        out["student_forward_s"] = _timed(lambda: forward(student))
        out["teacher_forward_s"] = _timed(lambda: forward(teacher))

        def decode():  # lock-step turns: turn k's live rows decode together, one step per free token
            depth = max(len(tr.turns) for tr in trajs)
            for k in range(depth):
                live = [tr.turns[k] for tr in trajs if len(tr.turns) > k]
                for start in range(0, len(live), 64):  # the backend's chunk
                    rows = live[start : start + 64]
                    ids, mask = _padded([t.prompt_ids for t in rows], pad, device, left=True)
                    # the next token's logits only: a prefill needs no other position's
                    o = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
                    past, nxt = cache_of(o), o.logits[:, -1:].argmax(-1)
                    free = [int(free_token_mask([t.allowed], torch.ones(1, len(t.response_ids))).sum())
                            for t in rows]
                    for _ in range(max(free) - 1 if free else 0):
                        mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
                        o = model(input_ids=nxt, attention_mask=mask, **with_cache(past), use_cache=True)
                        past, nxt = cache_of(o), o.logits[:, -1:].argmax(-1)

        out["decode_s"] = _timed(decode)
    model.train(was)
    model = trained  # the update trains the real module (the adapter's gradients)
    params = [p for p in model.parameters() if p.requires_grad]
    snapshot = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=0.0)  # lr 0: the timing of a real step, the weights unchanged

    def update():
        for start in range(0, len(student), cfg.ppo.mini_batch_size):
            opt.zero_grad(set_to_none=True)
            mini = student[start : start + cfg.ppo.mini_batch_size]
            for m in range(0, len(mini), cfg.ppo.micro_batch_size):
                micro = mini[m : m + cfg.ppo.micro_batch_size]
                # rows of similar length per forward (the least padding), one backward per micro-batch
                groups = length_groups([len(r) for r in micro], len(micro))
                loss = 0.0
                for g in groups:
                    ids, mask = _padded([micro[i] for i in g], pad, device)
                    logits = model(input_ids=ids, attention_mask=mask).logits
                    loss = loss + (torch.log_softmax(logits.float(), -1)[..., 0] * mask).sum()
                loss.backward()
            opt.step()

    out["update_s"] = _timed(update)
    with torch.no_grad():
        for p, s in zip(params, snapshot):
            p.copy_(s)
    return out


def build_trainer(cfg, shape: str, layers: int | None, console, shortcuts: bool = True):
    """The trainer of `cfg` on a model of `shape` (tiny: the config's warm-started model; smollm2: SmolLM2-135M-Instruct,
    its real weights, and a local checkpoint directory, warm-started when the config says so); shortcuts=False:
    without the shortcuts that keep the numbers (Shortcuts.none())."""
    from dataclasses import replace

    from sdar.train import Trainer
    from sdar.train.runtime import Shortcuts

    taken = Shortcuts() if shortcuts else Shortcuts.none()
    if shape in REAL or is_checkpoint_dir(shape):
        from sdar.train.warmstart import ensure_warm_start

        if shape != cfg.model.name_or_path:
            cfg = replace(cfg, model=replace(cfg.model, name_or_path=shape))
        ensure_warm_start(cfg, console)
        return Trainer(cfg, console=console, shortcuts=taken)
    return Trainer(cfg, policy=random_policy(shape, cfg.model, layers=layers, device=str(cfg.resolved_device()), seed=cfg.seed),
                   console=console, shortcuts=taken)


def metered(trainer, meter: ForwardMeter, last: dict) -> None:
    """Run each of the trainer's phases (this instance's) inside the meter's phase of the same name; `last[name]`
    is what the phase returned last."""
    def wrap(name, real):
        def phase(*a, **k):
            with meter.phase(name):
                last[name] = real(*a, **k)
            return last[name]
        return phase

    for name in PHASES:
        real = getattr(trainer, f"{name}_phase", None)
        if real is None:
            raise SystemExit(f"the trainer has no {name}_phase any more: name its phases in PHASES of {__file__}")
        setattr(trainer, f"{name}_phase", wrap(name, real))


def teacher_floor(trainer, meter: ForwardMeter, record: dict) -> None:
    """The teacher pass, metered as its own phase inside score, and the prefix trie of the sequences it scored."""
    teacher = getattr(trainer, "teacher", None)
    if teacher is None or not hasattr(teacher, "score") or not hasattr(teacher, "prompts"):
        return  # the floor needs the runtime's TeacherScorer; the phases are measured without it
    real_score, real_prompts = teacher.score, teacher.prompts

    def prompts(batch):  # the prompts the pass scored, kept for its trie (not built a second time)
        record["prompts"] = real_prompts(batch)
        return record["prompts"]

    def score(model, batch, *a, **k):
        from sdar.agent.rollout import TurnBatch
        from sdar.models.scoring import prefix_trie_positions

        with meter.phase("teacher"):
            out = real_score(model, batch, *a, **k)
        batch = batch if isinstance(batch, TurnBatch) else TurnBatch.of(batch)
        record["teacher_trie"] = prefix_trie_positions([p + r for p, r in zip(record.pop("prompts"), batch.responses)])
        return out

    teacher.prompts, teacher.score = prompts, score


def arm_steps(args, shape: str, arm: str, overrides: dict, console, shortcuts: bool = True):
    """One arm's run, a step per `next()`: the first builds the trainer and runs the warm-up step, then one timed
    step each; the generator's return value (StopIteration.value) is the arm's figures."""
    from sdar.config import load_config

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(args.config, {**overrides, "arm": arm, "tracking": False, "output_dir": tmp,
                                        "teacher.for_all_arms": False, "eval.every": 0})
        trainer = build_trainer(cfg, shape, args.layers, console, shortcuts)
        model = trainer.policy.model
        counts = trainer.policy.parameter_counts()
        meter, last, record = ForwardMeter.of(model), {}, {}
        metered(trainer, meter, last)
        teacher_floor(trainer, meter, record)
        steps = []
        with meter:
            for step in range(args.steps + 1):
                if step:
                    yield
                meter.reset()
                record.pop("teacher_trie", None)
                with meter.phase("step"):
                    trainer.train_step(step)
                steps.append(step_figures(meter, last["rollout"].trajs, record))
        timed = steps[1:] or steps  # the first step warms up, unless it is the only one
        flops = linear_flops_per_position(model)
        out = {**summary(timed, counts, model, cfg), "flops_per_position": flops}
        if args.ops:
            yield  # after every arm's timed steps (a round of their own)
            out["ops"] = update_ops(trainer, last["score"], args.steps + 1)
        if not args.limits:
            return out
        yield  # the limits are timed after every arm's steps (a round of their own)
        lim = limits(trainer, last["rollout"].trajs)
        lim["score_s"] = (lim["student_forward_s"] if trainer.arm.kl_coef else 0.0) + \
            (lim["teacher_forward_s"] if trainer.arm.needs_teacher else 0.0)
        out["limits"] = lim
        return out


def update_ops(trainer, batch, step: int) -> dict:
    """One more update on the last step's scored `batch`, under torch.profiler (after the timed steps, which it
    does not touch): where its seconds go by op (benchmarks/_shared.py:op_attribution), beside its wall seconds."""
    from torch.profiler import ProfilerActivity, profile

    model = trainer.policy.model
    if trainer.policy.device.type != "cpu":
        return {"skipped": f"--ops attributes the CPU's time by op, not {trainer.policy.device.type}'s: on a GPU, "
                           "torch.profiler's CUDA activity"}
    update = type(trainer).update_phase  # the trainer's own, not the meter's wrapper
    with trainer.scorer.scope(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        update(trainer, step, batch)
        wall = time.perf_counter() - t0
    r = trainer.cfg.model.lora_r if trainer.cfg.model.lora else None
    return {**op_attribution(prof, model.get_output_embeddings().weight.shape[0], r), "wall_s": wall}


def step_figures(meter: ForwardMeter, trajs, record: dict) -> dict:
    """One step's figures: per phase (score includes its teacher pass, listed again alone), the step, its batch."""
    f = {k: v.as_dict() for k, v in meter.figures.items()}
    step = f.pop("step")
    if "teacher" in f:
        t, s = f["teacher"], f.setdefault("score", {})
        merged = {k: s.get(k, 0) + t[k] for k in ("seconds", "forwards", "positions", "real", "model_s", "decode_steps",
                                                  "grad_positions")}
        merged["seconds"] = s.get("seconds", 0.0)  # the teacher's seconds are inside score's already
        f["score"] = merged
        if "teacher_trie" in record:
            t["trie"] = record["teacher_trie"]
    turns = [t for tr in trajs for t in tr.turns]
    # every forward of the step: its phases' and any outside them (none, while the phases are the whole step)
    forwards = sum(f[p]["forwards"] for p in PHASES if p in f) + step["forwards"]
    return {"phases": f, "step_s": step["seconds"], "forwards": forwards,
            "turn_samples": len(turns), "ktokens": sum(len(t.prompt_ids) + len(t.response_ids) for t in turns) / 1e3}


def summary(steps: list[dict], counts: dict, model, cfg) -> dict:
    """The median over the timed steps of every figure."""
    def med(get):
        return statistics.median(get(s) for s in steps)

    phases = {}
    for name in (*PHASES, "teacher"):
        if all(name in s["phases"] for s in steps):
            keys = steps[0]["phases"][name].keys()
            phases[name] = {k: med(lambda s, k=k, name=name: s["phases"][name].get(k, 0)) for k in keys}
    for p in phases.values():
        p["tokens_per_forward"] = p["positions"] / p["forwards"] if p["forwards"] else 0.0
        p["padding"] = 1 - p["real"] / p["positions"] if p["positions"] else 0.0
        p["host_s"] = max(p["seconds"] - p["model_s"], 0.0)
    out = {"phases": phases, **{k: med(lambda s, k=k: s[k]) for k in ("step_s", "forwards", "turn_samples", "ktokens")},
           "parameters": counts, "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
           "device": str(next(model.parameters()).device)}
    r = phases.get("rollout")
    out["host_s_per_decode_step"] = r["host_s"] / r["decode_steps"] if r and r["decode_steps"] else None
    if "teacher" in phases and "trie" in phases["teacher"]:
        t = phases["teacher"]
        out["teacher_floor_s"] = t["seconds"] * t["trie"] / max(t["positions"], 1)
    return out


def _fmt(x: float, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def report(rows: dict, args, shape: str, cfg_note: str) -> str:
    """The figures as markdown tables (what docs/benchmarks.md shows), then SDAR/GRPO and the teacher's floor."""
    first = next(iter(rows.values()))
    n = first["parameters"]
    layers = f"{args.layers} of {QWEN25_SHAPES[shape]['num_hidden_layers']} layers, " if shape in QWEN25_SHAPES and args.layers else ""
    lines = [f"model {shape} ({layers}{n['total'] / 1e6:,.1f}M parameters, {n['trainable'] / 1e6:,.2f}M trainable, "
             f"{first['dtype']} on {first['device']}); {cfg_note}; {first['turn_samples']:.0f} turn-samples "
             f"({first['ktokens']:.1f}k tokens) per step, " + (f"median of {args.steps} step(s) after a warm-up" if args.steps
                                                             else "one step, no warm-up"), "",
             "| arm | speed-ups | phase | seconds | forwards | tokens / forward | padding | host s | host s / decode step |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for (arm, mode), r in rows.items():
        for name in (*PHASES, "teacher"):
            p = r["phases"].get(name)
            if p is None:
                continue
            per_step = _fmt(r["host_s_per_decode_step"], 4) if name == "rollout" else ""
            label = "(teacher, in score)" if name == "teacher" else name
            lines.append(f"| {arm} | {mode} | {label} | {p['seconds']:.2f} | {p['forwards']:.0f} | {p['tokens_per_forward']:,.0f} "
                         f"| {p['padding']:.1%} | {p['host_s']:.2f} | {per_step} |")
        lines.append(f"| {arm} | {mode} | **step** | **{r['step_s']:.2f}** | {r['forwards']:.0f} | | | | |")
    modes = list(dict.fromkeys(m for _, m in rows))
    pairs = [m for m in modes if ("sdar", m) in rows and ("grpo", m) in rows]
    if pairs:
        lines += ["", "| SDAR / GRPO | " + " | ".join(f"speed-ups {m}" for m in pairs) + " |",
                  "|---|" + "---:|" * len(pairs)]
        for name in (*PHASES, "step"):
            cells = []
            for m in pairs:
                sd, gr = rows[("sdar", m)], rows[("grpo", m)]
                a = sd["step_s"] if name == "step" else sd["phases"].get(name, {}).get("seconds", 0.0)
                b = gr["step_s"] if name == "step" else gr["phases"].get(name, {}).get("seconds", 0.0)
                cells.append(f"{a / b:.2f}x" if b > 0 else "-")
            label = "**step**" if name == "step" else f"{name} seconds"
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        for m in pairs:
            sd, gr = rows[("sdar", m)], rows[("grpo", m)]
            lines.append(f"\nSDAR/GRPO, speed-ups {m}: {sd['step_s'] / gr['step_s']:.2f}x per step; forwards {sd['forwards']:.0f} "
                         f"against {gr['forwards']:.0f}; per 1k batch tokens {sd['step_s'] / sd['ktokens'] / (gr['step_s'] / gr['ktokens']):.2f}x")
            if "teacher_floor_s" in sd:
                t = sd["phases"]["teacher"]
                lines.append(f"teacher pass, speed-ups {m}: {t['seconds']:.2f} s, {t['positions'] / 1e3:.1f}k positions forwarded, "
                             f"the exact minimum (its prefix trie) {t['trie'] / 1e3:.1f}k ({t['trie'] / max(t['positions'], 1):.2f}x); "
                             f"SDAR/GRPO floor {1 + sd['teacher_floor_s'] / gr['step_s']:.2f}x = 1 + the pass at its minimum / GRPO's step")
    if args.floor:
        fl0 = first["flops_per_position"]
        rates = ", ".join(f"{r / 1e9:,.0f} GFLOP/s in {d}" for d, r in args.floor_rate.items())
        train_n = "6N" if fl0["train"] > 4.5 * fl0["linear_weights"] else "4N"
        note = (f"The arithmetic floor: each phase's forwarded positions (padding included) x the FLOPs per position of "
                f"the decoder's linear layers (no-grad forwards 2N, forwards with gradients, the update's, {train_n}; "
                f"N = "
                f"{fl0['linear_weights'] / 1e6:,.1f}M weights) at the matrix-multiply rate of the row's dtype measured "
                f"in this run ({rates}; 2048 x 2048); the head and attention's scores are left out, so the floor is a "
                "lower bound.")
        lines += ["", note, "", "| arm | speed-ups | phase | positions | floor s | seconds | x floor |",
                  "|---|---|---|---:|---:|---:|---:|"]
        for (arm, mode), r in rows.items():
            fl, rate = r["flops_per_position"], args.floor_rate[r["dtype"]]
            total = 0.0
            for name in PHASES:
                ph = r["phases"].get(name)
                if ph is None:
                    continue
                grad = ph.get("grad_positions", 0)
                floor = ((ph["positions"] - grad) * fl["forward"] + grad * fl["train"]) / rate
                total += floor
                ratio = f"{ph['seconds'] / floor:.2f}x" if floor > 0 else "-"
                lines.append(f"| {arm} | {mode} | {name} | {ph['positions']:,.0f} | {floor:.3f} | {ph['seconds']:.2f} "
                             f"| {ratio} |")
            ratio = f"**{r['step_s'] / total:.2f}x**" if total > 0 else "-"
            lines.append(f"| {arm} | {mode} | **step** | | **{total:.3f}** | **{r['step_s']:.2f}** | {ratio} |")
    skipped = {r["ops"]["skipped"] for r in rows.values() if "skipped" in r.get("ops", {})}
    if args.ops and skipped:
        lines += ["", *sorted(skipped)]
    elif args.ops:
        rates = getattr(args, "floor_rate", {})
        lines += ["", "Where the update's seconds go: one more update on the last step's batch under torch.profiler, "
                  "each op's own CPU time (the matmuls by the recorded shapes: the output head has a dimension of the "
                  "vocabulary, the adapter of its rank)" + ("; x rate: the part's seconds over its FLOPs at the "
                                                             "matrix-multiply rate of the row's dtype" if rates else ""),
                  "", "| arm | speed-ups | part | seconds | share | GFLOP | GFLOP/s | x rate |",
                  "|---|---|---|---:|---:|---:|---:|---:|"]
        for (arm, mode), r in rows.items():
            ops, rate = r["ops"], rates.get(r["dtype"], 0.0)
            for name, p in ops["parts"].items():
                cells = [f"{p['seconds']:.2f}", f"{p['seconds'] / ops['total_s']:.0%}", "", "", ""]
                if p["flops"]:
                    cells[2:] = [f"{p['flops'] / 1e9:,.0f}", f"{p['flops'] / 1e9 / max(p['seconds'], 1e-9):,.0f}",
                                 f"{p['seconds'] / (p['flops'] / rate):.2f}x" if rate else ""]
                lines.append(f"| {arm} | {mode} | {name} | " + " | ".join(cells) + " |")
            lines.append(f"| {arm} | {mode} | **update** (wall {ops['wall_s']:.2f} s) | **{ops['total_s']:.2f}** "
                         "| | | | |")
        for (arm, mode), r in rows.items():
            top = ", ".join(f"{k.removeprefix('aten::')} {v:.2f} s" for k, v in r["ops"]["rest_top"])
            lines.append(f"{arm}, {mode}: everything else's largest ops: {top}")
    if args.limits:
        lines += ["", "| arm | speed-ups | rollout / limit | score / limit | update / limit |", "|---|---|---:|---:|---:|"]
        for (arm, mode), r in rows.items():
            cells = [f"{r['phases'][name]['seconds'] / r['limits'][key]:.2f}x" if r["limits"][key] > 0 else "-"
                     for name, key in (("rollout", "decode_s"), ("score", "score_s"), ("update", "update_s"))]
            lines.append(f"| {arm} | {mode} | " + " | ".join(cells) + " |")
    if ("grpo", "off") in rows or ("sdar", "off") in rows:
        for arm in (a for a in dict.fromkeys(a for a, _ in rows) if (a, "on") in rows and (a, "off") in rows):
            on, off = rows[(arm, "on")], rows[(arm, "off")]
            lines.append(f"{arm}: step with speed-ups / without = {on['step_s']:.2f} / {off['step_s']:.2f} s = {on['step_s'] / off['step_s']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", type=model_arg, metavar="{" + ",".join(SHAPES) + "} or DIR",
                    help="the model: tiny (the config's warm start), smollm2 (SmolLM2-135M-Instruct's real weights, "
                         "warm-started when the config says so), a published shape with random weights, or a local "
                         "checkpoint directory (your own model: its real weights, warm-started when the config says so)")
    ap.add_argument("--floor", action="store_true", help="also print each phase's arithmetic floor: its positions x "
                    "the FLOPs per position at the matrix-multiply rate measured in this run (on by default for "
                    "smollm2 and a directory)")
    ap.add_argument("--layers", type=int, default=None, help="keep the first N decoder layers of a published shape")
    ap.add_argument("--config", default="configs/household-tiny.yaml")
    ap.add_argument("--arms", default="grpo,sdar")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per arm after one warm-up step (0: the warm-up "
                    "step alone, timed)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    ap.add_argument("--compare-off", action="store_true", help="also run every arm with every speed-up off")
    ap.add_argument("--modes", default="on", help=f"the runs per arm, by name: {', '.join(MODES)} (comma-separated)")
    ap.add_argument("--limits", action="store_true", help="also time the phases' raw limits on the last step's batch")
    ap.add_argument("--ops", action="store_true", help="also run one more update on the last step's batch under "
                    "torch.profiler (CPU) and print where its seconds go: the linear layers', the adapter's and the "
                    "head's matmuls, attention, everything else (on by default for smollm2 and a directory)")
    ap.add_argument("--smoke", action="store_true", help="the smallest run (CI): the training tests' miniature config "
                    "with one task, one step (no warm-up); a published shape: 1 layer, episodes of 1 turn")
    ap.add_argument("--json", default="runs/bench/train_step.json", help="where the figures are written")
    args = ap.parse_args(argv)
    import yaml
    from rich.console import Console

    if args.layers is not None and args.model == "tiny":
        ap.error("--layers applies to the published shapes; size the tiny model with --set model.tiny_overrides=...")
    if args.layers is not None and args.model not in QWEN25_SHAPES:
        ap.error(f"--layers applies to the published shapes ({', '.join(QWEN25_SHAPES)}); {args.model} runs whole")
    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    if args.smoke:  # a published shape needs no warm start, so its episodes can be one turn long
        overrides = {**SMOKE, **({"rollout.max_turns": 1} if args.model != "tiny" else {}), **overrides}
        args.steps = 0
        args.layers = args.layers or (1 if args.model in QWEN25_SHAPES else None)
    console = Console(stderr=True)  # progress and the trainer's notes; the figures go to stdout
    names = list(dict.fromkeys(args.modes.split(",") + (["off"] if args.compare_off else [])))
    if set(names) - set(MODES):
        ap.error(f"--modes {args.modes}: choose among {', '.join(MODES)}")
    modes = {name: MODES[name] for name in names}
    arms = args.arms.split(",")
    pretrained = args.model == "smollm2" or is_checkpoint_dir(args.model)  # real weights of a real model
    args.floor = args.floor or pretrained
    args.ops = args.ops or pretrained
    if args.floor:  # the rate of the precision that runs, measured before the arms (the same machine, the same run)
        import torch

        from sdar.config import load_config as _load

        probe = _load(args.config, overrides)
        dtypes = {probe.model.dtype, *(extra.get("model.dtype", probe.model.dtype) for extra in modes.values())}
        args.floor_rate = {d: matmul_rate(getattr(torch, d), str(probe.resolved_device())) for d in sorted(dtypes)}
        console.print("matrix-multiply rate (2048 x 2048): " + ", ".join(f"{r / 1e9:,.0f} GFLOP/s in {d}"
                                                                        for d, r in args.floor_rate.items()))
    runs = {(arm, mode): arm_steps(args, args.model, arm, {**overrides, **extra}, console, mode not in SHORTCUTS_OFF)
            for arm in arms for mode, extra in modes.items()}
    # interleaved: a round runs one step of every arm in turn, so a machine that drifts (another tenant, heat)
    # slows every arm alike and the ratios between them stay side by side
    rows: dict[tuple[str, str], dict] = {}
    while len(rows) < len(runs):
        for key, run in runs.items():
            if key in rows:
                continue
            try:
                next(run)
            except StopIteration as done:
                rows[key] = done.value
    rows = {key: rows[key] for key in runs}
    from sdar.config import load_config

    cfg = load_config(args.config, overrides)
    note = f"{args.config}, {cfg.tasks_per_step} tasks x {cfg.group_size} rollouts"
    print(report(rows, args, args.model, note))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "layers": args.layers, "config": args.config, "overrides": overrides,
                               "steps": args.steps, "rows": {f"{a}/{m}": r for (a, m), r in rows.items()}}, indent=1, default=str))
    print(f"\nfigures: {out}")


if __name__ == "__main__":
    main()
