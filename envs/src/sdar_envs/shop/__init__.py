"""The shop family: WebShop (Yao et al. 2022) on a generated catalogue, as a TextEnv.

`ShopEnv` is what `make_env("shop")` builds; the reward, catalogue and expert are importable for tests and tools.
"""

from sdar_envs.shop.catalogue import generate_catalogue
from sdar_envs.shop.env import ShopConfig, ShopEnv
from sdar_envs.shop.goals import ShopWorld, build_world
from sdar_envs.shop.reward import Goal, Product, get_reward, token_set_ratio
from sdar_envs.shop.skills import HINTS, shop_skill_library, skills_key_for

__all__ = [
    "HINTS",
    "Goal",
    "Product",
    "ShopConfig",
    "ShopEnv",
    "ShopWorld",
    "build_world",
    "generate_catalogue",
    "get_reward",
    "shop_skill_library",
    "skills_key_for",
    "token_set_ratio",
]
