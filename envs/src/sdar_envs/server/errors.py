"""The errors a client of an env server can cause, each mapped to one HTTP status (and a short `kind`): raised by
a session's environment (sdar_envs.server.environment) and the session table (sdar_envs.server.sessions), answered by
the routes (sdar_envs.server.routes)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import ValidationError


class EnvRequestError(Exception):
    """A request the environment refused; `status` is its HTTP status, `kind` a short name."""

    status = 400
    kind = "bad_request"


class UnknownTaskError(EnvRequestError):
    status = 404
    kind = "unknown_task"


class ResetError(EnvRequestError):
    status = 400
    kind = "bad_reset"


class ActionTooLongError(EnvRequestError):
    status = 413
    kind = "action_too_long"


class EpisodeStateError(EnvRequestError):
    status = 409
    kind = "episode_state"


class StepNotFoundError(EnvRequestError):
    status = 404
    kind = "unknown_step"


class SessionGoneError(EnvRequestError):
    status = 410
    kind = "session_gone"


class SessionAuthError(EnvRequestError):
    """No token where one is needed (401, with a WWW-Authenticate challenge)."""

    status = 401
    kind = "unauthorized"
    headers: ClassVar[dict[str, str]] = {"WWW-Authenticate": 'Bearer realm="sdar-env"'}


class SessionForbiddenError(EnvRequestError):
    status = 403
    kind = "forbidden"


class TooManySessionsError(EnvRequestError):
    status = 429
    kind = "too_many_sessions"


class RequestValidationFailed(EnvRequestError):
    """A body or message whose values do not fit its model (422); `errors` are pydantic's, without the input."""

    status = 422
    kind = "invalid_request"

    def __init__(self, what: str, exc: ValidationError) -> None:
        self.errors = exc.errors(include_url=False, include_context=False, include_input=False)
        shown = "; ".join(f"{'.'.join(str(part) for part in e['loc']) or 'body'}: {e['msg']}" for e in self.errors[:5])
        super().__init__(f"invalid {what} data ({shown})")
