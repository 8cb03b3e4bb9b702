"""Templated questions over the world with gold answers, per type (single-hop, two-hop, comparison).

Each question carries the hops a solver must search for (query, subject, fact); task ids are
"searchqa/<type>/<index:06d>", deterministic from the world seed, and every 10th is a test task.
The templates (every candidate question a world offers) are in searchqa/templates.py.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

from sdar_envs.searchqa.templates import (
    Candidate,
    Hop,
    comparison_candidates,
    single_hop_candidates,
    two_hop_candidates,
)
from sdar_envs.searchqa.world import build_world

QUESTION_TYPES = ("single_hop", "two_hop", "comparison")
SPLITS = ("train", "test")
_TASK_ID = re.compile(r"^searchqa/(?P<qtype>[a-z_]+)/(?P<index>\d{6})$")


@dataclass(frozen=True)
class Question:
    """A question with its gold answers (first is canonical, the rest aliases) and its hops."""

    task_id: str
    qtype: str
    template: str
    text: str
    answers: tuple[str, ...]
    hops: tuple[Hop, ...]


@dataclass(frozen=True)
class QuestionSetConfig:
    """How many questions to build.

    per_type: questions per question type (templates interleaved so each is represented).
    test_every: every n-th question of a type (index % n == 0) is a test task, the rest train.
    """

    per_type: int = 2000
    test_every: int = 10


def _interleave(
    by_template: dict[str, list[Candidate]], n: int, rng: random.Random
) -> list[Candidate]:
    """Up to `n` candidates taken round-robin over shuffled templates, so small templates are not drowned."""
    pools = []
    for name in sorted(by_template):
        items = list(by_template[name])
        rng.shuffle(items)
        pools.append(iter(items))
    out: list[Candidate] = []
    seen: set[str] = set()
    while pools and len(out) < n:
        alive = []
        for it in pools:
            cand = next(it, None)
            if cand is None:
                continue
            alive.append(it)
            if cand[1] not in seen and len(out) < n:
                seen.add(cand[1])
                out.append(cand)
        pools = alive
    return out


@functools.lru_cache(maxsize=4)
def build_questions(
    seed: int = 0, config: QuestionSetConfig = QuestionSetConfig()
) -> dict[str, tuple[Question, ...]]:
    """All questions of the world of `seed`, by type; the i-th question of a type has index i."""
    w = build_world(seed)
    rng = random.Random(f"sdar-searchqa-questions:{seed}")
    raw = {
        "single_hop": single_hop_candidates(w, rng),
        "two_hop": two_hop_candidates(w, rng),
        "comparison": comparison_candidates(w, rng, per_template=config.per_type),
    }
    out: dict[str, tuple[Question, ...]] = {}
    for qtype in QUESTION_TYPES:
        chosen = _interleave(raw[qtype], config.per_type, rng)
        rng.shuffle(chosen)  # else the round-robin order would tie templates to index % test_every
        out[qtype] = tuple(
            Question(f"searchqa/{qtype}/{i:06d}", qtype, tmpl, text, answers, hops)
            for i, (tmpl, text, answers, hops) in enumerate(chosen)
        )
    return out


def split_of(index: int, config: QuestionSetConfig = QuestionSetConfig()) -> str:
    return "test" if index % config.test_every == 0 else "train"


def parse_task_id(task_id: str) -> tuple[str, int]:
    """("two_hop", 42) from "searchqa/two_hop/000042"; a clear error for anything else."""
    m = _TASK_ID.match(task_id or "")
    if not m or m["qtype"] not in QUESTION_TYPES:
        raise ValueError(
            f"bad searchqa task id {task_id!r}; expected 'searchqa/<type>/<6 digits>' with type one of "
            f"{', '.join(QUESTION_TYPES)}, e.g. 'searchqa/two_hop/000042' (list them with task_ids(split))"
        )
    return m["qtype"], int(m["index"])


def iter_split(
    questions: dict[str, tuple[Question, ...]],
    split: str,
    config: QuestionSetConfig = QuestionSetConfig(),
) -> Iterator[Question]:
    """The questions of `split` ("train" or "test"), type by type, in index order."""
    if split not in SPLITS:
        raise ValueError(f"unknown searchqa split {split!r}; choose one of {', '.join(SPLITS)}")
    for qtype in QUESTION_TYPES:
        for i, q in enumerate(questions[qtype]):
            if split_of(i, config) == split:
                yield q
