"""A seeded, generated product catalogue in WebShop's schema (title, category path, attributes, options).

Deterministic from (seed, num_products); 1,200 products build in a few tenths of a second and are
cached per process. Products are checked so the reward stays meaningful (see `_clean_options`).
"""

from __future__ import annotations

import random
from functools import lru_cache

from sdar_envs.shop.reward import EXACT_MATCH_OPTS, Product, normalize_color, token_set_ratio
from sdar_envs.shop.taxonomy import PRODUCT_TYPES, Attribute, ProductType

MIN_PRODUCTS = 100  # WebShop's smallest index; below it some product types would have no product

# fmt: off
_SYLLABLES_A = (
    "lu", "ve", "zo", "ka", "mi", "no", "ri", "bel", "cor", "dax", "fen", "gal", "hal", "ix", "jo",
    "kel", "lor", "mar", "nex", "or", "pra", "quin", "sol", "tri", "ul", "vor", "wyn", "yar", "zen",
    "bri", "cal", "dru", "eko", "fai", "hel", "ju", "kyo", "lym", "mov", "nor",
)
# fmt: on
# fmt: off
_SYLLABLES_B = (
    "ra", "vo", "na", "lix", "ton", "vi", "mo", "dex", "ly", "ora", "ani", "ette", "ix", "ova",
    "eon", "ux", "ima", "aro", "uvo", "ela",
)
# fmt: on
_LINES = (
    "Pro",
    "Essentials",
    "Premium",
    "Everyday",
    "Signature",
    "Select",
    "Plus",
    "Max",
    "Lite",
    "Studio",
)
_ASIN_CHARS = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"

# category-flavoured filler sentences for descriptions (no digits, no colour or size words)
_FILLER = {
    "beauty": (
        "Gentle enough for daily use.",
        "Made with care and tested for quality.",
        "Suitable for all skin and hair types.",
        "Our formula is made without harsh chemicals.",
    ),
    "food": (
        "Great for snacking at home or on the go.",
        "Packed fresh for great flavor.",
        "Perfect for the pantry, the office or a picnic.",
        "Made from carefully selected ingredients.",
    ),
    "fashion": (
        "Comfortable for everyday wear.",
        "Designed for work or weekends.",
        "Easy to match with the rest of your wardrobe.",
        "Made with durable, comfortable fabric.",
    ),
    "electronics": (
        "Works with most popular devices.",
        "Backed by friendly customer support.",
        "Simple setup, no software needed.",
        "Built for daily use at home or on the go.",
    ),
    "garden": (
        "A simple upgrade for any home.",
        "Built to last with quality materials.",
        "Easy to clean and maintain.",
        "Looks great in any room of the house.",
    ),
}
_REVIEW_TITLES = ("Great value", "Works as described", "Would buy again", "Pretty good", "Not bad")
_REVIEW_BODIES = (
    "Does exactly what I needed.",
    "Good quality for the money.",
    "Arrived quickly and well packed.",
    "My family likes it a lot.",
    "Okay overall, nothing special.",
)


def _brands(rng: random.Random, n: int) -> list[str]:
    names = sorted({(a + b).capitalize() for a in _SYLLABLES_A for b in _SYLLABLES_B})
    return rng.sample(names, n)


def _asin(rng: random.Random, taken: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choice(_ASIN_CHARS) for _ in range(8))
        if asin not in taken:
            taken.add(asin)
            return asin


def _title(brand: str, line: str | None, ptype: ProductType, shown: list[Attribute]) -> str:
    pre = " ".join(a.phrase.title() for a in shown if not a.post)
    post = " ".join(
        a.phrase.title().replace("For ", "for ").replace("With ", "with ") for a in shown if a.post
    )
    parts = [brand, line or "", pre, ptype.title, post]
    return " ".join(p for p in parts if p)


