"""The tiny default policy: a small Qwen2 decoder built from a YAML config in the repo.

Sized so that one training update on 8 x 512 tokens takes about a second on 2 CPU cores
(see benchmarks/bench_model_update.py); real checkpoints use the same Qwen2 code path.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

DEFAULT_TINY_CONFIG = "tiny-qwen2.yaml"


@dataclass
class TinyModelConfig:
    """Architecture of the tiny Qwen2 policy (defaults = configs/tiny-qwen2.yaml)."""

    vocab_size: int | None = None  # embedding rows; None = len(tokenizer); may exceed it (padding rows)
    hidden_size: int = 256  # model width
    intermediate_size: int = 768  # SwiGLU MLP width
    num_hidden_layers: int = 4  # decoder blocks
    num_attention_heads: int = 4  # query heads (head_dim = hidden_size / heads)
    num_key_value_heads: int = 2  # grouped-query KV heads; must divide num_attention_heads
    max_position_embeddings: int = 2048  # longest sequence the rotary table is meant for
    tie_word_embeddings: bool = True  # share input embedding and LM head (saves vocab x hidden)
    rope_theta: float = 10000.0  # rotary base frequency
    rms_norm_eps: float = 1e-6  # RMSNorm epsilon
    initializer_range: float = 0.02  # std of the normal init of linear/embedding weights
    attention_dropout: float = 0.0  # dropout on attention probabilities (0 keeps log-probs deterministic)

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}; "
                "pick heads that divide the width"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads={self.num_key_value_heads} must divide num_attention_heads={self.num_attention_heads}"
            )
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> TinyModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown tiny-model setting(s) {unknown} in {source}; valid settings: {', '.join(sorted(known))}")
        return cls(**data)

    @classmethod
    def from_yaml(cls, path: str | Path | None = None) -> TinyModelConfig:
        """Read a YAML file of the fields above; None reads the packaged configs/tiny-qwen2.yaml."""
        if path is None:
            text = resources.files("sdar.models").joinpath("configs", DEFAULT_TINY_CONFIG).read_text()
            source = f"sdar/models/configs/{DEFAULT_TINY_CONFIG}"
        else:
            p = Path(path)
            if not p.is_file():
                raise FileNotFoundError(f"tiny-model config {p} does not exist; copy src/sdar/models/configs/{DEFAULT_TINY_CONFIG} and edit it")
            text, source = p.read_text(), str(p)
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise TypeError(f"{source} must be a mapping of TinyModelConfig fields, got {type(data).__name__}")
        return cls.from_dict(data, source)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def qwen2_config(tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig) -> Qwen2Config:
    """The transformers config for `cfg`, with vocabulary size and special ids taken from `tokenizer`."""
    n_tok = len(tokenizer)
    vocab = cfg.vocab_size if cfg.vocab_size is not None else n_tok
    if vocab < n_tok:
        raise ValueError(
            f"vocab_size={vocab} is smaller than the tokenizer ({n_tok} tokens); "
            "set vocab_size to null (use the tokenizer's size) or at least that"
        )
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer needs pad and eos tokens (train_tokenizer sets them); set tokenizer.pad_token first")
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_norm_eps,
        initializer_range=cfg.initializer_range,
        attention_dropout=cfg.attention_dropout,
        use_sliding_window=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig | None = None, *, seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2ForCausalLM for `tokenizer` (cfg None = the packaged YAML).

    seed: the weights are drawn from a private generator state, so building does not disturb
    the caller's RNG and the same seed gives the same weights.
    """
    cfg = cfg if cfg is not None else TinyModelConfig.from_yaml()
    config = qwen2_config(tokenizer, cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model.to(dtype)


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
