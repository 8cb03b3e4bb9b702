"""What the TRL GRPO tests share (tests/integration/test_trl_grpo.py, tests/integrations/test_trl_openenv.py): a tiny
policy with sdar's household tokenizer, scripted to write a fixed reply through `sequence_bias`."""

from __future__ import annotations


def tiny_policy():
    """(tokenizer, model): the Qwen tokenizer prepared for household replies (`<action>X</action>` read as act(X))
    and a one-layer tiny model on it."""
    from sdar.integrations.trl import prepare_tokenizer
    from sdar.models import TinyModelConfig, build_tiny_model, load_qwen_tokenizer

    tokenizer = prepare_tokenizer(load_qwen_tokenizer(), "household")
    cfg = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, max_position_embeddings=2048)
    return tokenizer, build_tiny_model(tokenizer, cfg)


def scripted_bias(tokenizer, reply: str) -> list:
    """`sequence_bias` entries that make any model write `reply` then <|im_end|>: each token is boosted
    after the reply's own prefix, more the longer the prefix, so the longest matching prefix wins."""
    ids = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return [[ids[: k + 1], 50.0 * (k + 1)] for k in range(len(ids))]
