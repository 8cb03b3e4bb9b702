"""Composer channel 2, hint distillation at error sites: the hint text for a marked step and the
teacher's context (the student's with the hint inserted at that turn). The full next-token logits both
need for the generalized JSD (`sdar.algos.generalized_jsd`, ALGORITHM.md section 5) come from the
Scorer (`sdar.models.scorer.Scorer.response_logits`).

Hints come from each family's templates (`hint_template_key` -> text), filled from the step's
`error_args`, which hold only what the agent observed (the action it took, the names it saw).
"""

from __future__ import annotations


HINT_HEADER = "\n\n[Hint] "


class _Blank(dict):
    def __missing__(self, key: str) -> str:
        return f"<{key}>"


def hint_templates(family: str) -> dict[str, str]:
    """The family's `hint_template_key` -> template text."""
    if family == "household":
        from sdar_envs.household.skills import HINT_TEMPLATES
    elif family == "shop":
        from sdar_envs.shop.skills import HINTS as HINT_TEMPLATES
    elif family == "searchqa":
        from sdar_envs.searchqa.skills import HINT_TEMPLATES
    else:
        raise ValueError(f"no hint templates for family {family!r}; choose household, shop or searchqa")
    return HINT_TEMPLATES


def render_hint(family: str, key: str, args: dict | None = None) -> str:
    """The hint for a step marked with `key`, its `{fields}` filled from `args` (unknown ones as <field>)."""
    templates = hint_templates(family)
    if key not in templates:
        raise KeyError(f"no {family} hint template {key!r}; known keys: {', '.join(sorted(templates))}")
    return templates[key].format_map(_Blank({k: str(v) for k, v in (args or {}).items() if v}))


def hint_prompt_ids(tokenizer, student_ids: list[int], hint: str) -> list[int]:
    """The student's prompt ids with `HINT_HEADER + hint` inserted at the end of its last message,
    just before that message's `<|im_end|>` (the chat template then opens the assistant turn): the
    student's exact context, token for token, plus the hint at the turn it concerns."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    where = max((k for k, t in enumerate(student_ids) if t == end), default=None)
    if where is None:
        raise ValueError("the student prompt has no <|im_end|> token: not a chat-templated prompt, nowhere to put the hint")
    hint_ids = tokenizer(HINT_HEADER + hint, add_special_tokens=False)["input_ids"]
    return student_ids[:where] + hint_ids + student_ids[where:]
