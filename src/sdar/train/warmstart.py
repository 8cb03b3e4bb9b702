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

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sdar.agent.parsing import format_action
from sdar.agent.prompts import PromptBuilder
from sdar.config import TrainConfig, drop_added_defaults
from sdar.train.imitation import (  # noqa: F401 - re-exported: the warm start's imitation machinery
    expert_turns,
    is_decision,
    prompt_fingerprint,
    sft,
    sft_batches,
    sft_examples,
    warmstart_config,
)
from sdar.train.warm_pretrained import (
    pretrained_path,
    pretrained_warm_start,
    wants_pretrained_warm_start,
)

WARMSTART_VERSION = 7
MARKER = "warmstart.json"


def _cache_key(cfg: TrainConfig, tiny) -> str:
    cfg = warmstart_config(cfg)  # the backend that plays the episodes does not shape the warm start
    blob = json.dumps({
        "prompts": hashlib.sha256(prompt_fingerprint(cfg).encode()).hexdigest(),
        # where episodes are served (env.url) does not change what the warm start imitates
        "v": WARMSTART_VERSION, "env": {k: v for k, v in asdict(cfg.env).items() if k != "url"}, "warmstart": _tiny_settings(cfg), "tiny": tiny.to_dict(),
        "rollout": {k: getattr(cfg.rollout, k) for k in ("history", "use_memory", "max_prompt_tokens", "max_turns", "constrained",
                                                          "show_admissible", "privileged_placement")},
        "teacher_max": cfg.teacher.max_prompt_tokens, "seed": cfg.seed,
    }, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _tiny_settings(cfg: TrainConfig) -> dict:
    """cfg.warmstart as the tiny warm start's key reads it: without the pretrained warm start's own settings."""
    ws = drop_added_defaults(asdict(cfg.warmstart), "warmstart")
    return {k: v for k, v in ws.items() if k not in ("pretrained", "lora", "eval_tasks", "seed")}


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


def tiny_config(cfg: TrainConfig):
    """The repo's tiny-model config with the experiment's overrides applied."""
    from sdar.models import TinyModelConfig

    base = TinyModelConfig.from_yaml(None).to_dict()
    return TinyModelConfig.from_dict({**base, **cfg.model.tiny_overrides}, "model.tiny_overrides")


def tiny_checkpoint_path(cfg: TrainConfig) -> Path:
    """Where the warm-started tiny checkpoint of this config is cached (built or not)."""
    from sdar.models.cache import cache_root

    cfg = warmstart_config(cfg)
    return cache_root() / "tiny" / f"{cfg.env.family}-{_cache_key(cfg, tiny_config(cfg))}"


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


def warm_start_path(cfg: TrainConfig) -> Path | None:
    """Where cfg.model's warm start is cached (built or not); None when the config needs none."""
    if cfg.model.name_or_path == "tiny":
        return tiny_checkpoint_path(cfg)
    return pretrained_path(cfg) if wants_pretrained_warm_start(cfg) else None


class WarmStartMissing(FileNotFoundError):
    """The config's model has no warm start yet: it is built by its own step, never implicitly."""


def load_warm_policy(cfg: TrainConfig):
    """The policy for `cfg.model`, loaded: "tiny" is the cached warm-started checkpoint, and so is a pretrained model
    with `warmstart.pretrained` (its adapter merged into it: RL trains a fresh adapter, the reference is the warm
    start); either must have been built (`sdar warmstart --config ...`, or `ensure_warm_start`). Anything else is
    loaded as named."""
    from sdar.models import ModelSpec, load_policy

    m = cfg.model
    path = m.name_or_path
    target = warm_start_path(cfg)
    if target is not None:
        if not (target / MARKER).is_file():
            what = "tiny model" if path == "tiny" else f"model {path!r}"
            raise WarmStartMissing(
                f"the {what} of this config has no warm start yet (expected at {target}); build it first with "
                "`sdar warmstart --config <your config>` (sdar train, sdar eval, sdar run and make demo build it "
                "themselves), or call sdar.train.warmstart.ensure_warm_start(cfg)")
        path = str(target)
    return load_policy(ModelSpec(name_or_path=path, dtype=m.dtype, lora=m.lora, lora_r=m.lora_r,
                                 lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout,
                                 gradient_checkpointing=m.gradient_checkpointing))
