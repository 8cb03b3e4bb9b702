"""The shop's expert policies.

`expert_action`: search with the goal's words, open the target, pick every goal option, buy. Works
from any page (it reads the session, not a plan), so it can take over mid-episode; it reaches reward 1
whenever the target shows up in the results, falling back to a title search otherwise. It knows the
target product, which no agent sees.

`shopper_action`: a shopper that knows only what an agent sees (the instruction, the pages) and
follows a search rule; the warm start of configs/shop-tiny.yaml imitates two of them (see
`ShopEnv.skilled_expert_action` and `ShopEnv.uninformed_expert_action`).
"""

from __future__ import annotations

from sdar_envs.shop.goals import ShopWorld
from sdar_envs.shop.pages import Session
from sdar_envs.shop.progress import best_options
from sdar_envs.shop.reward import Goal


def expert_query(goal: Goal) -> str:
    """What a careful shopper types: the goal's attributes and the product noun (no options, no price)."""
    return " ".join([*goal.attributes, goal.query])


def skilled_query(goal: Goal) -> str:
    """The query the shop skills recommend: attributes, product noun and option values, no price.

    The store's search indexes option values, so they rank the exact item first: on the 500 test goals
    the first result fits the goal for 95% of these queries, 71% without the option values
    (`expert_query`) and 7% for the noun alone.
    """
    return " ".join([*goal.attributes, goal.query, *goal.goal_options.values()])


def suggested_queries(goal: Goal) -> list[str]:
    """The ready queries of the search page (ShopConfig.suggest_queries), in a fixed order: the
    product noun, attributes + noun (`expert_query`), attributes + noun + option values
    (`skilled_query`); duplicates (a goal without options) are listed once."""
    out: list[str] = []
    for q in (goal.query, expert_query(goal), skilled_query(goal)):
        if q not in out:
            out.append(q)
    return out


def shopper_action(world: ShopWorld, goal: Goal, s: Session, query: str, check_price: bool) -> str:
    """The next action of a shopper that sees only the pages: search with `query`, open the first
    result (with `check_price`, the first one on the page priced under the instruction's ceiling, if
    any), click the instruction's option values the item offers, buy. It never goes back: a result
    that does not fit is bought anyway, which is how it fails."""
    if s.page == "done":
        raise RuntimeError(
            "the episode is over (the item was bought); call reset() before asking for an expert action"
        )
    if s.page == "search":
        return f"search[{query}]"
    if s.page == "results":
        shown = s.shown
        if not shown:
            return "click[back to search]"
        pick = shown[0]
        if check_price:
            pick = next((a for a in shown if world.by_asin[a].price < goal.price_upper), pick)
        return f"click[{s.handle(pick)}]"
    if s.page == "sub":
        return "click[< prev]"
    if s.page == "item":
        for name, value in best_options(world.by_asin[s.asin], goal).items():
            if s.options.get(name) != value:
                return f"click[{value}]"
        return "click[buy now]"
    raise ValueError(f"unknown shop page {s.page!r}")


def expert_action(world: ShopWorld, goal: Goal, s: Session) -> str:
    """The gold next action in WebShop's grammar ("search[...]" or "click[...]")."""
    target = goal.asin
    if s.page == "done":
        raise RuntimeError(
            "the episode is over (the item was bought); call reset() before asking for an expert action"
        )
    if s.page == "search":
        query = expert_query(goal)
        if target not in world.search(query):
            # rare: the goal's words rank the target below the top 50; its title always finds it
            query = world.by_asin[target].title.lower()
        return f"search[{query}]"
    if s.page == "results":
        if target not in s.results:
            return "click[back to search]"
        want = s.results.index(target) // s.page_size + 1
        if want == s.page_no:
            return f"click[{s.handle(target)}]"
        return "click[next >]" if want > s.page_no else "click[< prev]"
    if s.page == "sub":
        return "click[< prev]"
    if s.page == "item":
        if s.asin != target:
            return "click[< prev]" if target in s.results else "click[back to search]"
        for name, value in goal.goal_options.items():
            if s.options.get(name) != value:
                return f"click[{value}]"
        return "click[buy now]"
    raise ValueError(f"unknown shop page {s.page!r}")
