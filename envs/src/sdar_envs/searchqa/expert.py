"""The expert policy: search for each hop of the question, check the fact is in the results, then answer.

It knows the question's plan (which facts to look up) but answers only once every fact has been
seen in retrieved passages, so its exact match measures the retrieval, not an oracle.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sdar_envs.searchqa.corpus import Passage
from sdar_envs.searchqa.questions import Question
from sdar_envs.searchqa.retrieval import BM25Index
from sdar_envs.searchqa.scoring import contains_answer
from sdar_envs.searchqa.templates import Hop

# What the expert says when its budget ran out before every fact was found.
UNKNOWN_ANSWER = "unknown"


def supports(passage: Passage, hop: Hop) -> bool:
    """Whether `passage` states the hop's fact: it names the subject and contains the value."""
    text = f"{passage.title} {passage.text}"
    return contains_answer(text, hop.subject) and contains_answer(text, hop.value)


def hop_found(hop: Hop, retrieved: Iterable[Sequence[Passage]]) -> bool:
    return any(supports(p, hop) for docs in retrieved for p in docs)


def _next_search(
    queries: Sequence[str], options: Iterable[str], allowed: Collection[str] | None
) -> str | None:
    """The first of `options` not issued yet (and admissible, when there is a list), as a search action."""
    issued = {q.strip().lower() for q in queries}
    for query in options:
        action = f"<search>{query}</search>"
        if query.strip().lower() not in issued and (allowed is None or action in allowed):
            return action
    return None


def expert_action(
    question: Question,
    queries: Sequence[str],
    retrieved: Sequence[Sequence[Passage]],
    turns_left: int,
    allowed: Collection[str] | None = None,
) -> str:
    """The expert's next action given the searches of this episode so far.

    It follows the skills text (skills.py): one keyword query per hop (entity + relation; a two-hop
    question's second query names the bridge entity found by the first), each compared entity
    searched separately, and the answer is the question's fact, once every hop was retrieved.
    queries / retrieved: the queries issued and the passages each returned, in order.
    turns_left: actions left in the episode including this one (the last one must answer).
    allowed: the admissible actions when the env lists them (`candidate_actions`), else None.
    """
    pending = [h for h in question.hops if not hop_found(h, retrieved)]
    if not pending:
        return f"<answer>{question.answers[0]}</answer>"
    if turns_left <= 1:
        return f"<answer>{UNKNOWN_ANSWER}</answer>"
    hop = pending[0]
    search = _next_search(queries, (hop.query, hop.alt_query, f"{hop.subject[0]} {hop.query}"), allowed)
    return search or f"<answer>{UNKNOWN_ANSWER}</answer>"


def skilled_expert_action(
    question: Question,
    queries: Sequence[str],
    retrieved: Sequence[Sequence[Passage]],
    turns_left: int,
    allowed: Collection[str] | None = None,
) -> str:
    """The privileged teacher's expert: the same first search as the student's expert (the whole
    question, which retrieves the first hop's fact about as well as its keyword query), then what the
    skills text says (`expert_action`): a second query naming the bridge entity, the other side of a
    comparison, the asked fact as the answer. Sharing the first move keeps the skills' edge where the
    skills text is: decomposition and comparison, not query wording. Arguments as `expert_action`.
    """
    if not queries and turns_left > 1:
        first = _next_search(queries, (question_query(question),), allowed)
        if first is not None:
            return first
    return expert_action(question, queries, retrieved, turns_left, allowed)


def question_query(question: Question) -> str:
    """The whole question as a query (the uninformed expert's first search): the text without its "?"."""
    return question.text.rstrip("?").strip()


def uninformed_answer(question: Question) -> str:
    """What a solver that does not decompose answers once its first hop's fact is in view.

    single_hop: the fact (correct). two_hop: the bridge entity, i.e. the first hop's value (always
    wrong: the question asks a fact about it). comparison: the first entity the question names
    (right only when it wins, about half the time).
    """
    first = question.hops[0]
    if question.qtype == "comparison":
        return first.subject[0]
    if question.qtype == "two_hop":
        return first.value[0]
    return question.answers[0]


