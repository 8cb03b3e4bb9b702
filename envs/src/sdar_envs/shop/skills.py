"""Privileged skills for the shop family, the keyword rule that retrieves them, and its hint templates.

Retrieval is rule-based as in the SDAR reference code: the product noun found in the instruction
names the category (beauty, food, fashion, electronics, garden), which keys the library.
"""

from __future__ import annotations

import re

from sdar_envs.shop.taxonomy import PRODUCT_TYPES
from sdar_envs.skills import SkillLibrary

GENERAL = [
    # the shop's search indexes option values: on the 500 test goals the first result fits for 95% of
    # such queries, 71% without the option values, 7% for the noun alone (expert.skilled_query)
    (
        "Search with the key attributes, the product noun and the option values of the instruction, "
        "without the price (e.g. search[sulfate free shampoo dry hair lavender 12 fl oz]): the search "
        "indexes option values, so they rank the exact item first."
    ),
    "On the results page compare every title and price with the instruction before clicking a product id.",
    "The price must be lower than the instruction's ceiling; check the price on the results or item page.",
    "If nothing on the page fits, click next > for more results or back to search for a better query.",
    "On the item page click every option value the instruction names (e.g. click[large], click[blue]) before buying.",
    "Open description or features only when the title does not show a required attribute.",
    "Click buy now only when type, attributes, options and price all match: buying ends the episode and is scored.",
    "There are 15 actions per episode and only a purchase earns reward: do not wander.",
]

BY_KEY = {
    "beauty": [
        (
            "Attributes such as sulfate free, fragrance free, cruelty free or 'for dry skin' separate similar "
            "beauty products: put them in the query."
        ),
        "Sizes are matched exactly: click the size as written (e.g. 12 fl oz), then the scent, colour or shade.",
        "Shades and scents (honey, nude, lavender) are options: put them in the query and click them on the item page.",
    ],
    "food": [
        "Dietary attributes (gluten free, keto friendly, non gmo, vegan, organic) matter most: put them in the query.",
        "Flavor and pack size are separate options: select both.",
        "Count sizes (24 count, pack of 12) must be clicked exactly as the instruction says.",
    ],
    "fashion": [
        "Clothes and shoes have a colour and a size option: select both before buying.",
        "Size is matched exactly: large is not x-large, and shoe size 8.5 is not 8.",
        "Fit and sleeve attributes (slim fit, long sleeve, high waist) tell similar items apart; check title or features.",
    ],
    "electronics": [
        (
            "Put feature attributes (noise cancelling, fast charging, with microphone) in the query; check "
            "features before buying."
        ),
        "Capacity and length (64gb, 6 ft) are size options: click the exact value.",
        "Colour is usually the other option; pick the named colour.",
    ],
    "garden": [
        "For furniture and home goods put material and room words (solid wood, for living room, blackout) in the query.",
        "Bed, rug and curtain sizes (queen, 5 x 7 ft, 52 x 84 inch) are exact size options; select them and the colour.",
        "Furniture can be expensive: compare the price with the ceiling before buying.",
    ],
}

MISTAKES = {
    "*": [
        "Buying before selecting every requested option loses the option part of the score.",
        "Buying an item priced above the ceiling loses the price part of the score.",
        "Clicking text that is not a button (a product title instead of its id, an option of another product).",
        "Searching with the product noun alone ranks every similar product alike: the first result rarely fits.",
        "Using search[...] outside the search page does nothing: click back to search first.",
    ],
    "beauty": ["Mixing up scent, colour or shade values."],
    "food": ["Selecting the pack size but forgetting the flavor."],
    "fashion": ["Choosing a neighbouring size (x-large for large)."],
    "electronics": [
        "Buying another type that shares a word (a usb c cable when an hdmi cable is asked)."
    ],
    "garden": ["Picking the wrong bed or rug size."],
}

# hint_template_key -> hint text, for the hint-distillation channel (keys appear in step metadata)
HINTS = {
    "shop/action_format": "Actions are search[keywords] on the search page or click[button] with a button of the "
    "current page, e.g. click[buy now].",
    "shop/search_first": "You are on the search page: nothing can be clicked yet; search[<product and key attributes>].",
    "shop/back_to_search": "Search only works on the search page: click[back to search] first, then search again.",
    "shop/empty_query": "Give real keywords in search[...]: the product noun and its key attributes from the instruction.",
    "shop/not_clickable": "That is not a button on this page; choose one of the admissible actions (a product id, an "
    "option value, next >, < prev, back to search, buy now).",
    "shop/select_options": "Click every option value the instruction names before clicking buy now.",
    # no-progress sites of accepted actions (progress.py); fields hold only the agent's query, the item
    # it saw and words of the instruction
    "shop/search_no_match": "No result of search[{query}] fits the instruction ({wanted}). Search with "
    "the product noun and the attributes the instruction names, e.g. search[{suggested}].",
    "shop/non_matching_item": "Item {item} ({title}) does not fit the instruction ({wanted}); go back and "
    "open a result whose title and price fit it.",
    "shop/wrong_option": "The instruction asks for {option}: {wanted_value}, not {value}; "
    "click[{wanted_value}] instead.",
    "shop/buy_non_matching": "Do not buy item {item} ({title}): it does not fit the instruction "
    "({wanted}). Go back and find a product that does.",
    "shop/buy_wrong_options": "Do not buy yet: first click the option values the instruction names "
    "({options}), then buy now.",
}

# product nouns, longest first, so "coffee table" wins over a shorter noun inside it
_NOUNS = sorted(((t.name, t.category) for t in PRODUCT_TYPES), key=lambda nc: -len(nc[0]))
# the instruction's option and price parts name values ("honey", "caramel"), not the product
_TAIL = re.compile(r" with [a-z ]+: |, and price lower than ")


def shop_skill_library() -> SkillLibrary:
    return SkillLibrary(
        family="shop",
        general=list(GENERAL),
        by_key={k: list(v) for k, v in BY_KEY.items()},
        mistakes={k: list(v) for k, v in MISTAKES.items()},
    )


def skills_key_for(instruction: str) -> str | None:
    """The category keyword of an instruction: the longest product noun it names; None if it names none."""
    text = instruction.lower()
    m = _TAIL.search(text)
    head = text[: m.start()] if m else text
    for noun, category in _NOUNS:
        if re.search(rf"(?<![a-z]){re.escape(noun)}(?![a-z])", head):
            return category
    return None
