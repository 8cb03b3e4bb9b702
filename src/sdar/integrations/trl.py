"""sdar's environments as TRL `GRPOTrainer` environments (`environment_factory`, TRL >= 1.16).

One `SdarEnv` per rollout holds one env session (a server's, or an in-process env) and exposes a single
tool, `act(action)`; the tokenizer gets our prompts' chat template and a response template that reads
`<action>X</action>` as a call of `act`. What a TRL user gives up against `sdar train`: docs/trl.md.

    factory = SdarEnvFactory("http://127.0.0.1:8000", RolloutConfig(family="household", max_turns=10))
    trainer = GRPOTrainer(model, args=GRPOConfig(max_tool_calling_iterations=10, ...),
                          processing_class=prepare_tokenizer(tokenizer, "household"),
                          train_dataset=factory.task_dataset("train"), environment_factory=factory)
"""

from __future__ import annotations

import json
import random
import urllib.parse
from typing import Any, Callable

try:
    import trl  # noqa: F401 - checked here so a missing extra fails at import, with the fix
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(f"sdar.integrations.trl needs TRL ({exc}); install it with `pip install 'sdar[trl]'`") from exc
import transformers
from packaging.version import Version

from sdar.agent.parsing import format_action, parse_response
from sdar.agent.prompts import SYSTEM_PROMPTS, PromptBuilder
from sdar.agent.rollout import EpisodeState, Trajectory, episode_reward
from sdar.config import FAMILY_DEFAULTS, REWARDS, RolloutConfig
from sdar_envs.base import make_env
from sdar_envs.client import EnvServerError, RemoteEnv, http_json

TOOL = "act"  # the one tool every SdarEnv exposes
EPISODE_OVER = "The episode is over."  # what `act` says once the episode has ended (TRL cannot end it)


