"""The families' observation-only rule experts, served as teachers for N-teacher trace replay: each reads only the
chat messages the agent saw, read back into the turn they were built from (`read_turn`), and answers in the family's
canonical format; never the environment's state. The experts themselves live with their families in sdar_envs
(`sdar_envs.<family>.rule_expert`: household, shop, searchqa).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sdar_envs.household.rule_expert import household_rule_action
from sdar_envs.searchqa.rule_expert import searchqa_rule_action
from sdar_envs.shop.rule_expert import shop_rule_action
from sdar_envs.transcript import EXPERT_VARIANTS

from sdar.agent.parsing import format_action
from sdar.agent.prompts import TurnView

__all__ = ["EXPERT_VARIANTS", "Expert", "read_turn", "rule_expert"]

Expert = Callable[[list[dict[str, str]]], str]
_POLICIES: dict[str, Callable[[TurnView, str], str]] = {
    "household": household_rule_action,
    "shop": shop_rule_action,
    "searchqa": searchqa_rule_action,
}


def rule_expert(family: str, variant: str = "default") -> Expert:
    """The rule expert of `family`: messages (as `PromptBuilder.messages` builds them, possibly with
    the privileged text in the user message) -> the response, `format_action(family, action)`."""
    if family not in _POLICIES:
        raise ValueError(f"no rule expert for family {family!r}; choose one of {', '.join(_POLICIES)}")
    if variant not in EXPERT_VARIANTS:
        raise ValueError(f"unknown rule-expert variant {variant!r}; choose one of {', '.join(EXPERT_VARIANTS)}")
    policy = _POLICIES[family]

    def expert(messages: list[dict[str, str]]) -> str:
        return format_action(family, policy(read_turn(messages, family), variant))

    expert.__name__ = f"{family}_rule_expert_{variant}"
    return expert


# ---- reading the prompt back ------------------------------------------------------------------
_HEADER = re.compile(r"(?m)^Task: (?P<task>.*)\nStep (?P<step>\d+) of (?P<max>\d+)\.$")
_SHOP_ACTION = re.compile(r"(?:search|click)\[[^\]]*\]")


def read_turn(messages: list[dict[str, str]], family: str) -> TurnView:
    """The `TurnView` a user message was rendered from (`PromptBuilder.user_text` read backwards);
    a privileged prefix is skipped. Observations may span lines; actions are one line each."""
    content = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "")
    if isinstance(content, list):  # OpenAI content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    user = content if isinstance(content, str) else ""
    heads = list(_HEADER.finditer(user))
    if not heads:
        raise ValueError("the user message has no 'Task: ...' / 'Step k of N.' header; "
                         "build it with sdar.agent.prompts.PromptBuilder")
    head = heads[-1]
    body = user[head.end():]
    cut = body.rfind("\nNow: ")
    if cut < 0:
        raise ValueError("the user message has no 'Now: <observation>' line")
    recent, now = body[:cut], body[cut + len("\nNow: "):]
    memory = ""
    if family == "household":
        at = now.rfind("\nSeen: ")
        if at >= 0:
            now, memory = now[:at], now[at + 1:]
    admissible: list[str] = []
    at = now.rfind("\nAdmissible actions: ")
    if at >= 0:
        listed = now[at + len("\nAdmissible actions: "):].split("\n", 1)[0]
        now = now[:at]
        # shop options never hold ", " today, but the bracket pattern does not rely on it
        admissible = _SHOP_ACTION.findall(listed) if family == "shop" else listed.split(", ")
    history: list[tuple[str, str]] = []
    for chunk in re.split(r"\nObservation: ", recent)[1:]:
        obs, _, act = chunk.rpartition("\nAction: ")
        history.append((obs, act.strip()))
    return TurnView(task=head["task"], step=int(head["step"]) - 1, max_steps=int(head["max"]),
                    observation=now, admissible_actions=admissible, history=history, memory=memory)
