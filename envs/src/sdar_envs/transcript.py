"""One turn as the agent saw it: what the families' observation-only rule experts answer from.

Each family's `rule_expert` module (household, shop, searchqa) maps a `Turn` and a variant to the next action, reading
only what the agent's prompt showed (task, recent turns, observation, admissible list, household memory), never the
environment's state. sdar reads a `Turn` back from a prompt's messages (`sdar.replay.experts.read_turn`: its
`TurnView` is one) and serves the experts as replay teachers.
"""

from __future__ import annotations

from typing import Protocol

# "default" and "b" differ in a few decisions each (household: the search order and tie-breaks; shop: the query;
# searchqa: the wording of some searches), so a pool of both agrees on most turns (77-85% of an expert's own turns)
# and disagrees on some
EXPERT_VARIANTS: tuple[str, ...] = ("default", "b")


class Turn(Protocol):
    """A turn's prompt, read back.

    step: 0-based, of max_steps. history: (observation, action) pairs shown, oldest first. memory: the household's
    memory block ("" elsewhere, or when the prompt has none).
    """

    task: str
    step: int
    max_steps: int
    observation: str
    admissible_actions: list[str]
    history: list[tuple[str, str]]
    memory: str
