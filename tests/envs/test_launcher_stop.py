"""stop_server_thread: a uvicorn server in a thread stops even while a request holds its graceful shutdown open, and
the non-daemon AnyIO worker threads of its sync handlers end with it (else the interpreter never exits)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.request

from fastapi import FastAPI

from sdar_envs.launcher import stop_server_thread


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "AnyIO worker thread" and t.is_alive()]


def test_a_request_that_never_ends_does_not_keep_the_server_or_its_workers_alive():
    import uvicorn

    app = FastAPI()
    entered = threading.Event()

    @app.get("/sync")
    def sync_handler() -> dict:  # runs on an AnyIO worker thread (not a daemon)
        return {"ok": True}

    @app.get("/forever")
    async def forever() -> dict:
        entered.set()
        await asyncio.sleep(3600)
        return {}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # a graceful shutdown that would wait an hour for the open request
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3600))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    before = set(_workers())
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/sync", timeout=5) as r:
                assert r.status == 200
            break
        except OSError:
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.05)
    assert set(_workers()) - before, "the sync handler ran on no AnyIO worker thread"
    def hang() -> None:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/forever", timeout=60)
        except OSError:  # the forced stop ends it (500, or the connection closed)
            pass

    hanging = threading.Thread(target=hang, daemon=True)
    hanging.start()
    assert entered.wait(30)

    t0 = time.monotonic()
    assert stop_server_thread(server, thread, timeout_s=5.0)  # 5 s graceful, then forced (room for a loaded CI)
    assert time.monotonic() - t0 < 20
    assert server.force_exit  # the graceful stop alone would have waited for /forever
    deadline = time.monotonic() + 10
    while set(_workers()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not set(_workers()) - before, "an AnyIO worker thread outlived its server: the interpreter would hang"
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