# ---- the text side: prompts as ours, replies parsed as `act` calls ------------------------------------
def _quote(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid Jinja string literal


def chat_template(family: str) -> str:
    """ChatML as sdar renders it (Qwen2.5's template without its tools block), so a TRL prompt is token for
    token our prompt: system = the family's SYSTEM_PROMPTS entry unless the conversation has one; an `act`
    call is written as the model writes it (`<action>X</action>`; search-QA's action is already tagged);
    a tool result is the next user turn. Other tools' calls render as Qwen's `<tool_call>{json}</tool_call>`."""
    if family not in SYSTEM_PROMPTS:
        raise ValueError(f"no prompt template for family {family!r}; choose one of {', '.join(SYSTEM_PROMPTS)}")
    open_, close = ("", "") if family == "searchqa" else ("<action>", "</action>")
    return (
        "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>system\\n' + " + _quote(SYSTEM_PROMPTS[family]) + " + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- for message in messages %}"
        "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
        "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
        "{%- for call in message.tool_calls or [] %}"
        "{%- if call.function is defined %}{%- set call = call.function %}{%- endif %}"
        f"{{%- if call.name == '{TOOL}' %}}"
        "{{- " + _quote(open_) + " + (call.arguments.action | default('')) + " + _quote(close) + " }}"
        "{%- else %}{{- '<tool_call>' + ({'name': call.name, 'arguments': call.arguments} | tojson) + '</tool_call>' }}"
        "{%- endif %}{%- endfor %}{{- '<|im_end|>\\n' }}"
        "{%- elif message.role == 'tool' %}{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


def response_template(family: str) -> dict[str, Any]:
    """A transformers `response_template` that turns a reply into a message whose one tool call is
    `act(action=...)`: household/shop take the body of `<action>...</action>`, search-QA the whole
    `<search>q</search>` or `<answer>a</answer>` block (what sdar sends). The text around it is `content`.
    Several blocks in one reply: the last one is played (sdar counts that reply as a format error)."""
    # a block opens only once its closing tag is there: a reply cut off inside it is no call (sdar: a format error)
    if family == "searchqa":  # zero-width delimiters keep the tags in the action
        delims = {"open_pattern": r"(?=<(search|answer)>.*?</\1>)", "close_pattern": r"(?<=</search>|</answer>)"}
    else:
        delims = {"open_pattern": r"<action>(?=.*?</action>)", "close": "</action>"}
    call = {"type": "function", "function": {"name": TOOL, "arguments": {"action": "{content}"}}}
    return {
        "defaults": {"role": "assistant"},
        "start_anchor": "<|im_start|>assistant\n",
        "fields": {
            "tool_calls": {**delims, "content": "text", "transform": [call]},
            "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text", "repeats": True, "join": ""},
        },
    }


def prepare_tokenizer(tokenizer, family: str):
    """Set `tokenizer`'s chat template and response template for `family` (in place); returns it.

    The tokenizer must write ChatML (`<|im_start|>`/`<|im_end|>`): sdar's tiny tokenizer, Qwen2.5, SmolLM2."""
    if Version(transformers.__version__) < Version("5.13.0.dev0"):
        raise ImportError(
            f"parsing <action> replies as tool calls needs transformers >= 5.13 (response_template); "
            f"found {transformers.__version__}: `pip install 'sdar[trl]'`"
        )
    if tokenizer.convert_tokens_to_ids("<|im_end|>") in (None, tokenizer.unk_token_id):
        raise ValueError("the tokenizer has no <|im_end|> token; the TRL adapter writes ChatML "
                         "(Qwen2.5, SmolLM2, sdar's tiny tokenizer)")
    tokenizer.chat_template = chat_template(family)
    tokenizer.response_template = response_template(family)
    return tokenizer


# ---- the environment TRL drives -------------------------------------------------------------------------
class SdarEnv:
    """One rollout's environment: an env session, reset per episode, stepped by the `act` tool.

    open_env: opens the session (a `RemoteEnv` or an in-process env); called again, once, when a reset
        finds the server has dropped it. rollout: family, max_turns and the prompt settings. reward: REWARDS.
    TRL exposes every public method but `reset` and `get_reward` as a tool, so this class has one.
    After the episode ends (won, lost, out of steps or `max_turns`) `act` no longer steps the env and
    answers `EPISODE_OVER`; TRL keeps the rollout going until the model stops calling it,
    `max_tool_calling_iterations`, or `max_completion_length`.
    """

    def __init__(self, open_env: Callable[[], Any], rollout: RolloutConfig, reward: str = "env") -> None:
        self._open, self._cfg, self._reward_mode = open_env, rollout, reward
        self._env = open_env()
        self._builder = PromptBuilder(rollout.family, history=rollout.history, show_admissible=rollout.show_admissible)
        self._state: EpisodeState | None = None
        self.turn, self.reward, self.won, self.task_id = 0, 0.0, False, ""
        self.actions: list[str] = []  # what was sent to the env this episode

    def reset(self, task_id: str | None = None, seed: int | None = None, **row: Any) -> str:
        """Start an episode (on the dataset row's `task_id`, else one drawn with `seed`); returns our
        first turn's user text, which TRL appends to the row's (empty) user message."""
        try:
            first = self._env.reset(task_id=task_id, seed=seed)
        except EnvServerError:  # e.g. the server reclaimed the session while TRL was training: one new session
            self._close()
            self._env = self._open()
            first = self._env.reset(task_id=task_id, seed=seed)
        self._state = EpisodeState(first, self._cfg.family, self._cfg.use_memory, getattr(self._env, "task_text", ""))
        self.turn, self.reward, self.won, self.actions = 0, 0.0, False, []
        self.task_id = first.metadata.get("task_id") or task_id or ""
        return self._prompt()

    def act(self, action: str) -> str:
        """Take one action in the environment.

        Args:
            action: The action to take, one of the admissible actions.

        Returns:
            What the agent sees next, or that the episode is over.
        """
        state = self._state
        if state is None:
            raise RuntimeError("act() before reset(); TRL calls reset() first")
        if self.done:
            return EPISODE_OVER
        # the same normalisation (and length cap) sdar's rollout applies before stepping
        parsed = parse_response(format_action(self._cfg.family, action), self._cfg.family)
        result = self._env.step(parsed.action)
        self.actions.append(parsed.action)
        self.reward += float(result.reward)
        state.advance(parsed.action, result)
        self.turn += 1
        if result.done:
            self.won = bool(result.metadata.get("won", False))
        return f"{result.observation}\n{EPISODE_OVER}" if self.done else self._prompt()

    def get_reward(self) -> float:
        """The episode's reward (sdar's `rollout.episode_reward`): "env" = the sum of step rewards,
        "reference" = 10 x won for household and shop."""
        traj = Trajectory(self.task_id, "", 0, "", won=self.won, reward=self.reward)
        return episode_reward(traj, self._cfg.family, self._reward_mode)

    @property
    def done(self) -> bool:
        return self._state is not None and (self._state.done or self.turn >= self._cfg.max_turns)

    def _prompt(self) -> str:
        return self._builder.user_text(self._state.view(self.turn, self._cfg.max_turns))

    def _close(self) -> None:
        try:
            self._env.close()
        except Exception:  # a session the server already dropped has nothing left to close
            pass


def _family_rollout(family: str) -> RolloutConfig:
    keys = {k.split(".", 1)[1]: v for k, v in FAMILY_DEFAULTS.get(family, {}).items() if k.startswith("rollout.")}
    return RolloutConfig(family=family, **keys)


class SdarEnvFactory:
    """TRL's `environment_factory`: each call opens one more env session.

    url: a running env server (`sdar envs serve`); None = in-process envs built with `env_kwargs`.
    rollout: how episodes are played and prompted (family, max_turns, history, show_admissible,
        use_memory); a family name alone takes that family's defaults (FAMILY_DEFAULTS).
    reward: what `get_reward` returns, one of REWARDS ("env": summed step rewards; "reference").
    `close()` (or `with`) ends every session it opened; TRL never closes them itself.
    """

    def __init__(self, url: str | None = None, rollout: RolloutConfig | str = "household", *, reward: str = "env",
                 **env_kwargs: Any) -> None:
        self.rollout = _family_rollout(rollout) if isinstance(rollout, str) else rollout
        if self.rollout.constrained:
            raise ValueError("TRL samples freely; constrained decoding is sdar's own (set rollout.constrained false)")
        if self.rollout.skills_in_prompt:
            raise ValueError("the privileged skills are not in a TRL prompt (set rollout.skills_in_prompt false)")
        if reward not in REWARDS:
            raise ValueError(f"unknown reward {reward!r}; choose one of {', '.join(REWARDS)}")
        if url is not None and env_kwargs:
            raise ValueError(f"env kwargs {sorted(env_kwargs)} configure in-process envs (url=None); "
                             "a server has its own")
        self.url, self.reward, self.env_kwargs = url, reward, env_kwargs
        self.envs: list[SdarEnv] = []  # every instance handed to TRL, for close()

    @property
    def family(self) -> str:
        return self.rollout.family

    def __call__(self) -> SdarEnv:
        env = SdarEnv(self._open, self.rollout, self.reward)
        self.envs.append(env)
        return env

    def _open(self) -> Any:
        return make_env(self.family, **self.env_kwargs) if self.url is None else RemoteEnv(self.url, self.family)

    def task_ids(self, split: str = "train") -> list[str]:
        if self.url is None:
            probe = make_env(self.family, **self.env_kwargs)
            try:
                return list(probe.task_ids(split))
            finally:
                probe.close()
        url = f"{self.url.rstrip('/')}/tasks?split={urllib.parse.quote(split)}"
        return list(http_json("GET", url)["task_ids"])

    def task_dataset(self, split: str = "train", n: int | None = None, seed: int = 0):
        """A `datasets.Dataset` of (empty user prompt, task_id), `n` tasks of `split` drawn with `seed` (all
        when None). TRL repeats each row for its `num_generations` rollouts, so a group plays one task;
        without a dataset each rollout draws its own task and GRPO's group baseline compares different tasks."""
        from datasets import Dataset

        ids = self.task_ids(split)
        if n is not None:
            ids = random.Random(seed).sample(ids, min(n, len(ids)))
        return Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * len(ids), "task_id": ids})

    def close(self) -> None:
        envs, self.envs = self.envs, []
        for env in envs:
            env._close()

    def __enter__(self) -> SdarEnvFactory:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["EPISODE_OVER", "TOOL", "SdarEnv", "SdarEnvFactory", "chat_template", "prepare_tokenizer",
           "response_template"]
