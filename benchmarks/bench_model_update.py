"""Seconds per training update of the tiny policy: forward + backward + AdamW step on B x L tokens.

Times LoRA and full fine-tuning through the trainer's path (load_policy -> token_logprobs with entropy).
Run: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/bench_model_update.py [--batch 8 --seq 512 --config PATH]
On a CPU shared with other jobs, OpenMP threads that spin at barriers burn their time slices:
PASSIVE (or --threads 1) is then 2-3x faster in wall time. "CPU s per thread" estimates an idle machine.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

import torch

from sdar.models import ModelSpec, load_policy, token_logprobs, train_tokenizer


def synthetic_corpus(n_lines: int = 6000, seed: int = 0) -> list[str]:
    """Text with enough distinct words to fill a 4-8k BPE vocabulary (timing depends only on sizes)."""
    rng = random.Random(seed)
    syll = [a + b for a in "bcdfghklmnprstvwz" for b in "aeiou"] + ["ing", "er", "ed", "th", "sh", "ch"]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(6000)]
    return [" ".join(rng.choice(words) for _ in range(30)) + f" {rng.randint(0, 99)}." for _ in range(n_lines)]


def time_updates(mode: str, tok_dir: str, args: argparse.Namespace) -> dict[str, float]:
    spec = ModelSpec(f"tiny:{tok_dir}", lora=(mode == "lora"), tiny_config=args.config, dtype=args.dtype)
    policy = load_policy(spec)
    policy.model.train()
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-5)
    vocab = len(policy.tokenizer)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (args.batch, args.seq), generator=gen)
    mask = torch.ones_like(ids)

    def update() -> None:
        logp, ent = token_logprobs(policy.model, ids, mask, return_entropy=True)
        loss = -logp.mean() - 0.001 * ent.mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    update()  # warm-up: allocator, AdamW state
    times, cpu = [], []
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        update()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    counts = policy.parameter_counts()
    return {
        "params": counts["total"], "trainable": counts["trainable"], "min_s": min(times),
        "median_s": statistics.median(times), "tok_per_s": args.batch * args.seq / min(times),
        # CPU-seconds per thread: what the wall time would be with the cores to ourselves
        "cpu_per_thread_s": min(cpu) / torch.get_num_threads(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--config", default=None, help="TinyModelConfig YAML (default: the packaged tiny-qwen2.yaml)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--modes", default="lora,full")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice, one per core)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tok = train_tokenizer(synthetic_corpus(), vocab_size=args.vocab)
        tok.save_pretrained(tmp)
        print(
            f"torch threads {torch.get_num_threads()}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
            f"vocab {len(tok)}, batch {args.batch} x {args.seq} tokens, {args.dtype}, load {os.getloadavg()[0]:.1f}"
        )
        for mode in args.modes.split(","):
            r = time_updates(mode, tmp, args)
            print(
                f"{mode:5s} params {r['params'] / 1e6:.2f}M (trainable {r['trainable'] / 1e6:.2f}M): "
                f"min {r['min_s']:.3f} s, median {r['median_s']:.3f} s per update, {r['tok_per_s']:.0f} tokens/s; "
                f"CPU {r['cpu_per_thread_s']:.3f} s per thread"
            )


if __name__ == "__main__":
    main()
