"""The tiny Qwen2 policy: config from the packaged YAML, parameter count, seeding and bad settings."""

from __future__ import annotations

from importlib import resources

import pytest
import torch
import yaml
from transformers import Qwen2ForCausalLM

from sdar.models import TinyModelConfig, build_tiny_model, count_parameters


def expected_params(cfg: TinyModelConfig, vocab: int) -> int:
    """Qwen2 parameter count by hand: q/k/v carry biases, o and the MLP do not; tied head counted once."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    attn = (h * h + h) + 2 * (h * kv + kv) + h * h
    layer = attn + 3 * h * i + 2 * h  # + two RMSNorm weights
    head = 0 if cfg.tie_word_embeddings else vocab * h
    return vocab * h + cfg.num_hidden_layers * layer + h + head


def test_packaged_yaml_is_the_default_config():
    raw = yaml.safe_load(resources.files("sdar.models").joinpath("configs", "tiny-qwen2.yaml").read_text())
    cfg = TinyModelConfig.from_yaml()
    assert cfg.to_dict() == {**TinyModelConfig().to_dict(), **raw}
    # the dataclass defaults document the same numbers as the shipped file
    assert cfg == TinyModelConfig()


def test_default_model_matches_config_and_parameter_formula(tokenizer):
    cfg = TinyModelConfig.from_yaml()
    model = build_tiny_model(tokenizer, cfg)
    assert isinstance(model, Qwen2ForCausalLM)
    c = model.config
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers)
    assert (c.num_attention_heads, c.num_key_value_heads) == (cfg.num_attention_heads, cfg.num_key_value_heads)
    assert c.vocab_size == len(tokenizer)
    assert (c.pad_token_id, c.bos_token_id, c.eos_token_id) == (0, 1, 2)
    n = count_parameters(model)
    assert n == expected_params(cfg, len(tokenizer))
    # the default config with the default 4096-token vocabulary: ~4.2M parameters
    assert expected_params(cfg, 4096) == pytest.approx(4.2e6, rel=0.05)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_vocab_padding_and_too_small_vocab(tokenizer, small_cfg):
    big = TinyModelConfig(**{**small_cfg.to_dict(), "vocab_size": len(tokenizer) + 64})
    assert build_tiny_model(tokenizer, big).config.vocab_size == len(tokenizer) + 64
    small = TinyModelConfig(**{**small_cfg.to_dict(), "vocab_size": len(tokenizer) - 1})
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        build_tiny_model(tokenizer, small)


def test_seed_is_reproducible_and_private(tokenizer, small_cfg):
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = build_tiny_model(tokenizer, small_cfg, seed=7)
    after = torch.rand(3)
    assert torch.equal(before, after), "building a model must not consume the caller's RNG"
    b = build_tiny_model(tokenizer, small_cfg, seed=7)
    c = build_tiny_model(tokenizer, small_cfg, seed=8)
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb)
    assert not torch.equal(wa, wc)


def test_bfloat16_build(tokenizer, small_cfg):
    model = build_tiny_model(tokenizer, small_cfg, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_bad_configs_are_explained(tmp_path):
    with pytest.raises(ValueError, match="not divisible by num_attention_heads"):
        TinyModelConfig(hidden_size=100, num_attention_heads=3)
    with pytest.raises(ValueError, match="must divide num_attention_heads"):
        TinyModelConfig(num_attention_heads=4, num_key_value_heads=3)
    bad = tmp_path / "bad.yaml"
    bad.write_text("hidden_sise: 128\n")
    with pytest.raises(ValueError, match=r"unknown tiny-model setting\(s\) \['hidden_sise'\]"):
        TinyModelConfig.from_yaml(bad)
    with pytest.raises(FileNotFoundError, match="copy src/sdar/models/configs/tiny-qwen2.yaml"):
        TinyModelConfig.from_yaml(tmp_path / "missing.yaml")
