"""Fixtures for the teacher pool: a real OpenAI-style HTTP server on 127.0.0.1 whose replies and
failures a test scripts (`FakeTeachers`), and a tiny policy checkpoint for the local server."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import pytest


@dataclass
class FakeTeachers:
    """What the server answers. replies: model -> reply text (or a function of the messages);
    usage: model -> (prompt_tokens, completion_tokens); fail_next: the next N chat requests fail with
    `fail_mode` ("500", "429", "400", "drop" = close the connection unanswered, "slow" = answer late)."""

    url: str = ""
    replies: dict[str, str | Callable[[list[dict]], str]] = field(default_factory=dict)
    usage: dict[str, tuple[int, int]] = field(default_factory=dict)
    fail_next: int = 0
    fail_mode: str = "500"
    slow_s: float = 1.0
    requests: list[dict] = field(default_factory=list)  # every chat request body, failed ones too
    auth: list[str] = field(default_factory=list)  # the Authorization header of each request
    lock: threading.Lock = field(default_factory=threading.Lock)

    def chat_requests(self, model: str | None = None) -> int:
        return sum(1 for r in self.requests if model is None or r.get("model") == model)


def _handler(state: FakeTeachers):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep test output clean
            pass

        def _send(self, status: int, body: dict, headers: dict | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            with state.lock:
                state.requests.append(body)
                state.auth.append(self.headers.get("Authorization", ""))
                fail = state.fail_next > 0
                if fail:
                    state.fail_next -= 1
            if fail and state.fail_mode == "drop":
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if fail and state.fail_mode == "slow":
                time.sleep(state.slow_s)
            elif fail:
                status = int(state.fail_mode)
                self._send(status, {"error": {"message": f"scripted {status}", "type": "test"}},
                           {"Retry-After": "0"} if status == 429 else None)
                return
            model = body["model"]
            reply = state.replies.get(model, "<action>look</action>")
            text = reply(body["messages"]) if callable(reply) else reply
            p, c = state.usage.get(model, (10, 5))
            self._send(200, {"id": "x", "object": "chat.completion", "created": 0, "model": model,
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}})

    return Handler


@pytest.fixture
def fake_teachers():
    """A `FakeTeachers` serving on a free 127.0.0.1 port for the test; `.url` is its /v1 base."""
    state = FakeTeachers()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A `Policy.save` checkpoint of a random tiny Qwen2 on a small trained tokenizer (seconds to build)."""
    import yaml

    from sdar.models import ModelSpec, load_policy, train_tokenizer
    from tests.models.conftest import SMALL_CFG, agent_corpus

    tok_dir = tmp_path_factory.mktemp("replay-tok")
    cfg = dict(SMALL_CFG, max_position_embeddings=4096)  # the household skills are ~3k of its tokens
    train_tokenizer(agent_corpus(), vocab_size=512).save_pretrained(tok_dir)
    (tok_dir / "tiny-qwen2.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path_factory.mktemp("replay-policy")
    load_policy(ModelSpec(name_or_path=f"tiny:{tok_dir}")).save(out)
    return out
