"""bfloat16 against float32 on the SAME trajectories: does the cheaper precision keep what SDAR reads?

One step's rollouts are sampled once (float32); then a float32 trainer and a bfloat16 trainer, both holding the same
starting weights (the config's warm start, loaded in each precision: the base in that dtype, the LoRA adapter and its
optimizer state in float32, as mixed-precision LoRA runs), score them (old, reference and privileged-teacher
log-probs) and make the step's update. Printed, per quantity, float32's value, bfloat16's, and their difference:
- per token (over the tokens that carry a choice: every loss term and statistic reads these): the largest and the mean
  absolute difference of old_logp and the teacher's logp, and of the gap (teacher - old) the gate reads;
- the step's metrics: sdar/gap_mean, sdar/gate_mean, each loss term (loss/*), and the seconds of each phase;
- the update itself: the change it made to the adapter's weights, and to the policy's log-probs on the step's choice
  tokens as the float32 policy scores them with each trainer's adapter (bfloat16's own forwards round a small change
  away), each as its cosine with float32's and its norm's ratio to float32's.
`--set model.cpu_mixed_precision=false` compares plain bfloat16 (peft's path) instead of sdar.models.precision's.
A bound is printed beside each (`TOLERANCE`) and the run ends non-zero when one is exceeded, so a default that
depends on bfloat16 rests on a measured check. Run (SmolLM2, the real weights; its warm start must be cached):
  .venv/bin/python benchmarks/bench_precision.py --config configs/household-smollm2.yaml [--set KEY=VALUE] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

# what "keeps" means: per-token log-probs within 0.1 nats at the largest and 0.02 on average; the step's gap and
# gate means within 0.02 and 0.005 (the gate is sigmoid(beta * gap) with beta 5, so 0.005 is a 0.004-nat gap);
# each loss term within 5% of its float32 value or 1e-3 absolute; the update itself (what training keeps): the change
# it makes to the policy's log-probs on the step's choice tokens, scored in float32, and to the adapter's weights, each
# at a cosine of at least 0.98 with float32's and a norm within 10% of it. The loss terms and the update's statistics
# are bfloat16's own view: its forward rounds a fresh adapter's small change into the base's bfloat16 activations, so
# they can read a policy moved half as far when the float32 view shows the same move (docs/training.md)
TOLERANCE = {"token_max": 0.1, "token_mean": 0.02, "sdar/gap_mean": 0.02, "sdar/gate_mean": 0.005,
             "loss_rel": 0.05, "loss_abs": 1e-3, "update_cos": 0.98, "update_norm": 0.1}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/household-smollm2.yaml")
    p.add_argument("--arm", default="sdar")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--smoke", action="store_true", help="1 task x 2 rollouts of 3 turns (the CI's size)")
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args(argv)

    import torch

    from sdar.config import load_config, parse_set
    from sdar.models import ModelSpec, load_policy
    from sdar.models.scoring import free_token_mask
    from sdar.train import Trainer
    from sdar.train.metrics import step_metrics
    from sdar.train.runtime import Shortcuts
    from sdar.train.warmstart import ensure_warm_start, warm_start_path

    overrides = dict(parse_set(s) for s in args.set)
    if args.smoke:
        overrides = {"tasks_per_step": 1, "group_size": 2, "rollout.max_turns": 3, **overrides}
    # old_logp from each trainer's own score phase: the sampler's log-probs (float32's, here) would stand in for
    # bfloat16's, and rows left to the update's first forward would be compared before they are filled
    overrides = {"arm": args.arm, "tracking": False, "eval.every": 0, **overrides}
    base = load_config(args.config, overrides)
    ensure_warm_start(base)
    start = warm_start_path(base)
    where = str(start) if start is not None else base.model.name_or_path
    trainers = {}
    for dtype in ("float32", "bfloat16"):
        cfg = replace(base, model=replace(base.model, dtype=dtype), output_dir=f"/tmp/sdar-bench-precision/{dtype}")
        torch.manual_seed(cfg.seed)  # the fresh adapter's initialisation: the same in both
        policy = load_policy(ModelSpec.from_config(cfg.model, where))
        trainers[dtype] = Trainer(cfg, policy=policy, shortcuts=Shortcuts(old_logp_from_sampler=False, reuse_old_logp=False))
    t32, t16 = trainers["float32"], trainers["bfloat16"]
    adapter = lora_state(t32)
    t16.policy.model.load_state_dict(adapter, strict=False)  # the same adapter values (float32 in both)
    with t32.scorer.scope():
        t0 = time.perf_counter()
        rollouts = t32.rollout_phase(0)
        rollout_s = time.perf_counter() - t0
    out: dict[str, dict] = {}
    for dtype, tr in trainers.items():
        with tr.scorer.scope():
            t0 = time.perf_counter()
            batch = tr.score_phase(0, rollouts)
            score_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            update = tr.update_phase(0, batch)
            update_s = time.perf_counter() - t0
        metrics = step_metrics(tr.cfg, batch, update, 0.0, teacher=tr.teacher, skipped=0, replay=None, dist=tr.dist)
        out[dtype] = {"batch": batch, "metrics": metrics, "score_s": score_s, "update_s": update_s}
    b32, b16 = out["float32"]["batch"], out["bfloat16"]["batch"]
    free = free_token_mask(b32.allowed, b32.old.mask).bool()
    # the update itself, seen in float32: the float32 policy with each trainer's adapter after its update scores the
    # step's tokens, against the same policy's old_logp (the float32 score phase, before either update)
    after = {dtype: lora_state(tr) for dtype, tr in trainers.items()}
    with t32.scorer.scope(), torch.no_grad():
        moved = {}
        for dtype in ("bfloat16", "float32"):  # float32's adapter last: t32 ends as it was
            t32.policy.model.load_state_dict(after[dtype], strict=False)
            moved[dtype] = (t32.scorer.score(t32.model, b32.prompts, b32.responses, b32.allowed).logp.float().cpu()
                            - b32.old.logp.float().cpu())[free]
    step = {dtype: torch.cat([(after[dtype][k] - adapter[k]).flatten() for k in sorted(adapter)])
            for dtype in after}
    failures: list[str] = []
    rows: list[tuple[str, str, str, str, str]] = []

    def per_token(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
        d = (a.float().cpu() - b.float().cpu())[free].abs()
        mx, mean = float(d.max()) if d.numel() else 0.0, float(d.mean()) if d.numel() else 0.0
        rows.append((f"{name} per token (max / mean abs diff)", "", "", f"{mx:.4f} / {mean:.4f}",
                     f"{TOLERANCE['token_max']} / {TOLERANCE['token_mean']}"))
        if mx > TOLERANCE["token_max"] or mean > TOLERANCE["token_mean"]:
            failures.append(name)

    per_token("old_logp", b32.old.logp, b16.old.logp)
    if b32.teacher is not None:
        per_token("teacher logp", b32.teacher.logp, b16.teacher.logp)
        per_token("gap", b32.teacher.logp - b32.old.logp, b16.teacher.logp - b16.old.logp)
    m32, m16 = out["float32"]["metrics"], out["bfloat16"]["metrics"]
    keys = [k for k in ("sdar/gap_mean", "sdar/gate_mean") if k in m32] + sorted(k for k in m32 if k.startswith("loss/"))
    for k in keys:
        a, b = float(m32[k]), float(m16.get(k, float("nan")))
        diff = abs(a - b)
        if k.startswith("loss/"):
            bound = max(TOLERANCE["loss_rel"] * abs(a), TOLERANCE["loss_abs"])
        else:
            bound = TOLERANCE[k]
        rows.append((k, f"{a:+.5f}", f"{b:+.5f}", f"{diff:.5f}", f"{bound:.4g}"))
        if not diff <= bound:
            failures.append(k)
    for name, (a, b) in (("the update's change of the policy's log-probs, in float32", (moved["float32"], moved["bfloat16"])),
                         ("the update's change of the adapter's weights", (step["float32"], step["bfloat16"]))):
        if float(a.norm()) == 0.0:
            rows.append((f"{name} (cosine / norm ratio)", "0", f"{float(b.norm()):.3g}", "float32's update moved nothing",
                         ""))
            continue
        a, b = a.double(), b.double()
        cos = float(a @ b / (a.norm() * b.norm()).clamp_min(1e-300))
        ratio = float(b.norm() / a.norm())
        rows.append((f"{name} (cosine / norm ratio)", f"{float(a.norm()):.4g}", f"{float(b.norm()):.4g}",
                     f"{cos:.4f} / {ratio:.3f}", f">= {TOLERANCE['update_cos']} / {TOLERANCE['update_norm']}"))
        if not (cos >= TOLERANCE["update_cos"] and abs(ratio - 1.0) <= TOLERANCE["update_norm"]):
            failures.append(name.split(",")[0])
    rows.append(("score phase seconds", f"{out['float32']['score_s']:.1f}", f"{out['bfloat16']['score_s']:.1f}",
                 f"x{out['float32']['score_s'] / max(out['bfloat16']['score_s'], 1e-9):.2f}", ""))
    rows.append(("update phase seconds", f"{out['float32']['update_s']:.1f}", f"{out['bfloat16']['update_s']:.1f}",
                 f"x{out['float32']['update_s'] / max(out['bfloat16']['update_s'], 1e-9):.2f}", ""))
    n_tokens = int(free.sum())
    print(f"bfloat16 against float32 on the same {len(rollouts.trajs)} episodes ({len(rollouts.batch)} turn-samples, "
          f"{n_tokens} choice tokens; rollout sampled once in float32 in {rollout_s:.1f} s), arm {args.arm}, "
          f"model {base.model.name_or_path} from {where}")
    print("| quantity | float32 | bfloat16 | difference | bound |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print("within every bound" if not failures else f"OUTSIDE the bound: {', '.join(failures)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "failures": failures, "choice_tokens": n_tokens}, indent=2))
    return 1 if failures else 0


def lora_state(trainer) -> dict:
    """A copy of `trainer`'s LoRA adapter (float32 in both precisions)."""
    return {k: v.detach().float().clone() for k, v in trainer.policy.model.state_dict().items() if "lora_" in k}


if __name__ == "__main__":
    sys.exit(main())
