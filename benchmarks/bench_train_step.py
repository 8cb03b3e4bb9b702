"""Seconds per RL step for each arm on the same tasks, the phases against their raw limits, and the
speed-ups measured side by side (`--compare-off` runs every arm again with each speed-up switched off).

Every arm plays the same tasks from the same warm start (same seed), so the difference between arms is
the teacher's extra forward and the loss. GRPO skips the teacher here (teacher.for_all_arms false), as a
production GRPO run would. For the last timed step's own batch the benchmark also times the raw limits:
  (the no-grad limits run a plain module: a LoRA adapter merged into its base, no peft wrappers)
  rollout: a plain prefill (every prompt whole, the last position's logits) + one KV-cached decode step per
           non-forced token, turn by turn (no env, no trie);
  score:   a plain no-grad forward over the sequences each needed pass reads (reference: the student's,
           teacher: the privileged ones), length-bucketed like the trainer;
  update:  plain forward + backward + AdamW over the update's sequences in the same micro-batches (rows of
           similar length per forward when length_buckets is on, as the trainer does).
"passes" counts no-grad scoring passes per step in units of the step's whole batch (old_logp, reference,
teacher); the update's own forwards are not counted. For the arms with a teacher it also prints the
teacher pass's seconds and the positions it forwarded (padding included) beside the exact minimum, the
nodes of its sequences' prefix trie (`sdar.models.scoring.prefix_trie_positions`: no exact scheme forwards
fewer), and the SDAR/GRPO floor that minimum implies at the same seconds per position. Run:
  .venv/bin/python benchmarks/bench_train_step.py [--config configs/household-tiny.yaml] [--steps 2] [--compare-off]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

# the speed-ups, each a config flag (default on); --compare-off sets every one of them to its "off" value
SPEEDUPS_OFF = {"rollout.jump_forward": False, "rollout.share_prefix": False, "ppo.old_logp_from_sampler": False, "ppo.reuse_old_logp": False,
                "scoring.prefix_cache": False, "scoring.length_buckets": False, "scoring.merged_inference": False, "scoring.dedup": False,
                "scoring.head_at_free_tokens": False}


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
                groups = length_groups([len(r) for r in micro], len(micro)) if cfg.scoring.length_buckets else [
                    list(range(len(micro)))]
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


# the scoring passes of the step running now are counted here (the wrappers installed by `count_scoring_passes`)
ACTIVE: dict = {"rows": []}


def count_scoring_passes() -> None:
    """Wrap the trainer's no-grad scoring calls (old_logp, reference) so that each appends its row count to
    ACTIVE["rows"]; the teacher's pass is counted at its trainer's teacher.score (see arm_steps)."""
    import sdar.models.scoring as sc
    import sdar.train.trainer as tr

    def counting(real):
        def counted(*a, **k):  # no-grad calls only: the update's own forwards (grad=True) are not scoring passes
            if not k.get("grad"):
                ACTIVE["rows"].append(len(a[1]))
            return real(*a, **k)
        return counted

    # old_logp (when not from the sampler) and the reference pass (prefix-cached or plain)
    tr.response_logprobs = counting(tr.response_logprobs)
    sc.grouped_prefix_logprobs = counting(sc.grouped_prefix_logprobs)


def arm_steps(config: str, arm: str, steps: int, overrides: dict, console):
    """One arm's run, a step per `next()`: the first builds the trainer and runs the warm-up step, then one timed
    step each; the generator's return value (StopIteration.value) is the arm's figures, its limits included."""
    from sdar.config import load_config
    from sdar.train import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(config, {**overrides, "arm": arm, "tracking": False, "output_dir": tmp,
                                   "teacher.for_all_arms": False, "eval.every": 0})
        from sdar.train.warmstart import ensure_warm_start

        ensure_warm_start(cfg, console)
        trainer = Trainer(cfg, console=console)
        real_collect = trainer.collect
        last: dict = {}

        def collect(step):
            last["trajs"] = real_collect(step)
            return last["trajs"]

        trainer.collect = collect
        teacher_pass: dict = {}  # this step's teacher pass: seconds, positions forwarded, trie minimum

        def teacher_score(real):
            def score(model, batch, *a, **k):  # a TurnBatch (the trainer) or trajectories
                from sdar.agent.rollout import TurnBatch
                from sdar.models.scoring import prefix_trie_positions

                batch = batch if isinstance(batch, TurnBatch) else TurnBatch.of(batch)
                ACTIVE["rows"].append(len(batch.turns))
                positions = [0]

                def count(_module, _args, kwargs):  # every position the model computes, padding included
                    positions[0] += kwargs["input_ids"].numel()

                # the decoder: scoring runs it, then the output head at the needed positions (logits_at)
                decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
                hook = decoder.register_forward_pre_hook(count, with_kwargs=True)
                t0 = time.perf_counter()
                try:
                    out = real(model, batch, *a, **k)
                finally:
                    hook.remove()
                teacher_pass["teacher_s"] = time.perf_counter() - t0
                teacher_pass["teacher_positions"] = positions[0]
                seqs = [p + r for p, r in zip(teacher_pass.pop("prompts"), batch.responses)]
                teacher_pass["teacher_trie"] = prefix_trie_positions(seqs)
                return out
            return score

        def teacher_prompts(real):
            def prompts(batch):  # the prompts the pass scored, kept for its trie (not built a second time)
                teacher_pass["prompts"] = real(batch)
                return teacher_pass["prompts"]
            return prompts

        trainer.teacher.prompts = teacher_prompts(trainer.teacher.prompts)
        trainer.teacher.score = teacher_score(trainer.teacher.score)
        results = []
        for step in range(steps + 1):
            if step:
                yield
            last.clear()
            ACTIVE["rows"] = []
            teacher_pass.clear()
            m = trainer.train_step(step).metrics
            m.update(teacher_pass)
            # the guard's one-row probe is not a scoring pass
            m["passes"] = sum(r for r in ACTIVE["rows"] if r > 1) / max(m["turn_samples"], 1)
            # the arms' batches differ after step 0 (other episodes, other lengths): per 1k tokens of the
            # step's turn-samples (prompt + response) the arms compare on the same unit of work
            m["ktokens"] = sum(len(t.prompt_ids) + len(t.response_ids) for tr in last["trajs"] for t in tr.turns) / 1e3
            m["s_per_ktok"] = m["time/step_s"] / max(m["ktokens"], 1e-9)
            results.append(m)
        results = results[1:]  # the first step warms up
        keys = ("time/step_s", "time/rollout_s", "time/score_s", "time/update_s", "turn_samples", "passes",
                "tokens/forced_frac", "ktokens", "s_per_ktok", "teacher_s", "teacher_positions", "teacher_trie")
        out = {k: statistics.median(r[k] for r in results) for k in keys if all(k in r for r in results)}
        if "teacher_s" in out:  # the teacher's seconds had it forwarded no more positions than the exact minimum
            out["teacher_floor_s"] = statistics.median(r["teacher_s"] * r["teacher_trie"] / max(r["teacher_positions"], 1)
                                                       for r in results)
        yield  # the limits are timed after every arm's steps (a round of their own)
        lim = limits(trainer, last["trajs"])
        arm_cfg = trainer.arm
        lim["score_s"] = (lim["student_forward_s"] if arm_cfg.kl_coef else 0.0) + \
            (lim["teacher_forward_s"] if arm_cfg.needs_teacher else 0.0)
        out.update({f"limit/{k}": v for k, v in lim.items()})
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/household-tiny.yaml")
    ap.add_argument("--arms", default="grpo,sdar")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per arm (after one warm-up step)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    ap.add_argument("--compare-off", action="store_true", help="also run every arm with every speed-up off")
    ap.add_argument("--json", default="runs/bench/train_step.json", help="where the figures are written")
    args = ap.parse_args()
    import yaml
    from rich.console import Console
    from rich.table import Table

    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    console = Console()
    modes = {"on": {}} | ({"off": SPEEDUPS_OFF} if args.compare_off else {})
    count_scoring_passes()
    runs = {(arm, mode): arm_steps(args.config, arm, args.steps, {**overrides, **extra}, console)
            for arm in args.arms.split(",") for mode, extra in modes.items()}
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
    table = Table(title=f"seconds per RL step (median of {args.steps}), {args.config}; [x] = phase / its raw limit")
    for col in ("arm", "speed-ups", "step", "rollout", "score", "update", "passes", "forced", "s/1k tok", "x grpo"):
        table.add_column(col, justify="right")
    for (arm, mode), r in rows.items():
        base = rows.get(("grpo", mode), r)["time/step_s"]

        def ph(key, lim):
            limit = r[f"limit/{lim}"]
            return f"{r[key]:.1f} [{r[key] / limit:.2f}x]" if limit > 0 else f"{r[key]:.1f}"

        table.add_row(arm, mode, f"{r['time/step_s']:.1f}", ph("time/rollout_s", "decode_s"),
                      ph("time/score_s", "score_s"), ph("time/update_s", "update_s"), f"{r['passes']:.2f}",
                      f"{r['tokens/forced_frac']:.0%}", f"{r['s_per_ktok']:.3f}", f"{r['time/step_s'] / base:.2f}")
    console.print(table)
    for mode in modes:
        if ("sdar", mode) in rows and ("grpo", mode) in rows:
            sd, gr = rows[("sdar", mode)], rows[("grpo", mode)]
            console.print(f"SDAR/GRPO seconds per step, speed-ups {mode}: {sd['time/step_s'] / gr['time/step_s']:.2f}x; "
                          f"per 1k batch tokens: {sd['s_per_ktok'] / gr['s_per_ktok']:.2f}x "
                          f"(batches of {sd['ktokens']:.1f}k and {gr['ktokens']:.1f}k tokens)")
    for (arm, mode), r in rows.items():
        if "teacher_s" in r:
            console.print(f"{arm}, speed-ups {mode}: teacher pass {r['teacher_s']:.2f} s, {r['teacher_positions'] / 1e3:.1f}k "
                          f"positions forwarded (padding included); the exact minimum, the prefix trie of its sequences: "
                          f"{r['teacher_trie'] / 1e3:.1f}k ({r['teacher_trie'] / max(r['teacher_positions'], 1):.2f}x)")
            if ("grpo", mode) in rows:
                # GRPO's step only shrinks under any further speed-up of its passes, so this bounds the ratio from below
                floor = 1 + r["teacher_floor_s"] / rows[("grpo", mode)]["time/step_s"]
                console.print(f"  SDAR/GRPO floor, speed-ups {mode}: {floor:.2f}x = 1 + the teacher pass at its trie minimum "
                              f"({r['teacher_floor_s']:.2f} s at the same seconds per position) / GRPO's step")
    if args.compare_off:
        for arm in args.arms.split(","):
            on, off = rows[(arm, "on")], rows[(arm, "off")]
            console.print(f"{arm}: step with speed-ups / without = {on['time/step_s']:.1f} / {off['time/step_s']:.1f} s = "
                          f"{on['time/step_s'] / off['time/step_s']:.2f}; per 1k batch tokens "
                          f"{on['s_per_ktok'] / off['s_per_ktok']:.2f}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({f"{a}/{m}": r for (a, m), r in rows.items()}, indent=1))
    console.print(f"figures: {out}")


if __name__ == "__main__":
    main()
