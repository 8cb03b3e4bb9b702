"""The wire models of sdar's environment servers: OpenEnv Action/Observation/State subclasses.

Built on `openenv` 0.10 (openenv/core/env_server/types.py), the successor of `openenv-core`; what we rely on
of it is pinned by tests/envs/test_openenv_contract.py. Step metadata travels as typed observation fields
(published in /schema, so a schema-checking client such as OpenEnv's runtime validator checks them), not in
the untyped `Observation.metadata`, which stays empty; the conversions to and from `EnvStep` live here,
shared by server and client.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _import_openenv_core() -> None:
    """Import openenv.core without its Gradio web UI, which its package init loads eagerly.

    That UI is most of a server's start-up (about 2 s of CPU of 3); sdar never serves it. A None
    entry in sys.modules makes that one import fail softly (openenv guards it), and is removed
    right after, so an explicit import of the UI later still works.
    """
    web_ui = "openenv.core.env_server.web_interface"
    wanted = os.getenv("ENABLE_WEB_INTERFACE", "").lower() in ("true", "1", "yes")
    if "openenv.core" in sys.modules or wanted or web_ui in sys.modules:
        return
    sys.modules[web_ui] = None  # type: ignore[assignment]
    try:
        import openenv.core  # noqa: F401
    finally:
        if sys.modules.get(web_ui, 0) is None:
            del sys.modules[web_ui]


_import_openenv_core()

from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, ResetRequest, State  # noqa: E402
from pydantic import BaseModel, ConfigDict, Field  # noqa: E402

from sdar_envs import __version__  # noqa: E402
from sdar_envs.base import METADATA_KEYS, EnvStep  # noqa: E402

# metadata keys that get their own observation field; any other key a family adds rides in `extra`
_FIELD_KEYS = (*METADATA_KEYS, "task", "task_id")
# keys the server adds to every observation (not part of a family's metadata)
_SERVER_KEYS = ("step", "session_id", "family")


class SdarAction(Action):
    """One agent action: the text the agent sends to the environment."""

    message: str = Field(..., description="the action text, e.g. 'go to fridge 1' or 'search[red shoes]'")


class SdarResetRequest(ResetRequest):
    """Start an episode: the body of POST /sessions/{id}/reset and the data of a WebSocket reset message.

    OpenEnv's ResetRequest (seed >= 0, episode_id of at most 255 characters) with the task to play, no other
    key, and no type coerced: a seed is a JSON integer, ids are JSON strings."""

    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra={"examples": [{"task_id": "test-0"}, {"seed": 7}, {}]}
    )

    task_id: str | None = Field(None, description="the task to play (ids: GET /tasks?split=); none: one drawn from seed")


class SdarStepRequest(BaseModel):
    """Act: the body of POST /sessions/{id}/step."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"action": {"message": "look"}}]})

    action: SdarAction = Field(..., description="the agent's action")


class SdarObservation(Observation):
    """What the agent sees after reset or step, with every step-metadata key as a field.

    `done` and `reward` come from OpenEnv's base class; `step` counts actions taken so far
    (0 after reset), so a client can check that it receives its own session's next step.
    """

    text: str = Field("", description="the observation text the agent sees")
    won: bool = Field(False, description="the task is solved")
    admissible_actions: list[str] = Field(default_factory=list, description="valid actions now ([] if the family has none)")
    task_type: str = Field("", description="task type of this episode, e.g. 'pick_and_place'")
    valid_action: bool = Field(True, description="the environment accepted the last action")
    error_kind: str | None = Field(
        None, description="why the last action was refused, or (accepted) made no progress; None elsewhere"
    )
    hint_template_key: str | None = Field(None, description="hint template of the error site (with error_kind)")
    task: str | None = Field(None, description="the goal of this episode in words")
    task_id: str | None = Field(None, description="id of the task being played")
    step: int = Field(0, ge=0, description="actions taken so far in this episode (0 after reset)")
    session_id: str | None = Field(None, description="server session id; GET /sessions/{id}/state?t= reads step t back")
    family: str = Field("", description="the environment family serving this session")
    extra: dict[str, Any] = Field(default_factory=dict, description="family-specific metadata beyond the standard keys")


class SdarState(State):
    """The session's state: ids, progress, and the observation text of every step so far."""

    session_id: str | None = Field(None, description="server session id")
    family: str = Field("", description="the environment family")
    task_id: str | None = Field(None, description="id of the task being played")
    task: str | None = Field(None, description="the goal of this episode in words")
    done: bool = Field(False, description="the episode has ended")
    observations: list[str] = Field(default_factory=list, description="observation text of steps 0..step_count")


def _jsonable(value: Any) -> Any:
    """`value` if JSON can carry it, else its string form (families may put objects in metadata)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def observation_from_step(
    out: EnvStep, *, step: int, session_id: str | None, family: str, task: str | None, task_id: str | None
) -> SdarObservation:
    """The wire observation of one `EnvStep`; `task`/`task_id` come from the episode's reset."""
    md = out.metadata
    extra = {k: _jsonable(v) for k, v in md.items() if k not in _FIELD_KEYS}
    return SdarObservation(
        text=out.observation,
        reward=float(out.reward),
        done=bool(out.done),
        won=bool(md["won"]),
        admissible_actions=[str(a) for a in (md["admissible_actions"] or [])],
        task_type=str(md["task_type"] or ""),
        valid_action=bool(md["valid_action"]),
        error_kind=md["error_kind"],
        hint_template_key=md["hint_template_key"],
        task=md.get("task", task),
        task_id=None if md.get("task_id", task_id) is None else str(md.get("task_id", task_id)),
        step=step,
        session_id=session_id,
        family=family,
        extra=extra,
    )


def step_from_payload(payload: dict[str, Any]) -> EnvStep:
    """Rebuild an `EnvStep` from OpenEnv's wire payload {"observation": {...}, "reward", "done"}.

    metadata = the standard keys + task, task_id + step, session_id, family + the family's extra keys.
    """
    obs = dict(payload.get("observation") or {})
    if "text" not in obs:
        raise ValueError(f"server reply is not an sdar observation (no 'text' field): {str(payload)[:300]}")
    metadata: dict[str, Any] = dict(obs.get("extra") or {})
    for key in (*_FIELD_KEYS, *_SERVER_KEYS):
        metadata[key] = obs.get(key)
    reward = payload.get("reward")
    return EnvStep(
        observation=obs["text"],
        reward=0.0 if reward is None else float(reward),
        done=bool(payload.get("done", False)),
        metadata=metadata,
    )


def family_metadata(family: str) -> EnvironmentMetadata:
    """What GET /metadata (and a session's environment) says of a family's server."""
    return EnvironmentMetadata(
        name=f"sdar-{family}",
        description=f"sdar {family} text environment (actions: {{'message': str}}; reset: task_id, seed)",
        version=__version__,
    )
