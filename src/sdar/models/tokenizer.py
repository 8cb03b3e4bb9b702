"""A byte-level BPE tokenizer trained locally on environment text, with ChatML and the agent tags.

No tokenizer can be downloaded here, so the tiny model gets one trained in seconds with `tokenizers`,
pre-tokenised like Qwen2 and formatted with Qwen2.5's chat template.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)
from transformers import PreTrainedTokenizerFast

from sdar.models.chat_templates import DEFAULT_SYSTEM, chatml_template

# Qwen2's pre-tokenisation pattern (one digit per piece, contractions, punctuation runs)
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Qwen2's pieces, except that a word takes at most a space before it (never "[" or ":") and a punctuation run
# takes the space after it: "color: nude, and" -> "color", ": ", "nude", ", ", "and", and "click[nude]" ->
# "click", "[", "nude", "]". Under Qwen2's pattern the value is " nude" in the instruction and "[nude" in the
# action, two unrelated ids a model trained from scratch must pair value by value; here it is one id, so copying
# it is a generic match. About as many tokens as Qwen2's pattern (+2% on shop prompts); giving every word the
# space after it instead doubles the vocabulary a word needs (+75% tokens at 4,096).
PUNCT_SPACE_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+(?:[\r\n]+| )?|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# how text is split before BPE (warmstart.pretokenizer); decoding is byte-exact under either
PRETOKENIZERS = {"qwen2": QWEN2_PATTERN, "punct_space": PUNCT_SPACE_PATTERN}

PAD_TOKEN = "<|endoftext|>"  # padding and document separator, as in Qwen2.5
BOS_TOKEN = "<|im_start|>"  # every ChatML turn starts with it (SmolLM2 uses it as bos too)
EOS_TOKEN = "<|im_end|>"  # ends a turn: generation stops here
# special tokens get the first ids in this order: pad 0, <|im_start|> 1, <|im_end|> 2
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)
# agent markup; added as whole (non-special) tokens so each tag is one id and decodes as text
AGENT_TAGS: tuple[str, ...] = (
    "<think>", "</think>", "<action>", "</action>", "<search>", "</search>",
    "<answer>", "</answer>", "<information>", "</information>",
)
DEFAULT_VOCAB_SIZE = 4096


def _check_specials(special_tokens: Sequence[str]) -> list[str]:
    specials = list(dict.fromkeys(special_tokens))
    missing = [t for t in SPECIAL_TOKENS if t not in specials]
    if missing:
        raise ValueError(
            f"special_tokens must include the pad/chat tokens {list(SPECIAL_TOKENS)}; missing {missing}. "
            "Pass extra special tokens in addition to these, not instead of them."
        )
    # the fixed ids 0, 1, 2 keep pad/bos/eos stable across retrainings
    return list(SPECIAL_TOKENS) + [t for t in specials if t not in SPECIAL_TOKENS]


def bpe_skeleton(pattern: str = QWEN2_PATTERN) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    special_tokens: Sequence[str] = SPECIAL_TOKENS,
    *,
    agent_tags: Sequence[str] = AGENT_TAGS,
    min_frequency: int = 2,
    default_system: str = DEFAULT_SYSTEM,
    model_max_length: int = 4096,
    pretokenizer: str = "qwen2",
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts` and wrap it as a transformers tokenizer.

    vocab_size: the largest total size, including the 256 byte symbols, special tokens and agent
        tags; a small corpus can end below it (no pair left that occurs min_frequency times).
    special_tokens: must contain "<|endoftext|>" (pad), "<|im_start|>" (bos) and "<|im_end|>" (eos);
        they get ids 0, 1, 2. Any byte sequence is encodable (byte-level), so there is no unk token.
    agent_tags: added as single, non-special tokens (they survive skip_special_tokens).
    min_frequency: pairs seen fewer times are not merged.
    default_system: the system prompt the chat template inserts when a conversation has none.
    pretokenizer: how text is split before the merges, a key of PRETOKENIZERS: "qwen2" (Qwen2's
        pattern) or "punct_space" (punctuation carries the space after it, a word nothing but a space
        before it: see PUNCT_SPACE_PATTERN).
    Returns a tokenizer with `chat_template` set to Qwen2.5's ChatML template, padding on the left
    (the rollout side); the trainer may pad either way (see `sdar.models.logprobs`).
    """
    specials = _check_specials(special_tokens)
    if pretokenizer not in PRETOKENIZERS:
        raise ValueError(f"unknown pretokenizer {pretokenizer!r}; choose one of {', '.join(PRETOKENIZERS)}")
    n_fixed = 256 + len(specials) + len(agent_tags)
    if vocab_size < n_fixed + 1:
        raise ValueError(
            f"vocab_size={vocab_size} leaves no room for merges: 256 bytes + {len(specials)} special "
            f"tokens + {len(agent_tags)} agent tags = {n_fixed}; use at least {n_fixed + 64}"
        )
    tok = bpe_skeleton(PRETOKENIZERS[pretokenizer])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(agent_tags),
        min_frequency=min_frequency,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in specials],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    n_texts = 0

    def counted() -> Iterable[str]:
        nonlocal n_texts
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"train_tokenizer expects an iterable of str, got an item of type {type(text).__name__}")
            n_texts += 1
            yield text

    tok.train_from_iterator(counted(), trainer=trainer)
    if n_texts == 0:
        raise ValueError("train_tokenizer got no texts; pass the environment observations/actions to learn from")
    tok.add_tokens([AddedToken(t, special=False, normalized=False, single_word=False) for t in agent_tags])
    return wrap_tokenizer(tok, default_system=default_system, model_max_length=model_max_length)


def wrap_tokenizer(
    tok: Tokenizer, *, default_system: str = DEFAULT_SYSTEM, model_max_length: int = 4096,
    eos_token: str = EOS_TOKEN, chat_template: str | None = None,
) -> PreTrainedTokenizerFast:
    """A `tokenizers.Tokenizer` as a transformers tokenizer with our pad/bos/eos and ChatML template."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=eos_token,
        padding_side="left",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    # ChatML prompts carry their own markers; an automatic bos would double them
    fast.add_bos_token = False
    fast.chat_template = chat_template if chat_template is not None else chatml_template(default_system)
    return fast
