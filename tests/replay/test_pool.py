"""TeacherPool against a real HTTP server through the real openai client: retries, failures, the
budget cap, the cache, key handling and the accounting numbers (checked by hand)."""

from __future__ import annotations

import logging

import pytest

from sdar.replay import ReplayConfig, TeacherEndpoint, TeacherPool

MSG = [{"role": "system", "content": "s"}, {"role": "user", "content": "Task: t\nNow: room"}]


def prompts(n: int) -> list[list[dict]]:
    return [[MSG[0], {"role": "user", "content": f"Task: t\nNow: room {i}"}] for i in range(n)]


def endpoint(fake, name="a", model=None, **kw) -> TeacherEndpoint:
    return TeacherEndpoint(name=name, base_url=fake.url, model=model or name, **kw)


# ---- endpoints ------------------------------------------------------------------------------------
def test_endpoint_validation_names_the_problem():
    with pytest.raises(ValueError, match="base_url must start with http"):
        TeacherEndpoint(name="a", base_url="127.0.0.1:8300", model="m")
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        TeacherEndpoint(name="a", base_url="http://x/v1", model="m", concurrency=0)
    with pytest.raises(ValueError, match="price_in_per_1k must be >= 0"):
        TeacherEndpoint(name="a", base_url="http://x/v1", model="m", price_in_per_1k=-1)
    with pytest.raises(ValueError, match="api_key_env must name an environment variable"):
        TeacherEndpoint(name="a", base_url="http://x/v1", model="m", api_key_env="sk-live 123")
    with pytest.raises(ValueError, match=r"unknown teacher setting\(s\) \['api_key'\].*api_key_env"):
        TeacherEndpoint.from_dict({"name": "a", "base_url": "http://x/v1", "model": "m", "api_key": "sk-1"})
    with pytest.raises(ValueError, match="lacks \\['model'\\]"):
        TeacherEndpoint.from_dict({"name": "a", "base_url": "http://x/v1"})
    e = TeacherEndpoint.from_dict({"name": "a", "base_url": "http://x/v1/", "model": "m", "concurrency": 2})
    assert e.identity == "http://x/v1|m" and e.concurrency == 2


def test_pool_rejects_duplicate_names_and_empty(fake_teachers):
    with pytest.raises(ValueError, match="at least one endpoint"):
        TeacherPool([])
    with pytest.raises(ValueError, match=r"\['a'\] appear more than once"):
        TeacherPool([endpoint(fake_teachers), endpoint(fake_teachers)])


# ---- retries and failures ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["500", "429", "drop"])
def test_retries_then_answers(fake_teachers, mode):
    fake_teachers.replies["a"] = "<action>go to desk 1</action>"
    fake_teachers.fail_next, fake_teachers.fail_mode = 2, mode
    with TeacherPool([endpoint(fake_teachers, max_retries=3)], backoff_s=0.01) as pool:
        out = pool.propose([MSG])
        s = pool.stats()
    assert out == [["<action>go to desk 1</action>"]]
    assert fake_teachers.chat_requests() == 3
    assert (s["replay/calls"], s["replay/retries"], s["replay/failures"]) == (1, 2, 0)


def test_timeout_is_retried(fake_teachers):
    fake_teachers.fail_next, fake_teachers.fail_mode, fake_teachers.slow_s = 1, "slow", 1.5
    with TeacherPool([endpoint(fake_teachers, timeout_s=0.3, max_retries=1)], backoff_s=0.01) as pool:
        assert pool.propose([MSG]) == [["<action>look</action>"]]
        assert pool.stats()["replay/retries"] == 1


def test_always_failing_teacher_gives_none_and_counts(fake_teachers, caplog):
    fake_teachers.replies["b"] = "<action>look</action>"
    fake_teachers.fail_next = 10**6  # every request fails, for both teachers
    with TeacherPool([endpoint(fake_teachers, "a", max_retries=2)], backoff_s=0.01) as pool:
        with caplog.at_level(logging.WARNING, logger="sdar.replay"):
            out = pool.propose(prompts(2))
        s = pool.stats()
    assert out == [[None], [None]]
    assert fake_teachers.chat_requests() == 2 * 3  # 1 try + 2 retries per prompt
    assert (s["replay/calls"], s["replay/retries"], s["replay/failures"]) == (2, 4, 2)
    assert s["replay/failures/a"] == 2 and s["replay/tokens_in"] == 0 and s["replay/cost_usd"] == 0
    assert "teacher 'a' failed after 3 attempt(s): InternalServerError (HTTP 500)" in caplog.text


