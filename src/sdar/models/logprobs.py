"""Per-token log-probabilities (and entropies) of a causal LM on padded batches, in float32.

This is how the trainer turns a model into the `logp`, `old_logp`, `ref_logp` and `teacher_logp`
tensors that `sdar.algos` consumes.
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from sdar.models.kv_cache import cache_of
from sdar.models.logits import process_logits


class _LogpEntropy(torch.autograd.Function):
    """log p(target) and the entropy from [N, V] logits in one fused pass, with a hand-written backward.

    Autograd through logsumexp + softmax * logits keeps several [N, V] tensors alive and walks
    them many times; here backward keeps only the logits and recomputes p once:
    d logp/dz = onehot(target) - p,  dH/dz = -p * (log p + H).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, want_entropy: bool):
        lse = torch.logsumexp(logits, dim=-1)
        logp = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1) - lse
        if want_entropy:
            p = torch.exp(logits - lse.unsqueeze(-1))
            ent = lse - (p * logits).sum(-1)
            del p
        else:
            ent = torch.zeros_like(lse)
        ctx.save_for_backward(logits, target, lse, ent)
        ctx.want_entropy = want_entropy
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp: torch.Tensor, g_ent: torch.Tensor):
        logits, target, lse, ent = ctx.saved_tensors
        log_p = logits - lse.unsqueeze(-1)
        p = torch.exp(log_p)
        if ctx.want_entropy:
            # grad = -p * (g_logp + g_ent * (log p + H)), built in place on log_p
            grad = log_p.add_(ent.unsqueeze(-1)).mul_(g_ent.unsqueeze(-1)).add_(g_logp.unsqueeze(-1)).mul_(p).neg_()
        else:
            grad = p.mul_(-g_logp.unsqueeze(-1))
        grad.scatter_add_(-1, target.unsqueeze(-1), g_logp.unsqueeze(-1))
        return grad, None, None


