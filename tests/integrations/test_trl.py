"""`sdar.integrations.trl` without a trainer: prompts token for token ours, replies parsed into `act`
calls, episodes stepped and scored as sdar does. The GRPO step against a server is
tests/integration/test_trl_grpo.py."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from sdar.agent.prompts import PromptBuilder, chat_ids  # noqa: E402
from sdar.config import RolloutConfig  # noqa: E402
from sdar.integrations.trl import (  # noqa: E402
    EPISODE_OVER,
    SdarEnv,
    SdarEnvFactory,
    chat_template,
    prepare_tokenizer,
)

TASK = "sim/pick/000000"


@pytest.fixture(scope="module")
def qwen():
    from sdar.models import load_qwen_tokenizer

    return load_qwen_tokenizer()


@pytest.fixture(scope="module")
def prepared():
    """family -> a Qwen tokenizer prepared for it (each its own copy: preparing sets attributes)."""
    from sdar.models import load_qwen_tokenizer

    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = prepare_tokenizer(load_qwen_tokenizer(), family)
        return cache[family]

    return get


@pytest.fixture(scope="module")
def household_tok(prepared):
    return prepared("household")


def _ids(tok, messages, **kw):
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True, **kw)
    return list(out["input_ids"])


def test_prompts_are_ours_token_for_token(qwen, household_tok):
    factory = SdarEnvFactory(None, "household")
    env = factory()
    builder = PromptBuilder("household", history=2)
    text = env.reset(task_id=TASK, prompt=[{"role": "user", "content": ""}])  # TRL passes the whole row
    assert text == builder.user_text(env._state.view(0, 50))
    # what TRL tokenizes (the row's empty user message + the reset text, with the tool schema) is our prompt
    ours = chat_ids(qwen, builder.messages(env._state.view(0, 50)))
    assert _ids(household_tok, [{"role": "user", "content": text}], tools=[env.act]) == ours
    # the next turn: the tool result is our turn-2 user text, rendered as the next user turn
    nxt = env.act("go to  cabinet 1")
    assert env.actions == ["go to cabinet 1"]  # normalised as sdar's parser does before stepping
    assert nxt == builder.user_text(env._state.view(1, 50)) and "Step 2 of 50." in nxt
    call = {"type": "function", "function": {"name": "act", "arguments": {"action": "go to cabinet 1"}}}
    convo = [{"role": "user", "content": text}, {"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "name": "act", "content": nxt}]
    rendered = household_tok.apply_chat_template(convo, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith(
        "<|im_start|>assistant\n<action>go to cabinet 1</action><|im_end|>\n"
        f"<|im_start|>user\n{nxt}<|im_end|>\n<|im_start|>assistant\n"
    )
    factory.close()


def test_trl_accepts_the_chat_template(household_tok):
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    assert supports_tool_calling(household_tok) and is_chat_template_prefix_preserving(household_tok)


@pytest.mark.parametrize("family,reply,content,action", [
    ("household", "<think>near</think><action> go to cabinet 1 </action><|im_end|>", "<think>near</think>",
     "go to cabinet 1"),
    ("household", "<action>a</action> then <action>b</action><|im_end|>", "then", "b"),  # the last block is played
    ("household", "I would look around.<|im_end|>", "I would look around.", None),  # no call: TRL's rollout ends
    ("household", "<think>t</think><action>go to cab", "<think>t</think><action>go to cab", None),  # cut off
    ("searchqa", "<search>capital of", "<search>capital of", None),
    ("shop", "<action>search[red mug]</action><|im_end|>", "", "search[red mug]"),
    ("searchqa", "<think>x</think><search>capital of France</search><|im_end|>", "<think>x</think>",
     "<search>capital of France</search>"),
    ("searchqa", "<answer>Paris</answer><|im_end|>", "", "<answer>Paris</answer>"),
])
def test_replies_parse_into_act_calls(prepared, family, reply, content, action):
    from trl.chat_template_utils import parse_response

    tok = prepared(family)
    prefix = _ids(tok, [{"role": "user", "content": "Task: t"}])
    msg = parse_response(tok, tok(reply, add_special_tokens=False)["input_ids"], prefix=prefix)
    assert msg["role"] == "assistant" and msg["content"] == content
    if action is None:
        assert not msg.get("tool_calls")
    else:
        assert msg["tool_calls"] == [{"type": "function", "function": {"name": "act", "arguments": {"action": action}}}]


@pytest.mark.parametrize("reward,expected", [("env", 1.0), ("reference", 10.0)])  # summed steps; 10 x won
def test_an_expert_episode_is_won_and_scored_then_over(reward, expected):
    with SdarEnvFactory(None, "household", reward=reward) as factory:
        env = factory()
        env.reset(task_id=TASK)
        while not env.done:
            last = env.act(env._env.expert_action())
        assert env.won and last.endswith(EPISODE_OVER) and env.get_reward() == expected
        steps = env._env.num_steps
        assert env.act("look") == EPISODE_OVER and env._env.num_steps == steps  # no step after the end
        env.reset(task_id=TASK)  # a pooled instance starts over
        assert not env.done and env.get_reward() == 0.0 and env.actions == []


def test_max_turns_ends_the_episode_for_trl():
    with SdarEnvFactory(None, RolloutConfig(family="household", max_turns=1)) as factory:
        env = factory()
        assert "Step 1 of 1." in env.reset(task_id=TASK)
        assert env.act("look").endswith(EPISODE_OVER) and env.done and env.act("look") == EPISODE_OVER
        assert env.actions == ["look"]


def test_a_session_the_server_dropped_is_reopened_at_reset():
    from sdar_envs.base import make_env
    from sdar_envs.client import EnvServerError

    class Dropped:  # what a RemoteEnv whose session was reclaimed does
        def reset(self, **kwargs):
            raise EnvServerError("session was idle and the server reclaimed it", code="CLOSED")

        def close(self):
            raise EnvServerError("already closed", code="CLOSED")

    opened = []

    def open_env():
        opened.append(make_env("household") if opened else Dropped())
        return opened[-1]

    env = SdarEnv(open_env, RolloutConfig(family="household"))
    assert env.reset(task_id=TASK).startswith("Task: ") and len(opened) == 2 and env.task_id == TASK


def test_task_dataset_gives_each_group_one_task():
    factory = SdarEnvFactory(None, "household")
    ds = factory.task_dataset("test", n=3, seed=1)
    assert ds.column_names == ["prompt", "task_id"] and len(ds) == 3
    assert set(ds["task_id"]) <= set(factory.task_ids("test"))
    assert ds[0]["prompt"] == [{"role": "user", "content": ""}]


def test_settings_trl_cannot_honour_are_refused():
    with pytest.raises(ValueError, match="constrained decoding"):
        SdarEnvFactory(None, RolloutConfig(constrained=True))
    with pytest.raises(ValueError, match="skills_in_prompt"):
        SdarEnvFactory(None, RolloutConfig(skills_in_prompt=True))
    with pytest.raises(ValueError, match="unknown reward 'won'"):
        SdarEnvFactory(None, "household", reward="won")
    with pytest.raises(ValueError, match="configure in-process envs"):
        SdarEnvFactory("http://127.0.0.1:1", "household", backend="sim")
    with pytest.raises(ValueError, match="no prompt template for family 'kitchen'"):
        chat_template("kitchen")