def test_client_errors_are_not_retried(fake_teachers):
    fake_teachers.fail_next, fake_teachers.fail_mode = 1, "400"
    with TeacherPool([endpoint(fake_teachers, max_retries=3)], backoff_s=0.01) as pool:
        assert pool.propose([MSG]) == [[None]]
        assert pool.stats()["replay/retries"] == 0
    assert fake_teachers.chat_requests() == 1


def test_unreachable_endpoint_fails_cleanly():
    dead = TeacherEndpoint(name="dead", base_url="http://127.0.0.1:9/v1", model="m", max_retries=1, timeout_s=2)
    with TeacherPool([dead], backoff_s=0.01) as pool:
        assert pool.propose([MSG]) == [[None]]
        s = pool.stats()
    assert (s["replay/retries"], s["replay/failures"]) == (1, 1)


# ---- accounting ---------------------------------------------------------------------------------------
def test_accounting_by_hand(fake_teachers):
    fake_teachers.usage.update({"a": (120, 7), "b": (300, 20)})
    a = endpoint(fake_teachers, "a", price_in_per_1k=0.5, price_out_per_1k=1.5)
    b = endpoint(fake_teachers, "b", price_in_per_1k=0.1, price_out_per_1k=0.4)
    with TeacherPool([a, b]) as pool:
        out = pool.propose(prompts(3))
        s = pool.stats()
    assert len(out) == 3 and all(len(row) == 2 for row in out)
    assert s["replay/calls"] == 6 and s["replay/calls/a"] == 3 and s["replay/calls/b"] == 3
    assert s["replay/tokens_in"] == 3 * 120 + 3 * 300 == 1260
    assert s["replay/tokens_out"] == 3 * 7 + 3 * 20 == 81
    # a: 120/1000*0.5 + 7/1000*1.5 = 0.0705; b: 300/1000*0.1 + 20/1000*0.4 = 0.038; x3 each
    assert s["replay/cost_usd"] == pytest.approx(3 * 0.0705 + 3 * 0.038) == pytest.approx(0.3255)
    assert s["replay/cache_hits"] == 0 and s["replay/budget_exhausted"] == 0
    assert 0 < s["replay/latency_p50_s"] <= s["replay/latency_p99_s"] < 5
    assert {r["model"] for r in fake_teachers.requests} == {"a", "b"}
    assert all(r["max_tokens"] == 64 and r["temperature"] == 0.0 for r in fake_teachers.requests)


# ---- budget ---------------------------------------------------------------------------------------------
def test_budget_cap_stops_calling(fake_teachers, caplog):
    fake_teachers.usage["a"] = (100, 50)
    # one call costs 100/1000*2 + 50/1000*4 = 0.4 USD: after 3 calls 1.2 >= 1.0, the rest are skipped
    a = endpoint(fake_teachers, "a", price_in_per_1k=2.0, price_out_per_1k=4.0, concurrency=1)
    with TeacherPool([a], budget_usd=1.0) as pool:
        with caplog.at_level(logging.WARNING, logger="sdar.replay"):
            out = pool.propose(prompts(6))
            more = pool.propose(prompts(8)[6:])
        s = pool.stats()
    assert [r[0] is not None for r in out] == [True, True, True, False, False, False]
    assert more == [[None], [None]]
    assert fake_teachers.chat_requests() == 3
    assert s["replay/calls"] == 3 and s["replay/budget_skipped"] == 5
    assert s["replay/cost_usd"] == pytest.approx(1.2) and s["replay/budget_exhausted"] == 1.0
    warnings = [r for r in caplog.records if "budget reached" in r.getMessage()]
    assert len(warnings) == 1  # logged once, however many calls it stops
    assert "$1.2000 spent of the $1.0000 cap" in warnings[0].getMessage()
    assert "Raise replay.budget_usd" in warnings[0].getMessage()


def test_cache_hits_cost_nothing_even_over_budget(fake_teachers, tmp_path):
    fake_teachers.usage["a"] = (1000, 0)
    a = endpoint(fake_teachers, "a", price_in_per_1k=1.0)
    with TeacherPool([a], budget_usd=1.0, cache_dir=tmp_path) as pool:
        first = pool.propose([MSG])
        assert pool.budget_exhausted is False  # spent == 1.0 is only noticed at the next call
        again = pool.propose([MSG])
        s = pool.stats()
    assert first == again and fake_teachers.chat_requests() == 1
    assert s["replay/cache_hits"] == 1 and s["replay/cost_usd"] == pytest.approx(1.0)


