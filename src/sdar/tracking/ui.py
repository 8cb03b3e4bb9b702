"""`sdar ui`: the MLflow UI on a run's store, opened on the comparison's view (sdar.tracking.view), and a headless
Chromium that reads what that page shows (the UI test and the docs' screenshot use it).

`serve` starts `mlflow server` on 127.0.0.1 over a store; `render` opens a URL in Debian's `chromium` with a fresh
profile and returns the page's text (and a screenshot) once it shows what the caller waits for, driving it over
the DevTools protocol (a WebSocket on loopback).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdar.browser import find_browser, install_hint
from sdar.lifecycle import Terminated, ending_on_signals, group_members
from sdar.ports import free_port
from sdar.tags import PIPELINE_JOB_TAG
from sdar.tracking.store import mlflow_client
from sdar.tracking.view import publish_view, view_url

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--remote-debugging-port=0")


def _get(url: str, timeout: float = 3.0) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    with opener.open(url, timeout=timeout) as r:
        return r.read()


# set on every mlflow server `serve` starts (inherited by its uvicorn and workers): who started it and over which store,
# so that a later `serve` on the same port can tell a server an earlier one left behind (its starter SIGKILLed)
UI_STARTER_ENV, UI_STORE_ENV = "SDAR_UI_STARTER", "SDAR_UI_STORE"


@contextlib.contextmanager
def serve(tracking_uri: str, port: int = 0, timeout_s: float = 120.0, quiet: bool = True,
          say: Callable[[str], Any] | None = None) -> Iterator[str]:
    """`mlflow server` on 127.0.0.1 over `tracking_uri` (a sqlite:/// store) while the block runs; yields its base
    URL. port 0: a free one. The server (and its workers) stop when the block ends. A server that an earlier `serve`
    left on `port` when its process was killed outright is taken over when it serves the same store (and stopped
    when this block ends), else stopped first; `say` is told which."""
    port = port or free_port()
    base = f"http://127.0.0.1:{port}"
    left = left_behind(port)
    if left is not None:
        from sdar.lifecycle import group_members, stop_processes

        pgid, store = left
        if store == tracking_uri and _healthy(base):
            if say is not None:
                say(f"reusing the mlflow server an earlier sdar ui left on port {port} (process group {pgid})")
            try:
                yield base
            finally:
                stop_processes(group_members(pgid), grace_s=15)
            return
        stop_processes(group_members(pgid), grace_s=15)
        if say is not None:
            say(f"stopped the mlflow server an earlier sdar ui left on port {port} over {store} (process group {pgid})")
    out = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri,
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            env={**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, UI_STARTER_ENV: str(os.getpid()),
                                 UI_STORE_ENV: tracking_uri}, stdout=out, stderr=out, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with code {proc.returncode} before answering on port {port} "
                                   "(is the port taken? pass another with --port)")
            with contextlib.suppress(OSError):
                if _get(f"{base}/health") .strip() == b"OK":
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"mlflow server did not answer {base}/health within {timeout_s:g} s")
            time.sleep(0.3)
        yield base
    finally:
        stop_group(proc, grace_s=15)


def _healthy(base: str) -> bool:
    with contextlib.suppress(OSError):
        return _get(f"{base}/health").strip() == b"OK"
    return False


def left_behind(port: int) -> tuple[int, str] | None:
    """(process group, store) of an mlflow server that `serve` started on 127.0.0.1:`port` and whose starter is gone
    (killed outright: no handler ran), read from /proc; None when the port is free, held by anything else (another
    program, a live sdar ui's server), or there is no /proc."""
    from pathlib import Path

    holder = _listening_pid(port)
    if holder is None:
        return None
    try:
        env = dict(kv.split("=", 1) for kv in Path(f"/proc/{holder}/environ").read_text().split("\0") if "=" in kv)
        pgid = os.getpgid(holder)
    except (OSError, ValueError):
        return None
    starter = env.get(UI_STARTER_ENV)
    if not starter or not starter.isdigit() or Path(f"/proc/{starter}").exists():
        return None
    return pgid, env.get(UI_STORE_ENV, "")


def _listening_pid(port: int) -> int | None:
    """The process holding a listening TCP socket on `port` (IPv4 or IPv6), from /proc/net and /proc/<pid>/fd."""
    from pathlib import Path

    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(fd_dir.parent.name)
    return None


def chromium_path() -> str:
    """A headless Chrome or Chromium (`sdar.browser.find_browser`: $CHROMIUM, PATH, Playwright's, the macOS apps);
    FileNotFoundError with the commands that install one on this system when there is none."""
    found = find_browser()
    if not found:
        raise FileNotFoundError(install_hint())
    return found


@dataclass
class Page:
    """What `render` saw: the page's visible text, its URL after the app's redirects, the screenshot (PNG bytes)."""

    text: str
    url: str
    png: bytes
    seconds: float


class _DevTools:
    """The few DevTools protocol calls `render` needs, over one page's WebSocket (only replies: no domain is
    enabled, so no events arrive)."""

    def __init__(self, ws) -> None:
        self.ws = ws  # an open websockets.sync connection, closed by its `with` block
        self.n = 0

    def call(self, method: str, **params) -> dict:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"chromium {method}: {msg['error']}")
                return msg.get("result", {})

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")


def render(url: str, ready: Callable[[str], bool], *, timeout_s: float = 90.0, window: tuple[int, int] = (1600, 1000),
           settle_s: float = 2.0) -> Page:
    """Open `url` in headless Chromium with a fresh profile and wait until `ready(page text)` holds (then `settle_s`
    more for charts to draw); returns the Page. TimeoutError, with the text the page showed, when it never holds."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sdar-chromium-") as profile:
        proc = subprocess.Popen([chromium_path(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                 f"--window-size={window[0]},{window[1]}", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            port = _devtools_port(proc, profile)
            target = next(t for t in json.loads(_get(f"http://127.0.0.1:{port}/json/list")) if t["type"] == "page")
            from websockets.sync.client import connect

            with connect(target["webSocketDebuggerUrl"], max_size=64 * 2**20, open_timeout=20) as ws:
                tools = _DevTools(ws)
                tools.call("Page.navigate", url=url)
                text = ""
                while time.monotonic() - t0 < timeout_s:
                    text = tools.evaluate("document.body ? document.body.innerText : ''") or ""
                    if ready(text):
                        time.sleep(settle_s)
                        text = tools.evaluate("document.body.innerText") or text
                        png = base64.b64decode(tools.call("Page.captureScreenshot", format="png")["data"])
                        return Page(text, tools.evaluate("location.href") or url, png, time.monotonic() - t0)
                    time.sleep(0.5)
                raise TimeoutError(f"{url} did not show what was expected within {timeout_s:g} s; it showed:\n{text[:3000]}")
        finally:
            stop_group(proc, grace_s=10)


def _devtools_port(proc: subprocess.Popen, profile: str, timeout_s: float = 90.0) -> int:
    """The DevTools port chromium chose (it writes it to <profile>/DevToolsActivePort)."""
    marker = Path(profile) / "DevToolsActivePort"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with code {proc.returncode}: {proc.stderr.read()[-2000:]}")
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(marker.read_text().split()[0])
        time.sleep(0.1)
    raise TimeoutError(f"chromium opened no DevTools port within {timeout_s:g} s")




def newest_job(tracking_uri: str, experiment: str | None = None) -> tuple[str, str]:
    """(experiment id, job id) of the newest pipeline run in the store (of `experiment` when given): the run
    tagged with a pipeline job id that has no parent of its own."""
    client = mlflow_client(tracking_uri)
    exps = [client.get_experiment_by_name(experiment)] if experiment else client.search_experiments()
    ids = [e.experiment_id for e in exps if e is not None]
    runs = client.search_runs(ids, f"tags.`{PIPELINE_JOB_TAG}` LIKE '%'", order_by=["attributes.start_time DESC"],
                              max_results=200) if ids else []
    for run in runs:
        if not run.data.tags.get("mlflow.parentRunId") or run.data.tags.get("sdar.parent_owner") == "kfp":
            return run.info.experiment_id, run.data.tags[PIPELINE_JOB_TAG]
    where = f"experiment {experiment!r}" if experiment else "any experiment"
    raise LookupError(f"no comparison pipeline run in {where} of {tracking_uri}; run `sdar run --local --quick` (or "
                      "`make demo`) first, or pass --tracking-uri to the store the pipeline logged to")


def comparison_url(tracking_uri: str, base_url: str, job: str | None = None, experiment: str | None = None) -> str:
    """The URL of a job's comparison view (the newest job when None) on the MLflow UI at `base_url`."""
    return view_url(base_url, *comparison_view(tracking_uri, job, experiment))


def comparison_view(tracking_uri: str, job: str | None = None, experiment: str | None = None) -> tuple[str, str]:
    """(experiment id, job id) of a job's comparison (the newest job when None), its view saved on the experiment
    first (sdar.tracking.view.publish_view), so that stores written before views existed open the same way."""
    exp_id, newest = newest_job(tracking_uri, experiment)
    if job and job != newest:
        from sdar.tags import PIPELINE_JOB_TAG
        from sdar.tracking.store import mlflow_client

        client = mlflow_client(tracking_uri)
        found = [r for e in client.search_experiments()
                 for r in client.search_runs([e.experiment_id], f"tags.`{PIPELINE_JOB_TAG}` = '{job}'", max_results=1)]
        if not found:
            raise LookupError(f"no run of pipeline job {job!r} in {tracking_uri}; `sdar ui` without --job opens the "
                              "newest one")
        exp_id = found[0].info.experiment_id
    job = job or newest
    publish_view(tracking_uri, exp_id, job)
    return exp_id, job


def _store_uri(args: argparse.Namespace) -> str:
    if args.tracking_uri:
        return args.tracking_uri
    db = Path(args.root).expanduser().resolve() / "mlflow.db"
    if not db.is_file():
        raise SystemExit(f"sdar ui: no MLflow store at {db}; run `sdar run --local --quick` first, or pass --root "
                         "(the pipeline root) or --tracking-uri")
    return f"sqlite:///{db}"


def _cmd_ui(args: argparse.Namespace) -> int:
    uri = _store_uri(args)
    if uri.startswith(("http://", "https://")):  # a tracking server: its UI is already there
        try:
            print(comparison_url(uri, args.ui_url or uri, args.job, args.experiment))
        except LookupError as exc:
            raise SystemExit(f"sdar ui: {exc}") from None
        return 0
    try:
        url = comparison_url(uri, f"http://127.0.0.1:{args.port}", args.job, args.experiment)
    except LookupError as exc:
        raise SystemExit(f"sdar ui: {exc}") from None
    if args.no_serve:
        print(url)
        return 0

    print(f"starting mlflow server on 127.0.0.1:{args.port} over {uri} ...", flush=True)
    try:
        # SIGTERM and SIGHUP stop the server as Ctrl-C does (its whole process group: uvicorn, job runner, workers)
        with ending_on_signals(), serve(uri, port=args.port, say=lambda m: print(m, flush=True)):
            print(f"the comparison in MLflow (arms side by side, held-out success, curves): open\n  {url}\n"
                  "Ctrl-C (or SIGTERM) stops the server.", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    except Terminated as exc:
        print(f"sdar ui: {exc}; the mlflow server on 127.0.0.1:{args.port} is stopped", flush=True)
        return exc.code
    except RuntimeError as exc:
        raise SystemExit(f"sdar ui: {exc}") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ui", help="start the MLflow UI on a comparison's store and print the URL of its view")
    p.add_argument("--root", default="runs/kfp-local", help="pipeline root whose mlflow.db to open (default runs/kfp-local)")
    p.add_argument("--tracking-uri", default=None,
                   help="an MLflow store or server instead of --root (sqlite:///... is served here; http(s)://... "
                        "is a server whose UI is used as it is)")
    p.add_argument("--port", type=int, default=5000, help="port of the local mlflow server (default 5000)")
    p.add_argument("--job", default=None, help="pipeline job (KFP run) id; default: the newest comparison in the store")
    p.add_argument("--experiment", default=None, help="look for the comparison in this MLflow experiment only")
    p.add_argument("--ui-url", default=None, help="with an http(s) --tracking-uri: the UI's URL if it differs")
    p.add_argument("--no-serve", action="store_true", help="print the URL without starting a server")
    p.set_defaults(func=_cmd_ui)


def stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """End the process group `proc` leads, every member of it: SIGTERM to the group, then SIGKILL to what is left of it
    after `grace_s` (the leader may exit before its workers do: an mlflow server's uvicorn and huey workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if group_members(proc.pid) or proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
