"""Privileged skills: per family a library of general skills, keyed skills and common mistakes.

`SkillLibrary.render(key)` is the text the privileged teacher sees; retrieval is rule-based
(the family maps a task to a key: task type, shop keyword, question type).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SkillLibrary:
    """Skills of one family.

    general: skills that apply to every task of the family.
    by_key: skills for one retrieval key (a task type, a product keyword, a question type).
    mistakes: common mistakes per key ("*" applies to every key).
    """

    family: str
    general: list[str] = field(default_factory=list)
    by_key: dict[str, list[str]] = field(default_factory=dict)
    mistakes: dict[str, list[str]] = field(default_factory=dict)

    def keys(self) -> list[str]:
        return sorted(self.by_key)

    def render(self, key: str | None, *, general: bool = True, common_mistakes: bool = True) -> str:
        """The privileged text for `key`: general skills, then the key's skills and mistakes.

        general / common_mistakes: include the family-wide skills / the "*" mistakes; a compact text for a
        tiny model's teacher prompt leaves them out (ShopConfig / SearchQAConfig `compact_skills`).
        """
        if key is not None and key not in self.by_key:
            raise KeyError(f"no skills for key {key!r} in family {self.family!r}; known keys: {', '.join(self.keys())}")
        lines = ["General skills:"] + [f"- {s}" for s in self.general] if general else []
        if key is not None:
            lines += [f"Skills for {key}:"] + [f"- {s}" for s in self.by_key[key]]
        mistakes = (list(self.mistakes.get("*", [])) if common_mistakes else []) + (
            list(self.mistakes.get(key, [])) if key else [])
        if mistakes:
            lines += ["Common mistakes to avoid:"] + [f"- {m}" for m in mistakes]
        return "\n".join(lines)
