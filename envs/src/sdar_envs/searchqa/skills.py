"""Privileged skills for search QA (keyed by question type) and hint templates for failed actions.

The skills are what SDAR's teacher sees; the hints are rendered at error sites for the
hint-distillation channel, one per `hint_template_key` the environment emits.
"""

from __future__ import annotations

from sdar_envs.skills import SkillLibrary

SEARCHQA_SKILLS = SkillLibrary(
    family="searchqa",
    general=[
        "Search before answering: the facts are in the corpus, not in your memory; answer only from retrieved text.",
        "Write short keyword queries that name the entity and the relation, e.g. <search>Tarnwell Systems founder</search>.",
        "Read every returned document; the fact is usually stated in the document whose title is the entity you asked about.",
        "Answer with the short entity, year or name only, e.g. <answer>Port Kessan</answer>, never a sentence.",
        "You have at most 4 turns: plan the searches so that one turn is left for the answer.",
        "Use exactly one action per turn: <search>query</search> or <answer>text</answer>.",
    ],
    by_key={
        "single_hop": [
            "One search with the entity's name plus the relation word (capital, founded, born, currency) is usually enough.",
            "Copy the answer exactly as the document writes it (full name for people, the city's full name).",
        ],
        "two_hop": [
            "Decompose: first find the bridge entity (the founder, the author, the country), then search for the asked fact about it.",
            "Your second query must name the bridge entity found in the first results, not repeat the question.",
            "The final answer is a fact about the bridge entity, not the bridge entity itself.",
        ],
        "comparison": [
            "Search each of the two entities separately and note the compared value (year, length, population) for each.",
            "Compare the numbers yourself: founded first or born first means the smaller year; longer or larger means the bigger number.",
            "Answer with the name of one of the two entities exactly as the question writes it.",
        ],
    },
    mistakes={
        "*": [
            "Answering from memory without searching: the entities are unknown outside this corpus.",
            "Repeating the same query: it returns the same documents; reformulate with other words.",
            "Writing the answer as a sentence or adding explanations inside <answer>: exact match fails.",
            "Using bare formats such as search[...] or answer: ...: only the tagged forms are understood.",
        ],
        "two_hop": [
            "Stopping after the first hop and answering with the bridge entity.",
            ("Searching the whole question and answering with the entity it returns: that is the bridge entity; "
             "the asked fact needs a second query that names it."),
        ],
        "comparison": [
            "Answering with a year or a number instead of the entity's name.",
            "Answering with the first entity the question names before both compared values were retrieved.",
        ],
    },
)

def compact_skills(key: str | None) -> str:
    """The question type's own skills and mistakes, without the general ones: a short privileged text
    for a tiny model's teacher prompt (what sets the teacher apart from the student is the type's plan;
    the general lines repeat the action format the student already follows). No key: the whole text."""
    if key is None:
        return SEARCHQA_SKILLS.render(None)
    return SEARCHQA_SKILLS.render(key, general=False, common_mistakes=False)


# Hint texts for the environment's `hint_template_key`s; `{...}` fields come from the step.
HINT_TEMPLATES = {
    "searchqa/format": "Use exactly one tagged action: <search>your query</search> to search, or "
    "<answer>short answer</answer> to answer.",
    "searchqa/search_first": "You answered without searching. Search for the entity in the question first, "
    "then answer from the returned documents.",
    "searchqa/verify_answer": "Your answer was not supported by the documents. Check that the retrieved text states "
    "it, search again if needed, and answer with the short entity only.",
    "searchqa/reformulate": "This query was already issued and returns the same documents. Name a different entity "
    "or relation in the next query.",
    "searchqa/budget": "You ran out of turns. Answer as soon as the documents contain the fact; the last turn must "
    "be an <answer>.",
    # no-progress sites of accepted actions (progress.py); {query} and {answer} are the agent's own
    "searchqa/no_answer_passage": "The results of <search>{query}</search> state no fact the question still needs. "
    "If earlier results already hold the answer, answer now; otherwise name the entity and the relation the "
    "question asks about in a new query.",
    "searchqa/short_answer": "'{answer}' is not a short answer ({problem}). Answer with the entity, name, year or "
    "number only, e.g. <answer>Port Kessan</answer>.",
}
