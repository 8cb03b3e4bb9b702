"""Generalized Jensen-Shannon divergence between student and teacher token distributions.

Used by the hint-distillation channel: M = beta*pT + (1-beta)*pS,
JSD = beta*KL(pT||M) + (1-beta)*KL(pS||M); beta = 0 is KL(pT||pS), beta = 1 is KL(pS||pT).
"""

from __future__ import annotations

import math

import torch

from sdar.algos._agg import aggregate, as_mask, upcast


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per position from log-probs [..., V] -> [...]; 0 * log 0 is taken as 0."""
    p = p_log.exp()
    return torch.where(p > 0, p * (p_log - q_log), torch.zeros_like(p)).sum(dim=-1)


def generalized_jsd(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.5,
    temperature: float = 1.0,
    top_k: int | None = None,
    agg: str = "token-mean",
    budget: int | None = None,
) -> torch.Tensor:
    """Generalized JSD per token, aggregated over `mask`.

    student_logits, teacher_logits: [B, T, V] next-token logits at the same positions
        (the teacher's context has the hint inserted); the teacher gets no gradient.
    mask: [B, T], 1 on the post-hint tokens that are distilled.
    beta: interpolation in [0, 1]; the end points are the KL limits, computed directly.
    temperature: both distributions are softmax(logits / temperature).
    top_k: when set, both distributions are restricted to the teacher's top-k tokens at
        each position and renormalised there.
    Returns a scalar (0 for an empty mask).
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1] (0 = KL(teacher||student), 1 = KL(student||teacher)), got {beta}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} and teacher logits {tuple(teacher_logits.shape)} differ; "
            "align them on the same positions and vocabulary"
        )
    s = upcast(student_logits) / temperature
    t = upcast(teacher_logits.detach()) / temperature
    if top_k is not None:
        if not 0 < top_k <= t.shape[-1]:
            raise ValueError(f"top_k must be in 1..{t.shape[-1]} (the vocabulary size), got {top_k}")
        idx = t.topk(top_k, dim=-1).indices
        s, t = s.gather(-1, idx), t.gather(-1, idx)
    s_log = torch.log_softmax(s, dim=-1)
    t_log = torch.log_softmax(t, dim=-1)
    if beta == 0.0:
        per_token = _kl(t_log, s_log)
    elif beta == 1.0:
        per_token = _kl(s_log, t_log)
    else:
        m_log = torch.logsumexp(
            torch.stack([t_log + math.log(beta), s_log + math.log(1.0 - beta)]), dim=0
        )
        per_token = beta * _kl(t_log, m_log) + (1.0 - beta) * _kl(s_log, m_log)
    return aggregate(per_token, as_mask(mask, per_token), agg, budget)
