"""ShopEnv: a WebShop-style shopping task (search, browse, pick options, buy) as a TextEnv.

Actions follow WebShop's grammar, search[query] and click[button]; the reward is WebShop's score on
"buy now" (see reward.py) and success means a score of 1. Invalid actions keep the page and are marked;
accepted ones that cannot lead to a full-score purchase are marked too (progress.py).
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass
from typing import Any

from sdar_envs.base import EnvStep, TextEnv
from sdar_envs.shop import expert as _expert
from sdar_envs.shop.goals import SPLITS, ShopWorld, build_world
from sdar_envs.shop.pages import HANDLES, PAGE_SIZE, SEARCH_TEMPLATE, Session, render
from sdar_envs.shop.progress import ShopProgress
from sdar_envs.shop.reward import Goal, get_reward
from sdar_envs.shop.skills import shop_skill_library, skills_key_for
from sdar_envs.skills import SkillLibrary

_ACTION = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)


def _parse(action: str) -> tuple[str, str] | None:
    """(verb, argument) of a well-formed action, both lower case with single spaces."""
    m = _ACTION.match(action) if isinstance(action, str) else None
    if m is None:
        return None
    return m.group(1).lower(), " ".join(m.group(2).lower().split())


@dataclass
class ShopConfig:
    """Shop settings; the defaults give WebShop's episode shape on a 1,200-product catalogue.

    backend: "generated", the only one: a WebShop-style catalogue built in-process (WebShop's
        scraped data cannot be downloaded here).
    seed: seeds the catalogue and the goals (the world), not the episode.
    num_products: catalogue size (>= 100).
    goals_per_product: goals written per target product.
    test_products: target products whose goals form the test split (2 goals each: 500 test goals,
        WebShop's test-set size); the other products' goals form train.
    horizon: actions per episode before it ends unbought (15 in the SDAR paper for WebShop).
    require_options: refuse "buy now" until every option is selected (error "shop/select_options").
        WebShop allows the purchase and scores it lower, hence False.
    suggest_queries: the search page lists ready queries (`expert.suggested_queries`: the product
        noun, attributes + noun, attributes + noun + option values) and the admissible actions are
        those searches instead of the free-text template "search[<query>]" (any query is still
        accepted). A laptop-scale deviation from WebShop, off by default: constrained decoding
        (rollout.constrained) can then search; it cannot fill a free-text slot.
    page_size: results per page (WebShop: 10); fewer keep a small model's prompt short.
    compact_pages: only the search page shows the instruction (the agent's prompt states the task on
        every turn); off by default, as WebShop repeats it on every page.
    compact_skills: the privileged text is the general skills alone (no category skills, no common
        mistakes), for a small model's teacher prompt; off by default.
    result_handles: "asin" (WebShop: a result is listed and clicked by its product id, ten random
        characters to copy) or "rank" (listed and clicked as "item 1", "item 2", ... by its place in
        the result list, `pages.Session.handles`). Only the name changes: which product a handle
        opens, and everything after, is the same. A laptop-scale deviation: a tiny model picked the
        right id 47% of the time (configs/shop-tiny.yaml).
    max_goal_options: a goal names a value for at most this many of its product's options (drawn per goal);
        None (the default) names one for every option, as WebShop's goals do. A laptop-scale deviation:
        the tiny model clicks the named value of an option about half the time, so success falls with
        every option a goal names (configs/shop-tiny.yaml).
    show_clicked: the item page opens with "You have clicked <value>." for each option value
        selected, as WebShop's "text" observation mode does; off by default (WebShop's "simple" mode,
        whose pages these are, shows no selection, so an agent must remember its clicks).
    """

    backend: str = "generated"
    seed: int = 0
    num_products: int = 1200
    goals_per_product: int = 2
    test_products: int = 250
    horizon: int = 15
    require_options: bool = False
    suggest_queries: bool = False
    page_size: int = PAGE_SIZE
    compact_pages: bool = False
    compact_skills: bool = False
    result_handles: str = "asin"
    show_clicked: bool = False
    max_goal_options: int | None = None


class ShopEnv(TextEnv):
    """WebShop-style shopping over a generated catalogue; one episode at a time."""

    family = "shop"

    def __init__(self, config: ShopConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        fields = {f.name for f in dataclasses.fields(ShopConfig)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise TypeError(f"unknown ShopEnv option(s) {unknown}; choose from {sorted(fields)}")
        self.config = dataclasses.replace(config or ShopConfig(), **overrides)
        if self.config.backend != "generated":
            raise ValueError(
                f"unknown shop backend {self.config.backend!r}; the shop has one backend, 'generated' "
                "(a WebShop-style catalogue built in-process)"
            )
        if self.config.horizon < 1:
            raise ValueError(f"horizon={self.config.horizon} must be >= 1 (the paper uses 15)")
        if self.config.page_size < 1:
            raise ValueError(
                f"page_size={self.config.page_size} must be >= 1 (WebShop shows {PAGE_SIZE})"
            )
        if self.config.result_handles not in HANDLES:
            raise ValueError(
                f"unknown result_handles {self.config.result_handles!r}; choose one of "
                f"{', '.join(HANDLES)} (asin: WebShop's product ids; rank: item 1, item 2, ...)"
            )
        self.backend_name = self.config.backend
        self.world: ShopWorld = build_world(
            self.config.seed,
            self.config.num_products,
            self.config.goals_per_product,
            self.config.test_products,
            self.config.max_goal_options,
        )
        self._rng = random.Random()
        self._goal: Goal | None = None
        self._progress: ShopProgress | None = None
        self._session = self._new_session()
        self._clicks: list[str] = []
        self._done = False
        self._won = False
        self._steps = 0
        self._episodes = 0
        self._uninformed_query = ""

    # ---- TextEnv ----------------------------------------------------------------------------
    def _reset(self, task_id: str | None, seed: int | None) -> EnvStep:
        if task_id is None:
            rng = random.Random(seed) if seed is not None else self._rng
            task_id = rng.choice(self.world.splits["train"])
        self._goal = self.world.goal(task_id)
        self._progress = ShopProgress(self._goal, self.world.by_asin)
        self._task_id = task_id
        self._session = self._new_session()
        self._done = self._won = False
        self._steps = 0
        self._episodes += 1
        # the uninformed shopper's query: one suggested query drawn per episode, reproducibly
        draw = random.Random(f"shop-uninformed/{task_id}/{self._episodes}")
        self._uninformed_query = draw.choice(_expert.suggested_queries(self._goal))
        obs = self._render()
        meta = self._meta(valid=True)
        meta.update(task=self._goal.instruction_text, task_id=task_id)
        return EnvStep(observation=obs, reward=0.0, done=False, metadata=meta)

    def _step(self, action: str) -> EnvStep:
        if self._done:
            raise RuntimeError(
                "the shop episode is over (bought or out of steps); call reset() to start a new one"
            )
        self._steps += 1
        reward, extra, marker = 0.0, {}, None
        page = self._session.page
        error = self._apply(action)
        if error is None and self._session.page == "done":
            reward, extra = self._buy()
        if error is None:
            # accepted, but it may still make no progress (valid_action stays True)
            marker = self._no_progress(page, action, reward)
        if not self._done and self._steps >= self.config.horizon:
            self._done = True
            extra["truncated"] = True
        obs = self._render(reward)
        meta = self._meta(valid=error is None, error=error or marker)
        meta.update(extra)
        return EnvStep(observation=obs, reward=reward, done=self._done, metadata=meta)

    def task_ids(self, split: str = "test") -> list[str]:
        if split not in self.world.splits:
            raise ValueError(f"unknown shop split {split!r}; choose one of {', '.join(SPLITS)}")
        return list(self.world.splits[split])

    @property
    def task_text(self) -> str:
        return self._require_goal().instruction_text

    @property
    def task_type(self) -> str:
        return self._require_goal().category

    def expert_action(self) -> str:
        return _expert.expert_action(self.world, self._require_goal(), self._session)

    def uninformed_expert_action(self) -> str:
        """The next action of a shopper without the skills: it cannot tell which query this store's
        search ranks well, so it searches with one of the suggested queries drawn at random per
        episode (`expert.suggested_queries`), then opens the first result without comparing prices
        and buys it with the instruction's options. The warm start imitates it in prompts without
        skills; it wins 56% of the test goals (configs/shop-tiny.yaml's setting)."""
        goal = self._require_goal()
        query = self._uninformed_query
        return _expert.shopper_action(self.world, goal, self._session, query, check_price=False)

    def skilled_expert_action(self) -> str:
        """The next action of a shopper that does what the skills text says: search with the
        attributes, noun and option values (`expert.skilled_query`), open the first result priced
        under the ceiling, click the options, buy. Its edge over the uninformed shopper is the
        skills' search rule, a fact about this store's search engine (it indexes option values) that
        the student's prompt does not carry; it wins 99% of the test goals (the uninformed one 56%)."""
        goal = self._require_goal()
        query = _expert.skilled_query(goal)
        return _expert.shopper_action(self.world, goal, self._session, query, check_price=True)

    def skills_key(self) -> str | None:
        return skills_key_for(self._require_goal().instruction_text)

    @classmethod
    def skill_library(cls) -> SkillLibrary:
        return shop_skill_library()

    def privileged_skills(self) -> str:
        """The category's skills; with compact_skills only the general ones (a short teacher prompt)."""
        if self.config.compact_skills:
            return self.skill_library().render(None, common_mistakes=False)
        return self.skill_library().render(self.skills_key())

    # ---- internals --------------------------------------------------------------------------
    def _require_goal(self) -> Goal:
        if self._goal is None:
            raise RuntimeError("no shop episode yet; call reset() first")
        return self._goal

    def _new_session(self) -> Session:
        return Session(page_size=self.config.page_size, handles=self.config.result_handles)

    def _suggestions(self) -> list[str] | None:
        """The search page's ready queries (ShopConfig.suggest_queries), None when off."""
        return _expert.suggested_queries(self._goal) if self.config.suggest_queries else None

    def _render(self, reward: float = 0.0) -> str:
        obs, self._clicks = render(
            self._session,
            self._goal.instruction_text,
            self.world.by_asin,
            reward,
            self._suggestions(),
            compact=self.config.compact_pages,
            show_clicked=self.config.show_clicked,
        )
        return obs

    def _admissible(self) -> list[str]:
        if self._done:
            return []
        extra = []
        if self._session.page == "search":
            suggestions = self._suggestions()
            extra = [f"search[{q}]" for q in suggestions] if suggestions else [SEARCH_TEMPLATE]
        return extra + [f"click[{c}]" for c in self._clicks]

    def _meta(self, valid: bool, error: tuple | None = None) -> dict[str, Any]:
        """error: (error_kind, hint_template_key) of a refused action, or (kind, key, error_args)
        of an accepted one that made no progress (`progress.ShopProgress`)."""
        return {
            "won": self._won,
            "admissible_actions": self._admissible(),
            "task_type": self._goal.category,
            "valid_action": valid,
            "error_kind": error[0] if error else None,
            "hint_template_key": error[1] if error else None,
            "error_args": error[2] if error and len(error) > 2 else None,
            "page": self._session.page,
        }

    def _no_progress(self, page: str, action: str, reward: float) -> tuple | None:
        """The no-progress marker of an accepted `action` taken on `page`, or None."""
        verb, arg = _parse(action)
        s, check = self._session, self._progress
        if verb == "search":
            return check.search(arg, s.results)
        if s.page == "done":
            return check.buy(s.asin, reward, s.handle(s.asin))
        if page == "results" and s.page == "item":
            return check.open_item(s.asin, s.handle(s.asin))
        if page == "item" and s.page == "item":  # an option value was clicked
            name = next(n for n, values in self.world.by_asin[s.asin].options.items() if arg in values)
            return check.click_option(name, arg)
        return None

    def _apply(self, action: str) -> tuple[str, str] | None:
        """Change the session for `action`; (error_kind, hint_template_key) when it cannot be done."""
        s = self._session
        parsed = _parse(action)
        if parsed is None:
            return ("malformed_action", "shop/action_format")
        verb, arg = parsed
        if verb == "search":
            if s.page != "search":
                return ("search_unavailable", "shop/back_to_search")
            if not arg or (arg.startswith("<") and arg.endswith(">")):
                return ("empty_query", "shop/empty_query")
            self._session = Session(
                page="results",
                keywords=arg,
                results=self.world.search(arg),
                page_size=self.config.page_size,
                handles=self.config.result_handles,
            )
            return None
        if s.page == "search":
            return ("search_first", "shop/search_first")
        if arg not in self._clicks:
            return ("not_clickable", "shop/not_clickable")
        if arg == "back to search":
            self._session = self._new_session()
        elif s.page == "results":
            if arg == "next >":
                s.page_no += 1
            elif arg == "< prev":
                s.page_no -= 1
            else:
                s.page, s.asin, s.options = "item", s.result(arg), {}
        elif s.page == "sub":  # only "< prev" is left: back to the item, options kept
            s.page, s.sub = "item", None
        elif arg == "< prev":  # item page -> the results page it came from
            s.page, s.asin, s.options = "results", None, {}
        elif arg in ("description", "features", "reviews"):
            s.page, s.sub = "sub", arg
        elif arg == "buy now":
            product = self.world.by_asin[s.asin]
            missing = [name for name in product.options if name not in s.options]
            if self.config.require_options and missing:
                return ("options_missing", "shop/select_options")
            s.page = "done"
        else:  # an option value
            product = self.world.by_asin[s.asin]
            name = next(n for n, values in product.options.items() if arg in values)
            s.options[name] = arg
        return None

    def _buy(self) -> tuple[float, dict[str, Any]]:
        s = self._session
        product = self.world.by_asin[s.asin]
        score, info = get_reward(product, self._goal, product.price, s.options)
        self._done = True
        self._won = score >= 1.0 - 1e-9
        return score, {
            "score_info": info,
            "purchased": {"asin": s.asin, "options": dict(s.options)},
        }