# ---- cache ---------------------------------------------------------------------------------------------
def test_cache_in_memory_and_on_disk(fake_teachers, tmp_path):
    fake_teachers.replies["a"] = lambda msgs: f"<action>{msgs[-1]['content'][-6:]}</action>"
    cache = tmp_path / "cache"
    with TeacherPool([endpoint(fake_teachers)], cache_dir=cache) as pool:
        first = pool.propose(prompts(3))
        second = pool.propose(prompts(3))
        s = pool.stats()
    assert first == second and fake_teachers.chat_requests() == 3
    assert s["replay/calls"] == 3 and s["replay/cache_hits"] == 3
    assert len(list(cache.rglob("*.json"))) == 3
    # a new pool (a restarted run) reads the disk cache: no request, no cost
    with TeacherPool([endpoint(fake_teachers, price_in_per_1k=1.0)], cache_dir=cache) as pool:
        assert pool.propose(prompts(3)) == first
        s = pool.stats()
    assert fake_teachers.chat_requests() == 3
    assert s["replay/calls"] == 0 and s["replay/cache_hits"] == 3 and s["replay/cost_usd"] == 0
    # other sampling parameters, another model or another address are other keys
    with TeacherPool([endpoint(fake_teachers)], cache_dir=cache, temperature=0.7) as pool:
        pool.propose(prompts(1))
    with TeacherPool([endpoint(fake_teachers, "a", model="a2")], cache_dir=cache) as pool:
        pool.propose(prompts(1))
    assert fake_teachers.chat_requests() == 5


def test_a_prompt_repeated_in_a_batch_is_asked_once(fake_teachers):
    # the G rollouts of a task share their first turn
    with TeacherPool([endpoint(fake_teachers, "tiny+skills", model="m")]) as pool:
        out = pool.propose([MSG, MSG, MSG])
        s = pool.stats()
    assert out == [["<action>look</action>"]] * 3 and fake_teachers.chat_requests() == 1
    assert s["replay/calls"] == 1 and s["replay/cache_hits"] == 2
    assert s["replay/calls/tiny_skills"] == 1  # MLflow takes no "+" in a metric name


def test_failures_are_not_cached(fake_teachers):
    fake_teachers.fail_next, fake_teachers.fail_mode = 1, "400"
    with TeacherPool([endpoint(fake_teachers, max_retries=0)]) as pool:
        assert pool.propose([MSG]) == [[None]]
        assert pool.propose([MSG]) == [["<action>look</action>"]]


# ---- keys ------------------------------------------------------------------------------------------------
SECRET = "sk-test-9f8e7d6c5b4a-DO-NOT-LOG"


def test_api_key_reaches_the_server_and_nothing_else(fake_teachers, monkeypatch, caplog, capsys):
    monkeypatch.setenv("SDAR_TEST_TEACHER_KEY", SECRET)
    caplog.set_level(logging.DEBUG)  # every logger, the openai client's and httpx's included
    spec = {"name": "paid", "base_url": fake_teachers.url, "model": "paid", "api_key_env": "SDAR_TEST_TEACHER_KEY",
            "price_in_per_1k": 0.01}
    ep = TeacherEndpoint.from_dict(spec)
    cfg = ReplayConfig.from_dict({"teachers": [spec, dict(spec, name="local", api_key_env=None)]})
    fake_teachers.fail_next = 1  # a retried failure logs too
    with TeacherPool(cfg.teachers, backoff_s=0.01) as pool:
        pool.propose([MSG])
        shown = [repr(ep), str(ep), repr(cfg), str(cfg), str(cfg.to_dict()), repr(pool), str(pool.stats())]
    assert f"Bearer {SECRET}" in fake_teachers.auth  # the key does reach the endpoint
    assert "Bearer sdar-local" in fake_teachers.auth  # api_key_env None: the dummy key
    out = capsys.readouterr()
    for text in shown + [caplog.text, out.out, out.err]:
        assert SECRET not in text
    assert "SDAR_TEST_TEACHER_KEY" in repr(ep)  # the variable's name is fine to show


def test_missing_key_variable_is_an_error_naming_it(fake_teachers, monkeypatch):
    monkeypatch.delenv("SDAR_TEST_MISSING_KEY", raising=False)
    ep = endpoint(fake_teachers, api_key_env="SDAR_TEST_MISSING_KEY")
    with pytest.raises(ValueError, match="environment variable SDAR_TEST_MISSING_KEY is not set"):
        TeacherPool([ep])
    assert fake_teachers.chat_requests() == 0


def test_closed_pool_refuses(fake_teachers):
    pool = TeacherPool([endpoint(fake_teachers)])
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.propose([MSG])
