"""WebShop's purchase reward (web_agent_site/engine/goal.py::get_reward), re-implemented on the stdlib.

The formula, as in WebShop:

    total = r_type * (num_attr_matches + num_option_matches + r_price) / (len(goal attributes) + len(goal options) + 1)

- r_type (product type match): query_match = purchased query == goal query; category_match = the two
  category paths (split on "›") share >= 2 components; title_score = |nouns(purchased title) ∩
  nouns(goal product title)| / len(nouns(goal title)) (0.2 if the goal title has no nouns).
  r_type = 1.0; 0.5 if none of (query_match, category_match, title_score > 0.2); then 0.1 if
  title_score < 0.1; then 0.0 if title_score == 0.
- num_attr_matches: per goal attribute, 1 if token_set_ratio(product attribute, goal attribute) > 85
  for some product attribute, else 1 if the goal attribute is a substring of the lower-cased title,
  bullet points (features) or description.
- num_option_matches: per *purchased* option (name, value), after normalize_color on every value:
  for name "size" an exact match against the goal option values, otherwise token_set_ratio > 85
  against some goal option value; if unmatched, 1 if the value is a substring of title, bullet
  points or description. (So options never clicked never count.)
- r_price: 1 if price <= the goal's price ceiling, else 0.
Success (`won`) is total == 1.

Deviations, each forced by "no downloads": thefuzz's token_set_ratio is re-implemented on
difflib.SequenceMatcher (python-Levenshtein's ratio differs by a point or two on a few pairs); spaCy's
noun filter (NOUN/PROPN tokens) is approximated by dropping stop words, numbers and the catalogue's
attribute vocabulary (`taxonomy.MODIFIER_WORDS`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from functools import lru_cache
from typing import Any

from sdar_envs.shop.taxonomy import MODIFIER_WORDS

# option names the reward matches exactly (WebShop's EXACT_MATCH_OPTS)
EXACT_MATCH_OPTS = ("size",)

# WebShop's normalize.py COLOR_SET, alphabetical: the first entry found inside a value wins, so
# "navy blue" -> "blue" and "dark wash" -> "ash" (quirks kept on purpose).
# fmt: off
COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "baby-blue", "beige", "black", "blue", "blush",
    "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne", "charcoal",
    "cheetah", "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper", "coral",
    "cranberry", "cream", "crystal", "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia",
    "gold", "granite", "grape", "graphite", "grass", "gray", "green", "grey", "heather", "indigo",
    "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac", "lime", "magenta",
    "maroon", "mauve", "merlot", "midnight", "mint", "mocha", "multicolor", "mushroom", "mustard",
    "natural", "navy", "nude", "olive", "orange", "peach", "pewter", "pink", "plum", "purple",
    "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull",
    "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal", "tiger",
    "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)
# fmt: on

# English stop words (spaCy tags none of these as nouns)
# fmt: off
STOPWORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "if", "in", "into", "is",
    "it", "its", "no", "not", "of", "on", "or", "s", "such", "that", "the", "their", "then",
    "there", "these", "they", "this", "to", "was", "will", "with", "without", "your", "you",
))
# fmt: on

_NON_WORD = re.compile(r"(?u)\W")
_ALPHA = re.compile(r"[a-z]+")


@dataclass
class Product:
    """A catalogue product with WebShop's fields.

    asin: the ASIN-like id ("B0" + 8 characters), upper case.
    title: WebShop's `Title` / `name`.
    category: one of taxonomy.CATEGORIES.
    product_category: the category path joined with " › ".
    query: the product-type noun ("shampoo"), WebShop's scraping query.
    attributes: WebShop's `Attributes`.
    options: option name -> allowed values, in page order.
    price: dollars.
    description: WebShop's `Description`.
    bullet_points: WebShop's `BulletPoints` (the Features page).
    reviews: [{"title", "score", "body"}] for the Reviews page.
    """

    asin: str
    title: str
    category: str
    product_category: str
    query: str
    attributes: list[str]
    options: dict[str, list[str]]
    price: float
    description: str
    bullet_points: list[str] = field(default_factory=list)
    reviews: list[dict[str, Any]] = field(default_factory=list)

    @property
    def price_tag(self) -> str:
        return f"${self.price:.2f}"

    @property
    def rating(self) -> str:
        if not self.reviews:
            return "N.A."
        return f"{sum(r['score'] for r in self.reviews) / len(self.reviews):.1f}"


@dataclass
class Goal:
    """What the shopper wants (WebShop's goal dict).

    asin: the target product the instruction was written from.
    category, query, product_category: the target's (used by r_type).
    name: the target's title (used by r_type's title score).
    instruction_text: the instruction shown to the agent.
    attributes: goal attributes (a subset of the target's).
    goal_options: option name -> wanted value (one per option of the target).
    price_upper: price ceiling in dollars.
    """

    asin: str
    category: str
    query: str
    product_category: str
    name: str
    instruction_text: str
    attributes: list[str]
    goal_options: dict[str, str]
    price_upper: float


# ---- fuzzy matching (thefuzz semantics) ----------------------------------------------------
def full_process(s: str) -> str:
    """thefuzz's default processor: non-word characters to spaces, lower case, stripped."""
    return _NON_WORD.sub(" ", s).lower().strip()


def ratio(a: str, b: str) -> int:
    """fuzz.ratio: similarity in 0..100 (0 when either side is empty)."""
    if not a or not b:
        return 0
    return round(100 * SequenceMatcher(None, a, b, autojunk=False).ratio())


@lru_cache(
    maxsize=1 << 16
)  # pure; the catalogue check and the reward compare the same pool values often
def token_set_ratio(s1: str, s2: str) -> int:
    """fuzz.token_set_ratio: 100 when one side's words are a subset of the other's."""
    p1, p2 = full_process(s1), full_process(s2)
    if not p1 or not p2:
        return 0
    t1, t2 = set(p1.split()), set(p2.split())
    sect = " ".join(sorted(t1 & t2))
    c12 = (sect + " " + " ".join(sorted(t1 - t2))).strip()
    c21 = (sect + " " + " ".join(sorted(t2 - t1))).strip()
    return max(ratio(sect, c12), ratio(sect, c21), ratio(c12, c21))


def normalize_color(value: str) -> str:
    """WebShop's normalize_color: the first COLOR_SET entry contained in `value`, else `value`."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def type_nouns(title: str) -> list[str]:
    """The title's product-type words (a list: WebShop divides by its length, duplicates included)."""
    return [
        w
        for w in _ALPHA.findall(title.lower())
        if len(w) > 1 and w not in STOPWORDS and w not in MODIFIER_WORDS
    ]


# ---- the reward terms ------------------------------------------------------------------------
def type_reward(product: Product, goal: Goal) -> dict[str, Any]:
    query_match = product.query == goal.query
    p_cat = {x.strip() for x in product.product_category.split("›")}
    g_cat = {x.strip() for x in goal.product_category.split("›")}
    category_match = len(p_cat & g_cat) >= 2
    purchased, desired = type_nouns(product.title), type_nouns(goal.name)
    title_score = 0.2 if not desired else len(set(purchased) & set(desired)) / len(desired)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def _in_text(needle: str, product: Product) -> bool:
    return (
        needle in product.title.lower()
        or needle in " ".join(product.bullet_points).lower()
        or needle in product.description.lower()
    )


def attribute_reward(product: Product, goal: Goal) -> tuple[float, int]:
    matches = 0
    for g_attr in goal.attributes:
        if any(token_set_ratio(p_attr, g_attr) > 85 for p_attr in product.attributes) or _in_text(
            g_attr, product
        ):
            matches += 1
    return (matches / len(goal.attributes) if goal.attributes else 0.0), matches


def option_reward(
    product: Product, goal_options: list[str], purchased: dict[str, str]
) -> tuple[float | None, int]:
    purchased = {k: normalize_color(v) for k, v in purchased.items()}
    goal_values = [normalize_color(v) for v in goal_options]
    matches = 0
    for name, value in purchased.items():
        if name.lower() in EXACT_MATCH_OPTS:
            matched = value in goal_values
        else:
            matched = any(token_set_ratio(g, value) > 85 for g in goal_values)
        if matched or _in_text(value, product):
            matches += 1
    return (matches / len(goal_values) if goal_values else None), matches


def get_reward(
    product: Product, goal: Goal, price: float, options: dict[str, str]
) -> tuple[float, dict[str, Any]]:
    """The WebShop score of buying `product` at `price` with `options` selected, and its parts."""
    t = type_reward(product, goal)
    r_price = price <= goal.price_upper
    r_att, n_att = attribute_reward(product, goal)
    r_option, n_opt = option_reward(product, list(goal.goal_options.values()), options)
    denom = len(goal.attributes) + len(goal.goal_options) + 1
    total = t["r_type"] * (n_att + n_opt + int(r_price)) / denom
    info = {
        **t,
        "r_att": r_att,
        "num_attr_matches": n_att,
        "r_option": r_option,
        "num_option_matches": n_opt,
        "r_price": bool(r_price),
        "w_att": len(goal.attributes) / denom,
        "w_option": len(goal.goal_options) / denom,
        "w_price": 1 / denom,
    }
    return total, info
