"""Log-probs of response tokens given prompts, aligned on the response: the one forward behind old, reference and
teacher log-probs, the training pass (plain, length-bucketed or from a shared prefix) and the hint channel's logits."""

from __future__ import annotations

import os

import torch

from sdar.models.kv_cache import with_cache
from sdar.models.logits import keep_mask, process_logits
from sdar.models.logprobs import (
    encode_kv,
    head_where_needed_on,
    logits_at,
    logp_and_entropy,
    position_ids_from_mask,
    token_logprobs,
)
from sdar.models.padding import padded
from sdar.models.scored import ScoredBatch, allowed_mask, forced, pick, response_mask


def unique_rows(prompts: list[list[int]], responses: list[list[int]],
                allowed: list[list[list[int]] | None] | None = None, groups: list | None = None) -> tuple[list[int], list[int]]:
    """(first, inverse): the first row of each distinct (prompt, response, allowed tokens, group), and per row the
    index of its distinct one in `first`. Rows equal in all of these score the same, so one forward serves them
    all: the G rollouts of a task often play the same first turns (identical prompts and, at low entropy, the same
    sampled action)."""
    first: list[int] = []
    inverse: list[int] = []
    seen: dict = {}
    for i, (p, r) in enumerate(zip(prompts, responses)):
        a = allowed[i] if allowed is not None else None
        key = (tuple(p), tuple(r), None if a is None else tuple(tuple(x) for x in a[: len(r)]),
               None if groups is None else groups[i])
        k = seen.setdefault(key, len(first))
        if k == len(first):
            first.append(i)
        inverse.append(k)
    return first, inverse



def _scored_once(score, prompts, responses, allowed, groups=None) -> ScoredBatch | None:
    """`score(rows)` over the distinct rows only, expanded back to every row; None when no two rows are equal."""
    first, inverse = unique_rows(prompts, responses, allowed, groups)
    if len(first) == len(prompts):
        return None
    out = score(first)
    inv = torch.tensor(inverse, dtype=torch.long, device=out.logp.device)
    return ScoredBatch(logp=out.logp[inv], entropy=None if out.entropy is None else out.entropy[inv],
                       mask=out.mask[inv])


def _response_scores(model, forward: dict, prompt_lens: list[int], responses: list[list[int]],
                     allowed: list[list[list[int]] | None] | None, T: int, temperature: float, with_entropy: bool,
                     grad: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, object]:
    """logp, entropy and mask [b, T] of each row's response tokens (0 past a row's response) from one forward
    `model(**forward)` whose row j holds its response after `prompt_lens[j]` tokens, and the forward's output. Logits are computed only where a token
    is not forced: a constrained step that allows exactly the sampled token has the renormalised log-prob 0 and
    entropy 0 (what the masked softmax gives there, exactly, and no gradient), so it needs no output head
    (`sdar.models.logprobs.head_where_needed`; off, the forced tokens are scored like the others)."""
    picked = []  # (row, position of the logits, response index, target token, allowed tokens or None)
    skip_forced = head_where_needed_on()
    for j, (n_prompt, r) in enumerate(zip(prompt_lens, responses)):
        if n_prompt < 1:
            raise ValueError(f"row {j} has an empty prompt: the first response token is predicted from the last prompt token")
        steps = allowed[j] if allowed is not None else None
        for k, tok in enumerate(r):
            toks = steps[k] if steps is not None and k < len(steps) else None
            if not (skip_forced and forced(toks, tok)):
                picked.append((j, n_prompt - 1 + k, k, tok, toks or None))
    rows, cols, ks, targets, sets = (list(c) for c in zip(*picked)) if picked else ([], [], [], [], [])
    b = len(prompt_lens)
    device = forward["input_ids"].device
    probe = not rows  # every token forced: one position still runs, so that a loss keeps its graph
    if probe:
        rows, cols, targets, sets = [0], [prompt_lens[0] - 1], [0], [None]
    logits, out = logits_at(model, torch.tensor(rows, device=device), torch.tensor(cols, device=device), **forward)
    logits = process_logits(logits, temperature=temperature, keep=keep_mask(sets, logits.shape[-1], device))
    lp, ent = logp_and_entropy(logits, torch.tensor(targets, device=device), with_entropy)
    mask = response_mask(responses, T, device)
    zero = torch.zeros(b, T, device=device)
    if probe:
        nothing = lp.sum() * 0.0 if grad else 0.0
        return zero + nothing, (zero.clone() if with_entropy else None), mask, out
    where = (torch.tensor(rows, device=device), torch.tensor(ks, device=device))
    return zero.index_put(where, lp), (zero.index_put(where, ent) if with_entropy else None), mask, out