def _clean_options(product: Product) -> None:
    """Drop option values the reward could not tell apart, so only the right click earns an option.

    WebShop scores a purchased value as matched if it fuzzy-matches any goal value (token_set_ratio >
    85, after normalize_color; exact for "size") or appears in the title/features/description. A
    value that matches another value of the same product, or sits in its text, would score without
    being the wanted one; such values are removed (and an option left with < 2 values is dropped).
    """
    text = " ".join([product.title, *product.bullet_points, product.description]).lower()
    kept: dict[str, list[str]] = {}
    seen: list[tuple[str, str]] = []  # (option name, normalized value) of values kept so far
    for name, values in product.options.items():
        good = []
        for v in values:
            nv = normalize_color(v)
            if nv in text:
                continue
            exact = name in EXACT_MATCH_OPTS
            clash = any(
                nv == ov
                or (not exact and token_set_ratio(nv, ov) > 85)
                or (oname not in EXACT_MATCH_OPTS and token_set_ratio(ov, nv) > 85)
                for oname, ov in seen
            )
            if clash:
                continue
            good.append(v)
            seen.append((name, nv))
        if len(good) >= 2:
            kept[name] = good
    product.options = kept


def _make_product(rng: random.Random, ptype: ProductType, brand: str, asin: str) -> Product:
    n_attr = rng.randint(3, min(5, len(ptype.attributes)))
    picked = set(rng.sample(ptype.attributes, n_attr))
    attrs = [a for a in ptype.attributes if a in picked]  # pool order reads naturally
    in_title = set(rng.sample(attrs, rng.choice((1, 2, 2))))
    shown = [a for a in attrs if a in in_title]
    line = rng.choice(_LINES) if rng.random() < 0.5 else None
    title = _title(brand, line, ptype, shown)
    options: dict[str, list[str]] = {}
    for name, pool in ptype.options:
        k = rng.randint(2, min(5, len(pool)))
        idx = sorted(rng.sample(range(len(pool)), k))
        options[name] = [pool[i] for i in idx]
    noun = ptype.name
    said = [a.phrase for a in attrs]
    listed = ", ".join(said[:-1]) + (" and " if len(said) > 1 else "") + said[-1]
    filler = rng.sample(_FILLER[ptype.category], 2)
    description = f"{brand} {noun}: {listed}. {' '.join(filler)}"
    bullets = [
        f"{a.name.upper()}: made {a.phrase}."
        if a.post
        else f"{a.name.upper()}: a {a.phrase} choice."
        for a in attrs
    ]
    bullets.append(rng.choice(_FILLER[ptype.category]))
    lo, hi = ptype.price
    price = max(round(rng.uniform(lo, hi)) - 0.01, 0.99)
    reviews = [
        {
            "title": rng.choice(_REVIEW_TITLES),
            "score": rng.randint(3, 5),
            "body": rng.choice(_REVIEW_BODIES),
        }
        for _ in range(rng.choice((0, 0, 1, 2, 3)))
    ]
    product = Product(
        asin=asin,
        title=title,
        category=ptype.category,
        product_category=ptype.path,
        query=ptype.name,
        attributes=[a.name for a in attrs],
        options=options,
        price=price,
        description=description,
        bullet_points=bullets,
        reviews=reviews,
    )
    _clean_options(product)
    return product


@lru_cache(maxsize=4)
def generate_catalogue(seed: int = 0, num_products: int = 1200) -> tuple[Product, ...]:
    """`num_products` products spread evenly over the product types, in a seeded shuffled order.

    Cached: callers share the tuple and must not mutate its products.
    """
    if num_products < MIN_PRODUCTS:
        raise ValueError(
            f"num_products={num_products} is too small; use at least {MIN_PRODUCTS} so every product type has products"
        )
    rng = random.Random(f"shop-catalogue-{seed}")
    brands = _brands(rng, 320)
    type_brands = {t.name: rng.sample(brands, 8) for t in PRODUCT_TYPES}
    taken: set[str] = set()
    products = []
    for i in range(num_products):
        ptype = PRODUCT_TYPES[i % len(PRODUCT_TYPES)]
        products.append(
            _make_product(rng, ptype, rng.choice(type_brands[ptype.name]), _asin(rng, taken))
        )
    rng.shuffle(products)
    return tuple(products)
