"""Where converted models and tokenizers are cached, and how a cache entry is written atomically.

Root: $SDAR_CACHE_DIR, else $XDG_CACHE_HOME/sdar, else ~/.cache/sdar (shared with the ALFWorld data).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from sdar_envs.base import cache_root  # noqa: F401 - the one definition, re-exported


def build_once(target: Path, build: Callable[[Path], None], marker: str) -> Path:
    """Return `target`, first running `build(tmp_dir)` and renaming it into place if `target/marker` is missing.

    Building into a sibling temporary directory and renaming means a crash or a concurrent
    builder never leaves a half-written entry that later runs would trust.
    """
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        if not (tmp / marker).is_file():
            raise RuntimeError(f"building the cache entry {target} did not write {marker}")
        if target.exists():
            if (target / marker).is_file():  # another process won the race; keep its copy
                return target
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
