"""Generation tokens/s of the transformers and vLLM rollout engines on the same model and prompts,
plus teacher scoring through vLLM prompt log-probs vs the training-side forward. GPU only.

Prompts are real first-turn household prompts (the rollout's own prompt builder), optionally
constrained to the admissible actions. Besides speed it checks that the engines agree: vLLM's
sampled-token log-probs (processed: after the trie mask) against the trainer's scoring of the
same tokens, and the vLLM teacher scores against the training-side ones. Run on a CUDA machine
with `pip install -e '.[gpu]'`:
  python benchmarks/bench_vllm.py [--model smollm2 | <dir> | <hub id>] [--prompts 128] [--constrained]
--dry needs neither: the transformers half alone, on this machine's device, at a tiny size (2 prompts, 4 new
tokens, float32 on a CPU; unless --model is given, one layer of the Qwen2.5-0.5B shape with random weights), and it
says what it skipped (CI runs it: tests/benchmarks/test_smoke.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def household_prompts(tokenizer, n: int, max_tokens: int, skills: bool = False):
    """`n` first-turn prompts of household train tasks (repeated when there are fewer) and their
    admissible actions, built exactly as the rollout builds them."""
    from sdar_envs import make_env
    from sdar_envs.base import privileged_skills_for

    from sdar.agent.prompts import PromptBuilder, fit_prompt_ids
    from sdar.agent.rollout import EpisodeState

    env = make_env("household")
    builder = PromptBuilder("household")
    out = []
    try:
        tasks = env.task_ids("train")
        for i in range(n):
            first = env.reset(task_id=tasks[i % len(tasks)])
            view = EpisodeState(first, "household", True, getattr(env, "task_text", "")).view(0, 50)
            text = privileged_skills_for(env, "household", first.metadata) if skills else None
            ids, _ = fit_prompt_ids(tokenizer, builder, view, max_tokens, skills=text)
            out.append((ids, view.admissible_actions))
    finally:
        env.close()
    return out


def timed(fn):
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    result = fn()
    sync()
    return result, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="smollm2 (the default), a local checkpoint directory or a hub id")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="both engines' weights")
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--hf-batch-size", type=int, default=64, help="transformers generate chunk size")
    ap.add_argument("--constrained", action="store_true", help="decode only admissible actions (the action trie)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    ap.add_argument("--teacher-topk", type=int, default=20)
    ap.add_argument("--out", help="also write the results as JSON here")
    ap.add_argument("--dry", action="store_true", help="the transformers half alone, tiny, on this machine's device")
    args = ap.parse_args()

    import torch

    from sdar.agent.backends import require_vllm

    skipped = None  # why the vLLM half does not run
    try:
        require_vllm()
    except RuntimeError as exc:
        if not args.dry:
            sys.exit(f"bench_vllm: {exc}")
        skipped = str(exc)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.dry:
        skipped = skipped or "--dry"
        args.prompts, args.max_new_tokens = min(args.prompts, 2), min(args.max_new_tokens, 4)
        args.dtype = args.dtype if device == "cuda" else "float32"
    args.model = args.model or ("random:qwen2.5-0.5b" if args.dry else "smollm2")
    from rich.table import Table

    from sdar.agent.backends import TransformersBackend, VLLMBackend
    from sdar.agent.constrained import action_trie
    from sdar.console import make_console
    from sdar.models import ModelSpec, load_policy
    from sdar.models.scoring import response_logprobs
    from sdar.teacher.vllm_scoring import vllm_response_logprobs

    console = make_console()
    if args.model.startswith("random:"):  # a published shape with random weights, one layer (benchmarks/_shared.py)
        from sdar.config import ModelConfig

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _shared import random_policy

        settings = ModelConfig(dtype=args.dtype, lora=True, lora_r=16, lora_alpha=32)
        policy = random_policy(args.model.split(":", 1)[1], settings, layers=1, device=device)
    else:
        policy = load_policy(ModelSpec(args.model, dtype=args.dtype, lora=True, lora_r=16, lora_alpha=32)).to(device)
    torch.manual_seed(0)
    with torch.no_grad():  # a non-zero adapter, so both engines really apply it
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=1e-3)
    policy.model.eval()
    tok = policy.tokenizer
    data = household_prompts(tok, args.prompts, max_tokens=1024)
    prompts = [p for p, _ in data]
    tries = None
    if args.constrained:
        eos = tok.convert_tokens_to_ids("<|im_end|>")
        tries = [action_trie(tok, "household", acts, eos) for _, acts in data]
    gen_kw = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "tries": tries}

    rows: dict[str, dict] = {}
    hf = TransformersBackend(policy.model, tok, batch_size=args.hf_batch_size)
    hf.generate(prompts[:4], **{**gen_kw, "tries": tries[:4] if tries else None})  # warm-up
    gens, secs = timed(lambda: hf.generate(prompts, **gen_kw))
    rows["transformers"] = {"tokens": sum(len(g.token_ids) for g in gens), "seconds": secs}

    engine = None
    if skipped is None:
        t0 = time.perf_counter()
        engine = VLLMBackend(policy, gpu_memory_utilization=args.gpu_memory_utilization, dtype=args.dtype,
                             teacher_topk=args.teacher_topk)
        startup = time.perf_counter() - t0
        engine.generate(prompts[:4], **{**gen_kw, "tries": tries[:4] if tries else None})  # warm-up + adapter load
        vgens, secs = timed(lambda: engine.generate(prompts, **gen_kw))
        rows["vllm"] = {"tokens": sum(len(g.token_ids) for g in vgens), "seconds": secs, "startup_s": startup}
    else:
        vgens = gens
    base = rows["transformers"]["tokens"] / rows["transformers"]["seconds"]
    table = Table(title=f"generation, {args.model} ({args.dtype}), {len(prompts)} prompts, "
                        f"<= {args.max_new_tokens} new tokens, T={args.temperature}"
                        + (", constrained" if args.constrained else ""))
    for col in ("engine", "tokens", "seconds", "tokens/s", "x transformers"):
        table.add_column(col, justify="right")
    for name, r in rows.items():
        r["tokens_per_s"] = r["tokens"] / r["seconds"]
        table.add_row(name, str(r["tokens"]), f"{r['seconds']:.2f}", f"{r['tokens_per_s']:.0f}",
                      f"{r['tokens_per_s'] / base:.1f}")
    console.print(table)
    if engine is None:
        console.print(f"vllm: skipped ({skipped}); the agreement checks below compare nothing with it")
    else:
        console.print(f"vLLM engine start (base load, CUDA graphs): {rows['vllm']['startup_s']:.1f}s, paid once per training run")

    # agreement: vLLM's processed sampled-token log-probs vs the trainer's scoring of the same tokens
    responses = [g.token_ids for g in vgens]
    allowed = [t.allowed_along(r) for t, r in zip(tries, responses)] if tries else None
    pad = tok.pad_token_id
    checks = {}
    if engine is not None and args.temperature == 1.0 and all(g.logprobs is not None for g in vgens):
        ref = response_logprobs(policy.model, prompts, responses, pad_id=pad, batch_size=16, allowed=allowed)
        diffs = [abs(lp - ref.logp[i, k].item()) for i, g in enumerate(vgens) for k, lp in enumerate(g.logprobs)]
        checks["sampler_vs_trainer_logp_abs_mean"] = sum(diffs) / max(len(diffs), 1)
        checks["sampler_vs_trainer_logp_abs_max"] = max(diffs, default=0.0)

    # teacher scoring: vLLM prompt log-probs vs the training-side forward, on the same sequences
    teacher_prompts = [p for p, _ in household_prompts(tok, args.prompts, max_tokens=2048, skills=True)]
    ref, t_train = timed(lambda: response_logprobs(policy.model, teacher_prompts, responses, pad_id=pad, batch_size=16,
                                                   allowed=allowed))
    checks["teacher_train_s"] = t_train
    if engine is not None:
        (out, fell_back), t_vllm = timed(lambda: vllm_response_logprobs(
            engine, policy.model, teacher_prompts, responses, pad_id=pad, batch_size=16, allowed=allowed,
            topk=args.teacher_topk))
        checks.update({"teacher_vllm_s": t_vllm, "teacher_vllm_fallback_rows": fell_back,
                       "teacher_logp_abs_max": float(((out.logp - ref.logp) * ref.mask).abs().max())})
    table = Table(title="agreement and teacher scoring")
    table.add_column("check")
    table.add_column("value", justify="right")
    for k, v in checks.items():
        table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    console.print(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "generation": rows, "checks": checks, "skipped": skipped}, f, indent=2)


if __name__ == "__main__":
    main()
