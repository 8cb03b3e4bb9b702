"""The shop's pages as WebShop's text observations ("simple" mode: visible strings joined by " [SEP] ").

Each renderer returns the observation and the page's clickables, lower-cased as WebShop's
`get_available_actions` lists them ("back to search", "next >", "b0abc12345", "blue", "buy now").
Two laptop-scale options (off by default) change what the pages show: results listed by rank
("item 1") instead of product id (`Session.handles`), and the options already clicked named on the
item page, as WebShop's own "text" observation mode does (`show_clicked`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sdar_envs.shop.reward import Product

SEP = " [SEP] "
PAGE_SIZE = 10  # WebShop's PRODUCT_WINDOW: results per page

# button texts, as on WebShop's pages
BACK_TO_SEARCH = "Back to Search"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BUY_NOW = "Buy Now"
SUB_PAGES = ("Description", "Features", "Reviews")
# what a click can name besides a result and an option value, lower-cased as in click[...]
BUTTONS = frozenset(b.lower() for b in (BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE, BUY_NOW, *SUB_PAGES))
SEARCH_TEMPLATE = "search[<query>]"  # listed on the search page: the query is free text
SUGGESTED = "Suggested queries:"  # heads the ready queries of ShopConfig.suggest_queries
HANDLES = ("asin", "rank")  # how results are named and clicked (Session.handles)


@dataclass
class Session:
    """Where the shopper is (the state WebShop keeps per session).

    page: "search", "results", "item", "sub" (Description/Features/Reviews) or "done".
    keywords: the last search query.
    results: ASINs the last search returned, best first.
    page_no: the results page (1-based).
    asin: the product open on the item page.
    options: option name -> selected value on the item page.
    sub: which sub page is open ("description", "features", "reviews").
    page_size: results per page (WebShop: 10; fewer keep a small model's prompt short).
    handles: how the results page names its products and how they are clicked: "asin" (WebShop: the
        id, "B0ABC12345" on the page, click[b0abc12345]) or "rank" ("item 3" on the page and in
        click[item 3]: the product's place in the whole result list, so page 2 starts at item 6 of 5
        a page). A handle says nothing about the product but where the search ranked it.
    """

    page: str = "search"
    keywords: str | None = None
    results: list[str] = field(default_factory=list)
    page_no: int = 1
    asin: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    sub: str | None = None
    page_size: int = PAGE_SIZE
    handles: str = "asin"

    def handle(self, asin: str) -> str:
        """The click text (lower case) that opens result `asin`."""
        if self.handles == "rank":
            return f"item {self.results.index(asin) + 1}"
        return asin.lower()

    def result(self, handle: str) -> str:
        """The ASIN a result's click text opens (the inverse of `handle`)."""
        if self.handles == "rank":
            return self.results[int(handle.removeprefix("item ")) - 1]
        return handle.upper()

    @property
    def num_pages(self) -> int:
        return max(1, -(-len(self.results) // self.page_size))

    @property
    def shown(self) -> list[str]:
        """The ASINs on the results page now open."""
        return self.results[(self.page_no - 1) * self.page_size : self.page_no * self.page_size]


def _head(instruction: str | None) -> list[str]:
    """The instruction block that heads every page but the search page; None (ShopConfig.compact_pages)
    leaves it out."""
    return [] if instruction is None else ["Instruction:", instruction]


def search_page(instruction: str, suggestions: list[str] | None = None) -> tuple[str, list[str]]:
    """The search box; with `suggestions` (ShopConfig.suggest_queries) also a list of ready queries."""
    parts = ["WebShop", "Instruction:", instruction, "Search"]
    if suggestions:
        parts += [SUGGESTED, *suggestions]
    return SEP.join(parts), []


def results_page(
    instruction: str, s: Session, products: dict[str, Product]
) -> tuple[str, list[str]]:
    parts = [
        *_head(instruction),
        BACK_TO_SEARCH,
        f"Page {s.page_no} (Total results: {len(s.results)})",
    ]
    clicks = [BACK_TO_SEARCH.lower()]
    if s.page_no > 1:
        parts.append(PREV_PAGE)
        clicks.append(PREV_PAGE.lower())
    if s.page_no * s.page_size < len(s.results):
        parts.append(NEXT_PAGE)
        clicks.append(NEXT_PAGE.lower())
    for asin in s.shown:
        p = products[asin]
        handle = s.handle(asin)
        parts += [handle if s.handles == "rank" else p.asin, p.title, p.price_tag]
        clicks.append(handle)
    return SEP.join(parts), clicks


def item_page(
    instruction: str, s: Session, p: Product, show_clicked: bool = False
) -> tuple[str, list[str]]:
    """The product page; with `show_clicked` it opens with "You have clicked <value>." per option value
    selected, in the order chosen (WebShop's "text" mode says the same; its "simple" mode, which these
    pages follow otherwise, shows no selection at all)."""
    clicked = [f"You have clicked {v}." for v in s.options.values()] if show_clicked else []
    parts = [*clicked, *_head(instruction), BACK_TO_SEARCH, PREV_PAGE]
    clicks = [BACK_TO_SEARCH.lower(), PREV_PAGE.lower()]
    for name, values in p.options.items():
        parts.append(name)
        parts += values
        clicks += values
    parts += [p.title, f"Price: {p.price_tag}", f"Rating: {p.rating}", *SUB_PAGES, BUY_NOW]
    clicks += [x.lower() for x in SUB_PAGES] + [BUY_NOW.lower()]
    return SEP.join(parts), clicks


def sub_page(instruction: str, s: Session, p: Product) -> tuple[str, list[str]]:
    parts = [*_head(instruction), BACK_TO_SEARCH, PREV_PAGE]
    if s.sub == "description":
        parts.append(p.description)
    elif s.sub == "features":
        parts += p.bullet_points or ["No Features"]
    else:
        if not p.reviews:
            parts.append("No reviews found")
        for r in p.reviews:
            parts += [f'"{r["title"]}"', str(r["score"]), r["body"]]
    return SEP.join(parts), [BACK_TO_SEARCH.lower(), PREV_PAGE.lower()]


def done_page(asin: str, options: dict[str, str], reward: float) -> tuple[str, list[str]]:
    parts = [
        "Thank you for shopping with us!",
        "Purchased",
        "asin",
        asin,
        "options",
        json.dumps(options),
        "Your score (min 0.0, max 1.0)",
        f"{reward:.4g}",
    ]
    return SEP.join(parts), []


def render(
    s: Session,
    instruction: str,
    products: dict[str, Product],
    reward: float = 0.0,
    suggestions: list[str] | None = None,
    compact: bool = False,
    show_clicked: bool = False,
) -> tuple[str, list[str]]:
    """The observation and clickables of the page `s` is on (`suggestions`: see `search_page`;
    `show_clicked`: see `item_page`); `compact` leaves the instruction out of every page but the
    search page."""
    if s.page == "search":
        return search_page(instruction, suggestions)
    if compact:
        instruction = None
    if s.page == "results":
        return results_page(instruction, s, products)
    if s.page == "item":
        return item_page(instruction, s, products[s.asin], show_clicked)
    if s.page == "sub":
        return sub_page(instruction, s, products[s.asin])
    if s.page == "done":
        return done_page(s.asin, s.options, reward)
    raise ValueError(f"unknown shop page {s.page!r}; expected search, results, item, sub or done")
