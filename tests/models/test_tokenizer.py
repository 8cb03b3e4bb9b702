"""The locally trained byte-level BPE: special tokens, agent tags, ChatML template, save/load round trip."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from sdar.models import AGENT_TAGS, train_tokenizer
from tests.models.conftest import agent_corpus

CONVERSATION = [
    {"role": "system", "content": "You are an agent in a household."},
    {"role": "user", "content": "Your task is to: put a clean mug in cabinet."},
    {"role": "assistant", "content": "<think>find the mug</think><action>go to countertop 1</action>"},
    {"role": "user", "content": "You arrive at countertop 1. On the countertop 1, you see a mug 2."},
]
EXPECTED_CHATML = (
    "<|im_start|>system\nYou are an agent in a household.<|im_end|>\n"
    "<|im_start|>user\nYour task is to: put a clean mug in cabinet.<|im_end|>\n"
    "<|im_start|>assistant\n<think>find the mug</think><action>go to countertop 1</action><|im_end|>\n"
    "<|im_start|>user\nYou arrive at countertop 1. On the countertop 1, you see a mug 2.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_special_tokens_and_vocab_size(tokenizer):
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token) == ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    # vocab_size is an upper bound: this small corpus runs out of pairs seen twice before 512
    assert 400 < len(tokenizer) <= 512
    assert tokenizer.padding_side == "left"
    # no automatic bos: ChatML carries its own markers
    assert tokenizer("go to cabinet 1")["input_ids"][0] != tokenizer.bos_token_id


def test_agent_tags_are_single_non_special_tokens(tokenizer):
    for tag in AGENT_TAGS:
        ids = tokenizer(tag)["input_ids"]
        assert len(ids) == 1, tag
        assert tag not in tokenizer.all_special_tokens
    text = "<think>open it</think><action>open drawer 3</action>"
    ids = tokenizer(text)["input_ids"]
    # tags stay text even when special tokens are dropped from the decoding
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.convert_ids_to_tokens(ids)[0] == "<think>"
    # the corpus words were learned as merges: far fewer tokens than bytes
    assert len(tokenizer("You are in the middle of a room.")["input_ids"]) <= 10


def test_byte_level_round_trip_of_unseen_text(tokenizer):
    for text in ["héllo wörld 😀 毕老师", "  two  spaces\n\n\ttab", "x" * 50, "price: $12.50!"]:
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_chat_template_is_chatml(tokenizer):
    text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert text == EXPECTED_CHATML
    no_prompt = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=False)
    assert no_prompt == EXPECTED_CHATML[: -len("<|im_start|>assistant\n")]
    default = tokenizer.apply_chat_template(CONVERSATION[1:2], tokenize=False)
    assert default.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    ids = tokenizer.apply_chat_template(CONVERSATION, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids == tokenizer(EXPECTED_CHATML)["input_ids"]
    assert ids.count(tokenizer.bos_token_id) == 5 and ids.count(tokenizer.eos_token_id) == 4


def test_save_load_round_trip(tmp_path, tokenizer):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == len(tokenizer)
    assert loaded.chat_template == tokenizer.chat_template
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)
    assert loaded.padding_side == "left"
    for text in agent_corpus(20, seed=5) + [EXPECTED_CHATML]:
        assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True) == EXPECTED_CHATML


def test_training_is_deterministic_and_respects_vocab_size():
    a = train_tokenizer(agent_corpus(100), vocab_size=400)
    b = train_tokenizer(agent_corpus(100), vocab_size=400)
    assert len(a) == 400
    assert a.get_vocab() == b.get_vocab()


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match=r"missing \['<\|im_end\|>'\]"):
        train_tokenizer(["text"], special_tokens=["<|endoftext|>", "<|im_start|>"])
    with pytest.raises(ValueError, match="leaves no room for merges"):
        train_tokenizer(["text"], vocab_size=200)
    with pytest.raises(ValueError, match="got no texts"):
        train_tokenizer([], vocab_size=512)
    with pytest.raises(TypeError, match="iterable of str"):
        train_tokenizer([b"bytes"], vocab_size=512)


def test_punct_space_pieces_read_a_value_the_same_in_text_and_in_an_action():
    """warmstart.pretokenizer: punct_space. Under Qwen2's pattern an option value is one id after "color: "
    and another after "click[" (" nude" vs "[nude"); with punct_space it is the same ids in both."""
    corpus = agent_corpus(100) + [
        "i need a nude eyeshadow palette with color: nude, and size: 12 fl oz, and price lower than 30.00 dollars",
        "Admissible actions: click[nude], click[rose gold], click[12 fl oz], click[buy now]",
        "color [SEP] nude [SEP] rose gold [SEP] size [SEP] 12 fl oz [SEP] Buy Now",
    ] * 40
    qwen = train_tokenizer(corpus, vocab_size=600)
    punct = train_tokenizer(corpus, vocab_size=600, pretokenizer="punct_space")

    def ids(tok, text, value):  # the ids of `value` as it is tokenized inside `text`
        enc = tok(text, return_offsets_mapping=True)
        start = text.index(value)
        return [i for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if a < start + len(value) and b > start]

    for value, text in (("nude", "with color: nude, and price"), ("rose gold", "with color: rose gold, and size"),
                        ("12 fl oz", "and size: 12 fl oz, and price")):
        action = f"click[{value}]"
        assert ids(punct, text, value) == ids(punct, action, value), value
        if value[0].isalpha():  # Qwen2 glues the character before a word to it (digits stand alone)
            assert ids(qwen, text, value) != ids(qwen, action, value), value
    assert punct.convert_ids_to_tokens(punct("click[nude]")["input_ids"]) == ["click", "[", "nude", "]"]
    # still byte-level: any text round-trips, and prose costs about as many tokens as under Qwen2's pattern
    for text in ["héllo wörld 😀 毕老师", "  two  spaces\n\n\ttab", "x" * 50, "price: $12.50!", EXPECTED_CHATML]:
        assert punct.decode(punct(text)["input_ids"]) == text
    prose = " ".join(agent_corpus(30, seed=9))
    assert len(punct(prose)["input_ids"]) <= 1.1 * len(qwen(prose)["input_ids"])
    from sdar import config
    from sdar.models import tokenizer

    assert config.PRETOKENIZERS == tuple(tokenizer.PRETOKENIZERS)  # the torch-free mirror load_config checks
    with pytest.raises(ValueError, match="unknown pretokenizer 'gpt2'; choose one of qwen2, punct_space"):
        train_tokenizer(corpus, vocab_size=600, pretokenizer="gpt2")
