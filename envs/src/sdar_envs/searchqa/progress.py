"""No-progress error sites of accepted search-QA actions: searches that retrieve no fact the question
still needs, and answers that are not a short answer.

The search check reads the question's hidden hops (which facts answer it); the `error_args` hold
only the agent's own query or answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sdar_envs.searchqa.corpus import Passage
from sdar_envs.searchqa.expert import hop_found, supports
from sdar_envs.searchqa.questions import Question

# error_kind -> hint_template_key of each no-progress site (texts in skills.HINT_TEMPLATES)
NO_PROGRESS_HINTS = {
    "no_answer_passage": "searchqa/no_answer_passage",  # no result states a fact still needed
    "malformed_answer": "searchqa/short_answer",  # an answer that is not a short answer
}
# Gold answers are names, years and numbers of at most 4 words; Search-R1's answers are short spans.
MAX_ANSWER_WORDS = 8
_MARKUP = re.compile(r"[<>*_#`\[\]{}|\\]|https?:")
_SENTENCE = re.compile(r"\b(is|was|are|were)\b", re.IGNORECASE)

Error = tuple[str, str, dict[str, str]]


def answer_problem(answer: str) -> str | None:
    """Why `answer` is not a short answer ("too long", "markup", "a sentence", ...), else None."""
    words = answer.split()
    if not words:
        return "empty"
    if "\n" in answer.strip():
        return "several lines"
    if _MARKUP.search(answer):
        return "markup"
    if len(words) > MAX_ANSWER_WORDS:
        return f"more than {MAX_ANSWER_WORDS} words"
    if len(words) >= 3 and _SENTENCE.search(answer):
        return "a sentence"
    return None


def search_marker(question: Question, before: Sequence[Sequence[Passage]], docs: Sequence[Passage],
                  query: str) -> Error | None:
    """A search none of whose `docs` states a hop fact the passages retrieved `before` lacked
    (the final answer, or a bridge fact on the way to it)."""
    pending = [h for h in question.hops if not hop_found(h, before)]
    if any(supports(p, h) for p in docs for h in pending):
        return None
    return "no_answer_passage", NO_PROGRESS_HINTS["no_answer_passage"], {"query": query}


def answer_marker(answer: str) -> Error | None:
    """An answer that is not a short answer (checked on wrong answers only)."""
    problem = answer_problem(answer)
    if problem is None:
        return None
    return "malformed_answer", NO_PROGRESS_HINTS["malformed_answer"], {"answer": answer, "problem": problem}
