"""Tests of the search-QA no-progress error sites (sdar_envs/searchqa/progress.py): searches that
retrieve no fact the question still needs, and answers that are not a short answer."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from sdar_envs.searchqa import HINT_TEMPLATES, SearchQAEnv
from sdar_envs.searchqa.env import _HINT_OF
from sdar_envs.searchqa.progress import MAX_ANSWER_WORDS, NO_PROGRESS_HINTS, answer_problem
from sdar.teacher.hints import render_hint

from .test_searchqa import _question


@pytest.fixture(scope="module")
def env() -> SearchQAEnv:
    return SearchQAEnv()


def _marked(step, kind):
    md = step.metadata
    assert md["valid_action"] is True and md["error_kind"] == kind
    assert md["hint_template_key"] == NO_PROGRESS_HINTS[kind] == _HINT_OF[kind]
    return md["error_args"]


def test_a_search_that_finds_no_needed_fact(env):
    q = _question(env, "founder_birth_country")
    company, founder = q.hops[0].subject[0], q.hops[0].value[0]
    env.reset(task_id=q.task_id)
    step = env.step("<search>weather forecast tomorrow</search>")
    args = _marked(step, "no_answer_passage")
    assert args == {"query": "weather forecast tomorrow"}
    assert render_hint("searchqa", "searchqa/no_answer_passage", args) == (
        "The results of <search>weather forecast tomorrow</search> state no fact the question still needs. If "
        "earlier results already hold the answer, answer now; otherwise name the entity and the relation the "
        "question asks about in a new query."
    )
    # the bridge fact is progress; finding it again with other words is not
    step = env.step(f"<search>{company} founder</search>")
    assert founder in step.observation and step.metadata["error_kind"] is None
    step = env.step(f"<search>{q.hops[0].alt_query}</search>")
    assert founder in step.observation
    _marked(step, "no_answer_passage")


def test_the_turn_limit_and_a_repeated_query_keep_their_own_markers(env):
    q = env.questions["single_hop"][0]
    env.reset(task_id=q.task_id)
    assert env.step("<search>nothing useful here</search>").metadata["error_kind"] == "no_answer_passage"
    assert env.step("<search>Nothing useful HERE</search>").metadata["error_kind"] == "repeated_search"
    env.step("<search>still nothing</search>")
    assert env.step("<search>and again nothing</search>").metadata["error_kind"] == "turn_limit"


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("The answer is {a}", "a sentence"),
        ("<b>{a}</b>", "markup"),
        ("**{a}** [1]", "markup"),
        ("it could be any one of these many different places I guess", f"more than {MAX_ANSWER_WORDS} words"),
    ],
)
def test_an_answer_that_is_not_a_short_answer(env, answer, problem):
    q = env.questions["single_hop"][3]
    env.reset(task_id=q.task_id)
    env.step(f"<search>{q.hops[0].query}</search>")
    text = answer.format(a=q.answers[0])
    step = env.step(f"<answer>{text}</answer>")
    assert step.done and step.reward == 0.0
    args = _marked(step, "malformed_answer")
    assert args == {"answer": text, "problem": problem}
    assert render_hint("searchqa", "searchqa/short_answer", args) == (
        f"'{text}' is not a short answer ({problem}). Answer with the entity, name, year or number only, "
        "e.g. <answer>Port Kessan</answer>."
    )


def test_a_correct_or_plainly_wrong_short_answer_is_not_malformed(env):
    q = env.questions["single_hop"][3]
    env.reset(task_id=q.task_id)
    env.step(f"<search>{q.hops[0].query}</search>")
    assert env.step(f"<answer>**{q.answers[0]}**</answer>").metadata["won"]  # exact match forgives it
    env.reset(task_id=q.task_id)
    env.step(f"<search>{q.hops[0].query}</search>")
    assert env.step("<answer>Port Nowhere</answer>").metadata["error_kind"] == "wrong_answer"
    # no gold answer of the question set reads as malformed
    golds = {a for qs in env.questions.values() for question in qs for a in question.answers}
    assert [a for a in golds if answer_problem(a)] == []


def test_every_marker_has_a_hint():
    assert set(_HINT_OF.values()) <= set(HINT_TEMPLATES)
    assert set(NO_PROGRESS_HINTS.items()) <= set(_HINT_OF.items())


# ---- the expert never, a random policy often -------------------------------------------------------
def _random_action(rng, env, observation):
    """A random well-formed action (the family has no admissible list): mostly a search with 1-4 words
    of the question, else an answer of 1-12 consecutive words of the last observation."""
    words = re.findall(r"[A-Za-z0-9]+", env.task_text)
    if rng.random() < 0.7:
        return f"<search>{' '.join(rng.sample(words, min(rng.randint(1, 4), len(words))))}</search>"
    pool = re.findall(r"[A-Za-z0-9]+", observation) or words
    i = rng.randrange(len(pool))
    return f"<answer>{' '.join(pool[i : i + rng.randint(1, 12)])}</answer>"


def test_the_expert_never_makes_a_no_progress_step_and_random_play_often_does(env):
    # measured on all 600 test questions: expert 0 sites in 1,549 steps (won 600); random 0.553 per step
    tasks = env.task_ids("test")[:60]
    for policy in ("expert", "random"):
        rng, steps, kinds = random.Random(0), 0, Counter()
        for task_id in tasks:
            out = env.reset(task_id=task_id)
            while not out.done:
                action = env.expert_action() if policy == "expert" else _random_action(rng, env, out.observation)
                out = env.step(action)
                steps += 1
                if out.metadata["error_kind"] in NO_PROGRESS_HINTS:
                    kinds[out.metadata["error_kind"]] += 1
        rate = sum(kinds.values()) / steps
        if policy == "expert":
            assert rate == 0.0, kinds
        else:
            assert rate > 0.3 and set(kinds) == set(NO_PROGRESS_HINTS), (rate, kinds)
