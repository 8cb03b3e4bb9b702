"""The real ALFWorld engine (alfworld 0.4.2 + TextWorld) on official games: the game loader, the
engine, a process pool that pins sessions to workers, and the `AlfworldHousehold` backend."""

from __future__ import annotations

import atexit
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import random
import shutil
import tarfile
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdar_envs.base import EnvStep
from sdar_envs.household import wording as W
from sdar_envs.household.backend import TASK_TYPES, HouseholdBackend
from sdar_envs.household.pddl import EngineFacts, GoalSpec, domain_plan, parse_goal
from sdar_envs.household.progress import ProgressTracker

DATA_ENV_VAR = "SDAR_ALFWORLD_DATA"
GAME_FILE = "game.tw-pddl"
MAX_TASK_ID_CHARS = 1024  # the longest official id is ~130; longer ones are refused before any file lookup
LAYOUT_DIR = "json_2.1.1"
TASK_PREFIX = "Your task is to: "
# fallback error markers of a failed action (the sim's names, so hint templates fit both)
ERROR_KIND_INVALID = "invalid_action"
HINT_KEY_INVALID = "household/invalid_action"
# split aliases of the HouseholdBackend surface; real split directories always win
SPLIT_ALIASES = {"test": ("valid_seen",), "train": ("train", "valid_train")}

_MISSING_DATA_HELP = (
    f"set {DATA_ENV_VAR} (or pass data_dir=) to a directory holding the unpacked "
    f"'{LAYOUT_DIR}/<split>/<task>/<trial>/{GAME_FILE}' tree or a '{LAYOUT_DIR}*.tar.gz' tarball "
    "(`alfworld-download` fetches the official games; in this workspace they are in "
    "../shared/data/alfworld)"
)


# ---------------------------------------------------------------------------------------
# locating and listing the official games
# ---------------------------------------------------------------------------------------
def default_cache_dir() -> Path:
    """Where tarballs are unpacked once: <sdar cache root>/alfworld (sdar_envs.base.cache_root)."""
    from sdar_envs.base import cache_root

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
    from sdar_envs.household.catalog import OBJECT_TYPES

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


# ---------------------------------------------------------------------------------------
# the engine in this process
# ---------------------------------------------------------------------------------------
def forbid_network() -> None:
    """Make any outbound connection from this process fail loudly (engine workers call it).

    The engine plays games from local files only; a connection attempt would mean a library
    tried to fetch something, which must never happen silently on an air-gapped node.
    """
    import socket

    def _refuse(*args: Any, **kwargs: Any) -> None:
        raise ConnectionRefusedError("network access is disabled in ALFWorld engine processes")

    socket.socket.connect = _refuse  # type: ignore[method-assign]
    socket.socket.connect_ex = _refuse  # type: ignore[method-assign]
    socket.create_connection = _refuse  # type: ignore[assignment]


# TextWorld parses PDDL and derives its text with tatsu, whose parser contexts are not
# thread-safe: in-process engines driven from several threads at once (the rollout's env
# workers) corrupt each other's rule stack ("IndexError: pop from empty list"). In-process
# engines therefore take turns; the worker pool (one process per engine) runs in parallel.
_ENGINE_LOCK = threading.RLock()


def _make_pddl_env_class() -> type:
    """TextWorld's PddlEnv without the duplicate translation of the first reset after a load.

    PddlEnv.load already builds a fresh PDDL state; its reset rebuilds it (two more pddl2sas
    translations, half of a reset's 0.2-3 s). The state right after load is identical, so the
    first reset reuses it.
    """
    from textworld.envs.pddl.pddl import PddlEnv

    class _FreshPddlEnv(PddlEnv):
        _fresh = False

        def load(self, filename_or_data: Any) -> None:
            super().load(filename_or_data)
            self._fresh = True

        def reset(self) -> Any:
            if not self._fresh:
                return super().reset()
            self._fresh = False
            from textworld.core import GameState

            # mirrors PddlEnv.reset minus the state rebuild
            self.prev_state = None
            self.state = GameState()
            self._last_action = None
            self._moves = 0
            context = {
                "state": self._pddl_state,
                "facts": list(self._pddl_state.facts),
                "variables": {},
                "mapping": {},
                "entity_infos": self._entity_infos,
            }
            self.state.feedback = self._logic.grammar.derive("#intro#", context)
            self.state.raw = self.state.feedback
            self._gather_infos()
            return self.state

        def step(self, command: str) -> Any:
            self._fresh = False
            return super().step(command)

    return _FreshPddlEnv


