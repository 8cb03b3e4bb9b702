"""Where each warm start lives and how a run loads it: the cache keys (everything that shapes a warm start, hashed),
the paths, and the policy a run starts from. The lower half of the warm start, below the runtime: building one
(`sdar.train.warmstart` for the tiny model, `sdar.train.warm_pretrained` for a pretrained checkpoint) evaluates
through the runtime, while the runtime and the strategies only load what was built, from here."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from sdar.config import TrainConfig, drop_added_defaults
from sdar.train.imitation import prompt_fingerprint, warmstart_config

MARKER = "warmstart.json"  # written last into a finished warm start: its absence means not built
WARMSTART_VERSION = 7


PRETRAINED_VERSION = 1
# what the key leaves out of cfg.warmstart: knobs of the tiny model's build, the switch itself, the report's size
_NOT_IN_KEY = ("tokenizer_episodes", "vocab_size", "pretokenizer", "pretrained", "eval_tasks", "seed", "dtype")



def tiny_key(cfg: TrainConfig, tiny) -> str:
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


def tiny_config(cfg: TrainConfig):
    """The repo's tiny-model config with the experiment's overrides applied."""
    from sdar.models import TinyModelConfig

    base = TinyModelConfig.from_yaml(None).to_dict()
    return TinyModelConfig.from_dict({**base, **cfg.model.tiny_overrides}, "model.tiny_overrides")


def tiny_checkpoint_path(cfg: TrainConfig) -> Path:
    """Where the warm-started tiny checkpoint of this config is cached (built or not)."""
    from sdar.models.cache import cache_root

    cfg = warmstart_config(cfg)
    return cache_root() / "tiny" / f"{cfg.env.family}-{tiny_key(cfg, tiny_config(cfg))}"


def wants_pretrained_warm_start(cfg: TrainConfig) -> bool:
    """Whether `cfg` trains a pretrained checkpoint from a warm start of it (`warmstart.pretrained`)."""
    return cfg.model.name_or_path != "tiny" and bool(cfg.warmstart.pretrained)


def base_identity(name_or_path: str) -> dict[str, Any]:
    """What identifies the weights and tokenizer `name_or_path` loads, without loading them: SmolLM2 by its GGUF file,
    a local directory by its files' names, sizes and modification times, a hub id by its name."""
    from sdar.models.gguf import SMOLLM2_ALIASES, SMOLLM2_NAME, smollm2_gguf_path

    if name_or_path.lower() in SMOLLM2_ALIASES:
        gguf = smollm2_gguf_path()
        return {"model": SMOLLM2_NAME, "gguf": gguf.name, "bytes": gguf.stat().st_size}
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        return {"dir": str(path.resolve()),
                "files": [[str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns] for p in files]}
    return {"hub": name_or_path}


def warm_seed(cfg: TrainConfig) -> int:
    """The seed of `cfg`'s pretrained warm start: `warmstart.seed`, else the run's."""
    return cfg.seed if cfg.warmstart.seed is None else int(cfg.warmstart.seed)


def warm_dtype(cfg: TrainConfig) -> str:
    """The dtype `cfg`'s pretrained warm start is trained in: `warmstart.dtype`, else model.dtype."""
    from sdar.models.policy import DTYPES

    dtype = cfg.warmstart.dtype or cfg.model.dtype
    if dtype not in DTYPES:
        raise ValueError(f"warmstart.dtype={dtype!r} is not one of {', '.join(DTYPES)} (null = model.dtype)")
    return dtype


def pretrained_key(cfg: TrainConfig) -> str:
    """The cache key of `cfg`'s pretrained warm start: the base's identity, the model settings that shape the SFT (dtype,
    LoRA), the expert episodes (env, rollout format, prompts as rendered), the warm-start settings and the seed."""
    cfg = replace(warmstart_config(cfg), seed=warm_seed(cfg))  # the run's seed only where the warm start's is
    ws = {k: v for k, v in drop_added_defaults(asdict(cfg.warmstart), "warmstart").items() if k not in _NOT_IN_KEY}
    ws["lora"] = cfg.warmstart.lora
    m = cfg.model
    blob = json.dumps({
        "v": PRETRAINED_VERSION, "base": base_identity(m.name_or_path),
        "model": {"dtype": warm_dtype(cfg), **({"lora_r": m.lora_r, "lora_alpha": m.lora_alpha} if cfg.warmstart.lora
                                                else {})},
        "prompts": hashlib.sha256(prompt_fingerprint(cfg).encode()).hexdigest(),
        "env": {k: v for k, v in asdict(cfg.env).items() if k != "url"}, "warmstart": ws,
        "rollout": {k: getattr(cfg.rollout, k) for k in ("history", "use_memory", "max_prompt_tokens", "max_turns",
                                                          "show_admissible", "privileged_placement")},
        "teacher_max": cfg.teacher.max_prompt_tokens, "seed": warm_seed(cfg),
    }, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def pretrained_path(cfg: TrainConfig) -> Path:
    """Where `cfg`'s pretrained warm start is cached (built or not): <cache>/warm/<family>-<model>-<key>."""
    from sdar.models.cache import cache_root

    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(cfg.model.name_or_path.rstrip("/")).name.lower()).strip("-.") or "model"
    return cache_root() / "warm" / f"{cfg.env.family}-{slug}-{pretrained_key(cfg)}"


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
    return load_policy(ModelSpec.from_config(m, path))
