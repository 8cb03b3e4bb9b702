"""The local teacher server through the real openai client: rule experts, a tiny policy checkpoint
(constrained to the admissible actions, with and without skills), errors, and the whole channel
(local pool -> TeacherPool -> build_pairs)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from sdar.agent.parsing import parse_response
from sdar.agent.prompts import PRIVILEGED_HEADER, PromptBuilder, TurnView
from sdar.agent.rollout import Trajectory, Turn
from sdar.replay import ServedPolicy, TeacherPool, build_pairs, serve_local_pool
from sdar.replay.experts import rule_expert
from sdar.replay.server import prompt_view, task_skills

ACTIONS = ["go to desk 1", "go to shelf 1", "go to cabinet 1", "go to countertop 1", "look", "inventory"]
VIEW = TurnView(task="put some mug on desk", step=0, max_steps=10,
                observation="You are in the middle of a room. Looking quickly around you, you see a desk 1, a shelf 1, "
                            "a cabinet 1, a countertop 1.", admissible_actions=ACTIONS)
MESSAGES = PromptBuilder("household").messages(VIEW)


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def experts_pool():
    with serve_local_pool("household", experts=("default", "b")) as pool:
        yield pool


def test_models_and_rule_expert_completions(experts_pool):
    c = client(experts_pool.url)
    assert [m.id for m in c.models.list().data] == ["rule", "rule-b"] == experts_pool.models
    assert c.models.retrieve("rule-b").id == "rule-b"
    resp = c.chat.completions.create(model="rule", messages=MESSAGES, max_tokens=64, temperature=0)
    text = resp.choices[0].message.content
    assert text == rule_expert("household", "default")(MESSAGES) == "<action>go to countertop 1</action>"
    assert resp.choices[0].finish_reason == "stop" and resp.model == "rule"
    words = sum(len(m["content"].split()) for m in MESSAGES)
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (words, 4)  # whitespace words
    assert [e.base_url for e in experts_pool.endpoints] == [experts_pool.url] * 2
    assert all(e.api_key_env is None for e in experts_pool.endpoints)


def test_errors_are_openai_style(experts_pool):
    c = client(experts_pool.url)
    with pytest.raises(openai.NotFoundError) as err:
        c.chat.completions.create(model="gpt-9", messages=MESSAGES)
    assert "'gpt-9' does not exist here; this server serves rule, rule-b" in str(err.value)
    with pytest.raises(openai.BadRequestError, match="streaming is not supported"):
        c.chat.completions.create(model="rule", messages=MESSAGES, stream=True)
    with pytest.raises(openai.BadRequestError, match="'messages' must be a non-empty list"):
        c.chat.completions.create(model="rule", messages=[])
    with pytest.raises(openai.BadRequestError, match="temperature must be a number"):
        c.chat.completions.create(model="rule", messages=MESSAGES, temperature=7)
    base = experts_pool.url.removesuffix("/v1")
    req = urllib.request.Request(experts_pool.url + "/chat/completions", data=b"{not json", method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, timeout=10)
    assert http.value.code == 400
    assert json.loads(http.value.read())["error"]["message"] == "the request body is not valid JSON"
    with urllib.request.urlopen(base + "/health", timeout=10) as r:
        assert json.loads(r.read())["models"] == ["rule", "rule-b"]


def test_unknown_expert_variant_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown rule-expert variant 'c'; choose from default, b"):
        with serve_local_pool("household", experts=("c",)):
            pass


def test_reading_the_prompt():
    assert prompt_view(MESSAGES, "household") == VIEW
    assert prompt_view([{"role": "user", "content": "hello"}], "household") is None
    assert ServedPolicy.parse("ckpt=/runs/a:skills") == ServedPolicy("ckpt", "/runs/a", True)
    assert ServedPolicy.parse("tiny:/tmp/tok") == ServedPolicy("tok", "tiny:/tmp/tok", False)
    assert ServedPolicy.parse("/runs/step-9:skills") == ServedPolicy("step-9-skills", "/runs/step-9", True)
    assert "Skills for pick_clean_then_place_in_recep:" in task_skills("household", "put a clean apple in fridge")
    assert "Skills for" not in task_skills("searchqa", "Who founded Acme?")  # general skills only


def test_tiny_policy_answers_admissible_actions_with_and_without_skills(tiny_checkpoint):
    with serve_local_pool("household", policies=(f"tiny={tiny_checkpoint}", f"tiny-skills={tiny_checkpoint}:skills"),
                          experts=()) as pool:
        assert pool.models == ["tiny", "tiny-skills"]
        c = client(pool.url)
        plain = c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=64, temperature=0)
        priv = c.chat.completions.create(model="tiny-skills", messages=MESSAGES, max_tokens=64, temperature=0)
        sampled = c.chat.completions.create(model="tiny", messages=MESSAGES, temperature=1.0)
        free = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=5)
    for resp in (plain, priv, sampled):
        parsed = parse_response(resp.choices[0].message.content, "household", ACTIONS)
        assert parsed.valid, resp.choices[0].message.content
        assert resp.choices[0].finish_reason == "stop"
    # the privileged teacher's prompt is the student's plus the skills prefix, in tokens too
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    skills = task_skills("household", VIEW.task)
    extra = len(tok(f"{PRIVILEGED_HEADER}\n{skills}\n\n", add_special_tokens=False)["input_ids"])
    assert priv.usage.prompt_tokens == plain.usage.prompt_tokens + extra
    assert free.usage.completion_tokens <= 5  # unconstrained: max_tokens bounds it


def test_context_overflow_is_a_400(tiny_checkpoint):
    with serve_local_pool("household", policies=(f"tiny={tiny_checkpoint}",), experts=()) as pool:
        with pytest.raises(openai.BadRequestError, match="holds 4096 positions: send a shorter prompt"):
            client(pool.url).chat.completions.create(model="tiny",
                                                     messages=[{"role": "user", "content": "mug " * 6000}])


def test_the_channel_end_to_end_over_the_local_pool(experts_pool, tmp_path):
    """Both rule experts say "go to countertop 1"; the student looked: one DPO pair."""
    turns = [Turn(view=VIEW, prompt_ids=[1, 2], response_ids=[3], response_text="<action>look</action>", action="look",
                  valid=True, env_valid=True, reward=0.0),
             Turn(view=VIEW, prompt_ids=[1, 2], response_ids=[4], response_text="", action="go to countertop 1",
                  valid=True, env_valid=True, reward=0.0)]
    trajs = [Trajectory("household/x", "pick_and_place_simple", 0, skills="", turns=turns)]
    with TeacherPool(experts_pool.endpoints, cache_dir=tmp_path) as pool:
        pairs, stats = build_pairs(trajs, pool, PromptBuilder("household"), "household")
    assert [(p.turn, p.chosen, p.rejected, p.agree, p.teachers) for p in pairs] == [
        (0, "go to countertop 1", "look", 2, 2)]
    assert stats["replay/agreement_rate"] == 1.0 and stats["replay/student_agrees_rate"] == 0.5
    # the two turns show the same prompt: the second is a cache hit
    assert stats["replay/calls"] == 2 and stats["replay/cache_hits"] == 2 and stats["replay/cost_usd"] == 0