def _make_demangler_class() -> type:
    """ALFWorld's AlfredDemangler (ids like 'Drawer_bar__plus_01...' -> 'drawer 3'), unshuffled."""
    import textworld
    from alfworld.agents.utils.misc import Demangler

    class _AlfredDemangler(textworld.core.Wrapper):
        def load(self, *args: Any, **kwargs: Any) -> None:
            super().load(*args, **kwargs)
            demangler = Demangler(game_infos=self._entity_infos, shuffle=False)
            for info in self._entity_infos.values():
                info.name = demangler.demangle_alfred_name(info.id)

    return _AlfredDemangler


@dataclass
class GoldEpisode:
    """One game played along the gold path.

    reset_s: load + reset seconds; plan_s: planning seconds; step_s: seconds in engine steps;
    planner: which planners produced the actions ("domain", "fd" or "domain+fd").
    """

    task_id: str
    task_type: str
    won: bool
    steps: int
    reset_s: float
    plan_s: float
    step_s: float
    episode_s: float
    actions: list[str] = field(default_factory=list)
    error: str | None = None
    planner: str = "auto"


class AlfworldEngine:
    """One ALFWorld game at a time, in this process (the unit a pool worker hosts).

    root: the json_2.1.1 directory; task ids are paths relative to it. A game file path
    outside it (e.g. a generated fidelity game) is accepted as an absolute path.
    max_steps: episode length after which `done` is forced (None: the engine never ends a
    lost episode; ALFWorld's own evaluation uses 50).
    planner: "auto" (default) takes the domain recipe (`domain_plan`, milliseconds) and checks
        every step, falling back to fast-downward; "fd" always asks fast-downward (optimal
        plans, but 0.01 s to several minutes per game on the official kitchens).
    """

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        max_steps: int | None = None,
        planner: str = "auto",
    ) -> None:
        import textworld

        if planner not in ("auto", "fd"):
            raise ValueError(
                f"unknown planner {planner!r}; choose 'auto' (recipe, fast-downward fallback) or 'fd'"
            )
        self.root = Path(root) if root is not None else None
        self.max_steps = max_steps
        self.planner = planner
        self._goal: GoalSpec | None = None
        self._progress: ProgressTracker | None = None
        self._plan_source = planner
        self.plan_s = 0.0
        self.fd_calls = 0
        infos = textworld.EnvInfos(won=True, admissible_commands=True)
        env = _make_pddl_env_class()(infos)
        self._env = _make_demangler_class()(env)
        self._loaded: str | None = None
        self._state: Any = None
        self._plan: list[str] | None = None
        self.task_id: str | None = None
        self.task_type: str | None = None
        self.task_text: str | None = None
        self.steps = 0
        self._done = False

    def game_path(self, task_id: str) -> Path:
        """The game file of `task_id`: relative to `root`, or absolute when the engine has no root.

        With a root, ids must stay inside it (an env server passes client-chosen ids here).
        """
        path = Path(task_id)
        if self.root is not None:
            resolved = (self.root / path).resolve()
            if path.is_absolute() or not resolved.is_relative_to(self.root.resolve()):
                raise ValueError(
                    f"task id {task_id!r} is not a game path inside {self.root}; use an id from task_ids(split)"
                )
            path = resolved
        elif not path.is_absolute():
            raise ValueError(
                f"task id {task_id!r} is relative but this engine has no data root; pass root="
            )
        try:
            found = path.is_file()
        except OSError:  # e.g. a name too long for the file system
            found = False
        if not found:
            raise FileNotFoundError(
                f"no ALFWorld game at {str(path)[:300]}; task ids come from task_ids(split)"
            )
        return path

    def reset(self, task_id: str) -> EnvStep:
        path = self.game_path(task_id)
        # a reload re-parses the domain and grammar; replaying the same game reuses them
        if self._loaded != str(path):
            self._env.load(str(path))
            self._loaded = str(path)
            try:
                self._goal = parse_goal(self._env.unwrapped._game_data["pddl_problem"])
            except ValueError:
                self._goal = None  # an unusual goal: fast-downward alone plans for it
        self._state = self._env.reset()
        self._plan = None
        self._done = False
        self.steps = 0
        self.task_id = task_id
        self.task_type = task_type_of(task_id)
        intro = self._state.feedback
        self.task_text = parse_task_text(intro)
        self._progress = ProgressTracker(self.task_text)
        meta = self._metadata(valid=True)
        meta["task"] = self.task_text
        meta["task_id"] = task_id
        if self.max_steps is not None:
            meta["max_steps"] = self.max_steps
        return EnvStep(observation=intro, reward=0.0, done=False, metadata=meta)

    def step(self, action: str) -> EnvStep:
        if self._state is None:
            raise RuntimeError("step() before reset(); call reset(task_id) first")
        if not isinstance(action, str):
            raise TypeError(
                f"action must be a string such as 'go to fridge 1', not {type(action).__name__}"
            )
        if self._done:
            error = ("episode_over", "household/episode_over", {})
            return EnvStep(self._state.feedback, 0.0, True, self._metadata(False, error))
        # the sim's normal form (case, spaces): the engine itself matches exact strings only
        command = W.normalize(action)
        valid = command in self._state["admissible_commands"]
        error = self._no_progress(command) if valid else self.diagnose(command)
        self._state, _, _ = self._env.step(command)
        self.steps += 1
        # the gold plan stays valid while the agent follows it (the engine is deterministic)
        if self._plan is not None:
            if valid and self._plan and self._plan[0] == command:
                self._plan.pop(0)
            elif valid:
                self._plan = None
        won = bool(self._state["won"])
        self._done = won or (self.max_steps is not None and self.steps >= self.max_steps)
        reward = 1.0 if won else 0.0
        return EnvStep(self._state.feedback, reward, self._done, self._metadata(valid, error))

    def _metadata(
        self, valid: bool, error: tuple[str, str, dict[str, str]] | None = None
    ) -> dict[str, Any]:
        return {
            "won": bool(self._state["won"]),
            "admissible_actions": list(self._state["admissible_commands"]),
            "task_type": self.task_type,
            "valid_action": valid,
            "error_kind": error[0] if error else None,
            "hint_template_key": error[1] if error else None,
            "error_args": error[2] if error else None,
            "steps": self.steps,
        }

    def diagnose(self, command: str) -> tuple[str, str, dict[str, str]]:
        """Why `command` is not admissible: (error_kind, hint_template_key, hint args).

        Reads the engine's PDDL facts into the view the sim's `diagnose` takes, so the error
        kinds and hint keys are the same on both backends.
        """
        from sdar_envs.household.sim import diagnose

        try:
            return diagnose(EngineFacts(self._env.unwrapped), command)
        except Exception:  # noqa: BLE001 - a diagnosis must never break a step: use the generic marker
            return ERROR_KIND_INVALID, HINT_KEY_INVALID, {"action": command}

    def _no_progress(self, command: str) -> tuple[str, str, dict[str, str]] | None:
        """The no-progress marker of accepted `command` (the sim's `ProgressTracker` on the
        engine's facts before the step), or None."""
        if self._progress is None:
            return None
        try:
            return self._progress.check(EngineFacts(self._env.unwrapped), command)
        except Exception:  # noqa: BLE001 - a marker must never break a step: leave it unmarked
            return None

    def plan(self) -> list[str]:
        """The remaining gold path from the current state (see `planner`)."""
        if self._state is None:
            raise RuntimeError("plan() before reset(); call reset(task_id) first")
        if self._plan is None:
            self._plan, self._plan_source = self._make_plan(use_fd=self.planner == "fd")
        return list(self._plan)

    def _make_plan(self, use_fd: bool) -> tuple[list[str], str]:
        inner = self._env.unwrapped
        t0 = time.perf_counter()
        try:
            if not use_fd and self._goal is not None:
                recipe = domain_plan(EngineFacts(inner), self._goal)
                if recipe:
                    return recipe, "domain"
            self.fd_calls += 1
            return list(inner._pddl_state.replan(inner._entity_infos)), "fd"
        finally:
            self.plan_s += time.perf_counter() - t0

    def expert_action(self) -> str:
        """The next gold action; falls back to fast-downward when the recipe's step is not admissible."""
        if self._state is None:
            raise RuntimeError("expert_action() before reset(); call reset(task_id) first")
        if self._state["won"]:
            raise RuntimeError(f"the game {self.task_id} is already won; reset() to start another")
        admissible = self._state["admissible_commands"]
        plan = self.plan()
        if plan and plan[0] in admissible:
            return plan[0]
        if self._plan_source != "fd":
            # the recipe met something it does not model (or ended without a win): ask the planner
            self._plan, self._plan_source = self._make_plan(use_fd=True)
            if self._plan and self._plan[0] in admissible:
                return self._plan[0]
        raise RuntimeError(
            f"the planner found no plan to the goal of {self.task_id} from the current state"
        )

    def admissible_actions(self) -> list[str]:
        return list(self._state["admissible_commands"]) if self._state is not None else []

    def goal_object_type(self) -> str | None:
        """The goal's object type in the catalog's names ("apple"); None for an unusual goal."""
        return catalog_object_type(self._goal.object_type) if self._goal is not None else None

    def gold_episode(self, task_id: str, max_steps: int = 50) -> GoldEpisode:
        """Play `task_id` along the gold path; timings split into reset, planning and steps."""
        t0 = time.perf_counter()
        actions: list[str] = []
        reset_s = step_s = 0.0
        won, error = False, None
        self.plan_s, self.fd_calls = 0.0, 0
        sources: set[str] = set()
        try:
            self.reset(task_id)
            reset_s = time.perf_counter() - t0
            while not self._state["won"] and len(actions) < max_steps:
                action = self.expert_action()
                sources.add(self._plan_source)
                ts = time.perf_counter()
                self.step(action)
                step_s += time.perf_counter() - ts
                actions.append(action)
            won = bool(self._state["won"])
        except Exception as exc:  # noqa: BLE001 - a broken game is a data point, not a crash
            error = f"{type(exc).__name__}: {exc}"
        return GoldEpisode(
            task_id=task_id,
            task_type=task_type_of(task_id),
            won=won,
            steps=len(actions),
            reset_s=reset_s,
            plan_s=self.plan_s,
            step_s=step_s,
            episode_s=time.perf_counter() - t0,
            actions=actions,
            error=error,
            planner="+".join(sorted(sources)) or self.planner,
        )

    def close(self) -> None:
        self._state = None
        self._plan = None