def response_logprobs(
    model,
    prompts: list[list[int]],
    responses: list[list[int]],
    *,
    pad_id: int,
    batch_size: int | None = None,
    with_entropy: bool = False,
    grad: bool = False,
    allowed: list[list[list[int]] | None] | None = None,
    prompt_lm: bool = False,
    temperature: float = 1.0,
    length_buckets: bool = True,
    dedup: bool = False,
) -> ScoredBatch:
    """Score `responses[i]` after `prompts[i]` for every i.

    Sequences are right-padded (positions start at 0 for every row, so no position-id
    correction is needed), run through `token_logprobs`, and the response positions are
    gathered into [B, T] tensors that start at each response's first token. Prompts of
    different lengths (student vs privileged teacher) therefore align token by token.
    batch_size: rows per forward (None = all at once); grad=False runs under no_grad.
    allowed: per row, the allowed tokens at each response position (constrained decoding) or
        None; those rows are scored under the same renormalised distribution they were sampled from.
    prompt_lm: also return the summed log-probs of the prompt tokens from the same forward
        (a language-modelling term for supervised warm starts; free of extra compute).
    temperature: score under softmax(logits / temperature): the rollout temperature, so that
        the scores are those of the distribution the responses were sampled from.
    length_buckets: forward rows in groups of similar length (`length_groups`, at most batch_size rows each) and
        return them in the caller's order, so one long prompt no longer pads a whole batch or micro-batch.
        Same numbers either way.
    dedup: rows equal to an earlier row (prompt, response, allowed tokens: `unique_rows`) are not forwarded again
        but take that row's scores (the same numbers up to the batch's float rounding); with grad each copy's loss
        reaches the one forward through the index that expands it, so its gradient is the sum of theirs.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    n = len(prompts)
    kw = dict(pad_id=pad_id, batch_size=batch_size, with_entropy=with_entropy, grad=grad, prompt_lm=prompt_lm,
              temperature=temperature, length_buckets=length_buckets, dedup=dedup)
    reordered = _reordered(model, prompts, responses, allowed, kw)
    if reordered is not None:
        return reordered
    T = max((len(r) for r in responses), default=0)
    device = next(model.parameters()).device
    logp = torch.zeros(n, T, device=device)
    ent = torch.zeros(n, T, device=device) if with_entropy else None
    mask = torch.zeros(n, T, device=device)
    step = batch_size or max(n, 1)
    chunks_lp, chunks_ent = [], []
    prompt_sum, prompt_n = torch.zeros((), device=device), 0
    with torch.enable_grad() if grad else torch.no_grad():
        for start in range(0, n, step):
            rows = range(start, min(start + step, n))
            ids, att = padded([prompts[i] + responses[i] for i in rows], pad_id)
            if not prompt_lm:  # logits only where a response token is predicted and not forced
                att = att.to(device)
                lp, e, m, _ = _response_scores(
                    model, dict(input_ids=ids.to(device), attention_mask=att, position_ids=position_ids_from_mask(att),
                                use_cache=False),
                    [len(prompts[i]) for i in rows], pick(responses, rows), pick(allowed, rows), T, temperature,
                    with_entropy, grad)
            else:  # the prompt LM term (the warm start's SFT) needs the logits at every position
                lp, e, m, lm_sum, lm_n = _with_prompt_lm(model, ids, att, pick(prompts, rows), pick(responses, rows),
                                                         pick(allowed, rows), T, temperature, with_entropy)
                prompt_sum, prompt_n = prompt_sum + lm_sum, prompt_n + lm_n
            chunks_lp.append(lp)
            if with_entropy:
                chunks_ent.append(e)
            mask[start : start + len(rows)] = m.to(device)
    if chunks_lp:
        logp = torch.cat(chunks_lp)
        if with_entropy:
            ent = torch.cat(chunks_ent)
    return ScoredBatch(logp=logp, entropy=ent, mask=mask,
                       prompt_logp_sum=prompt_sum if prompt_lm else None, prompt_tokens=prompt_n)


def _reordered(model, prompts, responses, allowed, kw: dict) -> ScoredBatch | None:
    """`response_logprobs` (its keyword arguments `kw`) with the rows forwarded in another grouping and returned in
    the caller's order: each distinct row once (dedup), groups of similar length (length_buckets); None when
    neither applies and the rows go through as they are."""
    n, batch_size = len(prompts), kw["batch_size"]
    if kw["dedup"] and not kw["prompt_lm"] and n > 1:
        once = _scored_once(lambda rows: response_logprobs(
            model, pick(prompts, rows), pick(responses, rows), allowed=pick(allowed, rows),
            **{**kw, "dedup": False}), prompts, responses, allowed)
        if once is not None:
            return once
    if kw["length_buckets"] and n > 1:
        # rows of similar lengths in one forward each, at most batch_size rows: one long row (a privileged prompt
        # beside a student's, a long answer beside a 3-token action) then pads only its own group, not a whole
        # batch or micro-batch; rows go back to their order after. With gradients the micro-batch keeps its rows
        # and its loss (only the padding goes); every group's activations stay alive until backward either way
        groups = length_groups([len(p) + len(r) for p, r in zip(prompts, responses)], batch_size or n)
        if len(groups) > 1:
            return _regrouped(groups, n, lambda rows: response_logprobs(
                model, pick(prompts, rows), pick(responses, rows), allowed=pick(allowed, rows),
                **{**kw, "batch_size": None, "length_buckets": False, "dedup": False}))
    return None


def _with_prompt_lm(model, ids, att, prompts, responses, allowed, T: int, temperature: float, with_entropy: bool):
    """One chunk scored at every position: (response log-probs [b, T], their entropies or None, mask [b, T], the
    summed log-probs of the prompt tokens after the first, their count)."""
    device = next(model.parameters()).device
    mask_v = None
    if allowed is not None and any(a is not None for a in allowed):
        vocab = model.get_output_embeddings().weight.shape[0]
        mask_v = allowed_mask(prompts, responses, list(allowed), ids.shape[1], vocab, start=0)
    lp, e = token_logprobs(model, ids.to(device), att.to(device), return_entropy=with_entropy,
                           allowed=mask_v, temperature=temperature, first_position=0)
    pm = torch.zeros_like(lp)
    for j, prompt in enumerate(prompts):
        pm[j, : len(prompt) - 1] = 1
    # token at position p is scored at index p - 1 of the [B, L-1] output
    idx = torch.zeros(len(prompts), T, dtype=torch.long)
    m = torch.zeros(len(prompts), T)
    for j, (prompt, response) in enumerate(zip(prompts, responses)):
        idx[j, : len(response)] = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(response))
        m[j, : len(response)] = 1
    idx, md = idx.to(device), m.to(device)
    ent = e.gather(1, idx) * md if with_entropy else None
    return lp.gather(1, idx) * md, ent, m, (lp * pm).sum(), int(pm.sum().item())


def response_logits(model, prompts: list[list[int]], responses: list[list[int]], *, pad_id: int,
                    allowed: list[list[list[int]] | None] | None = None, grad: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The next-token logits at the positions that predict each row's response tokens, float32 [B, T, V] (0 past
    a row's response), and the response mask [B, T], from one right-padded forward of all rows (with gradients
    when `grad`); the output head runs at those positions only (`logits_at`). Tokens a constrained step did not
    allow are at MASKED, so softmax gives the distribution the student sampled from; temperature 1."""
    B, T = len(prompts), max((len(r) for r in responses), default=0)
    device = next(model.parameters()).device
    picked = []  # (row, position of the logits, response index, allowed tokens or None)
    for j, (p, r) in enumerate(zip(prompts, responses)):
        if len(p) < 1:
            raise ValueError(f"row {j} has an empty prompt: the first response token is predicted from the last prompt token")
        steps = allowed[j] if allowed is not None else None
        picked += [(j, len(p) - 1 + k, k, steps[k] if steps is not None and k < len(steps) else None)
                   for k in range(len(r))]
    rows, cols, ks, sets = (list(c) for c in zip(*picked)) if picked else ([], [], [], [])
    ids, att = padded([p + r for p, r in zip(prompts, responses)], pad_id)
    ids, att = ids.to(device), att.to(device)
    probe = not rows  # no response token: one position still runs, for the vocabulary size (and a graph)
    at = (torch.tensor(rows or [0], device=device), torch.tensor(cols or [len(prompts[0]) - 1], device=device))
    with torch.set_grad_enabled(grad):
        logits, _ = logits_at(model, *at, input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att),
                              use_cache=False)
        z = process_logits(logits, keep=keep_mask(sets, logits.shape[-1], device))
        out = z.new_zeros(B, T, z.shape[-1])
        if not probe:
            out = out.index_put((at[0], torch.tensor(ks, device=device)), z)
        elif grad:
            out = out + z.sum() * 0.0
    return out, response_mask(responses, T, device)


