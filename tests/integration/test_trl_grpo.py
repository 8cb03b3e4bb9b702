"""One TRL `GRPOTrainer` step on a household server through `sdar.integrations.trl`: TRL opens one
session per rollout, its prompts are ours, the model's `<action>` replies step the server, and the
env's reward reaches TRL's reward log."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")

from sdar_envs.client import http_json  # noqa: E402
from sdar_envs.launcher import serve_in_background  # noqa: E402
from tests.integration.trl_tiny import scripted_bias, tiny_policy  # noqa: E402

OPERATOR = "operator-token-for-trl-tests-0123456789"
MAX_TURNS = 2  # the episode ends after two actions; a third call of `act` must not step the env


@pytest.fixture(scope="module")
def household_server():
    url, handle = serve_in_background("household", operator_token=OPERATOR)
    yield url
    handle.stop()



def test_one_grpo_step_plays_the_server(household_server, tmp_path, monkeypatch):
    from trl import GRPOConfig, GRPOTrainer

    from sdar.config import RolloutConfig
    from sdar.integrations.trl import EPISODE_OVER, SdarEnv, SdarEnvFactory

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is experimental in TRL 1.16
    tokenizer, model = tiny_policy()
    seen = []

    def spy(prompts, completions, **kwargs):  # records what TRL scored; 0, 1, ...: a group with a spread to learn from
        seen.extend(zip(prompts, completions))
        return [float(i) for i in range(len(prompts))]

    args = GRPOConfig(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, num_generations=2,
        max_completion_length=1536, max_tool_calling_iterations=MAX_TURNS + 1, learning_rate=1e-3,
        use_cpu=True, bf16=False, report_to="none", logging_steps=1, save_strategy="no", seed=0,
        generation_kwargs={"sequence_bias": scripted_bias(tokenizer, "<action>look</action>")},
    )
    with SdarEnvFactory(household_server, RolloutConfig(family="household", max_turns=MAX_TURNS)) as factory:
        dataset = factory.task_dataset("train", n=1, seed=3)
        trainer = GRPOTrainer(model, reward_funcs=[spy], args=args, processing_class=tokenizer,
                              train_dataset=dataset, environment_factory=factory)
        trainer.train()

        # the server: one session per rollout, each stepped MAX_TURNS times (not on the extra call)
        listed = http_json("GET", f"{household_server}/sessions", token=OPERATOR)["sessions"]
        assert len(factory.envs) == 2 and len(listed) == 2
        assert sorted(s["step_count"] for s in listed) == [MAX_TURNS, MAX_TURNS]
        for env in factory.envs:
            assert isinstance(env, SdarEnv) and env.actions == ["look"] * MAX_TURNS and env.done
            assert env.task_id == dataset[0]["task_id"]
    assert http_json("GET", f"{household_server}/sessions")["active"] == 0  # closed with the factory

    # what TRL scored: our first-turn text as the prompt, then reply, next turn, reply, end, reply, end,
    # and a last reply whose call TRL no longer runs (max_tool_calling_iterations)
    assert len(seen) == 2
    for prompt, completion in seen:
        assert prompt[-1]["content"].startswith("Task: ") and "Step 1 of 2." in prompt[-1]["content"]
        calls = [m["tool_calls"][0]["function"] for m in completion if m.get("tool_calls")]
        assert calls == [{"name": "act", "arguments": {"action": "look"}}] * (MAX_TURNS + 2)
        results = [m["content"] for m in completion if m["role"] == "tool"]
        assert "Step 2 of 2." in results[0] and results[1].endswith(EPISODE_OVER) and results[2] == EPISODE_OVER

    logs = trainer.state.log_history[0]
    assert trainer.state.global_step == 1 and math.isfinite(logs["grad_norm"])
    assert logs["rewards/SdarEnv/mean"] == 0.0 and logs["tools/call_frequency"] == MAX_TURNS + 1
    assert logs["tools/failure_frequency"] == 0.0