# ---------------------------------------------------------------------------------------
# worker processes
# ---------------------------------------------------------------------------------------
def _import_function(target: str) -> Callable[..., Any]:
    import importlib

    module, _, attr = target.partition(":")
    if not module or not attr:
        raise ValueError(f"expected 'module:function', got {target!r}")
    return getattr(importlib.import_module(module), attr)


def _worker_main(conn: Any, root: str | None, no_network: bool) -> None:
    """Serve engine sessions over `conn`: (request id, session id, method, args) -> result."""
    if no_network:
        forbid_network()
    sessions: dict[int, AlfworldEngine] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        rid, sid, method, args = msg
        try:
            if method == "open":
                sessions[sid] = AlfworldEngine(root, max_steps=args[0], planner=args[1])
                result: Any = sid
            elif method == "close":
                engine = sessions.pop(sid, None)
                if engine is not None:
                    engine.close()
                result = None
            elif method == "ping":
                result = os.getpid()
            elif method == "call_with_engine":
                # ("module:function", *args): run a whole job next to the engine, one round trip
                if sid not in sessions:
                    raise KeyError(f"session {sid} is not open in this worker")
                result = _import_function(args[0])(sessions[sid], *args[1:])
            else:
                if sid not in sessions:
                    raise KeyError(f"session {sid} is not open in this worker")
                result = getattr(sessions[sid], method)(*args)
            reply = (rid, True, result)
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller
            reply = (rid, False, (type(exc).__name__, str(exc), traceback.format_exc()))
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            break


