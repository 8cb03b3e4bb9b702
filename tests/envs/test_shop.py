"""Tests for the shop family: catalogue, goals, WebShop reward, page flow, errors, expert and skills."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import subprocess
import sys
import time

import pytest

from sdar_envs import METADATA_KEYS, make_env
from sdar_envs.shop import ShopEnv, build_world, generate_catalogue, get_reward, skills_key_for
from sdar_envs.shop.expert import expert_action, expert_query
from sdar_envs.shop.pages import Session
from sdar_envs.shop.reward import (
    Goal,
    Product,
    attribute_reward,
    normalize_color,
    ratio,
    token_set_ratio,
    type_nouns,
)
from sdar_envs.shop.search import BM25Index, analyze
from sdar_envs.shop.skills import BY_KEY, HINTS
from sdar_envs.shop.taxonomy import CATEGORIES, TYPES_BY_NAME


@pytest.fixture(scope="module")
def env() -> ShopEnv:
    return ShopEnv()


@pytest.fixture(scope="module")
def world():
    return build_world()


def _digest(products) -> str:
    return hashlib.sha256(
        json.dumps([dataclasses.asdict(p) for p in products], sort_keys=True).encode()
    ).hexdigest()


def _goal_with_many_results(env: ShopEnv, min_results: int = 21) -> str:
    for tid in env.task_ids("test"):
        if len(env.world.search(expert_query(env.world.goal(tid)))) >= min_results:
            return tid
    raise AssertionError("no test goal has enough search results")


# ---- catalogue ------------------------------------------------------------------------------
def test_catalogue_size_and_fields(world):
    products = world.products
    assert len(products) >= 1000
    assert len({p.asin for p in products}) == len(products)
    for p in products:
        assert re.fullmatch(r"B0[A-Z0-9]{8}", p.asin)
        assert p.title and p.description and p.bullet_points
        assert p.category in CATEGORIES
        assert " › " in p.product_category and p.product_category == TYPES_BY_NAME[p.query].path
        assert 3 <= len(p.attributes) <= 5 and set(p.attributes) <= {
            a.name for a in TYPES_BY_NAME[p.query].attributes
        }
        assert p.price > 0 and p.price_tag == f"${p.price:.2f}"
        for name, values in p.options.items():
            assert len(values) >= 2 and len(set(values)) == len(values), (p.asin, name)
    assert sum(bool(p.options) for p in products) > 0.9 * len(products)
    assert {p.category for p in products} == set(CATEGORIES)


def test_catalogue_is_deterministic_and_fast():
    t0 = time.perf_counter()
    fresh = generate_catalogue(seed=1234, num_products=1200)
    assert time.perf_counter() - t0 < 2.0  # about 0.1 s on one core
    assert _digest(fresh) == _digest(generate_catalogue.__wrapped__(seed=1234, num_products=1200))
    assert _digest(fresh) != _digest(generate_catalogue(seed=1235, num_products=1200))
    # another process with another hash seed builds the same catalogue
    code = (
        "import dataclasses,hashlib,json;from sdar_envs.shop import generate_catalogue as g;"
        "print(hashlib.sha256(json.dumps([dataclasses.asdict(p) for p in g(1234,1200)],sort_keys=True).encode()).hexdigest())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "777", "PATH": ""},
    )
    assert out.stdout.strip() == _digest(fresh)


def test_catalogue_too_small_is_refused():
    with pytest.raises(ValueError, match="at least 100"):
        generate_catalogue(seed=0, num_products=10)


def test_attributes_and_options_only_score_when_true(world):
    # a pool attribute the product lacks never matches it, and a wrong option value never scores:
    # otherwise WebShop's fuzzy/substring matching would pay for the wrong product or click
    for p in world.products[:400]:
        pool = [a.name for a in TYPES_BY_NAME[p.query].attributes]
        for a in pool:
            goal = Goal(p.asin, p.category, p.query, p.product_category, p.title, "", [a], {}, 1e6)
            _, n = attribute_reward(p, goal)
            assert n == (1 if a in p.attributes else 0), (p.asin, a)
        for name, values in p.options.items():
            want = {k: v[0] for k, v in p.options.items()}
            goal = Goal(
                p.asin,
                p.category,
                p.query,
                p.product_category,
                p.title,
                "",
                [p.attributes[0]],
                want,
                1e6,
            )
            wrong = dict(want, **{name: values[1]})
            score_right, _ = get_reward(p, goal, p.price, want)
            _, info = get_reward(p, goal, p.price, wrong)
            assert score_right == 1.0
            assert info["num_option_matches"] == len(want) - 1, (p.asin, name, values)


# ---- goals and splits ------------------------------------------------------------------------
def test_goals_are_webshop_like(world):
    assert len(world.goals) == 2400
    for g in world.goals:
        target = world.by_asin[g.asin]
        assert set(g.attributes) <= set(target.attributes) and 1 <= len(g.attributes) <= 3
        assert {k: target.options[k] for k in g.goal_options}.keys() == target.options.keys()
        assert all(v in target.options[k] for k, v in g.goal_options.items())
        assert (
            g.price_upper > target.price
            and g.price_upper % 10 == 0
            and g.price_upper - target.price <= 50
        )
        text = g.instruction_text
        assert text.endswith(f", and price lower than {g.price_upper:.2f} dollars")
        for a in g.attributes:
            assert a in text
        if g.goal_options:
            assert " with " + ", and ".join(f"{k}: {v}" for k, v in g.goal_options.items()) in text
        assert g.query in text and g.name == target.title


def test_splits_are_disjoint_and_ids_stable(env, world):
    test, train = env.task_ids("test"), env.task_ids("train")
    assert len(test) == 500 and len(train) == 1900
    assert test[0] == "shop/000000" and train[0] == "shop/000500" and train[-1] == "shop/002399"
    assert not set(test) & set(train)
    assert not {world.goal(t).asin for t in test} & {world.goal(t).asin for t in train}
    with pytest.raises(ValueError, match="choose one of train, test"):
        env.task_ids("valid")
    with pytest.raises(ValueError, match="shop/000123"):
        env.reset(task_id="shop/99999999")


# ---- reward (hand-made cases) ---------------------------------------------------------------
_SHAMPOO = Product(
    asin="B0TESTTEST",
    title="Lumora Sulfate Free Shampoo for Dry Hair",
    category="beauty",
    product_category="beauty & personal care › hair care › shampoo & conditioner › shampoos",
    query="shampoo",
    attributes=["sulfate free", "dry hair", "cruelty free"],
    options={"size": ["8 fl oz", "12 fl oz"], "scent": ["lavender", "citrus"]},
    price=19.99,
    description="Lumora shampoo: sulfate free, for dry hair and cruelty free.",
    bullet_points=["SULFATE FREE"],
)
_SHAMPOO_GOAL = Goal(
    asin="B0TESTTEST",
    category="beauty",
    query="shampoo",
    product_category="beauty & personal care › hair care › shampoo & conditioner › shampoos",
    name="Lumora Sulfate Free Shampoo for Dry Hair",
    instruction_text="i need a sulfate free shampoo for dry hair",
    attributes=["sulfate free", "dry hair"],
    goal_options={"scent": "lavender", "size": "12 fl oz"},
    price_upper=30.0,
)


def _shampoo(**kw) -> Product:
    return dataclasses.replace(_SHAMPOO, **kw)


def _shampoo_goal(**kw) -> Goal:
    return dataclasses.replace(_SHAMPOO_GOAL, **kw)


def test_reward_full_match_is_one():
    score, info = get_reward(
        _shampoo(), _shampoo_goal(), 19.99, {"size": "12 fl oz", "scent": "lavender"}
    )
    assert (
        score == 1.0 and info["r_type"] == 1.0 and info["r_att"] == 1.0 and info["r_option"] == 1.0
    )


def test_reward_missing_option_over_price_and_wrong_option():
    p, g = _shampoo(), _shampoo_goal()
    # 2 attributes + 2 options + price = 5 parts
    assert get_reward(p, g, 19.99, {"size": "12 fl oz"})[0] == pytest.approx(4 / 5)
    assert get_reward(p, g, 19.99, {})[0] == pytest.approx(3 / 5)
    assert get_reward(p, g, 35.00, {"size": "12 fl oz", "scent": "lavender"})[0] == pytest.approx(
        4 / 5
    )
    assert get_reward(p, g, 19.99, {"size": "8 fl oz", "scent": "citrus"})[0] == pytest.approx(
        3 / 5
    )
    # one of two goal attributes missing from the product and its text
    q = _shampoo(
        attributes=["cruelty free"],
        title="Lumora Shampoo",
        description="Lumora shampoo.",
        bullet_points=[],
    )
    assert get_reward(q, g, 19.99, {"size": "12 fl oz", "scent": "lavender"})[0] == pytest.approx(
        3 / 5
    )


def test_reward_wrong_type_is_zero_and_partial_type_is_halved():
    g = _shampoo_goal()
    cable = Product(
        asin="B0CABLE000",
        title="Nexora Braided HDMI Cable",
        category="electronics",
        product_category="electronics › computers & accessories › cables & accessories › hdmi cables",
        query="hdmi cable",
        attributes=["nylon braided"],
        options={},
        price=9.99,
        description="Nexora hdmi cable.",
    )
    score, info = get_reward(cable, g, 9.99, {})
    assert info["r_type"] == 0.0 and info["title_score"] == 0.0 and score == 0.0
    # no query/category match and 1 of 6 title nouns shared: 0.1 <= title_score <= 0.2 -> r_type 0.5
    g6 = _shampoo_goal(name="Lumora Shampoo Bottle Pump Kit Tray")
    assert type_nouns(g6.name) == ["lumora", "shampoo", "bottle", "pump", "kit", "tray"]
    odd = dataclasses.replace(cable, title="Shampoo Cable")
    score, info = get_reward(odd, g6, 9.99, {})
    assert info["title_score"] == pytest.approx(1 / 6) and info["r_type"] == 0.5
    assert score == pytest.approx(0.5 * 1 / 5)  # only the price part matches


def test_reward_matching_rules_follow_webshop():
    p, g = _shampoo(), _shampoo_goal(goal_options={"size": "large", "color": "navy blue"})
    # size is matched exactly: x-large does not count for large (token_set_ratio alone would say 100)
    assert token_set_ratio("x-large", "large") == 100
    _, info = get_reward(p, g, 19.99, {"size": "x-large"})
    assert info["num_option_matches"] == 0
    # other options are fuzzy after colour normalization: "blue" counts for "navy blue"
    _, info = get_reward(p, g, 19.99, {"color": "blue", "size": "large"})
    assert info["num_option_matches"] == 2
    # an attribute found only in the description counts
    g2 = _shampoo_goal(attributes=["dry hair", "made for you"])
    p2 = _shampoo(description="Lumora shampoo, made for you.")
    assert (
        get_reward(p2, g2, 19.99, {"size": "12 fl oz", "scent": "lavender"})[1]["num_attr_matches"]
        == 2
    )


def test_fuzzy_helpers_match_thefuzz_semantics():
    assert ratio("hello", "hallo") == 80 and ratio("", "x") == 0
    assert token_set_ratio("sulfate free", "free sulfate") == 100
    assert token_set_ratio("Dry-Hair!", "dry hair") == 100
    assert token_set_ratio("long lasting", "long sleeve") < 85
    assert token_set_ratio("", "a") == 0
    assert normalize_color("black forest") == "black"
    assert normalize_color("violet lavender") == "lavender"
    assert normalize_color("123alabaster") == "alabaster"
    assert normalize_color("webshop") == "webshop"


# ---- search ------------------------------------------------------------------------------------
def test_bm25_ranks_matches_first(world):
    assert analyze("The Protein Bars, berries!") == ["protein", "bar", "berry"]
    index = BM25Index(["red apple pie", "green apple", "banana bread", "apple apple apple juice"])
    assert index.search("apple")[0] == 3 and set(index.search("apple")) == {0, 1, 3}
    assert index.search("kiwi") == []
    firsts = 0
    for p in world.products[:200]:
        hits = world.search(p.title)
        assert p.asin in hits[:5]  # same-brand look-alikes with more matching words may rank above
        firsts += hits[0] == p.asin
    assert firsts >= 160
    shampoos = {p.asin for p in world.products if p.query == "shampoo"}
    assert set(world.search("shampoo")) == shampoos
    assert len(world.search("gluten free organic vegan")) == 50  # capped like WebShop's top-50


# ---- page flow ----------------------------------------------------------------------------------
def test_page_flow_search_results_item_buy(env):
    tid = _goal_with_many_results(env)
    first = env.reset(task_id=tid)
    g = env.world.goal(tid)
    assert (
        first.observation == f"WebShop [SEP] Instruction: [SEP] {g.instruction_text} [SEP] Search"
    )
    assert first.metadata["admissible_actions"] == ["search[<query>]"]
    assert first.metadata["task"] == g.instruction_text and first.metadata["task_id"] == tid
    assert set(METADATA_KEYS) <= set(first.metadata)

    query = expert_query(g)
    res = env.step(f"search[{query}]")
    n = len(env.world.search(query))
    assert res.observation.startswith(
        f"Instruction: [SEP] {g.instruction_text} [SEP] Back to Search [SEP] Page 1 (Total results: {n}) [SEP] Next > [SEP] B0"
    )
    assert "< Prev" not in res.observation
    adm = res.metadata["admissible_actions"]
    assert adm[:2] == ["click[back to search]", "click[next >]"] and len(adm) == 12
    assert res.observation.count(" [SEP] $") == 10

    page2 = env.step("click[next >]")
    assert (
        "Page 2 (Total results:" in page2.observation and "< Prev [SEP] Next >" in page2.observation
    )
    assert "click[< prev]" in page2.metadata["admissible_actions"]
    assert page2.observation != res.observation
    back = env.step("click[< prev]")
    assert back.observation == res.observation

    target = env.world.by_asin[g.asin]
    item = env.step(
        f"click[{env._session.results[0].lower()}]"
    )  # any product: open the first result
    opened = env.world.by_asin[env._session.results[0]]
    assert (
        f" [SEP] {opened.title} [SEP] Price: {opened.price_tag} [SEP] Rating: " in item.observation
    )
    assert item.observation.endswith("Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    assert "click[buy now]" in item.metadata["admissible_actions"]
    for name, values in opened.options.items():
        assert f" [SEP] {name} [SEP] " + " [SEP] ".join(values) in item.observation
    env.step("click[< prev]")

    # the target, with options chosen, a detour through the features page, then buy
    while env._session.page != "item" or env._session.asin != g.asin:
        env.step(env.expert_action())
    for value in g.goal_options.values():
        env.step(f"click[{value}]")
    feats = env.step("click[features]")
    assert feats.metadata["admissible_actions"] == ["click[back to search]", "click[< prev]"]
    assert " [SEP] ".join(target.bullet_points) in feats.observation
    again = env.step("click[< prev]")
    assert env._session.options == g.goal_options and again.metadata["page"] == "item"
    done = env.step("click[buy now]")
    assert done.done and done.reward == 1.0 and done.metadata["won"] is True
    assert done.metadata["purchased"] == {"asin": g.asin, "options": g.goal_options}
    assert done.observation.startswith(
        "Thank you for shopping with us! [SEP] Purchased [SEP] asin [SEP] " + g.asin
    )
    assert done.observation.endswith("Your score (min 0.0, max 1.0) [SEP] 1")
    assert done.metadata["admissible_actions"] == []
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("click[buy now]")


def test_buying_without_options_scores_less(env):
    tid = next(t for t in env.task_ids("test") if len(env.world.goal(t).goal_options) == 2)
    env.reset(task_id=tid)
    g = env.world.goal(tid)
    while env._session.page != "item":
        env.step(env.expert_action())
    out = env.step("click[buy now]")
    k = len(g.attributes)
    assert (
        out.done and out.reward == pytest.approx((k + 1) / (k + 3)) and out.metadata["won"] is False
    )


def test_back_to_search_and_a_search_without_hits(env):
    env.reset(task_id="shop/000001")
    res = env.step("search[zzzqqq xxyy]")
    assert "Page 1 (Total results: 0)" in res.observation and "Next >" not in res.observation
    assert res.metadata["admissible_actions"] == ["click[back to search]"]
    again = env.step("click[Back to Search]")  # clicks are case-insensitive, as in WebShop
    assert again.observation == env.state(0) and again.metadata["page"] == "search"


# ---- invalid actions ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "setup, action, kind, hint",
    [
        ([], "click[buy now]", "search_first", "shop/search_first"),
        ([], "search[<query>]", "empty_query", "shop/empty_query"),
        ([], "search[   ]", "empty_query", "shop/empty_query"),
        ([], "buy the shampoo", "malformed_action", "shop/action_format"),
        (["search[shampoo]"], "search[conditioner]", "search_unavailable", "shop/back_to_search"),
        (["search[shampoo]"], "click[b0nothere00]", "not_clickable", "shop/not_clickable"),
        (["search[shampoo]"], "click[< prev]", "not_clickable", "shop/not_clickable"),
        (["search[shampoo]"], "click[buy now]", "not_clickable", "shop/not_clickable"),
    ],
)
def test_invalid_actions_keep_the_page_and_are_marked(env, setup, action, kind, hint):
    env.reset(task_id="shop/000002")
    for a in setup:
        env.step(a)
    before = env.state()
    out = env.step(action)
    assert out.metadata["valid_action"] is False
    assert out.metadata["error_kind"] == kind and out.metadata["hint_template_key"] == hint
    assert hint in HINTS
    assert out.observation == before and out.reward == 0.0 and out.done is False
    assert set(METADATA_KEYS) <= set(out.metadata)


def test_valid_steps_carry_no_error_markers(env):
    env.reset(task_id="shop/000003")
    out = env.step(f"search[{expert_query(env.world.goal('shop/000003'))}]")
    assert out.metadata["valid_action"] is True
    assert out.metadata["error_kind"] is None and out.metadata["hint_template_key"] is None
    # accepted but useless (no protein bars among shampoos): still valid, marked as an error site
    env.reset(task_id="shop/000003")
    out = env.step("search[shampoo]")
    assert out.metadata["valid_action"] is True and out.metadata["error_kind"] == "search_no_match"


def test_require_options_refuses_early_buy():
    strict = ShopEnv(require_options=True)
    tid = next(t for t in strict.task_ids("test") if strict.world.goal(t).goal_options)
    strict.reset(task_id=tid)
    while strict._session.page != "item":
        strict.step(strict.expert_action())
    out = strict.step("click[buy now]")
    assert (
        out.metadata["error_kind"] == "options_missing"
        and out.metadata["hint_template_key"] == "shop/select_options"
    )
    assert not out.done
    while not out.done:
        out = strict.step(strict.expert_action())
    assert out.reward == 1.0


# ---- state(t), horizon, determinism -----------------------------------------------------------------
def test_state_t_returns_each_observation(env):
    seen = [env.reset(task_id="shop/000004").observation]
    for _ in range(4):
        seen.append(env.step(env.expert_action()).observation)
    seen.append(env.step("click[nonsense]").observation)
    for t, obs in enumerate(seen):
        assert env.state(t) == obs
    assert env.state() == seen[-1]
    with pytest.raises(IndexError):
        env.state(len(seen))


def test_horizon_ends_an_unbought_episode():
    short = ShopEnv(horizon=3)
    short.reset(task_id="shop/000005")
    assert not short.step("search[shampoo]").done
    assert not short.step("click[next >]").done
    last = short.step("click[< prev]")
    assert (
        last.done
        and last.reward == 0.0
        and last.metadata["truncated"] is True
        and last.metadata["won"] is False
    )
    assert ShopEnv().config.horizon == 15


def test_episodes_are_deterministic():
    a, b = ShopEnv(), ShopEnv()
    assert a.reset(seed=11).metadata["task_id"] == b.reset(seed=11).metadata["task_id"]
    assert a.reset(seed=11).metadata["task_id"] in a.task_ids("train")
    rng = random.Random(5)
    actions = []
    oa, ob = a.reset(task_id="shop/000042"), b.reset(task_id="shop/000042")
    for _ in range(12):
        assert oa.observation == ob.observation and oa.metadata == ob.metadata
        if oa.done:
            break
        act = rng.choice(oa.metadata["admissible_actions"]).replace("<query>", "dark chocolate")
        actions.append(act)
        oa, ob = a.step(act), b.step(act)


# ---- expert and random policies ---------------------------------------------------------------------
def _run(env: ShopEnv, tid: str, policy) -> tuple[float, int]:
    out = env.reset(task_id=tid)
    while not out.done:
        out = env.step(policy(out))
    return out.reward, env.num_steps


def test_expert_reaches_reward_one_on_test_goals(env):
    ids = env.task_ids("test")[:300]
    results = [_run(env, t, lambda _o: env.expert_action()) for t in ids]
    success = sum(r == 1.0 for r, _ in results) / len(results)
    assert success >= 0.9, success
    assert max(n for _, n in results) <= env.config.horizon


def test_expert_recovers_from_any_page(env):
    rng = random.Random(3)
    wins = 0
    for tid in env.task_ids("test")[300:340]:
        out = env.reset(task_id=tid)
        for _ in range(rng.randint(1, 4)):  # wander first
            act = rng.choice(out.metadata["admissible_actions"]).replace("<query>", "organic")
            if act == "click[buy now]":
                continue
            out = env.step(act)
        while not out.done:
            out = env.step(env.expert_action())
        wins += out.reward == 1.0
    assert wins >= 36


def test_expert_falls_back_to_the_title_when_its_query_misses(world):
    g = dataclasses.replace(world.goals[0], attributes=["zzzq"], query="qqzz")
    assert expert_query(g) == "zzzq qqzz" and world.search("zzzq qqzz") == []
    assert expert_action(world, g, Session()) == f"search[{world.by_asin[g.asin].title.lower()}]"
    assert (
        expert_action(world, world.goals[0], Session()) == f"search[{expert_query(world.goals[0])}]"
    )


def test_random_policy_mostly_fails(env):
    rng = random.Random(0)

    def random_policy(out):
        act = rng.choice(out.metadata["admissible_actions"])
        if act.startswith("search["):
            words = env.task_text.split()
            act = "search[" + " ".join(rng.sample(words, 4)) + "]"
        return act

    rewards = [_run(env, t, random_policy)[0] for t in env.task_ids("test")[:200]]
    assert sum(r == 1.0 for r in rewards) / len(rewards) < 0.1
    assert sum(rewards) / len(rewards) < 0.4


# ---- skills and registry ----------------------------------------------------------------------------
def test_skills_key_rule_matches_goal_category(env, world):
    assert all(skills_key_for(g.instruction_text) == g.category for g in world.goals)
    assert skills_key_for("i want a foundation with color: honey") == "beauty"
    assert skills_key_for("a nice thing") is None
    env.reset(task_id="shop/000007")
    key = env.skills_key()
    assert key == env.task_type == world.goal("shop/000007").category
    text = env.privileged_skills()
    assert (
        "General skills:" in text and BY_KEY[key][0] in text and "Common mistakes to avoid:" in text
    )
    assert sorted(ShopEnv.skill_library().keys()) == sorted(CATEGORIES)


def test_registry_and_config_errors():
    e = make_env("shop", horizon=7)
    assert isinstance(e, ShopEnv) and e.config.horizon == 7
    with pytest.raises(TypeError, match="unknown ShopEnv option"):
        ShopEnv(horizn=7)
    with pytest.raises(ValueError, match="horizon"):
        ShopEnv(horizon=0)
    with pytest.raises(ValueError, match="one backend, 'generated'"):
        ShopEnv(backend="webshop")
    assert ShopEnv(backend="generated").backend_name == "generated"
    with pytest.raises(RuntimeError, match="reset"):
        ShopEnv().expert_action()