def length_groups(lengths: list[int], max_rows: int, slack: float = 0.2) -> list[list[int]]:
    """Row indices in groups of similar length, shortest first: a group closes when it holds `max_rows` rows or
    when the next row would make its padded size exceed (1 + slack) x its real tokens (one long prompt then
    pads only its own group, not a whole micro-batch)."""
    groups: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        L = lengths[i]
        if cur and (len(cur) >= max_rows or (len(cur) + 1) * L > (1.0 + slack) * (total + L)):
            groups.append(cur)
            cur, total = [], 0
        cur.append(i)
        total += L
    if cur:
        groups.append(cur)
    return groups


def prefix_trie_positions(seqs: list[list[int]]) -> int:
    """How many positions an exact causal forward over `seqs` must compute at least: the number of distinct
    non-empty prefixes (the nodes of their prefix trie). Two positions with the same prefix have the same
    hidden states, so no exact scheme (prefix caching, deduplication, packing) forwards fewer; the benchmarks
    print it beside the positions a pass really forwards."""
    total, prev = 0, ()
    for s in sorted(map(tuple, seqs)):  # in sorted order, the predecessor shares the longest prefix of any earlier
        common = len(os.path.commonprefix([prev, s]))
        total += len(s) - common
        prev = s
    return total


def _regrouped(groups: list[list[int]], n: int, score) -> ScoredBatch:
    """`score(rows)` for every group, put back in row order."""
    return _in_row_order(groups, [score(rows) for rows in groups], n)


