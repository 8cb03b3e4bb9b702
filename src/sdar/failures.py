"""Failures a command ends on with one line instead of a traceback, recognised where they are caught."""

from __future__ import annotations

import sys


def env_server_error(exc: BaseException) -> bool:
    """Whether `exc` is an env server's error (sdar_envs.client.EnvServerError: a server that died, refused or closed
    the session, named by its URL). Read from sys.modules: a process that never loaded the client (a GPU machine
    without OpenEnv runs `sdar train` on in-process envs) cannot have met one, and must not import OpenEnv to ask."""
    client = sys.modules.get("sdar_envs.client")
    return client is not None and isinstance(exc, client.EnvServerError)
