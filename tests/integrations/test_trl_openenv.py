"""One TRL `GRPOTrainer` step on a household server through TRL's own OpenEnv path, without sdar's adapter.

TRL's documented way to train on an OpenEnv environment (TRL docs/source/openenv.md, examples/scripts/openenv/
echo.py) is an `environment_factory` class whose `__init__` opens an OpenEnv client on the server's URL, whose
`reset(**row)` resets it and returns the first observation, whose public methods are the tools (each a
`client.step(...)`), and, in TRL 1.16, a `get_reward()` through which the environment owns the reward (reward
functions become optional; they still get the instances as `environments`). Here that class holds OpenEnv's
`GenericEnvClient` (openenv 0.10), used synchronously as TRL's examples use their clients, against a real
`sdar-envs` household server. sdar's own adapter (`sdar.integrations.trl`, with sdar's prompts and rewards) has
its GRPO step in tests/integration/test_trl_grpo.py.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")

from sdar_envs.client import http_json  # noqa: E402
from sdar_envs.launcher import serve_in_background  # noqa: E402
from tests.integration.trl_tiny import scripted_bias, tiny_policy  # noqa: E402 - sdar's tokenizer, not its adapter

OPERATOR = "operator-token-for-trl-openenv-0123456789"
CALLS = 2  # max_tool_calling_iterations: each rollout steps the server twice


@pytest.fixture(scope="module")
def household_server():
    url, handle = serve_in_background("household", operator_token=OPERATOR, in_process=True)
    yield url
    handle.stop()


def openenv_tool_env(url: str, opened: list):
    """The environment class a TRL user writes for an OpenEnv server (TRL's `EchoToolEnv` pattern)."""
    from openenv.core.generic_client import GenericEnvClient

    class HouseholdToolEnv:
        def __init__(self):
            self.client = GenericEnvClient(base_url=url)  # the URL captured from the enclosing scope, as TRL documents
            self.reward, self.done, self.actions = 0.0, False, []
            opened.append(self)

        def reset(self, task_id: str | None = None, **kwargs) -> str:
            result = self.client.reset(task_id=task_id)
            self.reward, self.done, self.actions = 0.0, False, []
            self.task_id = result.observation["task_id"]
            return result.observation["text"]

        def act(self, action: str) -> str:
            """
            Take one action in the household.

            Args:
                action: The action to take, e.g. 'look' or 'go to fridge 1'.

            Returns:
                What the agent sees next.
            """
            if self.done:
                raise ValueError("The episode is over.")
            result = self.client.step({"message": action})
            self.actions.append(action)
            self.reward += float(result.reward or 0.0)
            self.done = result.done
            return result.observation["text"]

        def get_reward(self) -> float:  # TRL 1.16: the environment owns the reward (not a tool)
            return self.reward

    return HouseholdToolEnv



def test_grpo_step_through_trl_openenv_path(household_server, tmp_path, monkeypatch):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer


    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is experimental in TRL 1.16
    tokenizer, model = tiny_policy()
    task = http_json("GET", f"{household_server}/tasks?split=train")["task_ids"][0]
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "Solve the household task."}]], "task_id": [task]})
    opened: list = []
    scored: list = []  # (environment, completion) pairs TRL scored

    def spy(environments, completions, **kwargs):  # records what TRL scored; None: no reward of its own
        scored.extend(zip(environments, completions))
        return [None] * len(completions)

    args = GRPOConfig(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, num_generations=2,
        max_completion_length=1024, max_tool_calling_iterations=CALLS, learning_rate=1e-3,
        use_cpu=True, bf16=False, report_to="none", logging_steps=1, save_strategy="no", seed=0,
        generation_kwargs={"sequence_bias": scripted_bias(tokenizer, "<action>look</action>")},
    )
    trainer = GRPOTrainer(model, reward_funcs=[spy], args=args, processing_class=tokenizer,
                          train_dataset=dataset, environment_factory=openenv_tool_env(household_server, opened))
    try:
        trainer.train()
        # the server saw it: one WebSocket session per rollout, each reset on the row's task and stepped CALLS times
        listed = http_json("GET", f"{household_server}/sessions", token=OPERATOR)["sessions"]
        assert len(opened) == 2 and len(listed) == 2
        assert sorted(s["step_count"] for s in listed) == [CALLS, CALLS]
        for env in opened:
            assert env.task_id == task and env.actions == ["look"] * CALLS
            state = env.client.state()
            assert state["task_id"] == task and state["step_count"] == CALLS and len(state["observations"]) == CALLS + 1
        # what TRL fed back to the model as tool results is what the server answered, step for step
        assert len(scored) == 2
        for env, completion in scored:
            results = [m["content"] for m in completion if m["role"] == "tool"]
            assert results == env.client.state()["observations"][1:]
    finally:
        for env in opened:
            env.client.close()
    assert http_json("GET", f"{household_server}/sessions")["active"] == 0

    logs = trainer.state.log_history[0]
    assert trainer.state.global_step == 1 and math.isfinite(logs["grad_norm"])
    assert logs["tools/call_frequency"] == CALLS and logs["tools/failure_frequency"] == 0.0
    assert logs["rewards/HouseholdToolEnv/mean"] == 0.0  # `look` twice wins nothing: the env's reward, via get_reward
