"""Composer channel 2, hint distillation at error sites: the hint text for a marked step, the
teacher's context (the student's with the hint inserted at that turn), and the full next-token
logits both need for the generalized JSD (`sdar.algos.generalized_jsd`, ALGORITHM.md section 5).

Hints come from each family's templates (`hint_template_key` -> text), filled from the step's
`error_args`, which hold only what the agent observed (the action it took, the names it saw).
"""

from __future__ import annotations

import torch

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


def response_logits(model, prompts: list[list[int]], responses: list[list[int]], *, pad_id: int,
                    allowed: list | None = None, grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token logits at the positions that predict each response token, float32 [B, T, V], and the
    response mask [B, T]. With `allowed` (constrained decoding) the disallowed tokens are set to -1e9, so
    softmax gives the renormalised distribution the student sampled from (as `response_logprobs` does)."""
    from sdar.models.scoring import allowed_mask
    from sdar.models.logprobs import position_ids_from_mask

    B = len(prompts)
    T = max((len(r) for r in responses), default=0)
    L = max(len(p) + len(r) for p, r in zip(prompts, responses))
    device = next(model.parameters()).device
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    att = torch.zeros(B, L, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        att[i, : len(p) + len(r)] = 1
    with torch.set_grad_enabled(grad):
        logits = model(input_ids=ids.to(device), attention_mask=att.to(device),
                       position_ids=position_ids_from_mask(att.to(device)), use_cache=False).logits.float()
        if allowed is not None and any(a is not None for a in allowed):
            keep = allowed_mask(prompts, responses, allowed, L, logits.shape[-1]).to(device)
            logits = logits.masked_fill(~keep, -1e9)
        V = logits.shape[-1]
        out = logits.new_zeros(B, T, V)
        mask = torch.zeros(B, T, device=device)
        rows = []
        for i, (p, r) in enumerate(zip(prompts, responses)):
            rows.append(torch.cat([logits[i, len(p) - 1 : len(p) - 1 + len(r)], logits.new_zeros(T - len(r), V)]))
            mask[i, : len(r)] = 1.0
        out = torch.stack(rows) if rows else out
    return out, mask
