"""One session's environment: the OpenEnv `Environment` around a sdar TextEnv (`SdarEnvironment`), which keeps
the record of what each step returned, and `build_text_env`, which builds the TextEnv of a family or factory."""

from __future__ import annotations

import errno
import importlib
import logging
from typing import Any

# first, so that openenv is imported without its Gradio web UI (see openenv_models)
from sdar_envs.openenv_models import (
    SdarAction,
    SdarObservation,
    SdarState,
    family_metadata,
    observation_from_step,
)

# isort: split
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

from sdar_envs.base import TextEnv, make_env
from sdar_envs.server.errors import (
    ActionTooLongError,
    EpisodeStateError,
    ResetError,
    SessionGoneError,
    StepNotFoundError,
    UnknownTaskError,
)
from sdar_envs.server.limits import MAX_TASK_ID_CHARS

log = logging.getLogger("sdar_envs.server")


def build_text_env(family: str, env_kwargs: dict[str, Any] | None = None) -> TextEnv:
    """A registered family by name, or any TextEnv factory given as 'module:attr'."""
    kwargs = dict(env_kwargs or {})
    if ":" not in family:
        return make_env(family, **kwargs)
    module_name, _, attr = family.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load environment factory {family!r}: {exc}; give 'package.module:ClassName'") from exc
    env = factory(**kwargs)
    if not isinstance(env, TextEnv):
        raise TypeError(f"{family!r} built a {type(env).__name__}, not a sdar TextEnv")
    return env


# ---- the OpenEnv environment around a TextEnv -----------------------------------------------
class SdarEnvironment(Environment[SdarAction, SdarObservation, SdarState]):
    """One session's environment: a TextEnv plus the record of what each step returned."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session builds its own TextEnv; nothing is shared

    def __init__(self, family: str, env_kwargs: dict[str, Any] | None = None, max_action_chars: int = 4096):
        super().__init__()
        self.family = family
        self.max_action_chars = max_action_chars
        self.env = build_text_env(family, env_kwargs)
        self.session_id: str | None = None  # set by the server once the session exists
        self._records: list[SdarObservation] = []
        self._episode_id: str | None = None
        self._task: str | None = None
        self._task_id: str | None = None
        self._gone: str | None = None  # why the session can no longer be used

    # -- OpenEnv API ----------------------------------------------------------------------------
    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None, **kwargs: Any) -> SdarObservation:
        self._check_usable()
        if kwargs:
            raise ResetError(f"unknown reset parameter(s) {sorted(kwargs)}; reset accepts task_id, seed, episode_id")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ResetError(f"seed must be an integer, got {seed!r}")
        if task_id is not None and not isinstance(task_id, str):
            raise ResetError(f"task_id must be a string, got {type(task_id).__name__}")
        # a reset that fails leaves no episode behind: nothing to step in, no task in the state
        self._records, self._task_id, self._task, self._episode_id = [], None, None, None
        if task_id is not None and len(task_id) > MAX_TASK_ID_CHARS:
            raise UnknownTaskError(
                f"family {self.family!r} has no task id of {len(task_id)} characters (ids are at most {MAX_TASK_ID_CHARS}); "
                "list task ids with GET /tasks?split=train|test"
            )
        try:
            out = self.env.reset(task_id=task_id, seed=seed)
        except (LookupError, ValueError, FileNotFoundError, OSError) as exc:
            if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError) and exc.errno != errno.ENAMETOOLONG:
                raise  # the engine's own I/O failed: a server error, not the client's
            reason = exc.args[0] if exc.args else repr(exc)
            if isinstance(exc, OSError):
                reason = exc.strerror or reason
            if task_id is not None:
                raise UnknownTaskError(
                    f"family {self.family!r} has no task {task_id!r} ({reason}); list task ids with GET /tasks?split=train|test"
                ) from exc
            raise ResetError(f"reset(seed={seed!r}) refused by family {self.family!r}: {reason}") from exc
        md = out.metadata
        self._task_id = str(md.get("task_id", task_id)) if md.get("task_id", task_id) is not None else None
        self._task = md.get("task")
        if self._task is None:
            try:
                self._task = self.env.task_text
            except NotImplementedError:
                self._task = None
        self._episode_id = episode_id or f"{self.session_id}:{self._task_id}"
        obs = observation_from_step(
            out, step=0, session_id=self.session_id, family=self.family, task=self._task, task_id=self._task_id
        )
        self._records = [obs]
        return obs

    def step(self, action: SdarAction, timeout_s: float | None = None, **kwargs: Any) -> SdarObservation:
        self._check_usable()
        if not self._records:
            raise EpisodeStateError("step before reset: this session has no episode; send a reset first")
        if self._records[-1].done:
            raise EpisodeStateError(
                f"the episode on task {self._task_id!r} ended at step {len(self._records) - 1}; reset to start a new one"
            )
        message = action.message
        if len(message) > self.max_action_chars:
            raise ActionTooLongError(
                f"action has {len(message)} characters, over this server's limit of {self.max_action_chars}; "
                "send a shorter action or start the server with a larger --max-action-chars"
            )
        out = self.env.step(message)
        obs = observation_from_step(
            out, step=len(self._records), session_id=self.session_id, family=self.family, task=self._task, task_id=self._task_id
        )
        self._records.append(obs)
        return obs

    @property
    def state(self) -> SdarState:
        return SdarState(
            episode_id=self._episode_id,
            step_count=max(len(self._records) - 1, 0),
            session_id=self.session_id,
            family=self.family,
            task_id=self._task_id,
            task=self._task,
            done=bool(self._records and self._records[-1].done),
            observations=[r.text for r in self._records],
        )

    def observation_at(self, t: int) -> SdarObservation:
        """Exactly what reset (t = 0) or the t-th step returned."""
        if not self._records:
            raise StepNotFoundError("this session has no episode yet; reset first")
        if not 0 <= t < len(self._records):
            raise StepNotFoundError(f"step {t} does not exist; this episode has steps 0..{len(self._records) - 1}")
        return self._records[t]

    def get_metadata(self) -> EnvironmentMetadata:
        return family_metadata(self.family)

    def expire(self, reason: str) -> None:
        """Mark the session unusable (the reaper reclaimed it) before it is closed."""
        self._gone = reason

    def close(self) -> None:
        if self._gone is None:
            self._gone = "this session was closed; open a new session"
        try:
            self.env.close()
        except Exception as exc:  # a failing engine close must not take the server down
            log.warning("closing %s env failed: %s", self.family, exc)

    def _check_usable(self) -> None:
        if self._gone is not None:
            raise SessionGoneError(self._gone)
