"""The local teacher pool: an OpenAI-compatible chat server on 127.0.0.1 serving local policy
checkpoints and the observation-only rule experts, so channel 3 runs with no external API.

Routes: `GET /v1/models`, `POST /v1/chat/completions` (non-streaming, n=1), `GET /health`.
Errors are OpenAI-style JSON (`{"error": {"message", "type", "code"}}`) with 400 / 404 / 500.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request  # at module level: FastAPI resolves the route annotations here
from fastapi.responses import JSONResponse
from sdar_envs.base import env_class
from sdar_envs.household.catalog import TASK_TEMPLATES

from sdar.replay.config import DEFAULT_LOCAL_EXPERTS
from sdar.replay.pool import TeacherEndpoint, TeacherPool

log = logging.getLogger("sdar.replay")

DEFAULT_MAX_TOKENS = 256  # unconstrained generation when the request names no limit


class RequestError(Exception):
    """A request the server refuses: becomes an OpenAI-style error with `status`."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code


# ---- what a served model sees in a request ---------------------------------------------------------
def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else str(content)


def prompt_view(messages: list[dict[str, str]], family: str):
    """The `TurnView` an agent prompt was built from (`sdar.replay.experts.read_turn`), or None for a
    chat that is not one (then a policy answers unconstrained and "with skills" gets the general skills)."""
    from sdar.replay.experts import read_turn

    try:
        return read_turn(messages, family)
    except ValueError:
        return None


def _household_task_type(task: str) -> str | None:
    """The ALFWorld task type whose goal template matches `task` most specifically (longest literal text)."""
    best, best_len = None, -1
    for ttype, templates in TASK_TEMPLATES.items():
        for tmpl in templates:
            literal = re.sub(r"\{\w+\}", "", tmpl)
            pattern = "^" + re.sub(r"\\\{\w+\\\}", "(.+)", re.escape(tmpl)) + r"\.?$"
            if re.match(pattern, task.strip().lower()) and len(literal) > best_len:
                best, best_len = ttype, len(literal)
    return best


def task_skills(family: str, task: str) -> str:
    """The privileged skills for a task known only by its text (what a served policy "with skills" gets):
    the family's library rendered for the key the task text gives (household: the goal template's task
    type; shop: the product keyword; searchqa: none, i.e. the general skills and common mistakes)."""
    key = None
    if family == "household":
        key = _household_task_type(task)
    elif family == "shop":
        from sdar_envs.shop.skills import skills_key_for

        key = skills_key_for(task)
    library = env_class(family).skill_library()
    return library.render(key if key in library.by_key else None)


def _words(messages: list[dict[str, str]]) -> int:
    return sum(len(_text(m.get("content")).split()) for m in messages)


# ---- served models --------------------------------------------------------------------------------
@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str = "stop"


class ExpertModel:
    """A rule expert (`sdar.replay.experts.rule_expert`): token counts are word counts (it has no tokenizer)."""

    kind = "rule-expert"

    def __init__(self, name: str, fn: Callable[[list[dict[str, str]]], str]) -> None:
        self.name, self.fn = name, fn

    def complete(self, messages, *, max_tokens: int | None, temperature: float, top_p: float) -> Completion:
        text = self.fn(messages)
        return Completion(text, _words(messages), len(text.split()))


@dataclass
class ServedPolicy:
    """A checkpoint served as a teacher.

    name: its model id. path: anything `sdar.models` loads (a `Policy.save` checkpoint, a transformers
        directory, "smollm2", "tiny:<dir>", a hub id in the local cache).
    skills: prepend the task's privileged skills (`task_skills`, placed before the chat as the
        reference does) to every prompt: the policy as a privileged teacher.
    """

    name: str
    path: str
    skills: bool = False

    @classmethod
    def parse(cls, spec: str) -> ServedPolicy:
        """"NAME=PATH", "PATH" (named after its last path part), either with ":skills" at the end."""
        skills = spec.endswith(":skills")
        body = spec[: -len(":skills")] if skills else spec
        name, sep, path = body.partition("=")
        if not sep:
            path = body
            name = Path(body.split(":", 1)[-1] if body.startswith("tiny:") else body).name or body
            name += "-skills" if skills else ""
        if not name or not path:
            raise ValueError(f"cannot read policy {spec!r}; write NAME=PATH, PATH, or either with :skills at the end")
        return cls(name=name, path=path, skills=skills)


def load_for_serving(path: str, device: str | None = None):
    """(model, tokenizer) of a checkpoint, LoRA adapters merged, in eval mode on `device` (CUDA if any)."""
    import torch

    from sdar.models.policy import POLICY_META, ModelSpec, Policy, load_policy

    if (Path(path).expanduser() / POLICY_META).is_file():
        policy = Policy.load(Path(path).expanduser())
    else:  # a fresh LoRA adapter is a no-op (B = 0); merged away below
        policy = load_policy(ModelSpec(name_or_path=path, lora=True))
    model = policy.model
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval().requires_grad_(False), policy.tokenizer


