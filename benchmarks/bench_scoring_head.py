"""What running the output head only at the free response tokens (`head_at_free_tokens`) saves, per model.

A scoring pass (no grad) and an update forward + backward over the same constrained batch, with the head at the
free response tokens only and, switched off, over each forward's response span, interleaved (on, off, on, ...)
so that a drifting machine slows both alike; median seconds of `--repeats`. The batch is shaped like a
household step's: prompts of 120-200 tokens, responses of 10 tokens of which `--forced` are forced (a constrained
step allowing exactly the sampled token), the others free among 2-8 tokens. The share of a forward that the head
is grows with the vocabulary over the width: the tiny model (4,096 x 256) against SmolLM2-135M (49,152 x 576). Run:
  .venv/bin/python benchmarks/bench_scoring_head.py [--models tiny,smollm2] [--rows 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path


def batch(vocab: int, rows: int, forced: float, seed: int = 0):
    rng = random.Random(seed)
    prompts, responses, allowed = [], [], []
    for _ in range(rows):
        prompts.append([rng.randrange(vocab) for _ in range(rng.randrange(120, 200))])
        r = [rng.randrange(vocab) for _ in range(10)]
        steps = []
        for tok in r:
            if rng.random() < forced:
                steps.append([tok])
            else:
                steps.append(sorted({tok, *(rng.randrange(vocab) for _ in range(rng.randrange(1, 8)))}))
        responses.append(r)
        allowed.append(steps)
    return prompts, responses, allowed


def load(name: str):
    import torch

    if name == "tiny":
        from sdar.models import TinyModelConfig, build_tiny_model, train_tokenizer

        tok = train_tokenizer(["a b c d e f g h"] * 50, vocab_size=300)
        cfg = TinyModelConfig.from_yaml(None)
        return build_tiny_model(tok, TinyModelConfig.from_dict({**cfg.to_dict(), "vocab_size": 4096}))
    if name == "smollm2":
        from transformers import AutoModelForCausalLM

        from sdar.models.gguf import smollm2_dir

        return AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32)
    raise SystemExit(f"unknown model {name!r}: tiny or smollm2")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--rows", type=int, default=64, help="turn-samples in the batch")
    ap.add_argument("--forced", type=float, default=0.76, help="share of forced response tokens (household-tiny: 76%%)")
    ap.add_argument("--batch-size", type=int, default=16, help="rows per forward")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default="runs/bench/scoring_head.json")
    args = ap.parse_args()
    import torch

    from sdar.models.logprobs import head_where_needed
    from sdar.models.scoring import response_logprobs

    out = {}
    for name in args.models.split(","):
        model = load(name)
        vocab, width = model.get_output_embeddings().weight.shape
        prompts, responses, allowed = batch(vocab, args.rows, args.forced)
        kw = dict(pad_id=0, allowed=allowed, batch_size=args.batch_size, temperature=1.0)

        def score():
            with torch.no_grad():
                response_logprobs(model.eval(), prompts, responses, **kw)

        def update():
            model.train()
            model.zero_grad(set_to_none=True)
            for s in range(0, args.rows, args.batch_size):
                sl = slice(s, s + args.batch_size)
                got = response_logprobs(model, prompts[sl], responses[sl], grad=True, with_entropy=True,
                                        **{**kw, "allowed": allowed[sl]})
                (got.logp.sum() + 1e-3 * got.entropy.sum()).backward()

        times: dict[str, list[float]] = {}
        for rep in range(args.repeats + 1):  # the first round warms up
            for phase, fn in (("score", score), ("update", update)):
                for on in (True, False):
                    with head_where_needed(on):
                        t0 = time.perf_counter()
                        fn()
                        dt = time.perf_counter() - t0
                    if rep:
                        times.setdefault(f"{phase}/{'on' if on else 'off'}", []).append(dt)
        fig = {k: statistics.median(v) for k, v in times.items()}
        fig.update(vocab=vocab, width=width)
        out[name] = fig
        print(f"{name} (vocab {vocab} x width {width}), {args.rows} rows, {args.forced:.0%} forced: "
              f"score {fig['score/on']:.2f} s with the head at the free tokens, {fig['score/off']:.2f} s without "
              f"({fig['score/on'] / fig['score/off']:.2f}x); update {fig['update/on']:.2f} / {fig['update/off']:.2f} s "
              f"({fig['update/on'] / fig['update/off']:.2f}x)", flush=True)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"figures: {path}")


if __name__ == "__main__":
    main()
