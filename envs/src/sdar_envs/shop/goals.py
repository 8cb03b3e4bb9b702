"""Shopping goals in WebShop's style, and the world (catalogue + search index + goals + splits) they live in.

A goal is written from a target product: some of its attributes, one value per buying option and a
price ceiling, e.g. "i need a long lasting shampoo for dry hair with scent: lavender, and size: 12 fl
oz, and price lower than 30.00 dollars". Train and test goals come from disjoint target products.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache

from sdar_envs.shop.catalogue import generate_catalogue
from sdar_envs.shop.reward import Goal, Product
from sdar_envs.shop.search import SEARCH_RETURN_N, BM25Index, product_document
from sdar_envs.shop.taxonomy import TYPES_BY_NAME, Attribute, ProductType

PRICE_RANGE = [10.0 * i for i in range(1, 100)]  # WebShop's price ceilings: 10, 20, ..., 990
SPLITS = ("train", "test")
TASK_PREFIX = "shop/"

_TEMPLATES = (
    "i need {item}",
    "i am looking for {item}",
    "i want to buy {item}",
    "find me {item}",
    "i'm searching for {item}",
    "i would like {item}",
    "i want {item}",
    "looking for {item}",
)


def price_ceiling(rng: random.Random, price: float) -> float:
    """WebShop's rule: of the first four multiples of 10 above the price, the larger of two drawn."""
    above = [p for p in PRICE_RANGE if p > price][:4]
    if len(above) < 2:
        return 1_000_000.0
    return max(rng.sample(above, 2))


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _item_phrase(rng: random.Random, ptype: ProductType, attrs: list[Attribute]) -> str:
    plural = ptype.name.endswith("s")
    pre = [a.phrase for a in attrs if not a.post]
    post = [a.phrase for a in attrs if a.post]
    front = tail = ""
    if pre and rng.random() < 0.7:
        front = _and(pre) + " "
    elif pre:
        tail = (" that are " if plural else " that is ") + _and(pre)
    if ptype.countable and not plural:
        article = "an " if (front or ptype.name)[0] in "aeiou" else "a "
    else:
        article = rng.choice(("", "some "))
    after = (" " + _and(post)) if post else ""
    return f"{article}{front}{ptype.name}{after}{tail}"


def make_goal(rng: random.Random, product: Product, max_options: int | None = None) -> Goal:
    """One goal whose target is `product` (attributes, options and price ceiling drawn with `rng`); it names
    a value for every option of the product (WebShop's goals), or for `max_options` of them drawn at random."""
    ptype = TYPES_BY_NAME[product.query]
    k = min(rng.choice((2, 3, 3)), len(product.attributes))
    picked = set(rng.sample(product.attributes, k))
    attrs = [a for a in ptype.attributes if a.name in picked]
    goal_options = {name: rng.choice(product.options[name]) for name in sorted(product.options)}
    if max_options is not None and len(goal_options) > max_options:
        keep = set(rng.sample(sorted(goal_options), max_options))
        goal_options = {name: v for name, v in goal_options.items() if name in keep}
    price_upper = price_ceiling(rng, product.price)
    text = rng.choice(_TEMPLATES).format(item=_item_phrase(rng, ptype, attrs))
    if goal_options:
        text += " with " + ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
    if price_upper < 1_000_000:
        text += f", and price lower than {price_upper:.2f} dollars"
    return Goal(
        asin=product.asin,
        category=product.category,
        query=product.query,
        product_category=product.product_category,
        name=product.title,
        instruction_text=text,
        attributes=[a.name for a in attrs],
        goal_options=goal_options,
        price_upper=price_upper,
    )


@dataclass
class ShopWorld:
    """Everything an episode reads; built once per configuration and shared (treat as read-only).

    products: the catalogue, in index order.
    goals: all goals; goal i has task id "shop/{i:06d}"; test goals come first.
    splits: split name -> task ids.
    """

    products: tuple[Product, ...]
    goals: list[Goal]
    splits: dict[str, list[str]]
    index: BM25Index
    by_asin: dict[str, Product] = field(default_factory=dict)
    _search_cache: dict[str, list[str]] = field(default_factory=dict)

    def search(self, query: str) -> list[str]:
        """ASINs of the top results for `query` (at most SEARCH_RETURN_N), best first."""
        key = " ".join(query.lower().split())
        hit = self._search_cache.get(key)
        if hit is None:
            hit = [self.products[i].asin for i in self.index.search(key, SEARCH_RETURN_N)]
            if len(self._search_cache) > 20_000:  # bound memory on long training runs
                self._search_cache.clear()
            self._search_cache[key] = hit
        return hit

    def goal(self, task_id: str) -> Goal:
        return self.goals[task_index(task_id, len(self.goals))]


def task_id_of(i: int) -> str:
    return f"{TASK_PREFIX}{i:06d}"


def task_index(task_id: str, n: int) -> int:
    """The goal index of a task id like "shop/000123"; a clear error for anything else."""
    digits = (
        task_id[len(TASK_PREFIX) :]
        if isinstance(task_id, str) and task_id.startswith(TASK_PREFIX)
        else ""
    )
    if not digits.isdigit() or not 0 <= int(digits) < n:
        raise ValueError(
            f"unknown shop task {task_id!r}; task ids look like 'shop/000123' with a number in 0..{n - 1} "
            "(list them with ShopEnv().task_ids('train') or task_ids('test'))"
        )
    return int(digits)


@lru_cache(maxsize=4)
def build_world(
    seed: int = 0, num_products: int = 1200, goals_per_product: int = 2, test_products: int = 250,
    max_goal_options: int | None = None,
) -> ShopWorld:
    """The catalogue, its index and its goals; test goals target `test_products` products never targeted in
    train; `max_goal_options`: see `make_goal` (None: WebShop's, a value for every option)."""
    if goals_per_product < 1:
        raise ValueError(f"goals_per_product={goals_per_product} must be >= 1")
    if max_goal_options is not None and max_goal_options < 0:
        raise ValueError(f"max_goal_options={max_goal_options} must be >= 0, or null for a value of every option")
    products = generate_catalogue(seed, num_products)
    if not 0 < test_products < num_products:
        raise ValueError(
            f"test_products={test_products} must be between 1 and num_products-1={num_products - 1}"
        )
    rng = random.Random(f"shop-goals-{seed}")
    order = list(range(num_products))
    rng.shuffle(order)
    goals: list[Goal] = []
    n_test = 0
    for rank, pi in enumerate(order):
        seen: set[str] = set()
        for _ in range(goals_per_product):
            for _try in range(8):  # a product with few attributes/options may repeat a goal; redraw
                g = make_goal(rng, products[pi], max_goal_options)
                if g.instruction_text not in seen:
                    break
            seen.add(g.instruction_text)
            goals.append(g)
        if rank == test_products - 1:
            n_test = len(goals)
    ids = [task_id_of(i) for i in range(len(goals))]
    index = BM25Index([product_document(p) for p in products])
    return ShopWorld(
        products=products,
        goals=goals,
        splits={"test": ids[:n_test], "train": ids[n_test:]},
        index=index,
        by_asin={p.asin: p for p in products},
    )
