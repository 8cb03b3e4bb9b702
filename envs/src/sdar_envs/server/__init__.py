"""The environment server: any sdar TextEnv served over HTTP and WebSocket with OpenEnv's server, one environment per
session (what it serves and how: `sdar_envs.server.app`'s docstring, also the app's OpenAPI description).

One room per concept, each importing only those below it:
  config.py       ServerOptions and their command-line form (imported by the `sdar` CLI without FastAPI or OpenEnv)
  errors.py       the errors a client can cause, each with its HTTP status
  limits.py       bounds on connections, bodies, heads and JSON; the probe listener
  environment.py  one session's environment (SdarEnvironment around a TextEnv) and build_text_env
  routes.py       what a client speaks: /ws, /sessions..., /mcp, /info, /tasks (through the SessionTable protocol)
  sessions.py     the session table (SdarEnvServer: sessions, owners, tokens, the reaper)
  app.py          the FastAPI app (create_env_app) and the operator token
  process.py      uvicorn, bound sockets, run_server and the command line (`python -m sdar_envs.server`)

This package's own import loads nothing: `sdar_envs.server.config` stays cheap to import.
"""
