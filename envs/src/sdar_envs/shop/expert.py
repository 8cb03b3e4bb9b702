"""The shop's expert policy: search with the goal's words, open the target, pick every goal option, buy.

Works from any page (it reads the session, not a plan), so it can take over mid-episode; it reaches
reward 1 whenever the target shows up in the results, falling back to a title search otherwise.
"""

from __future__ import annotations

from sdar_envs.shop.goals import ShopWorld
from sdar_envs.shop.pages import PAGE_SIZE, Session
from sdar_envs.shop.reward import Goal


def expert_query(goal: Goal) -> str:
    """What a careful shopper types: the goal's attributes and the product noun (no options, no price)."""
    return " ".join([*goal.attributes, goal.query])


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
        want = s.results.index(target) // PAGE_SIZE + 1
        if want == s.page_no:
            return f"click[{target.lower()}]"
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
