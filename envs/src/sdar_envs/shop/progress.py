"""No-progress error sites of accepted shop actions: searches, clicks and purchases that cannot lead
to a full-score purchase.

The checks read the hidden goal (which products could be bought for the full score) to decide; the
`error_args` they attach hold only what the agent saw: its query, the clicked item's id and title,
the option it clicked, and words of the instruction (the product noun, attributes, options, price).
"""

from __future__ import annotations

from sdar_envs.shop.reward import (
    EXACT_MATCH_OPTS,
    Goal,
    Product,
    get_reward,
    normalize_color,
    token_set_ratio,
)

# error_kind -> hint_template_key of each no-progress site (texts in skills.HINTS)
NO_PROGRESS_HINTS = {
    "search_no_match": "shop/search_no_match",  # no result could be bought for the full score
    "non_matching_item": "shop/non_matching_item",  # opened an item that does not fit the goal
    "wrong_option": "shop/wrong_option",  # clicked a value of an option the instruction sets otherwise
    "buy_non_matching": "shop/buy_non_matching",  # bought an item that does not fit the goal
    "buy_wrong_options": "shop/buy_wrong_options",  # bought a fitting item without the asked options
}
Error = tuple[str, str, dict[str, str]]


def option_matches(name: str, value: str, wanted: str) -> bool:
    """Whether option `name` = `value` is the instruction's `wanted` value as the reward sees it
    (normalised colours; exact for size, else token_set_ratio > 85)."""
    v, w = normalize_color(value), normalize_color(wanted)
    if name.lower() in EXACT_MATCH_OPTS:
        return v == w
    return token_set_ratio(w, v) > 85


def best_options(product: Product, goal: Goal) -> dict[str, str]:
    """The goal's option values as `product` offers them (options it lacks are left out)."""
    out = {}
    for name, wanted in goal.goal_options.items():
        values = product.options.get(name, [])
        close = (v for v in values if option_matches(name, v, wanted))
        pick = wanted if wanted in values else next(close, None)
        if pick is not None:
            out[name] = pick
    return out


def fits(product: Product, goal: Goal) -> bool:
    """Whether buying `product` with the goal's options would score 1 (the episode's success)."""
    score, _ = get_reward(product, goal, product.price, best_options(product, goal))
    return score >= 1.0 - 1e-9


def _wanted(goal: Goal) -> str:
    """The instruction's product in its own words: attributes, noun, price ceiling."""
    text = " ".join([*goal.attributes, goal.query])
    if goal.price_upper < 1_000_000:  # the instruction names no ceiling above that
        text += f", price lower than {goal.price_upper:.2f} dollars"
    return text


class ShopProgress:
    """One episode's no-progress checks (with a per-episode cache of which products fit)."""

    def __init__(self, goal: Goal, products: dict[str, Product]) -> None:
        self.goal = goal
        self.products = products
        self._fits: dict[str, bool] = {}

    def fits(self, asin: str) -> bool:
        if asin not in self._fits:
            self._fits[asin] = fits(self.products[asin], self.goal)
        return self._fits[asin]

    def search(self, query: str, results: list[str]) -> Error | None:
        """A search none of whose results (every page) fits the goal."""
        if any(self.fits(a) for a in results):
            return None
        g = self.goal
        return "search_no_match", NO_PROGRESS_HINTS["search_no_match"], {
            "query": query, "suggested": " ".join([*g.attributes, g.query]), "wanted": _wanted(g)
        }

    def open_item(self, asin: str, handle: str) -> Error | None:
        """Opening (clicking) a result that does not fit the goal; `handle`: the click text the agent
        saw for it (`pages.Session.handle`)."""
        if self.fits(asin):
            return None
        return "non_matching_item", NO_PROGRESS_HINTS["non_matching_item"], self._item_args(asin, handle)

    def click_option(self, name: str, value: str) -> Error | None:
        """Clicking an option value other than the one the instruction names for that option."""
        wanted = self.goal.goal_options.get(name)
        if wanted is None or option_matches(name, value, wanted):
            return None
        return "wrong_option", NO_PROGRESS_HINTS["wrong_option"], {
            "option": name, "value": value, "wanted_value": wanted
        }

    def buy(self, asin: str, score: float, handle: str) -> Error | None:
        """Buying what scores below 1: an item that does not fit, or a fitting one without the
        instruction's options (`handle`: as in `open_item`)."""
        if score >= 1.0 - 1e-9:
            return None
        if not self.fits(asin):
            return "buy_non_matching", NO_PROGRESS_HINTS["buy_non_matching"], self._item_args(asin, handle)
        options = ", ".join(f"{k}: {v}" for k, v in self.goal.goal_options.items())
        return "buy_wrong_options", NO_PROGRESS_HINTS["buy_wrong_options"], {
            **self._item_args(asin, handle), "options": options
        }

    def _item_args(self, asin: str, handle: str) -> dict[str, str]:
        return {"item": handle, "title": self.products[asin].title, "wanted": _wanted(self.goal)}