def _in_row_order(groups: list[list[int]], parts: list[ScoredBatch], n: int) -> ScoredBatch:
    """Per-group results (`parts[k]` scores rows `groups[k]`) as one batch of the `n` rows in their order: each
    part padded to the longest response, concatenated and permuted back (differentiable: pad, cat, index)."""
    T = max(p.logp.shape[1] for p in parts)

    def cat(xs):
        return torch.cat([torch.nn.functional.pad(x, (0, T - x.shape[1])) for x in xs])

    inv = torch.empty(n, dtype=torch.long)
    inv[torch.tensor([i for rows in groups for i in rows])] = torch.arange(n)
    inv = inv.to(parts[0].logp.device)
    ent = None if parts[0].entropy is None else cat([p.entropy for p in parts])[inv]
    prompt_sum = None
    if parts[0].prompt_logp_sum is not None:
        prompt_sum = sum(p.prompt_logp_sum for p in parts)
    return ScoredBatch(logp=cat([p.logp for p in parts])[inv], entropy=ent, mask=cat([p.mask for p in parts])[inv],
                       prompt_logp_sum=prompt_sum, prompt_tokens=sum(p.prompt_tokens for p in parts))


def free_token_mask(allowed: list[list[list[int]] | None], mask: torch.Tensor, forced_free: bool = False) -> torch.Tensor:
    """[B, T] float: `mask` without the response positions where constrained decoding allowed exactly one
    token (a forced token carries no choice: its log-prob is 0 under student, teacher and reference alike,
    so it would only dilute every token mean with zero gaps, gate 0.5 and entropy 0).

    allowed: per row the allowed tokens per response position (None = unconstrained row: all free).
    forced_free: keep forced positions (the old behaviour, rollout.mask_forced_tokens=false).
    """
    out = mask.clone()
    if forced_free:
        return out
    for i, a in enumerate(allowed):
        if a is None:
            continue
        for k, toks in enumerate(a[: out.shape[1]]):
            if len(toks) == 1:
                out[i, k] = 0.0
    return out


