"""Parse a model response into an environment action, flagging format errors.

Household and shop answer `<think>...</think><action>X</action>`; search-QA answers
`<think>...</think><search>q</search>` or `<answer>a</answer>` (sent to the env verbatim).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TAG = {name: re.compile(rf"<{name}>(.*?)</{name}>", re.DOTALL) for name in ("think", "action", "search", "answer")}


@dataclass
class ParsedAction:
    """action: what is sent to the environment; valid_format: the response followed the
    format; admissible: the action is in the admissible list (True where there is none);
    error: why it is invalid ("" when valid)."""

    action: str
    valid_format: bool
    admissible: bool
    error: str = ""

    @property
    def valid(self) -> bool:
        return self.valid_format and self.admissible


def format_action(family: str, action: str) -> str:
    """The canonical response for an action (what the expert imitation targets and what
    constrained decoding allows): `<action>X</action>`; search-QA actions are already tagged."""
    return action if family == "searchqa" else f"<action>{action}</action>"


def parse_response(
    text: str,
    family: str,
    admissible_actions: list[str] | None = None,
    require_think: bool = False,
    max_action_chars: int = 512,
) -> ParsedAction:
    """Extract the action from a response.

    text: the decoded response. family: "household" | "shop" | "searchqa".
    admissible_actions: the valid actions now; an action outside it is flagged (the
        environment still receives it and answers with its own error markers).
    require_think: a missing <think> block counts as a format error.
    """
    thinks = _TAG["think"].findall(text)
    if family == "searchqa":
        found = [(m.start(), name, m.group(1)) for name in ("search", "answer") for m in _TAG[name].finditer(text)]
        if len(found) != 1:
            err = "no <search> or <answer> block" if not found else "more than one <search>/<answer> block"
            return ParsedAction(text.strip()[:max_action_chars], False, True, err)
        _, name, body = found[0]
        ok = bool(thinks) or not require_think
        return ParsedAction(f"<{name}>{body.strip()}</{name}>", ok, True, "" if ok else "missing <think> block")
    actions = _TAG["action"].findall(text)
    if len(actions) != 1:
        err = "no <action> block" if not actions else "more than one <action> block"
        return ParsedAction(text.strip()[:max_action_chars], False, False, err)
    action = " ".join(actions[0].strip().split())[:max_action_chars]
    if require_think and not thinks:
        return ParsedAction(action, False, True, "missing <think> block")
    if admissible_actions and not is_admissible(action, admissible_actions):
        return ParsedAction(action, True, False, "action not admissible")
    return ParsedAction(action, True, True)


# an admissible entry with a free-text slot, as the shop lists its search box: "search[<query>]"
_SLOT = re.compile(r"^(\w+)\[<\w+>\]$")


def is_admissible(action: str, admissible_actions: list[str]) -> bool:
    """`action` is listed, or fills a listed free-text template (`search[<query>]` admits `search[red mug]`)."""
    if action in admissible_actions:
        return True
    for entry in admissible_actions:
        m = _SLOT.match(entry)
        if m and action.startswith(m.group(1) + "[") and action.endswith("]") and len(action) > len(m.group(1)) + 2:
            return True
    return False
