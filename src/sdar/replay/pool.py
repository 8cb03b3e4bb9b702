"""N teachers behind OpenAI-compatible chat endpoints, asked in parallel for each turn's action
(Composer channel 3), with retries, a response cache and a spending cap.

An API key never appears in a field, an argument, a log line or a stat: an endpoint names the
environment variable that holds it (`api_key_env`, a Kubernetes Secret on a cluster).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import re
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sdar.config.replay import TeacherEndpoint  # noqa: F401 - re-exported: the pool's endpoints

log = logging.getLogger("sdar.replay")

_RETRY_STATUS = (408, 409, 429)  # plus every 5xx
LATENCY_WINDOW = 10_000  # latency percentiles are over the last this many requests
_METRIC_UNSAFE = re.compile(r"[^\w\-. :/]")


class ResponseCache:
    """Teacher replies by request key, in memory and (with `directory`) one JSON file per key on
    disk, written atomically, so a restarted run (or a second process) reuses them."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory else None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
        self._mem: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(endpoint: TeacherEndpoint, messages: list[dict[str, str]], max_tokens: int, temperature: float) -> str:
        blob = json.dumps({"teacher": endpoint.identity, "messages": messages, "max_tokens": max_tokens,
                           "temperature": temperature}, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            hit = self._mem.get(key)
        if hit is not None or self.directory is None:
            return hit
        path = self._path(key)
        try:
            hit = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:  # a torn or foreign file: ask again rather than fail the run
            log.warning("ignoring unreadable teacher cache entry %s (%s)", path, exc)
            return None
        with self._lock:
            self._mem[key] = hit
        return hit

    def put(self, key: str, entry: dict[str, Any]) -> None:
        with self._lock:
            self._mem[key] = entry
        if self.directory is None:
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(entry, ensure_ascii=False))
        os.replace(tmp, path)


def _retryable(exc: BaseException) -> bool:
    import openai

    if isinstance(exc, openai.APIConnectionError):  # APITimeoutError is one
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in _RETRY_STATUS or exc.status_code >= 500
    return False


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    return f"{type(exc).__name__}" + (f" (HTTP {status})" if status is not None else "")


def _percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (0 for no samples)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))
    return float(s[k])


