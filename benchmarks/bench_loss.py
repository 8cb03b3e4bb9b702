"""Micro-benchmark of the composed loss (forward + backward) for each arm on CPU.

Prints milliseconds per batch for [B, T] = [64, 512] with a 32k vocabulary, and the
SDAR-over-GRPO overhead ratio of the loss computation alone and with the vocabulary head.
Run: .venv/bin/python benchmarks/bench_loss.py [--batch 64 --seq 512 --vocab 32000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sdar.algos import LossBatch, compose_loss, entropy_per_token, get_arm


def loss_only_step(arm, tensors) -> None:
    """Loss from precomputed per-token tensors: the cost the arm itself adds."""
    logp = tensors["logp"].clone().requires_grad_(True)
    ent = tensors["entropy"].clone().requires_grad_(True)
    batch = LossBatch(
        logp=logp, old_logp=tensors["old"], advantages=tensors["adv"], mask=tensors["mask"],
        ref_logp=tensors["ref"], teacher_logp=tensors["teacher"] if arm.needs_teacher else None,
        entropy=ent,
    )
    total, _ = compose_loss(arm, batch)
    total.backward()


def with_head_step(arm, tensors, logits_mb, micro_batch: int) -> None:
    """Loss from logits, micro-batched like a trainer: log-softmax gather + entropy + loss."""
    B = tensors["logp"].shape[0]
    for start in range(0, B, micro_batch):
        sl = slice(start, start + micro_batch)
        logits = logits_mb[start // micro_batch].clone().requires_grad_(True)
        logp = torch.log_softmax(logits, -1).gather(-1, tensors["tokens"][sl, :, None]).squeeze(-1)
        batch = LossBatch(
            logp=logp, old_logp=tensors["old"][sl], advantages=tensors["adv"][sl],
            mask=tensors["mask"][sl], ref_logp=tensors["ref"][sl],
            teacher_logp=tensors["teacher"][sl] if arm.needs_teacher else None,
            entropy=entropy_per_token(logits),
        )
        total, _ = compose_loss(arm, batch)
        (total * logits.shape[0] / B).backward()


def timeit(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--micro-batch", type=int, default=4, help="sequences per head micro-batch (bounds memory)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--arms", default="grpo,grpo_opsd,sdar")
    ap.add_argument("--no-head", action="store_true", help="skip the vocabulary-head measurement")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    B, T, V = args.batch, args.seq, args.vocab
    logp = -torch.rand(B, T, generator=g) * 4
    tensors = {
        "logp": logp,
        "old": logp + 0.05 * torch.randn(B, T, generator=g),
        "ref": logp + 0.1 * torch.randn(B, T, generator=g),
        "teacher": logp + 0.3 * torch.randn(B, T, generator=g),
        "entropy": torch.rand(B, T, generator=g) * 3,
        "adv": torch.randn(B, generator=g),
        "mask": (torch.rand(B, T, generator=g) < 0.8).float(),
        "tokens": torch.randint(0, V, (B, T), generator=g),
    }
    from rich.table import Table

    from sdar.console import make_console

    console = make_console()
    console.print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, B={B} T={T} V={V}")
    rows = {}
    for name in args.arms.split(","):
        arm = get_arm(name)
        rows[name] = {"loss_only": statistics.median(timeit(lambda: loss_only_step(arm, tensors), args.repeats))}
    if not args.no_head:
        logits_mb = [torch.randn(min(args.micro_batch, B - s), T, V, generator=g) for s in range(0, B, args.micro_batch)]
        for name in rows:
            arm = get_arm(name)
            rows[name]["with_head"] = statistics.median(
                timeit(lambda: with_head_step(arm, tensors, logits_mb, args.micro_batch), max(1, args.repeats // 2))
            )
    table = Table(title="composed loss, forward + backward, median ms per batch")
    table.add_column("arm")
    table.add_column("loss alone [B,T] (ms)", justify="right")
    table.add_column("x grpo", justify="right")
    if not args.no_head:
        table.add_column("with vocab head [B,T,V] (ms)", justify="right")
        table.add_column("x grpo", justify="right")
    base = rows["grpo"] if "grpo" in rows else next(iter(rows.values()))
    for name, r in rows.items():
        cells = [name, f"{r['loss_only']:.1f}", f"{r['loss_only'] / base['loss_only']:.2f}"]
        if "with_head" in r:
            cells += [f"{r['with_head']:.0f}", f"{r['with_head'] / base['with_head']:.3f}"]
        table.add_row(*cells)
    console.print(table)
    if "sdar" in rows and "grpo" in rows:
        console.print(
            f"SDAR/GRPO overhead ratio of the loss computation alone: {rows['sdar']['loss_only'] / rows['grpo']['loss_only']:.2f}x"
        )


if __name__ == "__main__":
    main()
