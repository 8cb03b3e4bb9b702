"""Answer scoring as in Search-R1: SQuAD normalisation, exact match against gold aliases, token F1.

Normalisation: lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NON_WORD = re.compile(r"[^\w\s]")


def normalize_answer(text: str) -> str:
    """Search-R1 / SQuAD normalisation of an answer string."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(golds: str | Iterable[str]) -> list[str]:
    golds = [golds] if isinstance(golds, str) else list(golds)
    if not golds:
        raise ValueError(
            "no gold answers given; pass the answer and its aliases, e.g. ['Paris', 'City of Paris']"
        )
    return golds


def exact_match(prediction: str, golds: str | Iterable[str]) -> float:
    """1.0 when the normalised prediction equals any normalised gold answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _golds(golds)))


def f1_score(prediction: str, golds: str | Iterable[str]) -> float:
    """The best token-level F1 between the prediction and any gold answer (SQuAD's F1)."""
    pred = normalize_answer(prediction).split()
    best = 0.0
    for gold in _golds(golds):
        ref = normalize_answer(gold).split()
        common = sum((Counter(pred) & Counter(ref)).values())
        if common:
            precision, recall = common / len(pred), common / len(ref)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def contains_answer(text: str, golds: str | Iterable[str]) -> bool:
    """Whether a gold answer occurs in `text` as whole words (after normalisation).

    Non-ASCII punctuation (the dash in "(1901–1975)") also separates words here, so a year
    inside a date range counts as present.
    """

    def loose(s: str) -> str:
        return normalize_answer(_NON_WORD.sub(" ", s))

    hay = f" {loose(text)} "
    return any(f" {loose(g)} " in hay for g in _golds(golds) if loose(g))
