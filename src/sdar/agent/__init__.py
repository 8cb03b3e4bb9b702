"""The agent side of a rollout: prompts, action parsing, memory, generation backends and
the lock-step multi-turn loop that drives many environment sessions at once."""

from sdar.agent.parsing import ParsedAction, parse_response
from sdar.agent.prompts import PRIVILEGED_HEADER, PromptBuilder, privileged_prefix
from sdar.agent.rollout import RolloutConfig, Trajectory, Turn, rollout

__all__ = [
    "PRIVILEGED_HEADER",
    "ParsedAction",
    "PromptBuilder",
    "RolloutConfig",
    "Trajectory",
    "Turn",
    "parse_response",
    "privileged_prefix",
    "rollout",
]
