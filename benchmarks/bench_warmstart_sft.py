"""Where the warm start's SFT time goes, and the most that bucketing, packing or prefix sharing could save.

For a config's warm start (the same examples and the same batches, in the same order, as
`sdar warmstart` trains on) it prints, over every SFT update:
- positions forwarded: the padded batches as they run (rows x longest row), and the real tokens;
  bucketing or packing can at best forward only the real tokens (the ceiling: padded / real);
- the exact minimum for the same batches: the nodes of each batch's prefix trie
  (`sdar.models.scoring.prefix_trie_positions`), what encoding every shared prompt start once per
  batch (with gradient) would still forward (the ceiling: padded / trie);
- seconds per update, timed on `--time-updates` real SFT updates of the cached warm-started model
  (the same code as the build, lr as configured), and the SFT's projected seconds.
A ceiling is a speed-up at the same seconds per position; attention grows with the context, so a
real scheme gets less. Run:
  .venv/bin/python benchmarks/bench_warmstart_sft.py [--config configs/household-tiny.yaml] [--set KEY=VALUE]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/household-tiny.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    ap.add_argument("--time-updates", type=int, default=40, help="real SFT updates timed (0: none)")
    ap.add_argument("--json", default="runs/bench/warmstart_sft.json", help="where the figures are written")
    args = ap.parse_args()
    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sdar.agent.prompts import PromptBuilder
    from sdar.config import load_config
    from sdar.console import make_console
    from sdar.models.scoring import prefix_trie_positions
    from sdar.train.warmstart import ensure_warm_start, expert_turns, sft, sft_batches, sft_examples, warmstart_config

    console = make_console()  # the figures: stdout, the table `make bench` writes
    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    cfg = warmstart_config(load_config(args.config, overrides))
    ws = cfg.warmstart
    # the cached model's tokenizer is the one its SFT ran with; a build's progress goes to stderr, not the table
    path = ensure_warm_start(cfg, make_console(stderr=True))
    if path is None:
        raise SystemExit(f"{args.config} does not use the tiny model (model.name_or_path: {cfg.model.name_or_path!r}): "
                         "it has no warm start to measure")
    tokenizer = AutoTokenizer.from_pretrained(path)
    builder = PromptBuilder(cfg.env.family, history=cfg.rollout.history, show_admissible=cfg.rollout.show_admissible)
    # the build's own examples: the SFT episodes are drawn with seed + 1 (build_tiny_checkpoint)
    examples = sft_examples(cfg, tokenizer, builder, expert_turns(cfg, ws.episodes, seed=cfg.seed + 1))
    seqs = [p + r for p, r, _ in examples]
    lengths = [len(s) for s in seqs]
    g = torch.Generator().manual_seed(cfg.seed)
    padded = real = trie = updates = 0
    for _ in range(ws.epochs):
        for batch in sft_batches(lengths, ws.batch_size, g):
            padded += len(batch) * max(lengths[i] for i in batch)
            real += sum(lengths[i] for i in batch)
            trie += prefix_trie_positions([seqs[i] for i in batch])
            updates += 1
    fig = {"config": args.config, "examples": len(examples), "updates": updates, "batch_size": ws.batch_size,
           "padded_positions": padded, "real_tokens": real, "trie_positions": trie,
           "padding_frac": 1 - real / padded, "ceiling_packing": padded / real, "ceiling_prefix_sharing": padded / trie}
    console.print(f"{args.config}: {len(examples)} examples, {updates} updates of {ws.batch_size} ({ws.epochs} epochs)")
    console.print(f"positions forwarded: {padded / 1e3:.0f}k padded, {real / 1e3:.0f}k real tokens "
                  f"({1 - real / padded:.1%} padding); the exact minimum (each batch's prefix trie): {trie / 1e3:.0f}k")
    console.print(f"ceilings at the same seconds per position: bucketing or packing {padded / real:.2f}x, "
                  f"prefix sharing within each batch as well {padded / trie:.2f}x")
    if args.time_updates > 0:
        model = AutoModelForCausalLM.from_pretrained(path).to(cfg.resolved_device())  # float32, as the build trains
        n = min(args.time_updates * ws.batch_size, len(examples))
        t0 = time.perf_counter()
        stats = sft(model, examples[:n], pad_id=tokenizer.pad_token_id, epochs=1, lr=ws.lr, batch_size=ws.batch_size,
                    seed=cfg.seed, prompt_lm=ws.prompt_lm_weight)
        per = (time.perf_counter() - t0) / stats["sft_updates"]
        fig.update({"s_per_update": per, "sft_projected_s": per * updates})
        console.print(f"{per:.3f} s per update ({stats['sft_updates']} timed, {cfg.resolved_device()}): the SFT takes "
                      f"about {per * updates / 60:.1f} min; at the prefix-sharing ceiling {per * updates / 60 / (padded / trie):.1f} min")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(fig, indent=1))
    console.print(f"figures: {out}")


if __name__ == "__main__":
    main()
