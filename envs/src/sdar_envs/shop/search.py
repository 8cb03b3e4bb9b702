"""The shop's search engine: Okapi BM25 over each product's title, description, features and options.

Stands in for WebShop's Pyserini/Lucene index (same k1=0.9, b=0.4 defaults, top 50 returned), with
a small English analyzer (lower case, stop words, plural stripping) instead of Lucene's Porter stemmer.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence

from sdar_envs.shop.reward import Product

SEARCH_RETURN_N = 50  # WebShop's SEARCH_RETURN_N: a search shows at most this many results

# Lucene's English stop words
# fmt: off
_STOP = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they",
    "this", "to", "was", "will", "with",
))
# fmt: on
_TOKEN = re.compile(r"[a-z0-9]+")


def analyze(text: str) -> list[str]:
    """Lower-cased word tokens without stop words, plurals folded ("bars" -> "bar", "berries" -> "berry")."""
    out = []
    for w in _TOKEN.findall(text.lower()):
        if w in _STOP:
            continue
        if len(w) > 4 and w.endswith("ies"):
            w = w[:-3] + "y"
        elif len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
        out.append(w)
    return out


def product_document(p: Product) -> str:
    """The text indexed for a product (WebShop indexes title, description, features and options)."""
    options = ", and ".join(f"{name}: {', '.join(values)}" for name, values in p.options.items())
    return " ".join([p.title, p.description, " ".join(p.bullet_points), options])


class BM25Index:
    """An in-memory inverted index with BM25 scoring; ties keep catalogue order (deterministic)."""

    def __init__(self, docs: Sequence[str], k1: float = 0.9, b: float = 0.4) -> None:
        if not docs:
            raise ValueError("BM25Index needs at least one document")
        self.k1, self.b = k1, b
        self._postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self._len: list[int] = []
        for i, doc in enumerate(docs):
            toks = analyze(doc)
            self._len.append(len(toks))
            tf: dict[str, int] = defaultdict(int)
            for t in toks:
                tf[t] += 1
            for t, n in tf.items():
                self._postings[t].append((i, n))
        self._n = len(docs)
        self._avgdl = sum(self._len) / self._n
        # Lucene's idf: log(1 + (N - df + 0.5) / (df + 0.5)), always positive
        self._idf = {
            t: math.log(1 + (self._n - len(p) + 0.5) / (len(p) + 0.5))
            for t, p in self._postings.items()
        }

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
        """Indices of the top-k documents with a positive score, best first."""
        scores: dict[int, float] = defaultdict(float)
        for term in analyze(query):
            idf = self._idf.get(term)
            if idf is None:
                continue
            for doc, tf in self._postings[term]:
                norm = self.k1 * (1 - self.b + self.b * self._len[doc] / self._avgdl)
                scores[doc] += idf * tf * (self.k1 + 1) / (tf + norm)
        ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
        return [doc for doc, _ in ranked[:k]]