class AlfworldWorkerError(RuntimeError):
    """An engine call failed inside a worker process (the message carries its traceback)."""


class _Worker:
    def __init__(self, index: int, ctx: Any, root: str | None, no_network: bool) -> None:
        self.index = index
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_worker_main,
            args=(child, root, no_network),
            name=f"alfworld-worker-{index}",
            daemon=True,
        )
        self.proc.start()
        child.close()
        self.conn = parent
        self.send_lock = threading.Lock()
        self.pending: dict[int, Future] = {}
        self.sessions: set[int] = set()
        self.dead: str | None = None
        # guards `pending` and `dead` between callers and the reader thread
        self.state_lock = threading.Lock()
        self.reader = threading.Thread(
            target=self._read, name=f"alfworld-reader-{index}", daemon=True
        )
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                rid, ok, payload = self.conn.recv()
            except (EOFError, OSError):
                self.proc.join(timeout=1.0)
                with self.state_lock:
                    self.dead = f"ALFWorld worker {self.index} (pid {self.proc.pid}) exited with code {self.proc.exitcode}"
                    lost = list(self.pending.values())
                    self.pending.clear()
                for fut in lost:
                    if not fut.done():
                        fut.set_exception(
                            AlfworldWorkerError(
                                self.dead + "; the sessions it held are lost, open new ones"
                            )
                        )
                return
            with self.state_lock:
                fut = self.pending.pop(rid, None)
            if fut is None or fut.done():
                continue
            if ok:
                fut.set_result(payload)
            else:
                name, message, tb = payload
                fut.set_exception(
                    AlfworldWorkerError(
                        f"{name}: {message} (in ALFWorld worker {self.index})\n{tb}"
                    )
                )

    def submit(self, rid: int, sid: int, method: str, args: tuple) -> Future:
        fut: Future = Future()
        with self.state_lock:
            if self.dead:
                fut.set_exception(AlfworldWorkerError(self.dead))
                return fut
            self.pending[rid] = fut
        with self.send_lock:
            try:
                self.conn.send((rid, sid, method, args))
            except (BrokenPipeError, OSError) as exc:
                with self.state_lock:
                    self.pending.pop(rid, None)
                if not fut.done():
                    fut.set_exception(
                        AlfworldWorkerError(f"ALFWorld worker {self.index} is gone ({exc})")
                    )
        return fut

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(timeout=5.0)
        self.conn.close()

    def stop(self, timeout: float = 5.0) -> None:
        with self.send_lock:
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self.proc.join(timeout=timeout)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=timeout)
        self.conn.close()