def uninformed_expert_action(
    question: Question,
    queries: Sequence[str],
    retrieved: Sequence[Sequence[Passage]],
    turns_left: int,
    allowed: Collection[str] | None = None,
) -> str:
    """The student's expert: the mistakes the skills text warns against (skills.py), made consistently.

    It searches the whole question first (not an entity + relation query), reformulates with the first
    hop's keyword queries only while that hop's fact is not retrieved, and answers as soon as it is:
    with the bridge entity on a two-hop question, with the first-named entity on a comparison
    (`uninformed_answer`). Single-hop questions it solves like the skilled expert. Arguments as
    `expert_action`.
    """
    first = question.hops[0]
    if hop_found(first, retrieved):
        return f"<answer>{uninformed_answer(question)}</answer>"
    if turns_left <= 1:
        return f"<answer>{UNKNOWN_ANSWER}</answer>"
    search = _next_search(queries, (question_query(question), first.query, first.alt_query), allowed)
    return search or f"<answer>{UNKNOWN_ANSWER}</answer>"


@dataclass
class RetrievalReport:
    """Hit rates of the expert's first-choice queries.

    hops: hops checked; hop_hits: hops whose fact was in the top k of their first query.
    questions: questions checked; question_hits: questions with every hop hit.
    """

    k: int
    hops: int = 0
    hop_hits: int = 0
    questions: int = 0
    question_hits: int = 0

    @property
    def hop_hit_rate(self) -> float:
        return self.hop_hits / max(self.hops, 1)

    @property
    def question_hit_rate(self) -> float:
        return self.question_hits / max(self.questions, 1)


def retrieval_hit_rate(
    questions: Iterable[Question], index: BM25Index, k: int = 3
) -> RetrievalReport:
    """hit@k: how often the passage stating a hop's fact is among the top k for the hop's query."""
    report = RetrievalReport(k=k)
    for q in questions:
        hits = [any(supports(p, h) for p in index.search(h.query, k)) for h in q.hops]
        report.hops += len(hits)
        report.hop_hits += sum(hits)
        report.questions += 1
        report.question_hits += all(hits)
    return report


def run_episode(
    env: Any, task_id: str, policy: Callable[[Any], str] | None = None
) -> dict[str, Any]:
    """Play one episode of `env` (a SearchQAEnv) with `policy(env) -> action` (default: the expert)."""
    policy = policy or (lambda e: e.expert_action())
    step = env.reset(task_id=task_id)
    actions = []
    while not step.done:
        actions.append(policy(env))
        step = env.step(actions[-1])
    return {
        "task_id": task_id,
        "task_type": env.task_type,
        "won": bool(step.metadata["won"]),
        "reward": step.reward,
        "turns": len(actions),
        "searches": step.metadata["num_searches"],
        "actions": actions,
    }


def evaluate_policy(
    env: Any,
    split: str = "test",
    limit_per_type: int | None = None,
    policy: Callable[[Any], str] | None = None,
) -> dict[str, dict[str, float]]:
    """Exact match and mean searches per question type (and "all") of `policy` on a split."""
    by_type: dict[str, list[dict[str, Any]]] = {}
    for task_id in env.task_ids(split):
        qtype = task_id.split("/")[1]
        if limit_per_type is not None and len(by_type.get(qtype, [])) >= limit_per_type:
            continue
        by_type.setdefault(qtype, []).append(run_episode(env, task_id, policy))
    rows = {k: v for k, v in by_type.items()}
    rows["all"] = [r for v in by_type.values() for r in v]
    return {
        k: {
            "episodes": len(v),
            "em": sum(r["reward"] for r in v) / max(len(v), 1),
            "searches": sum(r["searches"] for r in v) / max(len(v), 1),
        }
        for k, v in rows.items()
    }