class TeacherPool:
    """Asks every teacher for every prompt; `propose` returns the reply texts.

    cache_dir: keep replies on disk there (a hit costs nothing and sends no request); None = memory only.
    budget_usd: stop sending requests once the spent cost (from `usage` and the endpoint prices)
        reaches this; the rest return None, `budget_exhausted` is set and one warning is logged.
        Requests already in flight when it is reached still complete (at most the summed concurrency).
    max_tokens, temperature: the sampling parameters of every request (part of the cache key).
    backoff_s: the first retry's delay; each next one doubles, times a random factor in [0.5, 1.5).
    """

    def __init__(self, endpoints: list[TeacherEndpoint], *, cache_dir: str | Path | None = None,
                 budget_usd: float | None = None, max_tokens: int = 64, temperature: float = 0.0,
                 backoff_s: float = 0.5) -> None:
        from openai import OpenAI

        self.endpoints = [e if isinstance(e, TeacherEndpoint) else TeacherEndpoint.from_dict(e) for e in endpoints]
        if not self.endpoints:
            raise ValueError("a teacher pool needs at least one endpoint (replay.teachers, or the local pool)")
        names = [e.name for e in self.endpoints]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"teacher names must be unique; {dup} appear more than once")
        if budget_usd is not None and budget_usd < 0:
            raise ValueError(f"budget_usd must be >= 0 or None (no cap), got {budget_usd}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.budget_usd, self.max_tokens, self.temperature = budget_usd, int(max_tokens), float(temperature)
        self.backoff_s = float(backoff_s)
        self._jitter = random.Random()  # its own stream: a retry must not move the global RNG training draws from
        self.cache = ResponseCache(cache_dir)
        # keys are resolved here so a missing variable fails before any work, and live only inside the clients
        self._clients = [OpenAI(base_url=e.base_url, api_key=e.api_key(), timeout=e.timeout_s, max_retries=0)
                         for e in self.endpoints]
        self._executors = [ThreadPoolExecutor(max_workers=e.concurrency, thread_name_prefix=f"teacher-{e.name}")
                           for e in self.endpoints]
        self._lock = threading.Lock()
        self._counts = {k: 0 for k in ("calls", "cache_hits", "retries", "failures", "tokens_in", "tokens_out",
                                       "budget_skipped")}
        self._per_teacher = {n: {"calls": 0, "failures": 0} for n in names}
        self._cost = 0.0
        self._latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self.budget_exhausted = False
        self._closed = False

    # -- the public surface -------------------------------------------------------------------------
    def propose(self, messages: list[list[dict[str, str]]]) -> list[list[str | None]]:
        """Every teacher's reply text for every prompt: out[i][j] is teacher j on prompt i, None when the
        request failed after its retries or the budget stopped it."""
        if self._closed:
            raise RuntimeError("this TeacherPool is closed; make a new one")
        # the same prompt twice in a batch (the G rollouts of a task share their first turn) is asked once;
        # the repeats count as cache hits
        asked: list[dict[str, Any]] = [{} for _ in self.endpoints]
        futures = []
        for m in messages:
            row = []
            for j, ex in enumerate(self._executors):
                key = ResponseCache.key(self.endpoints[j], m, self.max_tokens, self.temperature)
                if key in asked[j]:
                    with self._lock:
                        self._counts["cache_hits"] += 1
                else:
                    asked[j][key] = ex.submit(self._ask, j, m, key)
                row.append(asked[j][key])
            futures.append(row)
        return [[f.result() for f in row] for row in futures]

    def stats(self) -> dict[str, float]:
        """Cumulative counters since the pool was made, prefixed `replay/` (per teacher: `replay/calls/<name>`,
        `replay/failures/<name>`, characters MLflow refuses in a name written as "_")."""
        with self._lock:
            c, lat = dict(self._counts), list(self._latencies)
            out = {f"replay/{k}": float(v) for k, v in c.items()}
            out["replay/cost_usd"] = self._cost
            for name, pt in self._per_teacher.items():
                metric = _METRIC_UNSAFE.sub("_", name)  # MLflow refuses other characters in metric names
                out[f"replay/calls/{metric}"] = float(pt["calls"])
                out[f"replay/failures/{metric}"] = float(pt["failures"])
        out["replay/latency_p50_s"] = _percentile(lat, 0.50)
        out["replay/latency_p99_s"] = _percentile(lat, 0.99)
        out["replay/budget_exhausted"] = float(self.budget_exhausted)
        return out

    @property
    def spent_usd(self) -> float:
        return self._cost

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ex in self._executors:
            ex.shutdown(wait=True)
        for c in self._clients:
            c.close()

    def __enter__(self) -> TeacherPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TeacherPool({', '.join(e.name for e in self.endpoints)}; spent ${self._cost:.4f})"

    # -- one request -----------------------------------------------------------------------------
    def _over_budget(self) -> bool:
        """Whether the budget is spent (logging the warning the first time); call under the lock."""
        if self.budget_usd is None or self._cost < self.budget_usd:
            return False
        if not self.budget_exhausted:
            self.budget_exhausted = True
            log.warning("teacher budget reached: $%.4f spent of the $%.4f cap (replay.budget_usd) after %d calls; "
                        "the remaining teacher calls are skipped (no reply, no pair). Raise replay.budget_usd, or set "
                        "it to null for no cap, to continue.", self._cost, self.budget_usd, self._counts["calls"])
        return True

    def _ask(self, j: int, messages: list[dict[str, str]], key: str) -> str | None:
        ep, client = self.endpoints[j], self._clients[j]
        hit = self.cache.get(key)
        if hit is not None:
            with self._lock:
                self._counts["cache_hits"] += 1
            return hit["text"]
        with self._lock:
            if self._over_budget():
                self._counts["budget_skipped"] += 1
                return None
            self._counts["calls"] += 1
            self._per_teacher[ep.name]["calls"] += 1
        start = time.monotonic()
        for attempt in range(ep.max_retries + 1):
            try:
                resp = client.chat.completions.create(model=ep.model, messages=messages, max_tokens=self.max_tokens,
                                                      temperature=self.temperature)
                break
            except Exception as exc:  # noqa: BLE001 - every failure becomes a None reply, counted
                if _retryable(exc) and attempt < ep.max_retries:
                    with self._lock:
                        self._counts["retries"] += 1
                    time.sleep(self._delay(attempt, exc))
                    continue
                with self._lock:
                    self._counts["failures"] += 1
                    self._per_teacher[ep.name]["failures"] += 1
                log.warning("teacher %r failed after %d attempt(s): %s", ep.name, attempt + 1, _describe(exc))
                return None
        text = (resp.choices[0].message.content or "") if resp.choices else ""
        usage = resp.usage
        t_in = int(getattr(usage, "prompt_tokens", 0) or 0) if usage else 0
        t_out = int(getattr(usage, "completion_tokens", 0) or 0) if usage else 0
        cost = ep.cost(t_in, t_out)
        with self._lock:
            self._counts["tokens_in"] += t_in
            self._counts["tokens_out"] += t_out
            self._cost += cost
            self._latencies.append(time.monotonic() - start)
        self.cache.put(key, {"text": text, "tokens_in": t_in, "tokens_out": t_out, "cost_usd": cost,
                             "teacher": ep.identity})
        return text

    def _delay(self, attempt: int, exc: BaseException) -> float:
        delay = self.backoff_s * (2 ** attempt) * (0.5 + self._jitter.random())
        retry_after = None
        response = getattr(exc, "response", None)
        if response is not None:
            try:
                retry_after = float(response.headers.get("retry-after", ""))
            except (TypeError, ValueError):
                retry_after = None
        if retry_after is not None:  # the server's word, within reason
            delay = max(delay, min(retry_after, 60.0))
        return delay
