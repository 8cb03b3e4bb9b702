"""How good is the warm start? Student and teacher success, greedy imitation accuracy by action kind.

Builds (or loads from the cache) the warm-started tiny model of a config, then prints:
- whether this run built it or loaded it, and the build's own seconds either way (from the cache entry's
  warmstart.json, written by the run that built it);
- greedy accuracy on fresh expert turns (student turns: listing-order expert; teacher turns:
  the skills-following expert with the skills in the prompt), split by the action's verb and,
  for `go to`, by whether the memory names the expert's target: go-search ("Search next: go to
  X"), go-next ("Next: go to X", a known place), go-other (neither: the skills' search order);
  shop clicks by what they do: click-item (open a result), click-option, click-buy, click-nav;
- success on the held-out eval tasks of the student and of the teacher (skills in the prompt)
  at the eval temperature, with 95% Wilson intervals, and the teacher-student log-prob gap;
- shop, with --by-options N: student and teacher success on the first N held-out goals that name
  0, 1, 2, ... option values (how the shop's max_goal_options was chosen).
This is how the household difficulty and warm-start size of configs/household-tiny.yaml were
chosen (target: student 20-60%, teacher at least 10 points better). Run:
  .venv/bin/python benchmarks/bench_warmstart.py [--config configs/household-tiny.yaml] [--set warmstart.episodes=2000]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import time


from sdar_envs.shop.pages import BUTTONS as SHOP_BUTTONS

SHOP_NAV = SHOP_BUTTONS - {"buy now"}


def shop_click_kind(action: str) -> str:
    """What a shop click does: item (open a result, by product id or rank handle), buy, nav, or option."""
    arg = action[len("click["):-1]
    if re.fullmatch(r"b0[0-9a-z]{8}|item \d+", arg):
        return "item"
    return "buy" if arg == "buy now" else "nav" if arg in SHOP_NAV else "option"


def options_breakdown(runtime, n: int) -> dict[str, dict]:
    """Shop: student and teacher success on the first `n` held-out goals naming k option values, per k."""
    if runtime.cfg.env.family != "shop" or runtime.cfg.env.url:
        raise SystemExit("--by-options needs the in-process shop (a shop config without env.url)")
    world = runtime.env_factory().world  # the world the runtime's episodes are drawn from, config caps included
    groups: dict[int, list[str]] = collections.defaultdict(list)
    for t in world.splits["test"]:
        groups[len(world.goal(t).goal_options)].append(t)
    out = {}
    for k, ids in sorted(groups.items()):
        ids = ids[:n]
        s, t = runtime.evaluate(tasks=ids), runtime.evaluate(tasks=ids, privileged=True)
        out[str(k)] = {"goals": len(ids), "student": round(s.success, 3), "student_ci": s.ci95,
                       "teacher": round(t.success, 3), "teacher_ci": t.ci95}
        print(f"goals naming {k} option value(s): student {s.success:.3f}  teacher {t.success:.3f}  on {len(ids)}", flush=True)
    return out


def report(out: dict, temperature: float) -> None:
    """The figures as a short text report (--json writes them all)."""
    print(f"warm start {out['warm_start']} (its build took {out['build_s']} s); ready in {out['ready_s']} s, "
          f"everything {out['total_s']} s, on {out['device']}")
    print(f"held-out success on {out['eval_tasks']} tasks at T={temperature} [95% Wilson interval]")
    print(f"  student {out['student_success']:.3f} [{out['student_ci'][0]:.3f}, {out['student_ci'][1]:.3f}]   "
          f"teacher {out['teacher_success']:.3f} [{out['teacher_ci'][0]:.3f}, {out['teacher_ci'][1]:.3f}]   "
          f"teacher-student log-prob gap {out['gap']:+.4f}")
    types = sorted(out["student_per_type"])
    width = max(map(len, ["by task type", *types]))
    print(f"  {'by task type':<{width}}  student  teacher")
    for t in types:
        print(f"  {t:<{width}}  {out['student_per_type'][t]:7.3f}  {out['teacher_per_type'].get(t, float('nan')):7.3f}")
    acc = out["greedy_accuracy"]
    kinds = sorted({k.split("/", 1)[1] for k in acc if "/" in k})
    width = max(map(len, ["action kind", *kinds]))
    print("greedy accuracy on fresh expert turns: fraction right (turns)")
    print(f"  {'action kind':<{width}}  {'student':>13}  {'teacher':>13}")
    cell = lambda key: f"{acc[key][0]:.3f} ({acc[key][1]:>4})" if key in acc else "-"  # noqa: E731
    print(f"  {'all':<{width}}  {cell('student'):>13}  {cell('teacher'):>13}")
    for k in kinds:
        print(f"  {k:<{width}}  {cell('student/' + k):>13}  {cell('teacher/' + k):>13}")
    if out.get("overrides"):
        print(f"overrides: {out['overrides']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/household-tiny.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    ap.add_argument("--probe-episodes", type=int, default=60, help="fresh expert episodes for the greedy accuracy")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--by-options", type=int, default=0, metavar="N",
                    help="shop: also score student and teacher on the first N held-out goals per count of option values named")
    args = ap.parse_args()
    import tempfile

    import yaml

    from sdar.agent.constrained import action_trie
    from sdar.agent.parsing import format_action
    from sdar.agent.prompts import fit_prompt_ids
    from sdar.config import load_config
    from sdar.train.runtime import build_runtime
    from sdar.train.warm_cache import MARKER, warm_start_path
    from sdar.train.warmstart import ensure_warm_start, expert_turns

    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(args.config, {**overrides, "tracking": False, "output_dir": tmp})
        entry = warm_start_path(cfg)
        cached = entry is not None and (entry / MARKER).is_file()
        ensure_warm_start(cfg)  # builds (and times) the warm start, or loads the cached one
        runtime = build_runtime(cfg, train=False)
        ready_s = time.perf_counter() - t0
        built = json.loads((entry / MARKER).read_text()) if entry is not None else {}
        tok = runtime.tokenizer
        eos = tok.convert_tokens_to_ids("<|im_end|>")
        turns = expert_turns(cfg, args.probe_episodes, seed=cfg.seed + 777)
        prompts, tries = [], []
        for x in turns:
            limit = cfg.teacher.max_prompt_tokens if x["privileged"] else cfg.rollout.max_prompt_tokens
            ids, _ = fit_prompt_ids(tok, runtime.builder, x["view"], limit, skills=x["skills"] if x["privileged"] else None,
                                    placement=runtime.rollout_cfg.privileged_placement)
            prompts.append(ids)
            tries.append(action_trie(tok, cfg.env.family, x["view"].admissible_actions, eos) if cfg.rollout.constrained else None)
        gens = runtime.backend.generate(prompts, max_new_tokens=cfg.rollout.max_response_tokens, temperature=0.0,
                                        tries=tries if cfg.rollout.constrained else None)
        acc: dict[str, list[bool]] = collections.defaultdict(list)
        for g, x in zip(gens, turns):
            a = x["action"]
            kind = re.match(r"\W*([a-z]+)", a.lower())  # the verb: go/take (household), search/click (shop)
            kind = kind.group(1) if kind else "other"
            if kind == "go":
                mem = x["view"].memory or ""
                m = re.search(r"Search next: go to ([^.]+)\.", mem)
                n = re.search(r"(?<!Search )Next: go to ([^.]+)\.", mem)
                kind = ("go-search" if m and m.group(1) == a[len("go to "):] else
                        "go-next" if n and n.group(1) == a[len("go to "):] else "go-other")
            elif kind == "click" and cfg.env.family == "shop":
                kind = f"click-{shop_click_kind(a)}"
            who = "teacher" if x["privileged"] else "student"
            ok = g.text == format_action(cfg.env.family, a)  # search-QA actions carry their own tags
            acc[f"{who}/{kind}"].append(ok)
            acc[who].append(ok)
        student = runtime.evaluate()
        teacher = runtime.evaluate(privileged=True)
        gap = runtime.teacher_gap(student.trajectories)
        by_options = options_breakdown(runtime, args.by_options) if args.by_options else None
    n = len(runtime.eval_tasks)
    out = {
        "warm_start": "loaded from the cache" if cached else "built by this run",
        "build_s": round(built["seconds"], 1) if "seconds" in built else None,  # the build's, whichever run built it
        "ready_s": round(ready_s, 1),  # this run: built or loaded, and the runtime made
        "greedy_accuracy": {k: [round(sum(v) / len(v), 3), len(v)] for k, v in sorted(acc.items())},
        "student_success": student.success, "student_ci": student.ci95,
        "teacher_success": teacher.success, "teacher_ci": teacher.ci95,
        "teacher_minus_student": teacher.success - student.success, "gap": gap, "eval_tasks": n,
        "student_per_type": {k: round(v["success"], 3) for k, v in student.per_type.items()},
        "teacher_per_type": {k: round(v["success"], 3) for k, v in teacher.per_type.items()},
        **({"by_options": by_options} if by_options else {}),
        "device": str(runtime.device), "overrides": overrides, "total_s": round(time.perf_counter() - t0, 1),
    }
    report(out, cfg.eval.temperature)
    print(f"student {student.success:.3f}  teacher {teacher.success:.3f}  (+{100 * (teacher.success - student.success):.1f} points)"
          f"  gap {gap:+.4f}  on {n} held-out tasks at T={cfg.eval.temperature}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
