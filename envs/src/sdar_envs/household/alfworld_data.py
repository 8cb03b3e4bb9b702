"""The official ALFWorld games on disk: where they are (a tree or tarballs unpacked once into the
cache), which splits and games there are, and what a task id or a game's intro says."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from sdar_envs.base import cache_root
from sdar_envs.household.backend import TASK_TYPES
from sdar_envs.household.catalog import OBJECT_TYPES

DATA_ENV_VAR = "SDAR_ALFWORLD_DATA"
GAME_FILE = "game.tw-pddl"
MAX_TASK_ID_CHARS = 1024  # the longest official id is ~130; longer ones are refused before any file lookup
LAYOUT_DIR = "json_2.1.1"
TASK_PREFIX = "Your task is to: "
# split aliases of the HouseholdBackend surface; real split directories always win
SPLIT_ALIASES = {"test": ("valid_seen",), "train": ("train", "valid_train")}

_MISSING_DATA_HELP = (
    f"set {DATA_ENV_VAR} (or pass data_dir=) to a directory holding the unpacked "
    f"'{LAYOUT_DIR}/<split>/<task>/<trial>/{GAME_FILE}' tree or a '{LAYOUT_DIR}*.tar.gz' tarball "
    "(`alfworld-download` fetches the official games; in this workspace they are in "
    "../shared/data/alfworld)"
)


def default_cache_dir() -> Path:
    """Where tarballs are unpacked once: <sdar cache root>/alfworld (sdar_envs.base.cache_root)."""
    return cache_root() / "alfworld"


def _sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def unpack_tarballs(tarballs: list[Path], cache_dir: Path | None = None) -> Path:
    """Unpack `tarballs` once into `cache_dir/<sha256 prefix>/` and return that directory.

    Keyed by the tarballs' content hash, so a changed tarball unpacks afresh; the unpack goes
    to a temporary sibling first and is renamed into place, so concurrent callers never see
    a half-written tree.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache_dir / _sha256(sorted(tarballs))[:16]
    if (target / ".complete").exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=cache_dir))
    try:
        for tarball in sorted(tarballs):
            with tarfile.open(tarball, "r:*") as tar:
                tar.extractall(tmp, filter="data")
        (tmp / ".complete").write_text("\n".join(str(t) for t in sorted(tarballs)) + "\n")
        try:
            os.replace(tmp, target)
        except OSError:
            # another process finished first (target is a non-empty directory): use theirs
            if not (target / ".complete").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_data_root(
    data_dir: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None
) -> Path:
    """The `json_2.1.1` directory of the official games.

    `data_dir` (else $SDAR_ALFWORLD_DATA) may be: the json_2.1.1 directory itself, a directory
    holding json_2.1.1/, a directory holding json_2.1.1*.tar.gz tarballs, or one tarball.
    Tarballs are unpacked once into the cache (see `unpack_tarballs`).
    """
    source = data_dir if data_dir is not None else os.environ.get(DATA_ENV_VAR)
    if not source:
        raise FileNotFoundError(
            f"no ALFWorld games: {DATA_ENV_VAR} is not set; {_MISSING_DATA_HELP}"
        )
    path = Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no ALFWorld games: {path} does not exist; {_MISSING_DATA_HELP}")
    cache = Path(cache_dir) if cache_dir is not None else None
    if path.is_file():
        tarballs = [path]
    elif path.name == LAYOUT_DIR and any(path.iterdir()):
        return path
    elif (path / LAYOUT_DIR).is_dir():
        return path / LAYOUT_DIR
    else:
        tarballs = sorted(path.glob(f"{LAYOUT_DIR}*.tar.gz")) or sorted(path.glob("*.tar.gz"))
        if not tarballs:
            raise FileNotFoundError(
                f"no ALFWorld games in {path}: neither a {LAYOUT_DIR}/ directory nor a tarball; {_MISSING_DATA_HELP}"
            )
    unpacked = unpack_tarballs(tarballs, cache)
    root = unpacked / LAYOUT_DIR
    if not root.is_dir():
        raise FileNotFoundError(
            f"the tarball(s) {', '.join(map(str, tarballs))} hold no {LAYOUT_DIR}/ directory; {_MISSING_DATA_HELP}"
        )
    return root


def splits_of(root: Path) -> list[str]:
    """Split directories present under a json_2.1.1 root (e.g. valid_seen, valid_train)."""
    return sorted(p.name for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith("."))


def resolve_split(root: Path, split: str) -> str:
    """A split directory name; "test" means valid_seen and "train" the training games."""
    present = splits_of(root)
    if split in present:
        return split
    for candidate in SPLIT_ALIASES.get(split, ()):
        if candidate in present:
            return candidate
    aliases = ", ".join(f"{a} (= {' or '.join(c)})" for a, c in SPLIT_ALIASES.items())
    raise ValueError(
        f"unknown ALFWorld split {split!r} in {root}; choose one of {', '.join(present)} or {aliases}"
    )


_GAME_LISTS: dict[tuple[str, str], list[str]] = {}


def list_games(root: Path, split: str) -> list[str]:
    """Task ids (game paths relative to `root`, sorted) of the solvable games of `split`.

    Follows ALFWorld's own filter (alfred_tw_env.collect_game_files): skips games marked
    unsolvable and the 'movable'/'Sliced' variants the text engine does not support.
    """
    split = resolve_split(root, split)
    key = (str(root), split)
    if key not in _GAME_LISTS:
        ids = []
        for game in sorted((Path(root) / split).glob(f"*/*/{GAME_FILE}")):
            rel = game.relative_to(root).as_posix()
            if "movable" in rel or "Sliced" in rel:
                continue
            with open(game) as fh:
                if not json.load(fh).get("solvable", False):
                    continue
            ids.append(rel)
        if not ids:
            raise FileNotFoundError(
                f"no {GAME_FILE} games under {Path(root) / split}; {_MISSING_DATA_HELP}"
            )
        _GAME_LISTS[key] = ids
    return list(_GAME_LISTS[key])


def task_type_of(task_id: str) -> str:
    """The task type from the task directory name ('pick_heat_then_place_in_recep-Apple-...')."""
    parts = Path(task_id).parts
    for part in parts:
        prefix = part.split("-", 1)[0]
        if prefix in TASK_TYPES:
            return prefix
    raise ValueError(
        f"cannot tell the task type of {task_id!r}: no path part starts with one of {', '.join(TASK_TYPES)}"
    )


def catalog_object_type(pddl_type: str) -> str:
    """The catalog's name (`catalog.OBJECT_TYPES` key, "apple") of a PDDL object type ("appletype");
    a type the catalog lacks keeps its lower-case PDDL name without the suffix."""
    name = pddl_type.lower()
    name = name[: -len("type")] if name.endswith("type") else name
    for key, alfworld_name in OBJECT_TYPES.items():
        if alfworld_name.lower() == name:
            return key
    return name


def parse_task_text(intro: str) -> str:
    """The goal from the intro ('Your task is to: put a clean apple in fridge.' -> without '.')."""
    idx = intro.rfind(TASK_PREFIX)
    if idx < 0:
        raise ValueError(
            f"the intro has no '{TASK_PREFIX}' line; is this an ALFWorld game? intro: {intro[:200]!r}"
        )
    return intro[idx + len(TASK_PREFIX) :].strip().splitlines()[0].strip().rstrip(".")
