"""The real ALFWorld engine (alfworld 0.4.2 + TextWorld) in this process: one game at a time,
its steps in the household protocol, the gold path, and no network."""

from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdar_envs.base import EnvStep
from sdar_envs.household import wording as W
from sdar_envs.household.alfworld_data import catalog_object_type, parse_task_text, task_type_of
from sdar_envs.household.engine_plan import EngineFacts, GoalSpec, domain_plan, parse_goal
from sdar_envs.household.progress import ProgressTracker
from sdar_envs.household.sim_game import diagnose

# fallback error markers of a failed action (the sim's names, so hint templates fit both)
ERROR_KIND_INVALID = "invalid_action"
HINT_KEY_INVALID = "household/invalid_action"


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
ENGINE_LOCK = threading.RLock()


class _DownwardLibraries:
    """fast-downward's shared library, one loaded copy per live engine, recycled on close.

    TextWorld's PddlEnv loads its own copy of libdownward.so (34 MB) in every constructor:
    `fast_downward.load_lib` copies the file into a temporary directory, dlopens it and deletes
    the directory, so each copy holds its disk blocks (deleted, still mapped) until the process
    exits. The library keeps the loaded task in globals, hence a copy per engine; but an
    engine that has closed no longer needs its copy, and the next engine's `load` re-sends its
    own task (`load_sas` in PddlState), so a closed engine's copy serves the next one. Without
    this, a process that makes one engine per episode (an evaluation) held ~9.5 GB of deleted
    files per 280 episodes and ran the disk full.
    """

    def __init__(self) -> None:
        self._free: list[Any] = []
        self._lock = threading.Lock()
        self.loaded = 0  # copies this process has loaded (the disk they hold: 34 MB each)

    def acquire(self) -> Any:
        with self._lock:
            if self._free:
                return self._free.pop()
            self.loaded += 1
        import fast_downward

        return fast_downward.load_lib()

    def release(self, lib: Any) -> None:
        with self._lock:
            self._free.append(lib)


DOWNWARD_LIBS = _DownwardLibraries()


def _make_pddl_env_class() -> type:
    """TextWorld's PddlEnv without the duplicate translation of the first reset after a load.

    PddlEnv.load already builds a fresh PDDL state; its reset rebuilds it (two more pddl2sas
    translations, half of a reset's 0.2-3 s). The state right after load is identical, so the
    first reset reuses it.
    """
    import textworld
    from textworld.envs.pddl.pddl import PddlEnv

    class _FreshPddlEnv(PddlEnv):
        _fresh = False

        def __init__(self, infos: Any = None) -> None:
            # PddlEnv.__init__ minus its own fast_downward.load_lib(): the copy comes from the
            # process's recycled ones and goes back when the engine closes
            textworld.core.Environment.__init__(self, infos)
            self.downward_lib = DOWNWARD_LIBS.acquire()

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
        # the library copy goes back on close(), or when an unclosed engine is collected
        self._library = weakref.finalize(self, DOWNWARD_LIBS.release, env.downward_lib)
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
        if not self._library.alive:
            raise RuntimeError("this AlfworldEngine is closed; create a new one")
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
        if self._library.alive:
            # after this the copy may serve another engine: this one must not touch it again
            pddl = self._env.unwrapped
            pddl.downward_lib = None
            if getattr(pddl, "_pddl_state", None) is not None:
                pddl._pddl_state.downward_lib = None
            self._loaded = None
            self._library()
