"""Candidate actions for a laptop-scale policy: a finite admissible list, so constrained decoding applies.

Search-R1 samples free text. A tiny model trained from scratch on a few thousand expert turns
cannot reliably spell entity names into queries or copy an answer span out of the passages, so with
`SearchQAConfig.candidate_actions` the environment lists what it would accept as sensible actions,
built only from what the agent has seen (nothing from the hidden hop plan):
- searches: the whole question, and "<entity> <relation>" queries for every entity named in the
  question or in the retrieved passages, with the relation phrasings the question bank uses for
  that kind of entity (capital of <country>, <person> born, <company> headquarters, ...);
- answers: every entity named in the question or the retrieved passages, every year in the
  passages, and "unknown".
The right action is among many plausible ones (about a hundred searches, a dozen answers), so
choosing still means reading the question and the passages.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence

from sdar_envs.searchqa.corpus import Passage
from sdar_envs.searchqa.questions import Question, QuestionSetConfig, build_questions
from sdar_envs.searchqa.world import World, build_world

_YEAR = re.compile(r"\b(1[0-9]{3}|20[0-9]{2})\b")
_SLOT = "{}"


def entity_kinds(world: World) -> dict[str, str]:
    """Every nameable entity of the world -> its kind (country, city, person, ...)."""
    kinds: dict[str, str] = {}
    groups: Iterable[tuple[str, Iterable[str]]] = (
        ("sea", world.seas),
        ("river", world.rivers),
        ("university", world.universities),
        ("work", world.works),
        ("company", world.companies),
        ("person", world.people),
        ("city", world.cities),
        ("country", world.countries),
        ("currency", (k.currency for k in world.countries.values())),
    )
    for kind, names in groups:
        for name in names:
            kinds.setdefault(name, kind)
    return kinds


def query_patterns(questions: dict[str, Sequence[Question]], kinds: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """Per entity kind, the query phrasings the question bank's hops use, with "{}" for the entity
    (e.g. person: "{} born", "{} birthplace"; country: "capital of {}")."""
    found: dict[str, dict[str, None]] = {}
    for pool in questions.values():
        for q in pool:
            for hop in q.hops:
                subject = next((s for s in hop.subject if s in kinds), None)
                if subject is None:
                    continue
                for query in (hop.query, hop.alt_query):
                    if subject in query:
                        found.setdefault(kinds[subject], {})[query.replace(subject, _SLOT, 1)] = None
    return {kind: tuple(sorted(p)) for kind, p in found.items()}


class CandidateBuilder:
    """Builds the admissible list of a turn from the question and the passages retrieved so far."""

    def __init__(self, world: World, questions: dict[str, Sequence[Question]]) -> None:
        self.kinds = entity_kinds(world)
        self.patterns = query_patterns(questions, self.kinds)
        # longest names first, so "Port Kessan" is found before "Kessan" claims its words
        self._names = sorted(self.kinds, key=len, reverse=True)
        self._first_words: dict[str, list[str]] = {}
        for name in self._names:
            self._first_words.setdefault(name.split()[0], []).append(name)

    def entities_in(self, text: str) -> list[str]:
        """Entity names occurring in `text` (whole words), in order of first occurrence."""
        hits: dict[int, str] = {}
        for m in re.finditer(r"[\w'.-]+", text):
            word = m.group(0).rstrip(".,;:")
            for name in self._first_words.get(word, ()):
                end = m.start() + len(name)
                if text.startswith(name, m.start()) and (end == len(text) or not text[end].isalnum()):
                    hits.setdefault(m.start(), name)
                    break
        return list(dict.fromkeys(hits[i] for i in sorted(hits)))

    def searches(self, question: Question, entities: Sequence[str]) -> list[str]:
        """The whole question, then every relation phrasing of every entity's kind."""
        out = [question.text.rstrip("?").strip()]
        for name in entities:
            out += [p.replace(_SLOT, name) for p in self.patterns.get(self.kinds[name], ())]
        return out

    def actions(self, question: Question, retrieved: Sequence[Sequence[Passage]]) -> list[str]:
        """The turn's admissible actions: candidate searches, then candidate answers (no duplicates)."""
        seen_text = " ".join(f"{p.title}. {p.text}" for docs in retrieved for p in docs)
        entities = list(dict.fromkeys(self.entities_in(question.text) + self.entities_in(seen_text)))
        answers = entities + list(dict.fromkeys(_YEAR.findall(seen_text))) + ["unknown"]
        out = [f"<search>{q}</search>" for q in self.searches(question, entities)]
        out += [f"<answer>{a}</answer>" for a in answers]
        return list(dict.fromkeys(out))


@functools.lru_cache(maxsize=4)
def candidate_builder(world_seed: int, per_type: int, test_every: int) -> CandidateBuilder:
    """The shared builder of a world (entity index and query phrasings are built once per process)."""
    return CandidateBuilder(build_world(world_seed), build_questions(world_seed, QuestionSetConfig(per_type, test_every)))