class AlfworldPool:
    """ALFWorld engines spread over worker processes; each session is pinned to one worker.

    workers: number of processes (each hosts any number of sessions, one game each).
    root: the json_2.1.1 directory (None: only absolute game paths work).
    call_timeout: seconds a single engine call may take before `call` gives up (fast-downward
        needs minutes on the hardest official kitchens; a stuck worker should not hang a run).
    no_network: workers refuse outbound connections (see `forbid_network`).
    start_method: multiprocessing start method; "spawn" is safe with threads in the parent.
    """

    def __init__(
        self,
        workers: int = 2,
        root: str | os.PathLike | None = None,
        call_timeout: float = 600.0,
        no_network: bool = True,
        start_method: str = "spawn",
    ) -> None:
        if workers < 1:
            raise ValueError(f"an ALFWorld pool needs workers >= 1, got {workers}")
        self._ctx = mp.get_context(start_method)
        self._no_network = no_network
        self.root = str(root) if root is not None else None
        self.call_timeout = call_timeout
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._owner: dict[int, _Worker] = {}
        self._workers = [_Worker(i, self._ctx, self.root, no_network) for i in range(workers)]
        self._closed = False

    @property
    def workers(self) -> int:
        return len(self._workers)

    def worker_pids(self) -> list[int | None]:
        return [w.proc.pid for w in self._workers]

    def open_session(
        self, max_steps: int | None = None, worker: int | None = None, planner: str = "auto"
    ) -> int:
        """A new engine session on the least-loaded live worker (or on `worker`); returns its id.

        max_steps, planner: the session engine's settings (see `AlfworldEngine`).
        """
        if planner not in ("auto", "fd"):
            raise ValueError(f"unknown planner {planner!r}; choose 'auto' or 'fd'")
        self._check_open()
        with self._lock:
            live = [w for w in self._workers if not w.dead]
            if not live:
                raise AlfworldWorkerError(
                    "every ALFWorld worker has died; close this pool and start a new one"
                )
            target = (
                self._workers[worker]
                if worker is not None
                else min(live, key=lambda w: len(w.sessions))
            )
            sid = next(self._ids)
            target.sessions.add(sid)
            self._owner[sid] = target
        self._result(
            target.submit(next(self._ids), sid, "open", (max_steps, planner)), self.call_timeout
        )
        return sid

    def worker_of(self, session: int) -> int:
        return self._session_worker(session).index

    def submit(self, session: int, method: str, *args: Any) -> Future:
        """Call `method(*args)` of the session's engine without waiting; returns a Future."""
        self._check_open()
        return self._session_worker(session).submit(next(self._ids), session, method, args)

    def call(self, session: int, method: str, *args: Any, timeout: float | None = None) -> Any:
        """Call `method(*args)` of the session's engine and wait for the result."""
        return self._result(self.submit(session, method, *args), timeout or self.call_timeout)

    def close_session(self, session: int) -> None:
        with self._lock:
            worker = self._owner.pop(session, None)
        if worker is None:
            return
        worker.sessions.discard(session)
        if not worker.dead and not self._closed:
            # fire and forget: a busy worker frees the engine after its current call
            worker.submit(next(self._ids), session, "close", ())

    def imap_unordered(
        self,
        method: str,
        args_list: Iterable[tuple],
        max_steps: int | None = None,
        job_timeout: float | None = None,
        on_timeout: Callable[[tuple, float], Any] | None = None,
        planner: str = "auto",
    ) -> Iterator[Any]:
        """Run `method(*args)` for every args tuple, one in flight per worker, yielding as done.

        Jobs go to whichever worker frees up first, so slow games (long plans) do not queue
        behind each other. Each worker gets one dedicated session for the whole map.
        job_timeout: a job running longer is abandoned: its worker process is killed and
            replaced, and `on_timeout(args, seconds)` is yielded in its place (without
            `on_timeout`, TimeoutError is raised). Default: `call_timeout`.
        """
        self._check_open()
        limit = job_timeout if job_timeout is not None else self.call_timeout
        todo = list(args_list)
        sessions = {
            w.index: self.open_session(max_steps=max_steps, worker=w.index, planner=planner)
            for w in self._workers
            if not w.dead
        }
        inflight: dict[
            Future, tuple[int, tuple, float]
        ] = {}  # future -> (worker index, args, start)

        def launch(index: int) -> None:
            if todo:
                args = todo.pop(0)
                inflight[self.submit(sessions[index], method, *args)] = (
                    index,
                    args,
                    time.monotonic(),
                )

        try:
            for index in list(sessions):
                launch(index)
            while inflight:
                now = time.monotonic()
                next_deadline = min(start + limit for _, _, start in inflight.values())
                done, _ = wait(
                    list(inflight),
                    timeout=max(next_deadline - now, 0.0),
                    return_when=FIRST_COMPLETED,
                )
                for fut in done:
                    index, _, _ = inflight.pop(fut)
                    result = fut.result()
                    launch(index)
                    yield result
                now = time.monotonic()
                for fut, (index, args, start) in list(inflight.items()):
                    if fut.done() or now - start < limit:
                        continue
                    inflight.pop(fut)
                    if on_timeout is None:
                        raise TimeoutError(
                            f"an ALFWorld job ran longer than {limit} s ({method}{args}); raise job_timeout"
                        )
                    self._replace_worker(index)
                    sessions[index] = self.open_session(
                        max_steps=max_steps, worker=index, planner=planner
                    )
                    launch(index)
                    yield on_timeout(args, now - start)
        finally:
            for fut in inflight:
                fut.cancel()
            for sid in sessions.values():
                self.close_session(sid)

    def gold_episodes(
        self,
        task_ids: list[str],
        max_steps: int = 50,
        progress: Callable[[GoldEpisode], None] | None = None,
        job_timeout: float | None = None,
        planner: str = "auto",
    ) -> list[GoldEpisode]:
        """Play every task along the gold path, spread over the workers (results in input order).

        A game whose episode outlasts `job_timeout` (default `call_timeout`) counts as not won,
        with the timeout as its error, and its worker is replaced.
        """

        def timed_out(args: tuple, seconds: float) -> GoldEpisode:
            task_id = args[0]
            return GoldEpisode(
                task_id,
                task_type_of(task_id),
                False,
                0,
                0.0,
                0.0,
                0.0,
                seconds,
                error=f"timeout after {seconds:.0f} s",
            )

        by_id: dict[str, GoldEpisode] = {}
        jobs = [(t, max_steps) for t in task_ids]
        for episode in self.imap_unordered(
            "gold_episode", jobs, job_timeout=job_timeout, on_timeout=timed_out, planner=planner
        ):
            by_id[episode.task_id] = episode
            if progress is not None:
                progress(episode)
        return [by_id[t] for t in task_ids]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            worker.stop()

    def __enter__(self) -> AlfworldPool:  # noqa: PYI034 - Self needs python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- helpers ----------------------------------------------------------------------
    def _replace_worker(self, index: int) -> None:
        """Kill worker `index` (e.g. stuck in a planner search) and start a fresh one in its place."""
        old = self._workers[index]
        old.kill()
        with self._lock:
            self._workers[index] = _Worker(index, self._ctx, self.root, self._no_network)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this AlfworldPool is closed; create a new one")

    def _session_worker(self, session: int) -> _Worker:
        worker = self._owner.get(session)
        if worker is None:
            raise KeyError(
                f"ALFWorld session {session} is not open in this pool (closed, or from another pool)"
            )
        return worker

    @staticmethod
    def _result(fut: Future, timeout: float) -> Any:
        try:
            return fut.result(timeout=timeout)
        except TimeoutError as exc:
            raise TimeoutError(
                f"an ALFWorld engine call took longer than {timeout} s; raise call_timeout if the planner needs more"
            ) from exc