def logp_and_entropy(
    logits: torch.Tensor, target: torch.Tensor, want_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log softmax(logits)[target], entropy of softmax(logits)) for logits [..., V], target [...]; float32 (float64 stays).

    Equal to `log_softmax(logits).gather(target)` and `-(p * log p).sum(-1)`, with a fused backward.
    When `want_entropy` is False the returned entropy is zeros.
    """
    z = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    shape = target.shape
    logp, ent = _LogpEntropy.apply(z.reshape(-1, z.shape[-1]), target.reshape(-1), want_entropy)
    return logp.view(shape), ent.view(shape)


# per module: whether its logits are exactly its output head applied to its decoder's last hidden state
_HEAD_SPLITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# the switch of `head_at_free_tokens` (TrainConfig): scoring runs the output head at the needed positions only
_HEAD_WHERE_NEEDED = contextvars.ContextVar("head_where_needed", default=True)


@contextmanager
def head_where_needed(on: bool = True) -> Iterator[None]:
    """Inside: scoring runs the output head only at the response tokens it needs (on, the default) or, off, over
    each forward's whole response span, forced tokens included (the same numbers; the reference path of
    `Shortcuts(head_at_free_tokens=False)`, sdar.train.runtime)."""
    token = _HEAD_WHERE_NEEDED.set(on)
    try:
        yield
    finally:
        _HEAD_WHERE_NEEDED.reset(token)


def head_where_needed_on() -> bool:
    """Whether `head_where_needed` is on here."""
    return _HEAD_WHERE_NEEDED.get()


def decoder_and_head(model: torch.nn.Module):
    """(decoder, output head) of a causal LM whose logits are `head(decoder(...).last_hidden_state)`, else None.

    Checked once per module on three tokens (in eval mode, dropout off): an architecture that post-processes
    its logits (soft-capping, a logit scale) fails the check and keeps the whole-model forward."""
    if model in _HEAD_SPLITS:
        return _HEAD_SPLITS[model]
    split = None
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError, ValueError):
        decoder = head = None
    if isinstance(decoder, torch.nn.Module) and isinstance(head, torch.nn.Module):
        modes = [(m, m.training) for m in model.modules()]
        model.eval()
        try:
            with torch.no_grad():
                ids = torch.tensor([[0, 1, 2]], device=next(model.parameters()).device)
                whole = model(input_ids=ids, use_cache=False).logits.float()
                parts = head(decoder(input_ids=ids, use_cache=False).last_hidden_state).float()
            if whole.shape == parts.shape and torch.allclose(whole, parts, rtol=1e-4, atol=1e-4):
                split = (decoder, head)
        finally:
            for m, mode in modes:
                m.training = mode
    _HEAD_SPLITS[model] = split
    return split


def logits_at(model: torch.nn.Module, rows: torch.Tensor, cols: torch.Tensor, **forward: Any) -> tuple[torch.Tensor, Any]:
    """The logits [N, V] at positions (rows[k], cols[k]) of the forward `model(**forward)`, and that forward's
    output (for its KV cache, `sdar.models.kv_cache.cache_of`). Where the logits are the output head applied to the decoder's last hidden
    state (`decoder_and_head`), the head and the [N, V] logits exist at those positions only (scoring needs few:
    not the forced tokens of a constrained decoder, not the prompt; 5-10% of a pass's time on the tiny model and on
    SmolLM2-135M, benchmarks/bench_scoring_head.py). Other models run from the first of those positions on and the
    positions are picked from their logits."""
    split = decoder_and_head(model) if _HEAD_WHERE_NEEDED.get() else None
    if split is None:  # the head over the span from the first needed position on (the model's logits_to_keep)
        L = forward["input_ids"].shape[1]
        first = int(cols.min()) if cols.numel() else L - 1
        out = model(**forward, logits_to_keep=L - first)
        return out.logits[rows, cols - first], out
    decoder, head = split
    out = decoder(**forward)
    return head(out.last_hidden_state[rows, cols]), out


def encode_kv(model: torch.nn.Module, input_ids: torch.Tensor):
    """The KV cache of `input_ids` (a prefix every row continues from), with no logits computed: the decoder alone
    where `decoder_and_head` splits the model, else the whole model keeping one position's logits."""
    split = decoder_and_head(model)
    if split is None:
        return cache_of(model(input_ids=input_ids, use_cache=True, logits_to_keep=1))
    return cache_of(split[0](input_ids=input_ids, use_cache=True))


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions 0, 1, ... counted over real tokens only, so left padding does not shift rotary positions. [B, L]"""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _check_scoring_args(input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float,
                        chunk_size: int | None, first_position: int) -> None:
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} must both be [B, L]"
        )
    if input_ids.shape[1] < 2:
        raise ValueError("need sequences of at least 2 tokens: the first token has no log-prob")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of sequences or None, got {chunk_size}")
    L = input_ids.shape[1]
    if not 0 <= first_position < L:
        raise ValueError(f"first_position must be in [0, {L}) for sequences of {L} tokens, got {first_position}")


def _chunk_logprobs(model, ids: torch.Tensor, mask: torch.Tensor, temperature: float, return_entropy: bool,
                    allowed: torch.Tensor | None, f: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward's (logp, entropy) [b, L] at every position (the last column a dummy target), zeros before `f`."""
    L = ids.shape[1]
    kw = {"logits_to_keep": L - f} if f else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False, **kw)
    logits = out.logits
    del out
    logits = process_logits(logits, temperature=temperature, keep=allowed)
    # score all L positions (a dummy target at the last one) so the [b, L, V] logits need no
    # sliced copy, then drop the last column
    target = torch.cat([ids[:, f + 1 :], torch.zeros_like(ids[:, :1])], dim=1)
    logp, ent = logp_and_entropy(logits, target, return_entropy)
    if f:  # the columns before first_position were not computed: zeros, like padding
        pad = torch.zeros(ids.shape[0], f, dtype=logp.dtype, device=logp.device)
        logp = torch.cat([pad, logp], dim=1)
        ent = torch.cat([pad, ent], dim=1) if return_entropy else ent
    return logp, ent


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    chunk_size: int | None = None,
    allowed: torch.Tensor | None = None,
    first_position: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(input_ids[:, t] | input_ids[:, :t]) for every t >= 1, from one forward pass per chunk.

    input_ids, attention_mask: [B, L]; padding may be on the left (what rollouts produce, and what
        the trainer uses: prompts left-padded, responses right-padded after them) or on the right,
        in any amount. Position ids are derived from the mask, so the numbers do not depend on it.
    temperature: logits are divided by it before the softmax; use the rollout temperature so that
        `old_logp` matches the distribution the tokens were sampled from.
    return_entropy: also return the entropy of softmax(logits / temperature) at each position.
    chunk_size: sequences per forward pass (None = the whole batch). Under `torch.no_grad()` this
        bounds memory to one chunk's [chunk, L, V] logits; with gradients every chunk's activations
        stay alive until backward, so micro-batch the update itself to bound training memory.
    allowed: optional bool [B, L, V]: the tokens a constrained decoder could emit after each
        position (True = allowed); log-probs and entropies are then those of the renormalised,
        constrained distribution the tokens were actually sampled from.
    first_position: compute logits only from this position on (the model's `logits_to_keep`): the output
        head and the softmax over the vocabulary are most of a small model's forward, and scoring needs
        only the positions that predict response tokens. Columns before it are 0; `allowed` then covers
        positions first_position..L-1 only ([B, L - first_position, V]).
    Returns (logp [B, L-1], entropy [B, L-1] or None), float32. Alignment: column j scores token
        j + 1 from the logits at position j; a response token at index t is at column t - 1, i.e.
        `logp[:, t0 - 1 : t1 - 1]` for response tokens `input_ids[:, t0:t1]`. Columns whose context
        position or target token is padding are 0 (mask them; never read them).
    """
    _check_scoring_args(input_ids, attention_mask, temperature, chunk_size, first_position)
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    attention_mask = attention_mask.to(device)
    B, f = input_ids.shape[0], first_position
    step = chunk_size or B
    logps: list[torch.Tensor] = []
    ents: list[torch.Tensor] = []
    for start in range(0, B, step):
        ids = input_ids[start : start + step]
        mask = attention_mask[start : start + step]
        chunk_allowed = None if allowed is None else allowed[start : start + step].to(device)
        logp, ent = _chunk_logprobs(model, ids, mask, temperature, return_entropy, chunk_allowed, f)
        valid = (mask[:, 1:] > 0) & (mask[:, :-1] > 0)
        valid[:, :f] = False
        logps.append(torch.where(valid, logp[:, :-1], torch.zeros((), dtype=logp.dtype, device=logp.device)))
        if return_entropy:
            ents.append(torch.where(valid, ent[:, :-1], torch.zeros((), dtype=ent.dtype, device=ent.device)))
    return torch.cat(logps), (torch.cat(ents) if return_entropy else None)