class PolicyModel:
    """A policy checkpoint answering with `TransformersBackend`; where the prompt lists admissible actions
    it is constrained to them (`action_trie`), so even a tiny model answers with a valid action, and the
    response is then bounded by the longest admissible one rather than by max_tokens."""

    kind = "policy"

    def __init__(self, name: str, model, tokenizer, family: str, skills: bool = False) -> None:
        from sdar.agent.backends import TransformersBackend

        self.name, self.family, self.skills = name, family, skills
        self.tokenizer = tokenizer
        self.backend = TransformersBackend(model, tokenizer, batch_size=1)
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        self._lock = threading.Lock()  # one generate at a time per model

    def complete(self, messages, *, max_tokens: int | None, temperature: float, top_p: float) -> Completion:
        from sdar.agent.constrained import action_trie
        from sdar.agent.prompts import chat_ids, prefix_ids

        ids = chat_ids(self.tokenizer, messages)
        view = prompt_view(messages, self.family)
        if self.skills:
            ids = prefix_ids(self.tokenizer, task_skills(self.family, view.task if view else "")) + ids
        actions = view.admissible_actions if view else []
        trie = None
        limit = max_tokens or DEFAULT_MAX_TOKENS
        if actions:
            eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
            trie = action_trie(self.tokenizer, self.family, actions, eos)
            limit = max(len(s) for s in trie.sequences)
        if self.max_positions and len(ids) + limit > self.max_positions:
            raise RequestError(400, f"the prompt is {len(ids)} tokens and the response may take {limit}; model "
                               f"{self.name!r} holds {self.max_positions} positions: send a shorter prompt",
                               code="context_length_exceeded")
        with self._lock:
            gen = self.backend.generate([ids], max_new_tokens=limit, temperature=temperature, top_p=top_p,
                                        tries=[trie] if trie is not None else None)[0]
        return Completion(gen.text, len(ids), len(gen.token_ids), "stop" if gen.finished else "length")


# ---- the HTTP app -----------------------------------------------------------------------------------
def _error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status)


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise RequestError(400, f"{name} must be a number in [{lo}, {hi}], got {value!r}", code="invalid_value")
    return float(value)


def _parse_request(body: Any, models: dict[str, Any]) -> tuple[Any, list[dict[str, str]], dict[str, Any]]:
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise RequestError(400, f"'model' is required; this server serves {', '.join(models)}", code="missing_model")
    if name not in models:
        raise RequestError(404, f"the model {name!r} does not exist here; this server serves {', '.join(models)}",
                           code="model_not_found")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "role" in m for m in msgs):
        raise RequestError(400, "'messages' must be a non-empty list of {role, content} objects")
    if body.get("stream"):
        raise RequestError(400, "streaming is not supported by the local teacher server; send stream: false")
    if body.get("n", 1) != 1:
        raise RequestError(400, f"only n=1 is supported, got n={body.get('n')!r}")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise RequestError(400, f"max_tokens must be a positive integer, got {max_tokens!r}", code="invalid_value")
    opts = {"max_tokens": max_tokens, "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
            "top_p": _number(body, "top_p", 1.0, 0.0, 1.0)}
    messages = [{"role": str(m["role"]), "content": _text(m.get("content"))} for m in msgs]
    return models[name], messages, opts


def create_app(models: dict[str, Any]):
    """The FastAPI app serving `models` (name -> an object with `complete(messages, **opts) -> Completion`)."""
    app = FastAPI(title="sdar local teachers", docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "models": list(models)}

    @app.get("/v1/models")
    def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": n, "object": "model", "created": created, "owned_by": "sdar",
                                            "kind": m.kind} for n, m in models.items()]}

    @app.get("/v1/models/{name:path}")
    def get_model(name: str):
        if name not in models:
            return _error(404, f"the model {name!r} does not exist here; this server serves {', '.join(models)}",
                          code="model_not_found")
        return {"id": name, "object": "model", "created": created, "owned_by": "sdar", "kind": models[name].kind}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        from starlette.concurrency import run_in_threadpool

        try:
            try:
                body = await request.json()
            except ValueError:
                raise RequestError(400, "the request body is not valid JSON") from None
            model, messages, opts = _parse_request(body, models)
            out: Completion = await run_in_threadpool(lambda: model.complete(messages, **opts))
        except RequestError as exc:
            return _error(exc.status, exc.message, exc.kind, exc.code)
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the server down
            log.exception("local teacher %r failed", body.get("model") if isinstance(body, dict) else None)
            return _error(500, f"the model failed on this request ({type(exc).__name__}: {exc})", "server_error")
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model.name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": out.text},
                         "finish_reason": out.finish_reason}],
            "usage": {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
                      "total_tokens": out.prompt_tokens + out.completion_tokens},
        }

    return app


# ---- the local pool ---------------------------------------------------------------------------------
def expert_model_name(variant: str) -> str:
    """The model id a rule-expert variant is served under: "rule" for the default, else "rule-<variant>"."""
    return "rule" if variant == "default" else f"rule-{variant}"


