"""The architecture table of `sdar size`: parameter counts, LoRA sizes and KV bytes of Qwen2/Llama
decoders, and how `--model` (a name, a size or a config.json) becomes an architecture."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from sdar.sizing.units import SizingError


@dataclass(frozen=True)
class Arch:
    """A decoder-only transformer of the Qwen2/Llama family (RMSNorm, GQA, SwiGLU MLP, RoPE)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tie_embeddings: bool
    qkv_bias: bool = True  # Qwen2 has biases on q, k, v (not on o); Llama/SmolLM2 has none
    head_dim: int | None = None  # None = hidden // heads
    published_params: float | None = None  # the total the model card states, for the tests

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.hd

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.hd

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of the seven linear layers of one decoder layer (the LoRA targets)."""
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_params(self) -> int:
        """One decoder layer: q/k/v (+ biases), o_proj, 3 MLP matrices, 2 RMSNorm weights."""
        weights = sum(a * b for a, b in self.linear_shapes().values())
        biases = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        return weights + biases + 2 * self.hidden

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def lm_head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab * self.hidden

    def root_params(self) -> int:
        """What is outside the decoder layers: embeddings, lm_head (if untied), final norm."""
        return self.embedding_params() + self.lm_head_params() + self.hidden

    def params(self) -> int:
        return self.layers * self.layer_params() + self.root_params()

    def lora_params(self, r: int) -> int:
        """LoRA A [r, in] and B [out, r] on all seven linear layers of every decoder layer."""
        return self.layers * sum(r * (a + b) for a, b in self.linear_shapes().values())

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """K and V of every layer for one token: 2 * layers * kv_heads * head_dim * bytes."""
        return 2 * self.layers * self.kv_heads * self.hd * bytes_per_value


# Real config.json numbers of the published checkpoints. Qwen2.5-7B/14B pad their vocabulary to
# 152064 rows (0.5B-3B: 151936) and do not tie the lm_head; that is what makes 7.62B and 14.77B.
ARCHS: dict[str, Arch] = {
    a.name.lower(): a
    for a in (
        Arch("Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936, True, published_params=0.49e9),
        Arch("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, True, published_params=1.54e9),
        Arch("Qwen2.5-3B", 2048, 36, 16, 2, 11008, 151936, True, published_params=3.09e9),
        Arch("Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, False, published_params=7.61e9),
        Arch("Qwen2.5-14B", 5120, 48, 40, 8, 13824, 152064, False, published_params=14.7e9),
        Arch("SmolLM2-135M", 576, 30, 9, 3, 1536, 49152, True, False, published_params=134.5e6),
        # the packaged tiny-qwen2.yaml on the default 4096-token local tokenizer (CPU runs)
        Arch("tiny", 256, 4, 4, 2, 768, 4096, True),
    )
}
_ALIASES = {"smollm2": "smollm2-135m", "qwen2.5": "qwen2.5-7b"}


def _normalize(name: str) -> str:
    key = name.strip().lower()
    for prefix in ("qwen/", "huggingfacetb/"):
        key = key.removeprefix(prefix)
    key = key.removesuffix("-instruct")
    return _ALIASES.get(key, key)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmbt]?)\s*$", re.IGNORECASE)
_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_size(text: str) -> float | None:
    """'7b' -> 7e9, '135M' -> 1.35e8, '7e9' -> 7e9; None when `text` is not a size."""
    m = _SIZE.match(text)
    if not m:
        return None
    value = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if value < 1e6:
        raise SizingError(
            f"model size {text!r} is too small to be a parameter count; "
            "write it with a unit, like 7b, 1.5b, 135m or 7e9"
        )
    return value


def _scaled_arch(target: float, template: Arch) -> Arch:
    """A Qwen2-like architecture of about `target` parameters: the template's depth scaled by the
    cube root of the size ratio, then the width (a multiple of head_dim) that comes closest."""
    layers = max(2, round(template.layers * (target / template.params()) ** (1 / 3)))
    hd, ratio = template.hd, template.intermediate / template.hidden
    best = None
    for heads in range(2, 257):
        h = heads * hd
        kv = math.gcd(heads, template.kv_heads)
        inter = max(hd, round(ratio * h / 128) * 128)
        cand = Arch(f"generic-{target / 1e9:g}B", h, layers, heads, kv, inter, template.vocab,
                    template.tie_embeddings, template.qkv_bias)
        if best is None or abs(cand.params() - target) < abs(best.params() - target):
            best = cand
    return best


def resolve_model(text: str) -> tuple[Arch, str]:
    """An architecture for `--model`: a table name, a size (7b, 7e9) or a local config.json path.
    Returns (arch, a sentence saying where the architecture came from)."""
    if not text or not text.strip():
        raise SizingError("--model is empty; " + _known_models_hint())
    key = _normalize(text)
    if key in ARCHS:
        a = ARCHS[key]
        return a, "built-in table of config.json numbers"
    path = Path(text).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        return arch_from_config(path), f"read from {path}"
    size = parse_size(text)
    if size is None:
        raise SizingError(f"unknown model {text!r}; " + _known_models_hint())
    real = [a for a in ARCHS.values() if a.name != "tiny"]
    nearest = min(real, key=lambda a: abs(math.log(a.params() / size)))
    if abs(math.log(nearest.params() / size)) <= math.log(1.2):
        return nearest, (
            f"size {text} -> nearest table architecture {nearest.name} "
            f"({nearest.params() / 1e9:.2f}B params)"
        )
    qwen = [a for a in real if a.name.startswith("Qwen")]
    template = min(qwen, key=lambda a: abs(math.log(a.params() / size)))
    a = _scaled_arch(size, template)
    return a, (
        f"size {text}: no table architecture within 20%, generic scaling of {template.name}: "
        f"{a.layers} layers, hidden {a.hidden}, {a.heads} heads ({a.kv_heads} KV), "
        f"MLP {a.intermediate} = {a.params() / 1e9:.2f}B params"
    )


def arch_from_config(path: str | Path) -> Arch:
    """An Arch from a Hugging Face config.json (Qwen2, Llama and similar decoder configs)."""
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SizingError(f"cannot read a model config from {path}: {exc}") from None
    cfg = cfg.get("text_config", cfg)
    need = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "vocab_size")
    missing = [k for k in need if k not in cfg]
    if missing:
        raise SizingError(
            f"{path} lacks {', '.join(missing)}; pass a decoder config.json "
            "(Qwen2/Llama style) or a model name/size"
        )
    model_type = str(cfg.get("model_type", ""))
    return Arch(
        name=str(cfg.get("_name_or_path") or Path(path).parent.name or model_type or "config"),
        hidden=int(cfg["hidden_size"]),
        layers=int(cfg["num_hidden_layers"]),
        heads=int(cfg["num_attention_heads"]),
        kv_heads=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
        intermediate=int(cfg["intermediate_size"]),
        vocab=int(cfg["vocab_size"]),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", model_type.startswith("qwen2"))),
        head_dim=cfg.get("head_dim"),
    )


def _known_models_hint() -> str:
    names = ", ".join(a.name for a in ARCHS.values())
    return f"known models: {names}; or a size (7b, 1.5b, 7e9) or a local config.json path"
