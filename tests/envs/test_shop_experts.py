"""The shop's see-only shoppers (skilled and uninformed) and the laptop-scale page options of
configs/shop-tiny.yaml: suggested queries, page_size, compact pages and compact skills."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from sdar_envs import make_env
from sdar_envs.shop import ShopEnv
from sdar_envs.shop.expert import expert_query, skilled_query, suggested_queries
from sdar_envs.shop.progress import fits

TINY = Path(__file__).resolve().parents[2] / "configs" / "shop-tiny.yaml"


@pytest.fixture(scope="module")
def tiny_env() -> ShopEnv:
    """The env exactly as configs/shop-tiny.yaml builds it."""
    return make_env("shop", **yaml.safe_load(TINY.read_text())["env"]["kwargs"])


@pytest.fixture(scope="module")
def plain_env() -> ShopEnv:
    return ShopEnv()


def _play(env: ShopEnv, task_id: str, policy: str) -> tuple[list[str], object]:
    """Play one episode with `policy` (a method name); every action must be admissible."""
    out = env.reset(task_id=task_id)
    actions = []
    while not out.done:
        action = getattr(env, policy)()
        assert action in out.metadata["admissible_actions"], (action, out.metadata["admissible_actions"])
        actions.append(action)
        out = env.step(action)
        assert out.metadata["valid_action"], (action, out.metadata["error_kind"])
    return actions, out


def _win_rate(env: ShopEnv, task_ids: list[str], policy: str) -> float:
    return sum(_play(env, t, policy)[1].metadata["won"] for t in task_ids) / len(task_ids)


# ---- the shoppers --------------------------------------------------------------------------------
def test_skilled_shopper_follows_the_skills_and_wins_a_held_out_goal(tiny_env):
    tid = tiny_env.task_ids("test")[0]
    goal = tiny_env.world.goal(tid)
    actions, last = _play(tiny_env, tid, "skilled_expert_action")
    assert actions[0] == f"search[{skilled_query(goal)}]"
    assert last.reward == 1.0 and last.metadata["won"]
    # the query it uses is the one the skills text tells the teacher to use
    assert "the option values of the instruction" in tiny_env.privileged_skills()


def test_uninformed_shopper_draws_its_query_and_buys_the_first_result_unchecked(tiny_env):
    world = tiny_env.world
    drawn, noun_losses = set(), 0
    for tid in tiny_env.task_ids("test")[:40]:
        goal = world.goal(tid)
        actions, last = _play(tiny_env, tid, "uninformed_expert_action")
        query = actions[0][len("search[") : -1]
        assert query in suggested_queries(goal)
        drawn.add(suggested_queries(goal).index(query))
        first = world.search(query)[0]
        assert actions[1] == f"click[{first.lower()}]"  # the first result, price never compared
        assert actions[-1] == "click[buy now]"  # it buys whatever it opened
        if query == goal.query and not fits(world.by_asin[first], goal):
            noun_losses += 1
            assert last.reward < 1.0 and last.metadata["error_kind"] == "buy_non_matching"
    assert drawn == {0, 1, 2}  # every suggestion gets drawn
    assert noun_losses > 0  # the mistake the skills warn against: searching with the noun alone


def test_uninformed_draws_differ_between_episodes_and_repeat_per_env(tiny_env):
    """The draw is per episode (a repeated task may get another query) and reproducible: a fresh env
    replaying the same resets draws the same queries (warm starts stay deterministic)."""
    tid = tiny_env.task_ids("test")[1]
    fresh = ShopEnv(**tiny_env.config.__dict__)

    def queries(env):
        out = []
        for _ in range(12):
            env.reset(task_id=tid)
            out.append(env.uninformed_expert_action())
        return out

    a, b = queries(fresh), queries(ShopEnv(**tiny_env.config.__dict__))
    assert a == b and len(set(a)) > 1


def test_shopper_success_rates_bracket_the_tiny_config_targets(tiny_env):
    """The no-model rates configs/shop-tiny.yaml was chosen by (500 test goals: 56% and 99%)."""
    ids = tiny_env.task_ids("test")[:150]
    uninformed = _win_rate(tiny_env, ids, "uninformed_expert_action")
    skilled = _win_rate(tiny_env, ids, "skilled_expert_action")
    assert 0.4 <= uninformed <= 0.7, uninformed
    assert skilled >= 0.9, skilled


def test_shoppers_refuse_after_the_purchase(tiny_env):
    _play(tiny_env, tiny_env.task_ids("test")[0], "skilled_expert_action")
    with pytest.raises(RuntimeError, match="reset"):
        tiny_env.skilled_expert_action()


# ---- the page options ----------------------------------------------------------------------------
def test_options_off_leave_the_pages_as_webshop_shows_them(plain_env):
    tid = plain_env.task_ids("test")[0]
    goal = plain_env.world.goal(tid)
    first = plain_env.reset(task_id=tid)
    assert first.observation == f"WebShop [SEP] Instruction: [SEP] {goal.instruction_text} [SEP] Search"
    assert first.metadata["admissible_actions"] == ["search[<query>]"]
    results = plain_env.step(f"search[{expert_query(goal)}]")
    assert results.observation.startswith(f"Instruction: [SEP] {goal.instruction_text} [SEP] Back to Search")
    assert results.observation.count(" [SEP] $") == 10
    assert plain_env.privileged_skills() == plain_env.skill_library().render(plain_env.skills_key())
    assert "Common mistakes to avoid:" in plain_env.privileged_skills()


def test_suggested_queries_are_listed_admissible_and_accepted(tiny_env):
    tid = tiny_env.task_ids("test")[2]
    goal = tiny_env.world.goal(tid)
    queries = suggested_queries(goal)
    assert queries[0] == goal.query and queries[-1] == skilled_query(goal) and len(set(queries)) == len(queries)
    for q in queries:
        first = tiny_env.reset(task_id=tid)
        assert first.observation.endswith(" [SEP] Suggested queries: [SEP] " + " [SEP] ".join(queries))
        assert first.metadata["admissible_actions"] == [f"search[{x}]" for x in queries]
        out = tiny_env.step(f"search[{q}]")
        assert out.metadata["valid_action"] and out.metadata["page"] == "results"
    # a free-text query is still accepted, though not listed
    tiny_env.reset(task_id=tid)
    assert tiny_env.step("search[anything at all]").metadata["valid_action"]


def test_compact_pages_page_size_and_compact_skills(tiny_env):
    tid = tiny_env.task_ids("test")[3]
    goal = tiny_env.world.goal(tid)
    tiny_env.reset(task_id=tid)
    results = tiny_env.step(f"search[{skilled_query(goal)}]")
    assert results.observation.startswith("Back to Search [SEP] Page 1 (Total results:")
    assert results.observation.count(" [SEP] $") == 5
    assert len([a for a in results.metadata["admissible_actions"] if a.startswith("click[b0")]) == 5
    item = tiny_env.step(tiny_env.skilled_expert_action())
    assert item.metadata["page"] == "item" and "Instruction:" not in item.observation
    skills = tiny_env.privileged_skills()
    assert skills.startswith("General skills:") and "Skills for" not in skills and "Common mistakes" not in skills


def test_goal_without_options_lists_its_query_once():
    env = ShopEnv(suggest_queries=True)
    goal = next(g for g in env.world.goals if not g.goal_options)
    assert suggested_queries(goal) == [goal.query, expert_query(goal)]


def test_bad_page_size_and_unknown_options_are_refused():
    with pytest.raises(ValueError, match="page_size"):
        ShopEnv(page_size=0)
    with pytest.raises(TypeError, match="suggest_queries"):
        ShopEnv(suggest_query=True)


# ---- the config ----------------------------------------------------------------------------------
def test_shop_tiny_config_loads_with_the_paper_family_defaults():
    from sdar.config import load_config

    cfg = load_config(str(TINY))
    assert cfg.env.family == "shop" and cfg.model.name_or_path == "tiny"
    assert cfg.rollout.max_turns == 15 and cfg.env.kwargs["horizon"] == 15  # the paper's WebShop horizon
    assert cfg.rollout.history == 2 and cfg.rollout.invalid_penalty == 0.1
    assert cfg.rollout.constrained and cfg.env.kwargs["suggest_queries"]  # constrained decoding needs them
    env = make_env("shop", **cfg.env.kwargs)
    assert isinstance(env, ShopEnv) and env.config.page_size == 5
