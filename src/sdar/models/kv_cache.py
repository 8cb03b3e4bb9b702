"""The KV cache's name in transformers' forward calls and outputs.

transformers 5.24 renamed a model forward's `past_key_values` argument (and its outputs' field) to `cache`; the
old name warns (FutureWarning) and goes in 5.40. The releases this project supports before 5.24 know only the
old name, so every forward that passes or reads a cache goes through `with_cache` / `cache_of`.
"""

from __future__ import annotations

import re
from importlib.metadata import version
from typing import Any


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


# the name of the cache in this transformers release (checked once: the package does not change under a process)
CACHE_KEY = "cache" if _release(version("transformers")) >= (5, 24) else "past_key_values"


def with_cache(cache: Any) -> dict[str, Any]:
    """The forward keyword argument that passes `cache`: `model(..., **with_cache(cache), use_cache=True)`."""
    return {CACHE_KEY: cache}


def cache_of(output: Any) -> Any:
    """The KV cache a forward returned (`use_cache=True`)."""
    return getattr(output, CACHE_KEY)