_SHARED_POOLS: dict[tuple[str | None, int], AlfworldPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(workers: int, root: str | os.PathLike | None) -> AlfworldPool:
    """The process-wide pool for (root, workers), started on first use.

    Many `AlfworldHousehold(workers=k)` in one process (e.g. an env server with one env per
    rollout) share these k engine processes instead of each starting its own.
    """
    key = (str(root) if root is not None else None, workers)
    with _SHARED_LOCK:
        pool = _SHARED_POOLS.get(key)
        if pool is None or pool._closed:
            pool = AlfworldPool(workers=workers, root=root)
            _SHARED_POOLS[key] = pool
        return pool


@atexit.register
def _close_shared_pools() -> None:
    for pool in list(_SHARED_POOLS.values()):
        pool.close()
    _SHARED_POOLS.clear()


# ---------------------------------------------------------------------------------------
# the HouseholdBackend
# ---------------------------------------------------------------------------------------
class AlfworldHousehold(HouseholdBackend):
    """The real ALFWorld engine behind `HouseholdEnv(backend="alfworld")`.

    data_dir: json_2.1.1 tree or tarball (see `resolve_data_root`); None reads $SDAR_ALFWORLD_DATA.
    split: the split `reset()` without a task id draws from ("valid_seen" = the paper's evaluation
        set; "test" and "train" are aliases, see `resolve_split`). Resolved on that first draw, so a
        data tree without it still plays the task ids of the splits it has.
    workers: 1 runs the engine in this process; k > 1 pins this backend's session to one of
        k shared worker processes (`shared_pool`), so many envs in one process run in parallel.
    max_steps: force `done` after this many actions (ALFWorld's evaluation and the paper use
        50, as does the sim; None: only a win ends an episode).
    cache_dir: where a tarball is unpacked (default $SDAR_CACHE_DIR/alfworld or ~/.cache/sdar/alfworld).
    pool: an explicit `AlfworldPool` to use instead of the shared one.
    planner: how `expert_action` plans ("auto": domain recipe checked step by step with a
        fast-downward fallback; "fd": fast-downward only, optimal but up to minutes per game).
    """

    name = "alfworld"

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        split: str = "valid_seen",
        workers: int = 1,
        max_steps: int | None = 50,
        cache_dir: str | os.PathLike | None = None,
        pool: AlfworldPool | None = None,
        planner: str = "auto",
    ) -> None:
        self.root = resolve_data_root(data_dir, cache_dir)
        self._split = split
        self.max_steps = max_steps
        self._pool: AlfworldPool | None = None
        self._session: int | None = None
        self._engine: AlfworldEngine | None = None
        if pool is not None or workers > 1:
            self._pool = pool if pool is not None else shared_pool(workers, self.root)
            self._session = self._pool.open_session(max_steps=max_steps, planner=planner)
        else:
            self._engine = AlfworldEngine(self.root, max_steps=max_steps, planner=planner)
        self._next = 0
        self._task_text: str | None = None
        self._task_type: str | None = None
        self._goal_object: str | None = None

    @property
    def split(self) -> str:
        """The split directory `reset()` without a task id draws from (an error naming the splits
        present when the data tree lacks it)."""
        return resolve_split(self.root, self._split)

    def _call(self, method: str, *args: Any) -> Any:
        if self._engine is not None:
            with _ENGINE_LOCK:
                return getattr(self._engine, method)(*args)
        if self._pool is None or self._session is None:
            raise RuntimeError("this ALFWorld backend is closed; create a new one")
        return self._pool.call(self._session, method, *args)

    def task_ids(self, split: str = "test") -> list[str]:
        return list_games(self.root, split)

    def reset(self, task_id: str | None = None, seed: int | None = None) -> EnvStep:
        if task_id is None:
            games = list_games(self.root, self.split)
            if seed is not None:
                task_id = random.Random(seed).choice(games)
            else:
                # no seed: walk the split in order, so repeated resets cover every game
                task_id = games[self._next % len(games)]
                self._next += 1
        else:
            self._check_game(task_id)
        out = self._call("reset", task_id)
        self._task_text = out.metadata["task"]
        self._task_type = out.metadata["task_type"]
        self._goal_object = self._call("goal_object_type")
        return out

    def _check_game(self, task_id: str) -> None:
        """A KeyError (an unknown task: the env server's 404) unless `task_id` names a game file
        under the data root; checked here, before an engine (maybe in a worker) sees it."""
        if not isinstance(task_id, str) or not task_id or len(task_id) > MAX_TASK_ID_CHARS or "\0" in task_id:
            shown = task_id[:80] + "..." if isinstance(task_id, str) and len(task_id) > 80 else task_id
            raise KeyError(
                f"no ALFWorld game {shown!r}: a task id is a game path from task_ids(split), "
                f"at most {MAX_TASK_ID_CHARS} characters"
            )
        path = self.root / task_id
        try:
            inside = path.resolve().is_relative_to(self.root.resolve()) and not Path(task_id).is_absolute()
            found = inside and path.is_file()
        except (OSError, ValueError, RuntimeError):  # too long a name, a symlink loop
            found = False
        if not found:
            shown = task_id if len(task_id) <= 200 else task_id[:200] + "..."
            raise KeyError(f"no ALFWorld game {shown!r} under the data root; task ids come from task_ids(split)")

    def goal_object_type(self) -> str | None:
        return self._goal_object

    def step(self, action: str) -> EnvStep:
        if self._task_type is None:
            raise RuntimeError("step() before reset(); call reset() first")
        return self._call("step", action)

    @property
    def task_text(self) -> str:
        if self._task_text is None:
            raise RuntimeError("no episode yet; call reset() first")
        return self._task_text

    @property
    def task_type(self) -> str:
        if self._task_type is None:
            raise RuntimeError("no episode yet; call reset() first")
        return self._task_type

    def expert_action(self) -> str:
        return self._call("expert_action")

    def plan(self) -> list[str]:
        """The full remaining gold path from the current state."""
        return self._call("plan")

    def close(self) -> None:
        if self._pool is not None and self._session is not None:
            self._pool.close_session(self._session)
            self._session = None
        if self._engine is not None:
            self._engine.close()
            self._engine = None