def build_models(family: str, policies: Sequence[str | ServedPolicy] = (),
                 experts: Sequence[str] = DEFAULT_LOCAL_EXPERTS) -> dict[str, Any]:
    """The served models by name: the rule-expert variants, then the policies (each checkpoint loaded once)."""
    from sdar.replay.experts import EXPERT_VARIANTS, rule_expert

    models: dict[str, Any] = {}
    for variant in experts:
        if variant not in EXPERT_VARIANTS:
            raise ValueError(f"unknown rule-expert variant {variant!r}; choose from {', '.join(EXPERT_VARIANTS)}")
        models[expert_model_name(variant)] = ExpertModel(expert_model_name(variant), rule_expert(family, variant))
    loaded: dict[str, tuple] = {}
    for p in policies:
        sp = p if isinstance(p, ServedPolicy) else ServedPolicy.parse(p)
        if sp.name in models:
            raise ValueError(f"two served models are named {sp.name!r}; name the policy with NAME=PATH")
        if sp.path not in loaded:
            loaded[sp.path] = load_for_serving(sp.path)
        models[sp.name] = PolicyModel(sp.name, *loaded[sp.path], family=family, skills=sp.skills)
    if not models:
        raise ValueError("the local teacher pool has nothing to serve; give --expert VARIANT or --policy PATH")
    return models


@dataclass
class LocalPool:
    """A running local teacher server: `url` (the /v1 base), one `TeacherEndpoint` per served model."""

    url: str
    endpoints: list[TeacherEndpoint] = field(default_factory=list)
    _server: Any = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def models(self) -> list[str]:
        return [e.model for e in self.endpoints]

    def stop(self) -> None:
        from sdar_envs.launcher import stop_server_thread

        if self._thread is not None:
            if not stop_server_thread(self._server, self._thread, timeout_s=10.0):
                log.warning("the local teacher server at %s did not stop within 10 s, nor 10 s after a forced stop",
                            self.url)
            self._thread = None


def start_server(models: dict[str, Any], host: str = "127.0.0.1", port: int = 0,
                 startup_timeout_s: float = 30.0) -> tuple[str, Any, threading.Thread]:
    """Serve `models` from a uvicorn thread; returns (base url, server, thread) once it answers."""
    import urllib.request

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port} ({exc}); pick another --port (0 = any free one)") from exc
    url = f"http://{host}:{sock.getsockname()[1]}/v1"
    config = uvicorn.Config(create_app(models), log_level="warning", access_log=False, timeout_graceful_shutdown=3)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="sdar-teachers", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while True:
        try:
            with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return url, server, thread
        except OSError:
            pass
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the local teacher server did not come up at {url} within {startup_timeout_s:.0f} s")
        time.sleep(0.05)


@contextlib.contextmanager
def serve_local_pool(family: str, *, policies: Sequence[str | ServedPolicy] = (),
                     experts: Sequence[str] = DEFAULT_LOCAL_EXPERTS, host: str = "127.0.0.1",
                     port: int = 0) -> Iterator[LocalPool]:
    """Serve the rule experts and policies of `family` on host:port (0 = a free port) for the block.

    Yields a `LocalPool` whose `endpoints` a `TeacherPool` takes as is; the server stops on exit.
    """
    models = build_models(family, policies, experts)
    url, server, thread = start_server(models, host, port)
    endpoints = [TeacherEndpoint(name=name, base_url=url, model=name, api_key_env=None,
                                 concurrency=4 if m.kind == "rule-expert" else 2,
                                 timeout_s=30.0 if m.kind == "rule-expert" else 300.0)
                 for name, m in models.items()]
    pool = LocalPool(url=url, endpoints=endpoints, _server=server, _thread=thread)
    try:
        yield pool
    finally:
        pool.stop()


@contextlib.contextmanager
def open_teacher_pool(cfg, family: str, *, cache_dir: str | Path | None = None) -> Iterator[Any]:
    """The `TeacherPool` a `ReplayConfig` describes, for the block: its `teachers`, or with none the local
    pool (this family's `local_experts` and `local_policies`) started on 127.0.0.1 and stopped after.

    cache_dir: where replies are kept when `cfg.cache_dir` is unset (None = memory only).
    """
    with contextlib.ExitStack() as stack:
        endpoints = list(cfg.teachers)
        if not endpoints:
            local = stack.enter_context(serve_local_pool(family, policies=tuple(cfg.local_policies),
                                                         experts=tuple(cfg.local_experts)))
            endpoints = local.endpoints
            log.info("replay: no replay.teachers configured; the local pool at %s serves %s", local.url,
                     ", ".join(local.models))
        if len(endpoints) < cfg.min_agree:
            raise ValueError(f"replay.min_agree={cfg.min_agree} but the pool has {len(endpoints)} teacher(s): no "
                             "turn could reach agreement; add teachers (or local_experts / local_policies) or lower "
                             "min_agree")
        pool = stack.enter_context(TeacherPool(endpoints, cache_dir=cfg.cache_dir or cache_dir,
                                               budget_usd=cfg.budget_usd, max_tokens=cfg.max_tokens,
                                               temperature=cfg.temperature))
        yield pool
