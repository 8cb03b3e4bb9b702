"""Supervised warm-start of the tiny default policy on expert trajectories.

The tokenizer is trained on environment text, the Qwen2-architecture model is built from
the repo's config, and it imitates expert turns rendered with exactly the rollout's prompts.
A share of the examples carries the privileged skills with the action of an expert that
follows exactly those skills (household: it searches the listed receptacle types first; search-QA:
it decomposes two-hop questions and searches both sides of a comparison), the rest has no skills and
the uninformed expert's action (household: listing-order search; search-QA: one search of the whole
question, then the bridge entity or the first-named entity as the answer), so
the skills-conditioned teacher can start out better than the student, as SDAR assumes. An
optional language-modelling term on the prompt tokens (`warmstart.prompt_lm_weight`) speeds
up learning to read the prompt. The result is cached by a hash of everything that shapes it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sdar.agent.parsing import format_action
from sdar.agent.prompts import PromptBuilder
from sdar.config import TrainConfig
from sdar.train.imitation import (  # noqa: F401 - re-exported: the warm start's imitation machinery
    expert_turns,
    is_decision,
    prompt_fingerprint,
    sft,
    sft_batches,
    sft_examples,
    warmstart_config,
)
from sdar.train.warm_cache import (  # noqa: F401 - re-exported: where a warm start lives and how a run loads it
    MARKER,
    WarmStartMissing,
    load_warm_policy,
    tiny_checkpoint_path,
    tiny_config,
    tiny_key,
    wants_pretrained_warm_start,
    warm_start_path,
)
from sdar.train.warm_pretrained import pretrained_warm_start


def build_tiny_checkpoint(cfg: TrainConfig, out_dir: Path, console=None) -> dict[str, Any]:
    """Train tokenizer + tiny model on expert turns and save both to `out_dir`."""
    from sdar.models import build_tiny_model, train_tokenizer

    t0 = time.perf_counter()
    cfg = warmstart_config(cfg)
    ws = cfg.warmstart
    # the tokenizer needs plenty of text to learn merges (short prompts = cheap updates); the
    # SFT needs far fewer examples, so the two sample sizes are separate knobs
    turns = expert_turns(cfg, max(ws.episodes, ws.tokenizer_episodes), seed=cfg.seed,
                         progress="warm start: tokenizer's expert episodes", console=console)
    builder = PromptBuilder(cfg.env.family, history=cfg.rollout.history, show_admissible=cfg.rollout.show_admissible)
    corpus = []
    for t in turns:
        for skills in (None, t["skills"]):
            msgs = builder.messages(t["view"], skills=skills)
            corpus.append("\n".join(m["content"] for m in msgs) + "\n" + format_action(cfg.env.family, t["action"]))
    tokenizer = train_tokenizer(corpus, vocab_size=ws.vocab_size, pretokenizer=ws.pretokenizer)
    turns = expert_turns(cfg, ws.episodes, seed=cfg.seed + 1, progress="warm start: expert episodes", console=console)
    tiny = tiny_config(cfg)
    model = build_tiny_model(tokenizer, tiny)
    examples = sft_examples(cfg, tokenizer, builder, turns)
    # the SFT runs where the trainer would (cfg.device: a GPU when one is visible); saved from the CPU
    model.to(cfg.resolved_device())
    stats = sft(model, examples, pad_id=tokenizer.pad_token_id, epochs=ws.epochs, lr=ws.lr,
                batch_size=ws.batch_size, seed=cfg.seed, console=console, prompt_lm=ws.prompt_lm_weight)
    model.to("cpu").save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {"device": str(cfg.resolved_device()), "examples": len(examples), "privileged_examples": sum(t["privileged"] for t in turns),
            "episodes": ws.episodes, "seconds": time.perf_counter() - t0, **stats}
    (out_dir / MARKER).write_text(json.dumps(info, indent=2))
    return info


def tiny_checkpoint(cfg: TrainConfig, console=None) -> Path:
    """The cached warm-started tiny checkpoint for this config, built on first use."""
    from sdar.models.cache import build_once

    backend = cfg.env.kwargs.get("backend", "sim") if cfg.env.family == "household" else "sim"
    target = tiny_checkpoint_path(cfg)
    cfg = warmstart_config(cfg)
    if console is None and not (target / MARKER).is_file():  # a build takes minutes: it shows its progress
        from sdar.console import make_console

        console = make_console(stderr=True)
    if backend != "sim" and console is not None:
        console.print(f"the tiny warm start imitates the household sim's experts; backend {backend!r} plays the episodes")
    if not (target / MARKER).is_file() and console is not None:
        console.print(f"building the warm-started tiny model (cached at {target}) ...")
    say = (lambda msg: console.print(msg, soft_wrap=True, highlight=False)) if console is not None else None
    return build_once(target, lambda tmp: build_tiny_checkpoint(cfg, tmp, console), MARKER, say=say)


def ensure_warm_start(cfg: TrainConfig, console=None) -> Path | None:
    """The explicit warm-start step of a command: builds (or finds) the warm start of cfg.model, the tiny model's
    always and a pretrained checkpoint's with `warmstart.pretrained` (`sdar.train.warm_pretrained`); None when the
    config trains a pretrained checkpoint as it is."""
    if cfg.model.name_or_path == "tiny":
        return tiny_checkpoint(cfg, console)
    if wants_pretrained_warm_start(cfg):
        return pretrained_warm_start(cfg, console)
    return None
