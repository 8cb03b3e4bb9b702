"""What sdar-envs relies on in OpenEnv (`openenv` 0.10, the successor of `openenv-core`), pinned, and wire
compatibility with OpenEnv's own clients and runtime contract checks, against a real household server on 127.0.0.1.

If an OpenEnv upgrade breaks one of these, the fix is in sdar_envs (server/, client.py, openenv_models.py) and
docs/environments.md ("OpenEnv version"), not here: these tests say what the upgrade changed.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, which openenv depends on
    import tomli as tomllib

# first, so that openenv is imported without its Gradio web UI (see openenv_models)
from sdar_envs.openenv_models import SdarAction, SdarObservation, SdarResetRequest, SdarState  # isort: skip

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.types import Action, Observation, ResetRequest, State

ROOT = Path(__file__).resolve().parents[2]
PIN = ">=0.10,<0.11"  # envs/pyproject.toml and pyproject.toml: "openenv>=0.10,<0.11"


# ---- the distribution ---------------------------------------------------------------------------------
def test_openenv_is_the_runtime_and_openenv_core_is_gone():
    version = Version(importlib.metadata.version("openenv"))
    assert Version("0.10") <= version < Version("0.11"), f"openenv {version} is outside {PIN}"
    # both wheels ship the `openenv` package; with both installed, uninstalling one breaks the other
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("openenv-core")
    for pyproject in (ROOT / "envs" / "pyproject.toml", ROOT / "pyproject.toml"):
        deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
        assert f"openenv{PIN}" in deps, f"{pyproject} should depend on openenv{PIN}"
        assert not [d for d in deps if d.startswith("openenv-core")], f"{pyproject} still names openenv-core"


# ---- the models we extend (openenv/core/env_server/types.py) ------------------------------------------
def test_base_models_keep_the_fields_we_extend():
    assert set(Action.model_fields) == {"metadata"} and Action.model_config["extra"] == "forbid"
    assert set(Observation.model_fields) == {"done", "reward", "metadata"} and Observation.model_config["extra"] == "forbid"
    assert set(State.model_fields) == {"episode_id", "step_count"} and State.model_config["extra"] == "allow"
    assert {"seed", "episode_id"} <= set(ResetRequest.model_fields)
    # our models are those models plus our fields: every base field is still there, with its meaning
    for ours, base in ((SdarAction, Action), (SdarObservation, Observation), (SdarState, State), (SdarResetRequest, ResetRequest)):
        assert issubclass(ours, base) and set(base.model_fields) <= set(ours.model_fields)
    assert {"text", "won", "admissible_actions", "valid_action", "error_kind", "hint_template_key", "step",
            "session_id"} <= set(SdarObservation.model_fields)
    assert {"session_id", "family", "task_id", "done", "observations"} <= set(SdarState.model_fields)
    # ResetRequest's bounds hold for ours: a negative seed or an over-long episode id is refused
    for bad in ({"seed": -1}, {"episode_id": "x" * 256}, {"seed": "1"}, {"task": "t"}):
        with pytest.raises(ValueError):
            SdarResetRequest.model_validate(bad)


def test_serialized_observation_envelope():
    """openenv/core/env_server/serialization.py: {"observation": fields minus reward/done, "reward", "done"},
    and a top-level "metadata" only when the observation has some (ours never does: the step metadata are fields)."""
    from openenv.core.env_server.serialization import serialize_observation

    wire = serialize_observation(SdarObservation(text="You see a fridge.", reward=0.5, done=False, step=2))
    assert set(wire) == {"observation", "reward", "done"} and wire["reward"] == 0.5 and wire["done"] is False
    assert set(wire["observation"]) == set(SdarObservation.model_fields) - {"reward", "done"}
    # a typed client rebuilds our model from the wire, strictly (extra="forbid")
    rebuilt = SdarObservation.model_validate({**wire["observation"], "reward": wire["reward"], "done": wire["done"]})
    assert rebuilt.text == "You see a fridge." and rebuilt.step == 2


def test_websocket_and_json_rpc_messages():
    from openenv.core.env_server.mcp_types import JsonRpcErrorCode, JsonRpcRequest, JsonRpcResponse
    from openenv.core.env_server.types import (
        WSErrorCode,
        WSErrorResponse,
        WSObservationResponse,
        WSResetMessage,
        WSStateMessage,
        WSStateResponse,
        WSStepMessage,
    )

    assert WSResetMessage.model_validate({"type": "reset", "data": {"task_id": "t"}}).data == {"task_id": "t"}
    assert WSStepMessage.model_validate({"type": "step", "data": {"message": "look"}}).data == {"message": "look"}
    WSStateMessage.model_validate({"type": "state"})
    assert WSObservationResponse(data={}).type == "observation" and WSStateResponse(data={}).type == "state"
    assert WSErrorResponse(data={"message": "m", "code": "X"}).type == "error"
    used = {"INVALID_JSON", "UNKNOWN_TYPE", "VALIDATION_ERROR", "EXECUTION_ERROR", "CAPACITY_REACHED", "FACTORY_ERROR"}
    assert used <= {c.value for c in WSErrorCode}
    assert {"INVALID_REQUEST", "INVALID_PARAMS", "METHOD_NOT_FOUND", "SERVER_ERROR"} <= set(JsonRpcErrorCode.__members__)
    rpc = JsonRpcRequest.model_validate({"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1})
    assert rpc.params == {} and JsonRpcResponse.success({"ok": True}, request_id=1).model_dump()["jsonrpc"] == "2.0"


# ---- the server and client internals we build on -----------------------------------------------------
def test_http_env_server_hooks_and_routes():
    """SdarEnvServer subclasses HTTPEnvServer (openenv/core/env_server/http_server.py): the hooks it overrides or
    calls, and the routes production mode registers (which create_env_app keeps, replaces or drops)."""
    from fastapi import FastAPI
    from openenv.core.env_server.types import ServerMode

    from sdar_envs.server.app import _REPLACED_ROUTES, _UNSERVED_ROUTES
    from sdar_envs.server.environment import SdarEnvironment
    from sdar_envs.server.sessions import SdarEnvServer

    for name in ("_create_session", "_destroy_session", "_reap_idle_sessions", "_run_in_session_executor"):
        assert inspect.iscoroutinefunction(getattr(HTTPEnvServer, name)), name
    for name in ("_update_session_activity", "_factory_produces_harness_env", "register_routes"):
        assert callable(getattr(HTTPEnvServer, name)), name
    params = inspect.signature(HTTPEnvServer.__init__).parameters
    assert {"env", "action_cls", "observation_cls", "concurrency_config", "env_name", "state_cls"} <= set(params)
    assert SdarEnvServer._factory_produces_harness_env is not HTTPEnvServer._factory_produces_harness_env

    class NoHarness(HTTPEnvServer):  # as SdarEnvServer answers it; the base class imports openenv's harness (~2 s)
        def _factory_produces_harness_env(self) -> bool:
            return False

    bare = NoHarness(SdarEnvironment, SdarAction, SdarObservation, state_cls=SdarState)
    for name in ("_sessions", "_session_info", "_session_lock", "_session_idle_timeout_s", "_executor", "active_sessions"):
        assert hasattr(bare, name), name
    app = FastAPI()
    bare.register_routes(app, mode=ServerMode.PRODUCTION)
    paths = {getattr(r, "path", None) for r in app.router.routes} - {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
    # a route OpenEnv adds in a later version shows up here: serve it, replace it or drop it on purpose (`/harness`,
    # 0.10's agent-harness WebSocket, is registered only for a HarnessEnvironment factory, which ours never is)
    assert paths == {"/health", "/schema"} | _REPLACED_ROUTES | _UNSERVED_ROUTES


def test_env_client_hooks():
    """SdarEnvClient subclasses EnvClient (openenv/core/env_client.py): the async hooks it overrides or calls."""
    for name in ("_ensure_connected", "_send", "_receive", "_send_and_receive", "_connect_async", "_reset_async",
                 "_step_async", "_state_async", "_close_async"):
        assert inspect.iscoroutinefunction(getattr(EnvClient, name)), name
    assert {"observation", "reward", "done"} <= set(inspect.signature(StepResult).parameters)
    assert callable(EnvClient.sync)


# ---- wire compatibility with OpenEnv's own clients, on a real server ----------------------------------
@pytest.fixture(scope="module")
def household():
    from sdar_envs.client import http_json
    from sdar_envs.launcher import serve_in_background

    url, handle = serve_in_background("household", in_process=True)
    with handle:
        yield url, http_json("GET", f"{url}/tasks?split=train")["task_ids"][0]


class TypedSdarClient(EnvClient[SdarAction, SdarObservation, SdarState]):
    """A typed client as `openenv init` writes one (openenv/cli/templates/openenv_env/client.py), on our models."""

    def _step_payload(self, action: SdarAction) -> dict[str, Any]:
        return {"message": action.message}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[SdarObservation]:
        obs = SdarObservation.model_validate({**payload["observation"], "reward": payload.get("reward"),
                                              "done": payload.get("done", False)})
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload.get("done", False),
                          metadata=payload.get("metadata"))

    def _parse_state(self, payload: dict[str, Any]) -> SdarState:
        return SdarState.model_validate(payload)


def test_generic_client_sync_without_a_wrapper(household):
    """openenv 0.10's EnvClient answers plain sync calls (no `.sync()`), as TRL's OpenEnv examples use it."""
    from openenv.core.generic_client import GenericEnvClient

    url, task = household
    client = GenericEnvClient(base_url=url)
    try:
        first = client.reset(task_id=task, seed=0, episode_id="ep-sync")
        assert first.observation["task_id"] == task and first.observation["step"] == 0 and first.done is False
        action = first.observation["admissible_actions"][0]
        nxt = client.step({"message": action})
        assert nxt.observation["step"] == 1 and isinstance(nxt.reward, float)
        state = client.state()
        assert state["episode_id"] == "ep-sync" and state["step_count"] == 1 and len(state["observations"]) == 2
    finally:
        client.close()


def test_generic_client_async(household):
    from openenv.core.generic_client import GenericEnvClient

    url, task = household

    async def play() -> tuple[Any, dict[str, Any]]:
        async with GenericEnvClient(base_url=url) as client:
            await client.reset(task_id=task)
            out = await client.step({"message": "look"})
            return out, await client.state()

    out, state = asyncio.run(play())
    assert out.observation["step"] == 1 and state["step_count"] == 1 and state["task_id"] == task


def test_typed_client_reads_our_models_back(household):
    url, task = household
    with TypedSdarClient(base_url=url).sync() as client:
        first = client.reset(task_id=task)
        assert isinstance(first.observation, SdarObservation) and first.observation.session_id
        out = client.step(SdarAction(message="look"))
        assert out.observation.step == 1 and out.observation.session_id == first.observation.session_id
        assert out.observation.valid_action in (True, False) and out.observation.family == "household"
        state = client.state()
        assert isinstance(state, SdarState) and state.step_count == 1 and state.session_id == first.observation.session_id


def test_a_reclaimed_session_is_reported_not_silently_replaced():
    """openenv 0.10's EnvClient reopens a socket the server closed, i.e. a new, empty server session; SdarEnvClient
    (under RemoteEnv, AsyncRemoteEnv and the TRL adapter) reports why the server ended the session, on every call."""
    from openenv.core.generic_client import GenericEnvClient

    from sdar_envs.client import EnvServerError, SdarEnvClient, http_json
    from sdar_envs.launcher import serve_in_background
    from sdar_envs.server.config import ServerOptions

    opts = ServerOptions(session_ttl_s=1.0, reap_interval_s=0.1)
    url, handle = serve_in_background("household", options=opts, in_process=True)
    with handle:
        task = http_json("GET", f"{url}/tasks?split=train")["task_ids"][0]
        theirs, ours = GenericEnvClient(base_url=url), SdarEnvClient(url).sync()
        try:
            theirs.reset(task_id=task)
            ours.reset(task_id=task)
            deadline = time.monotonic() + 10
            while http_json("GET", f"{url}/info")["sessions_expired"] < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            # OpenEnv's client: the step lands on a fresh session that has no episode
            with pytest.raises(RuntimeError, match="step before reset"):
                theirs.step({"message": "look"})
            # ours: why the server ended the session, then that it is closed; never a new session
            with pytest.raises(EnvServerError, match="idle for more than 1 s") as first:
                ours.step("look")
            with pytest.raises(EnvServerError) as again:
                ours.step("look")
            assert (first.value.code, again.value.code) == ("SESSION_EXPIRED", "CLOSED")
            assert http_json("GET", f"{url}/info")["active_sessions"] == 1  # the one OpenEnv's client reopened
        finally:
            theirs.close()
            ours.close()


def test_openenv_runtime_contract_graders_pass(household):
    """OpenEnv's own runtime validation (openenv/validation/runtime/collector.py and graders/runtime/basic.py): raw
    reset/state/step envelopes checked against /schema, the episode id and step count, and the rewards."""
    from openenv.validation.graders.runtime.basic import (
        ObservationSchemaGrader,
        RewardWellFormedGrader,
        StateContractGrader,
    )
    from openenv.validation.runtime.collector import collect_runtime_evidence
    from openenv.validation.runtime.contracts import RuntimePlan, RuntimeReset
    from openenv.validation.types import CheckStatus

    url, task = household
    plan = RuntimePlan(plan_schema_version="1", reset=RuntimeReset(episode_id="ep-graded", seed=3, options={"task_id": task}),
                       actions=[{"message": "look"}, {"message": "inventory"}, {"message": "not an action"}])
    evidence = collect_runtime_evidence(url, plan, episode_timeout_s=60)
    assert evidence.failure_reason is None and [e.operation for e in evidence.exchanges][:4] == ["reset", "state", "step", "state"]
    subject = SimpleNamespace(runtime_evidence=evidence, manifest=SimpleNamespace(reward=SimpleNamespace(range=(-100.0, 100.0))))
    for grader in (ObservationSchemaGrader(), StateContractGrader(), RewardWellFormedGrader()):
        result = grader.run(subject)
        assert result.status is CheckStatus.PASS, (result.check_id, result.evidence)


def test_openenv_validate_url_probe(household):
    """`openenv validate --url` (openenv/cli/_validation.py, validate_running_environment): every criterion passes
    but `mcp_endpoint`, which wants HTTP 200 for the JSON-RPC request `{}`; ours answers an invalid request 400 with
    a JSON-RPC error body (as MCP's Streamable HTTP transport asks), like every bad input (docs/environments.md)."""
    from openenv.cli._validation import validate_running_environment

    url, _ = household
    report = validate_running_environment(url, timeout_s=10)
    outcome = {c["id"]: c["passed"] for c in report["criteria"]}
    assert outcome == {"openapi_version_available": True, "health_endpoint": True, "metadata_endpoint": True,
                       "schema_endpoint": True, "mcp_endpoint": False, "mode_endpoint_consistency": True}
    mcp = next(c for c in report["criteria"] if c["id"] == "mcp_endpoint")
    assert mcp["actual"] == {"status_code": 400, "jsonrpc": "2.0"} and report["mode"] == "production"
