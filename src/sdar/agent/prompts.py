"""Turn prompts for the student and for the privileged teacher.

The student sees: task, step count, memory (household), the last `history` (observation,
action) pairs, the current observation and the admissible actions. The teacher sees the same
text with "[Privileged Skill Information]\\n{skills}\\n\\n" prepended to the user message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIVILEGED_HEADER = "[Privileged Skill Information]"

SYSTEM_PROMPTS = {
    "household": (
        "You are an agent in a household. Reply with <action>one admissible action</action>, "
        "optionally after <think>brief reasoning</think>."
    ),
    "shop": (
        "You are a shopping agent in a web store. Reply with <action>search[query] or "
        "click[button]</action>, optionally after <think>brief reasoning</think>."
    ),
    "searchqa": (
        "Answer the question. Reply with <search>query</search> to search the knowledge base "
        "or <answer>short answer</answer>, optionally after <think>brief reasoning</think>."
    ),
}


def privileged_prefix(skills: str) -> str:
    """The text prepended to the teacher's prompt."""
    return f"{PRIVILEGED_HEADER}\n{skills}\n\n"


@dataclass
class TurnView:
    """What the prompt of one turn is built from."""

    task: str
    step: int
    max_steps: int
    observation: str
    admissible_actions: list[str] = field(default_factory=list)
    history: list[tuple[str, str]] = field(default_factory=list)  # (observation, action), oldest first
    memory: str = ""


@dataclass
class PromptBuilder:
    """Builds chat messages for one family.

    history: how many past (observation, action) pairs to show (paper: 2; 4 for search).
    show_admissible: list the admissible actions (families that have them).
    """

    family: str
    history: int = 2
    show_admissible: bool = True

    def __post_init__(self) -> None:
        if self.family not in SYSTEM_PROMPTS:
            raise ValueError(f"no prompt template for family {self.family!r}; choose one of {', '.join(SYSTEM_PROMPTS)}")

    def user_text(self, view: TurnView, history: int | None = None) -> str:
        h = self.history if history is None else history
        lines = [f"Task: {view.task}", f"Step {view.step + 1} of {view.max_steps}."]
        past = view.history[-h:] if h > 0 else []
        if past:
            lines.append("Recent:")
            for obs, act in past:
                lines.append(f"Observation: {obs}")
                lines.append(f"Action: {act}")
        lines.append(f"Now: {view.observation}")
        if self.show_admissible and view.admissible_actions:
            lines.append("Admissible actions: " + ", ".join(view.admissible_actions))
        if view.memory:  # last: what the agent tracked (seen, held, where to search next)
            lines.append(view.memory)
        return "\n".join(lines)

    def messages(self, view: TurnView, skills: str | None = None, history: int | None = None) -> list[dict[str, str]]:
        """Chat messages; with `skills`, the privileged teacher's version of the same turn."""
        user = self.user_text(view, history)
        if skills is not None:
            user = privileged_prefix(skills) + user
        return [{"role": "system", "content": SYSTEM_PROMPTS[self.family]}, {"role": "user", "content": user}]


def fit_prompt_ids(tokenizer, builder: PromptBuilder, view: TurnView, max_tokens: int, skills: str | None = None) -> tuple[list[int], int]:
    """Token ids of the turn's prompt within `max_tokens`, dropping history pairs first.

    Returns (ids, history_pairs_dropped). The skills are never cut: when the prompt cannot
    fit even with no history, a ValueError says by how much.
    """
    for h in range(builder.history, -1, -1):
        ids = tokenizer.apply_chat_template(
            builder.messages(view, skills=skills, history=h), add_generation_prompt=True, tokenize=True
        )
        if hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        ids = list(ids)
        if len(ids) <= max_tokens:
            return ids, builder.history - h
    what = "the prompt (privileged skills + turn)" if skills is not None else "the prompt"
    raise ValueError(
        f"{what} needs {len(ids)} tokens with no history, over the limit of {max_tokens}; "
        "raise max_prompt_tokens (or teacher_max_prompt_tokens) or shorten the skills"
    )
