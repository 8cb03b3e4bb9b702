"""The search-QA warm start's two experts, the candidate-action and compact-skills options, and the
laptop-scale config (configs/searchqa-tiny.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdar_envs import make_env
from sdar_envs.searchqa import SEARCHQA_SKILLS, SearchQAEnv, evaluate_policy, run_episode
from sdar_envs.searchqa.expert import question_query
from sdar_envs.searchqa.questions import parse_task_id

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "searchqa-tiny.yaml"


@pytest.fixture(scope="module")
def env() -> SearchQAEnv:
    return SearchQAEnv()


@pytest.fixture(scope="module")
def listing_env() -> SearchQAEnv:
    return SearchQAEnv(candidate_actions=True)


def _first_test_task(env: SearchQAEnv, qtype: str) -> str:
    return next(t for t in env.task_ids("test") if parse_task_id(t)[0] == qtype)


def _skilled(e):
    return e.skilled_expert_action()


def _uninformed(e):
    return e.uninformed_expert_action()


# ---- the experts ---------------------------------------------------------------------------
def test_skilled_expert_answers_a_two_hop_question_through_the_bridge_entity(env):
    run = run_episode(env, _first_test_task(env, "two_hop"), _skilled)
    bridge = env.question.hops[0].value[0]
    assert run["won"]
    assert run["searches"] == 2
    assert bridge in run["actions"][1]  # the second query names the bridge entity found by the first


def test_uninformed_expert_searches_the_whole_question_and_answers_the_bridge_entity(env):
    run = run_episode(env, _first_test_task(env, "two_hop"), _uninformed)
    q = env.question
    assert run["actions"][0] == f"<search>{question_query(q)}</search>"
    assert run["actions"][-1] == f"<answer>{q.hops[0].value[0]}</answer>"
    assert not run["won"]


def test_uninformed_expert_answers_a_comparison_with_its_first_entity_after_one_search(env):
    run = run_episode(env, _first_test_task(env, "comparison"), _uninformed)
    q = env.question
    assert run["searches"] == 1
    assert run["actions"][-1] == f"<answer>{q.hops[0].subject[0]}</answer>"


def test_both_experts_solve_single_hop_questions_alike(env):
    task = _first_test_task(env, "single_hop")
    assert run_episode(env, task, _uninformed)["won"] and run_episode(env, task, _skilled)["won"]


def test_skilled_expert_shares_the_first_move_then_searches_the_other_side_of_a_comparison(env):
    """Both experts first search the whole question; the skilled one then retrieves both compared values
    and answers like the plan-following expert."""
    task = _first_test_task(env, "comparison")
    skilled, uninformed, plan = (run_episode(env, task, p) for p in (_skilled, _uninformed, None))
    assert skilled["actions"][0] == uninformed["actions"][0] == f"<search>{question_query(env.question)}</search>"
    assert skilled["won"] and skilled["actions"][-1] == plan["actions"][-1]


def test_expert_success_rates_leave_the_skills_an_edge(env):
    """On held-out tasks: the uninformed expert around half, the skills-following one near all."""
    uninformed = evaluate_policy(env, limit_per_type=20, policy=_uninformed)
    skilled = evaluate_policy(env, limit_per_type=20, policy=_skilled)
    assert uninformed["two_hop"]["em"] == 0.0
    assert 0.35 <= uninformed["all"]["em"] <= 0.65
    assert skilled["all"]["em"] >= 0.9


# ---- candidate actions ---------------------------------------------------------------------
def test_candidate_actions_are_off_by_default(env):
    step = env.reset(task_id=_first_test_task(env, "two_hop"))
    assert step.metadata["admissible_actions"] == []
    step = env.step(env.expert_action())
    assert step.metadata["admissible_actions"] == []


@pytest.mark.parametrize("qtype", ["single_hop", "two_hop", "comparison"])
def test_every_expert_action_is_a_listed_candidate(listing_env, qtype):
    for task in [t for t in listing_env.task_ids("test") if parse_task_id(t)[0] == qtype][:5]:
        for policy in (_skilled, _uninformed):
            step = listing_env.reset(task_id=task)
            while not step.done:
                action = policy(listing_env)
                assert action in step.metadata["admissible_actions"], (task, action)
                step = listing_env.step(action)
            assert step.metadata["admissible_actions"] == []  # the episode is over


def test_candidates_come_from_what_was_seen(listing_env):
    """The first turn offers the question's entities only; the gold answer of a two-hop question
    becomes a candidate once a search retrieved it."""
    step = listing_env.reset(task_id=_first_test_task(listing_env, "two_hop"))
    q = listing_env.question
    first = step.metadata["admissible_actions"]
    assert f"<search>{question_query(q)}</search>" in first
    assert f"<answer>{q.answers[0]}</answer>" not in first
    while not step.done:
        step = listing_env.step(action := listing_env.skilled_expert_action())
        if action.startswith("<search>") and not step.done:
            last = step.metadata["admissible_actions"]
    assert f"<answer>{q.answers[0]}</answer>" in last


def test_entities_are_found_as_whole_names():
    from sdar_envs.searchqa.candidates import candidate_builder

    b = candidate_builder(0, 2000, 10)
    person = next(name for name, kind in b.kinds.items() if kind == "person")
    assert b.entities_in(f"Text about {person}, and more.") == [person]
    assert b.entities_in(f"Text about {person}x.") == []


# ---- question types ------------------------------------------------------------------------
def test_question_types_filter_the_task_lists_and_default_to_all(env):
    two = SearchQAEnv(question_types=["single_hop", "two_hop"])
    assert {parse_task_id(t)[0] for t in env.task_ids("test")} == {"single_hop", "two_hop", "comparison"}
    assert {parse_task_id(t)[0] for t in two.task_ids("train")} == {"single_hop", "two_hop"}
    assert set(two.task_ids("test")) < set(env.task_ids("test"))


def test_unknown_question_type_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="question_types .* subset of single_hop, two_hop, comparison"):
        SearchQAEnv(question_types=["three_hop"])


# ---- compact skills ------------------------------------------------------------------------
def test_compact_skills_keep_the_type_plan_and_drop_the_general_lines():
    default, compact = SearchQAEnv(), SearchQAEnv(compact_skills=True)
    for e in (default, compact):
        e.reset(task_id=_first_test_task(e, "two_hop"))
    assert default.privileged_skills() == SEARCHQA_SKILLS.render("two_hop")  # default: unchanged
    text = compact.privileged_skills()
    assert "General skills" not in text and "Decompose" in text and "bridge entity" in text
    assert len(text) < len(default.privileged_skills()) / 2


# ---- the laptop-scale config ---------------------------------------------------------------
def test_searchqa_tiny_config_loads_with_the_reference_family_settings():
    from sdar.config import load_config

    cfg = load_config(CONFIG)
    assert cfg.env.family == "searchqa"
    assert cfg.rollout.max_turns == cfg.env.kwargs["max_turns"] == 4
    assert cfg.rollout.invalid_penalty == 0.01 and cfg.resolved_arm().kl_coef == 0.001
    assert cfg.rollout.constrained and cfg.env.kwargs["candidate_actions"]
    e = make_env(cfg.env.family, **cfg.env.kwargs)
    uninformed = evaluate_policy(e, limit_per_type=20, policy=_uninformed)["all"]["em"]
    skilled = evaluate_policy(e, limit_per_type=20, policy=_skilled)["all"]["em"]
    assert 0.35 <= uninformed <= 0.65 and skilled >= 0.85  # all 600 held-out tasks: 0.50 and 0.95
    step = e.reset(task_id=e.task_ids("test")[0])
    assert step.metadata["admissible_actions"]  # constrained decoding has a list to work with
