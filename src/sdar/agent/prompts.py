"""Turn prompts for the student and for the privileged teacher.

The student sees: task, step count, memory (household), the last `history` (observation,
action) pairs, the current observation and the admissible actions. The teacher sees exactly the
student's prompt with "[Privileged Skill Information]\\n{skills}\\n\\n" added, placed as the
reference does (`placement="prefix"`: in front of the whole chat-templated prompt, before the system
turn; ZJU-REAL/SDAR verl/trainer/ppo/rlsd_ray_trainer.py, the teacher batch of `main_sdar`) or, as an
option, at the start of the user message (`placement="user"`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIVILEGED_HEADER = "[Privileged Skill Information]"
# where the privileged text goes: "prefix" = before the chat-templated prompt (the reference),
# "user" = at the start of the user message (this project's first placement)
from sdar.config import PLACEMENTS

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


def check_placement(placement: str) -> str:
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown privileged placement {placement!r}; choose one of {', '.join(PLACEMENTS)} "
                         "(rollout.privileged_placement)")
    return placement


def chat_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """The chat-templated token ids of `messages`, ending with the assistant's generation prompt."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def prefix_ids(tokenizer, skills: str) -> list[int]:
    """Token ids of the privileged prefix alone (placement "prefix" puts them before the chat)."""
    return list(tokenizer(privileged_prefix(skills), add_special_tokens=False)["input_ids"])


def fit_prompt_ids(tokenizer, builder: PromptBuilder, view: TurnView, max_tokens: int, skills: str | None = None,
                   placement: str = "prefix") -> tuple[list[int], int]:
    """Token ids of the turn's prompt within `max_tokens`, dropping history pairs first.

    skills: the privileged text, placed per `placement` (see PLACEMENTS); None = the student's prompt.
    Returns (ids, history_pairs_dropped). The skills are never cut: when the prompt cannot
    fit even with no history, a ValueError says by how much.
    """
    check_placement(placement)
    head = prefix_ids(tokenizer, skills) if skills is not None and placement == "prefix" else []
    in_user = skills if placement == "user" else None
    for h in range(builder.history, -1, -1):
        ids = head + chat_ids(tokenizer, builder.messages(view, skills=in_user, history=h))
        if len(ids) <= max_tokens:
            return ids, builder.history - h
    what = "the prompt (privileged skills + turn)" if skills is not None else "the prompt"
    raise ValueError(
        f"{what} needs {len(ids)} tokens with no history, over the limit of {max_tokens}; "
        "raise rollout.max_prompt_tokens (or teacher.max_prompt_tokens) or shorten the skills"
    )


def teacher_prompt_ids(tokenizer, builder: PromptBuilder, view: TurnView, student_ids: list[int],
                       history_dropped: int, skills: str, placement: str = "prefix",
                       skills_ids: list[int] | None = None) -> list[int]:
    """The privileged teacher's prompt for a turn the student saw as `student_ids`: exactly the student's
    context plus the privileged text, never rebuilt with more (or less) history than the student had.
    skills_ids: `prefix_ids(tokenizer, skills)` when the caller has it already (placement prefix; the turns of an
        episode share it).

    prefix: prefix ids + the student's very ids (token for token; the reference decodes the student
        prompt and re-encodes `prefix + text`, which is the same sequence since the chat starts with a
        special token). user: the same turn with the same history pairs, the skills in the user message.
    """
    if check_placement(placement) == "prefix":
        return (prefix_ids(tokenizer, skills) if skills_ids is None else list(skills_ids)) + list(student_ids)
    return chat_ids(tokenizer, builder.messages(view, skills=skills, history=builder.history - history_dropped))
