"""BM25 retrieval over the passage corpus (SQLite FTS5, stdlib) and Search-R1's result format.

One in-memory index per corpus is shared by every environment of the process; queries are
free text, turned into an OR of their content words so no FTS5 syntax ever reaches SQLite.
"""

from __future__ import annotations

import functools
import re
import sqlite3
import threading
from collections.abc import Sequence

from sdar_envs.searchqa.corpus import Passage, build_corpus

# Function words carry no signal for BM25 but make every OR query touch every row.
# fmt: off
STOPWORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "by", "did", "do", "does", "for", "from", "had",
    "has", "have", "he", "her", "his", "how", "in", "is", "it", "its", "of", "on", "or", "she",
    "that", "the", "their", "this", "to", "was", "were", "what", "when", "where", "which",
    "who", "whom", "whose", "why", "with",
))
# fmt: on
_WORD = re.compile(r"\w+", re.UNICODE)


def query_terms(query: str) -> list[str]:
    """The distinct lowercase words of `query`, stopwords dropped (kept if nothing else is left)."""
    words = list(dict.fromkeys(w.lower() for w in _WORD.findall(query)))
    content = [w for w in words if w not in STOPWORDS]
    return content or words


class BM25Index:
    """BM25 (k1 = 1.2, b = 0.75, FTS5's built-in) over title and text of each passage.

    passages: the corpus; a passage's `pid` must equal its position.
    title_weight: weight of the title column relative to the text column in the bm25 sum.
    """

    def __init__(self, passages: Sequence[Passage], title_weight: float = 1.0) -> None:
        for i, p in enumerate(passages):
            if p.pid != i:
                raise ValueError(
                    f"passage {i} has pid {p.pid}; pids must be 0..n-1 in order (rebuild the corpus)"
                )
        self.passages = tuple(passages)
        self.title_weight = float(title_weight)
        self._lock = threading.Lock()  # one connection, shared by the server's threads
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        try:
            self._db.execute(
                "CREATE VIRTUAL TABLE docs USING fts5(title, text, tokenize='porter unicode61 remove_diacritics 2')"
            )
        except sqlite3.OperationalError as exc:
            raise RuntimeError(
                f"this Python's sqlite3 lacks FTS5 ({exc}); use a Python built with SQLite >= 3.9 and FTS5 "
                "(the python.org and distribution builds have it)"
            ) from exc
        self._db.executemany(
            "INSERT INTO docs(rowid, title, text) VALUES (?, ?, ?)",
            ((p.pid, p.title, p.text) for p in self.passages),
        )
        self._db.commit()

    def __len__(self) -> int:
        return len(self.passages)

    def search_scored(self, query: str, k: int = 3) -> list[tuple[Passage, float]]:
        """The top `k` passages for `query` with their BM25 scores (higher is better); ties by pid."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        terms = query_terms(query)
        if not terms:
            return []
        match = " OR ".join('"' + t.replace('"', "") + '"' for t in terms)
        with self._lock:
            rows = self._db.execute(
                "SELECT rowid, bm25(docs, ?, 1.0) AS score FROM docs WHERE docs MATCH ? "
                "ORDER BY score, rowid LIMIT ?",
                (self.title_weight, match, k),
            ).fetchall()
        return [(self.passages[rowid], -score) for rowid, score in rows]

    def search(self, query: str, k: int = 3) -> list[Passage]:
        """The top `k` passages for `query`, best first."""
        return [p for p, _ in self.search_scored(query, k)]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def format_information(passages: Sequence[Passage]) -> str:
    """Search-R1's observation: "<information>Doc 1(Title: X) text\\nDoc 2(Title: Y) text</information>"."""
    body = "\n".join(f"Doc {i + 1}(Title: {p.title}) {p.text}" for i, p in enumerate(passages))
    return f"<information>{body}</information>"


@functools.lru_cache(maxsize=4)
def get_index(backend: str = "synthetic", seed: int = 0) -> BM25Index:
    """The shared index of a corpus (built once per process, about a second for the default)."""
    return BM25Index(build_corpus(backend, seed))