def gold_path_eval(
    data_dir: str | os.PathLike | None = None,
    split: str = "valid_seen",
    workers: int = 2,
    limit: int | None = None,
    max_steps: int = 50,
    progress: Callable[[GoldEpisode], None] | None = None,
    planner: str = "auto",
    job_timeout: float = 900.0,
) -> tuple[list[GoldEpisode], float]:
    """Play every game of `split` (first `limit`) along the gold path over `workers`.

    Returns the episodes and the wall-clock seconds; the win rate is the fraction won. With
    workers > 1 a game running past `job_timeout` seconds counts as lost (its worker is
    replaced); in-process (workers=1) there is no timeout.
    """
    root = resolve_data_root(data_dir)
    games = list_games(root, split)[:limit]
    t0 = time.perf_counter()
    if workers <= 1:
        engine = AlfworldEngine(root, planner=planner)
        episodes = []
        for task_id in games:
            episode = engine.gold_episode(task_id, max_steps)
            episodes.append(episode)
            if progress is not None:
                progress(episode)
    else:
        with AlfworldPool(workers=workers, root=root) as pool:
            episodes = pool.gold_episodes(
                games,
                max_steps=max_steps,
                progress=progress,
                job_timeout=job_timeout,
                planner=planner,
            )
    return episodes, time.perf_counter() - t0
