"""Tests of the shop's no-progress error sites (sdar_envs/shop/progress.py): accepted searches, clicks
and purchases that cannot lead to a full-score purchase are marked, with hints from observed words."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from sdar_envs.shop import ShopEnv
from sdar_envs.shop.expert import expert_query
from sdar_envs.shop.pages import SEARCH_TEMPLATE
from sdar_envs.shop.progress import NO_PROGRESS_HINTS, fits
from sdar_envs.shop.skills import HINTS
from sdar.teacher.hints import render_hint

TASK = "shop/000002"  # low sugar, vegan and soy free protein bars, cookie dough, 12 count, under $70
TARGET = "b0lduvdjq3"
WANTED = "low sugar vegan soy free protein bars, price lower than 70.00 dollars"


@pytest.fixture(scope="module")
def env() -> ShopEnv:
    return ShopEnv()


def _play(env, actions):
    steps = [env.reset(task_id=TASK)]
    steps += [env.step(a) for a in actions]
    return steps


def _marked(step):
    md = step.metadata
    assert md["valid_action"] is True
    return md["error_kind"], md["hint_template_key"], md["error_args"]


def _non_fitting(env):
    goal = env.world.goal(TASK)
    return next(a for a in env.world.search(expert_query(goal)) if not fits(env.world.by_asin[a], goal)).lower()


def test_the_task_and_its_target():
    env = ShopEnv()
    env.reset(task_id=TASK)
    goal = env.world.goal(TASK)
    assert goal.asin.lower() == TARGET and fits(env.world.by_asin[goal.asin], goal)
    assert goal.goal_options == {"flavor": "cookie dough", "size": "12 count"}
    assert all(word in goal.instruction_text for word in [*goal.attributes, goal.query, "70.00"])


def test_a_search_without_a_fitting_result(env):
    (step,) = _play(env, ["search[hdmi cable]"])[1:]
    kind, key, args = _marked(step)
    assert (kind, key) == ("search_no_match", "shop/search_no_match")
    assert args == {"query": "hdmi cable", "suggested": "low sugar vegan soy free protein bars", "wanted": WANTED}
    assert render_hint("shop", key, args) == (
        f"No result of search[hdmi cable] fits the instruction ({WANTED}). Search with the product noun and "
        "the attributes the instruction names, e.g. search[low sugar vegan soy free protein bars]."
    )
    # the instruction's own words find the target: not marked
    step = _play(env, [f"search[{expert_query(env.world.goal(TASK))}]"])[-1]
    assert step.metadata["error_kind"] is None and step.metadata["error_args"] is None


def test_opening_and_buying_an_item_that_does_not_fit(env):
    other = _non_fitting(env)
    title = env.world.by_asin[other.upper()].title
    steps = _play(env, [f"search[{expert_query(env.world.goal(TASK))}]", f"click[{other}]", "click[buy now]"])
    kind, key, args = _marked(steps[2])
    assert (kind, key) == ("non_matching_item", "shop/non_matching_item")
    assert args == {"item": other, "title": title, "wanted": WANTED}
    assert render_hint("shop", key, args).startswith(f"Item {other} ({title}) does not fit the instruction")
    assert title in steps[1].observation  # the agent saw the title on the results page
    kind, key, args = _marked(steps[3])
    assert (kind, key, args["item"]) == ("buy_non_matching", "shop/buy_non_matching", other)
    assert steps[3].done and steps[3].reward < 1.0
    assert render_hint("shop", key, args) == (
        f"Do not buy item {other} ({title}): it does not fit the instruction ({WANTED}). Go back and find a "
        "product that does."
    )


def test_a_wrong_option_and_buying_the_right_item_without_its_options(env):
    product = env.world.by_asin[TARGET.upper()]
    other_flavor = next(v for v in product.options["flavor"] if v != "cookie dough")
    steps = _play(env, [f"search[{expert_query(env.world.goal(TASK))}]", f"click[{TARGET}]", f"click[{other_flavor}]",
                        "click[buy now]"])
    assert steps[2].metadata["error_kind"] is None  # opening the target
    kind, key, args = _marked(steps[3])
    assert (kind, key) == ("wrong_option", "shop/wrong_option")
    assert args == {"option": "flavor", "value": other_flavor, "wanted_value": "cookie dough"}
    assert render_hint("shop", key, args) == (
        f"The instruction asks for flavor: cookie dough, not {other_flavor}; click[cookie dough] instead."
    )
    kind, key, args = _marked(steps[4])
    assert (kind, key) == ("buy_wrong_options", "shop/buy_wrong_options") and steps[4].reward < 1.0
    assert args["options"] == "flavor: cookie dough, size: 12 count" and args["item"] == TARGET
    assert render_hint("shop", key, args) == (
        "Do not buy yet: first click the option values the instruction names (flavor: cookie dough, size: 12 "
        "count), then buy now."
    )


def test_the_right_clicks_stay_unmarked(env):
    steps = _play(env, [f"search[{expert_query(env.world.goal(TASK))}]", f"click[{TARGET}]", "click[cookie dough]",
                        "click[12 count]", "click[buy now]"])
    assert steps[-1].metadata["won"] and all(s.metadata["error_kind"] is None for s in steps)


def test_every_marker_has_a_hint():
    assert set(NO_PROGRESS_HINTS.values()) <= set(HINTS)


# ---- the expert never, a random policy often -------------------------------------------------------
def _random_action(rng, step, instruction):
    """A uniform random admissible action; the search page's free-text query is 1-4 random words of
    the instruction (what an untrained agent writes)."""
    action = rng.choice(step.metadata["admissible_actions"])
    if action == SEARCH_TEMPLATE:
        words = re.findall(r"[a-z0-9]+", instruction.lower())
        action = f"search[{' '.join(rng.sample(words, min(rng.randint(1, 4), len(words))))}]"
    return action


def _site_rate(env, task_ids, policy):
    rng = random.Random(0)
    steps, kinds = 0, Counter()
    for task_id in task_ids:
        out = env.reset(task_id=task_id)
        instruction = out.metadata["task"]
        while not out.done:
            out = env.step(policy(rng, out, instruction))
            steps += 1
            if out.metadata["valid_action"] and out.metadata["error_kind"]:
                kinds[out.metadata["error_kind"]] += 1
    return sum(kinds.values()) / steps, kinds


def test_the_expert_never_makes_a_no_progress_step_and_random_play_often_does(env):
    # measured on all 500 test goals: expert 0 sites in 2,244 steps (won 500); random 0.410 sites per step
    tasks = env.task_ids("test")[:60]
    rate, kinds = _site_rate(env, tasks, lambda rng, out, instruction: env.expert_action())
    assert rate == 0.0, kinds
    rate, kinds = _site_rate(env, tasks, _random_action)
    assert rate > 0.2 and set(kinds) >= set(NO_PROGRESS_HINTS) - {"buy_wrong_options"}, (rate, kinds)