def shared_prefix_logprobs(model, prefix: list[int], prompts: list[list[int]], responses: list[list[int]], *,
                           pad_id: int, batch_size: int | None = None,
                           allowed: list[list[list[int]] | None] | None = None, temperature: float = 1.0,
                           grad: bool = False, with_entropy: bool = False) -> ScoredBatch:
    """`response_logprobs(model, [prefix + p for p in prompts], responses, ...)` with `prefix` encoded once:
    its KV cache is computed in one forward and every row continues from it (the teacher's privileged skills
    prefix, or the system prompt and task a task's turn-samples share). Rows go in groups of similar length.
    grad: with gradients (the update): the prefix's one forward receives the gradient of every row, the
    same numbers as a forward per row."""
    from transformers import DynamicCache

    if not prefix:
        return response_logprobs(model, prompts, responses, pad_id=pad_id, batch_size=batch_size, allowed=allowed,
                                 temperature=temperature, grad=grad, with_entropy=with_entropy)
    n, P = len(prompts), len(prefix)
    device = next(model.parameters()).device
    T = max((len(r) for r in responses), default=0)
    if n == 0:
        z = torch.zeros(0, T, device=device)
        return ScoredBatch(logp=z, entropy=z if with_entropy else None, mask=z)
    ctx = torch.enable_grad() if grad else torch.no_grad()
    with ctx:
        # the prefix's KV cache only: none of its logits is ever read (its last token stays in every row's part)
        base = encode_kv(model, torch.tensor([prefix], device=device))
        kv = [(layer.keys, layer.values) for layer in base.layers]
        lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
        groups = length_groups(lengths, batch_size or n)  # one long row pads only its own group
        parts = []
        for rows in groups:
            ids, own = padded([prompts[i] + responses[i] for i in rows], pad_id)
            b, L = ids.shape
            att = torch.cat([torch.ones(b, P, dtype=torch.long), own], dim=1)  # the prefix, then each row's tokens
            # every row reads the one prefix: expand (a view) and let the cache's concatenation copy it
            cache = DynamicCache([(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)) for k, v in kv])
            pos = (P + torch.arange(L)).unsqueeze(0).expand(b, L)
            lp, ent, m, out = _response_scores(
                model, dict(input_ids=ids.to(device), attention_mask=att.to(device), position_ids=pos.to(device),
                            **with_cache(cache), use_cache=True),
                [len(prompts[i]) for i in rows], pick(responses, rows), pick(allowed, rows), T, temperature,
                with_entropy, grad)
            parts.append(ScoredBatch(logp=lp, mask=m, entropy=ent))
            del out, cache
    return _in_row_order(groups, parts, n)


def grouped_prefix_logprobs(model, prompts: list[list[int]], responses: list[list[int]], groups: list, *,
                            pad_id: int, batch_size: int | None = None,
                            allowed: list[list[list[int]] | None] | None = None, temperature: float = 1.0,
                            grad: bool = False, with_entropy: bool = False, dedup: bool = False) -> ScoredBatch:
    """`response_logprobs` of every row, with the rows of one group (`groups[i]`: any hashable, e.g. the task)
    continuing from one KV cache of the prompt start they all share (the system prompt, the task, the skills):
    that start is encoded once per group instead of once per row. grad: with gradients (the update's
    micro-batch), the same numbers and gradients as a forward per row. dedup: as in `response_logprobs` (equal rows
    of one group forwarded once, with or without gradients)."""
    if dedup and len(prompts) > 1:
        once = _scored_once(lambda rows: _grouped_prefix_logprobs(
            model, pick(prompts, rows), pick(responses, rows), pick(groups, rows), pad_id=pad_id,
            batch_size=batch_size, allowed=pick(allowed, rows), temperature=temperature, grad=grad,
            with_entropy=with_entropy), prompts, responses, allowed, groups)
        if once is not None:
            return once
    return _grouped_prefix_logprobs(model, prompts, responses, groups, pad_id=pad_id, batch_size=batch_size,
                                    allowed=allowed, temperature=temperature, grad=grad, with_entropy=with_entropy)


def _grouped_prefix_logprobs(model, prompts, responses, groups, *, pad_id, batch_size, allowed, temperature,
                             grad: bool = False, with_entropy: bool = False) -> ScoredBatch:
    n, T = len(prompts), max((len(r) for r in responses), default=0)
    device = next(model.parameters()).device
    by_group: dict = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)

    parts: list[tuple[list[int], ScoredBatch]] = []
    alone: list[int] = []  # rows sharing nothing with another row: scored together, in one plain pass
    for rows in by_group.values():
        group = [prompts[i] for i in rows]
        # the last prompt token stays in every row's own part: it predicts the first response token
        shared = len(os.path.commonprefix(group)) if len(group) > 1 else 0
        shared = min(shared, min(len(p) for p in group) - 1)
        if shared <= 0:
            alone += rows
            continue
        parts.append((rows, shared_prefix_logprobs(
            model, group[0][:shared], [p[shared:] for p in group], pick(responses, rows), pad_id=pad_id,
            batch_size=batch_size, allowed=pick(allowed, rows), temperature=temperature, grad=grad,
            with_entropy=with_entropy)))
    if alone:
        parts.append((alone, response_logprobs(model, pick(prompts, alone), pick(responses, alone), pad_id=pad_id,
                                               batch_size=batch_size, allowed=pick(allowed, alone),
                                               temperature=temperature, grad=grad, with_entropy=with_entropy)))
    if not parts:
        z = torch.zeros(0, T, device=device)
        return ScoredBatch(logp=z, entropy=z if with_entropy else None, mask=z)
    return _in_row_order([rows for rows, _ in parts], [p for _, p in parts], n)
