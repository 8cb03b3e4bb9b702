"""The shop's observation-only rule expert: a turn's prompt (the instruction, the page, the recent turns) -> the next
action, never the session or the target product; sdar serves it as a replay teacher (`sdar.replay.experts.rule_expert`).
It searches with the instruction's words, goes down the results in the engine's order, backs out of a product that
does not fit (price, options, attribute phrases on the title or detail pages), picks the options, buys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sdar_envs.transcript import Turn

_SEP = " [SEP] "
_PRICE = re.compile(r",? and price lower than (?P<p>[\d.]+) dollars")
_OPTIONS = re.compile(r" with (?=[a-z]+: )")
_RESULT = re.compile(r"^(?:B0[A-Z0-9]{8}|item \d+)$")  # a result's id, or its rank handle (ShopConfig.result_handles)
_PHRASE = re.compile(r",\s*|\s+(?:and|that is|that are|with|for)\s+")  # between attribute phrases
# words that carry no product meaning in an instruction (the request wording and glue words)
_SHOP_STOP = frozenset(
    "i i'm im am need want to buy find me searching looking for would like a an some the that is are and "
    "with of in it its on".split())


@dataclass
class _Want:
    """The instruction: its product words, attribute phrases, option values and price ceiling."""

    words: list[str]
    phrases: list[list[str]]  # "keto friendly and individually wrapped beef jerky" -> [keto friendly], [...]
    options: list[str]
    ceiling: float

    @classmethod
    def parse(cls, text: str) -> _Want:
        text = text.lower().strip()
        m = _PRICE.search(text)
        ceiling = float(m["p"]) if m else float("inf")
        text = text[:m.start()] if m else text
        head, *rest = _OPTIONS.split(text, maxsplit=1)
        options = [o.split(": ", 1)[1].strip() for o in rest[0].split(", and ")] if rest else []
        phrases = [p for p in (_words(x) for x in _PHRASE.split(head)) if p]
        return cls(_words(head), phrases, options, ceiling)

    def fits(self, title: str, details: list[str]) -> bool:
        """Whether every attribute phrase is stated by the title or the product's detail pages; a
        phrase that ends in the product's noun ("individually wrapped beef jerky") counts without it."""
        text, named = _words(" ".join([title, *details])), set(_words(title))
        for phrase in self.phrases:
            while phrase and not _contains(text, phrase) and phrase[-1] in named:
                phrase = phrase[:-1]
            if phrase and not _contains(text, phrase):
                return False
        return True


def _words(text: str) -> list[str]:
    """Content words, plurals folded."""
    out = []
    for w in re.findall(r"[a-z0-9'.-]+", text.lower()):
        w = w.strip(".")
        if w and w not in _SHOP_STOP:
            out.append(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w)
    return out


def _contains(text: list[str], phrase: list[str]) -> bool:
    n = len(phrase)
    return any(text[i:i + n] == phrase for i in range(len(text) - n + 1))


def _page(obs: str) -> str:
    if obs.startswith("WebShop [SEP]"):
        return "search"
    if obs.startswith("Thank you for shopping"):
        return "done"
    if re.search(r"\[SEP\] Page \d+ \(Total results: \d+\)", obs):
        return "results"
    return "item" if obs.endswith("[SEP] Buy Now") else "sub"


def _details(obs: str) -> str:
    """What a Description / Features / Reviews page says (the instruction it repeats left out)."""
    segs = obs.split(_SEP)
    return " ".join(segs[segs.index("< Prev") + 1:]) if "< Prev" in segs else ""


def _item(obs: str) -> tuple[str, float, list[str]]:
    """(title, price, option segments) of an item page."""
    segs = obs.split(_SEP)
    at = next(i for i, s in enumerate(segs) if s.startswith("Price: "))
    prev = segs.index("< Prev")
    price = float(re.sub(r"[^\d.]", "", segs[at]) or 0)
    return segs[at - 1], price, [s.lower() for s in segs[prev + 1:at - 1]]


def shop_rule_action(view: Turn, variant: str = "default") -> str:
    """The shop rule expert's next action (`EXPERT_VARIANTS`: b searches with the option values too) from what the
    turn's prompt shows."""
    want = _Want.parse(view.task)
    page = _page(view.observation)
    if page == "search":
        if variant == "default":
            return f"search[{' '.join(want.words)}]"
        return f"search[{' '.join(want.words + want.options)}]"
    if page == "done":
        return "click[back to search]"
    if page == "sub":
        return "click[< prev]"
    if page == "results":
        return _shop_results(view, want)
    if view.max_steps - view.step <= 1:
        return "click[buy now]"  # the last step: a partial score beats none
    return _shop_item(view, want)


def _shop_results(view: Turn, want: _Want) -> str:
    segs = view.observation.split(_SEP)
    rows = [(segs[i], segs[i + 1], float(re.sub(r"[^\d.]", "", segs[i + 2]) or 0))
            for i in range(len(segs) - 2) if _RESULT.match(segs[i])]
    # the engine's order (it matches the query against descriptions and options too, which the titles
    # shown here do not carry) beats re-ranking by title overlap (100% vs 91% on 100 test goals)
    ranked = [i for i in range(len(rows)) if rows[i][2] <= want.ceiling]
    # products backed out of in the window: go on after the latest one (the ranking is fixed, so
    # the sweep needs no memory beyond the window)
    left = [_item(o)[0] for o, a in view.history if _page(o) == "item" and a in ("click[< prev]",
                                                                                  "click[back to search]")]
    titles = [rows[i][1] for i in ranked]
    if left and left[-1] in titles:
        ranked = ranked[titles.index(left[-1]) + 1:]
    ranked = [i for i in ranked if rows[i][1] not in left]
    if ranked:
        return f"click[{rows[ranked[0]][0].lower()}]"
    return "click[next >]" if "Next >" in segs else "click[back to search]"


def _shop_item(view: Turn, want: _Want) -> str:
    title, price, options = _item(view.observation)
    if price > want.ceiling or any(v not in options for v in want.options):
        return "click[< prev]"
    # this product's turns: those since the results page it was opened from
    pages = [_page(o) for o, _ in view.history]
    since = max((i + 1 for i, p in enumerate(pages) if p in ("search", "results")), default=0)
    mine = view.history[since:]
    clicked = {a[len("click["):-1] for _, a in mine if a.startswith("click[")}
    # options are chosen only once the product looks right, so a chosen one means it was checked
    checked = any(v in clicked for v in want.options)
    details = [_details(o) for o, _ in mine if _page(o) == "sub"]
    if not checked and not want.fits(title, details):
        return "click[< prev]" if details else "click[description]"
    for v in want.options:
        if v not in clicked:
            return f"click[{v}]"
    return "click[buy now]"
