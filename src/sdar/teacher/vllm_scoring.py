"""Teacher log-probs through vLLM's prompt log-probs (teacher.engine: vllm): the response tokens of
prompt + response sequences scored by the rollout engine, as the same `ScoredBatch` the training-side
forward returns, with per-row fallback to that forward where vLLM's answer cannot be renormalised.

Constrained turns: the trainer scores them under the trie-renormalised distribution,
    logp_c(tok) = logp(tok) - logsumexp(logp(a) for a in allowed),
but prompt log-probs are unconstrained and hold only the scored token plus the top-k. A row is
converted in vLLM when, at each of its positions, every allowed token is in what vLLM returned
(positions with one allowed token score exactly 0 and need nothing); any other row is scored by the
training-side forward. Missing mass is never guessed: the result is exact either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from sdar.models.scoring import ScoredBatch, response_logprobs


def _logprob(entry, tok: int) -> float | None:
    lp = entry.get(tok) if entry is not None else None
    return None if lp is None else float(getattr(lp, "logprob", lp))


def scored_from_prompt_logprobs(
    prompt_logprobs: list,
    prompts: list[list[int]],
    responses: list[list[int]],
    allowed: list[list[list[int]] | None] | None = None,
    device: torch.device | str | None = None,
) -> tuple[ScoredBatch, list[int]]:
    """Convert vLLM prompt log-probs of `prompts[i] + responses[i]` to a `ScoredBatch` over responses.

    prompt_logprobs[i]: `RequestOutput.prompt_logprobs` of sequence i: one entry per token, None for
        the first, else a mapping token id -> Logprob (anything with `.logprob`, or a float).
    allowed: per row, the allowed tokens at each response position (constrained decoding) or None,
        as `response_logprobs` takes them.
    Returns the batch (logp [B, T] float32, mask [B, T], T = longest response, entropy None) and the
    rows it could not score exactly (left 0 in logp; score them with `response_logprobs`).
    """
    n = len(prompts)
    if not (len(prompt_logprobs) == len(responses) == n):
        raise ValueError(f"{len(prompt_logprobs)} prompt log-prob lists for {n} prompts and {len(responses)} responses")
    T = max((len(r) for r in responses), default=0)
    logp = torch.zeros(n, T, dtype=torch.float32)
    mask = torch.zeros(n, T, dtype=torch.float32)
    unresolved: list[int] = []
    for i, (plp, p, r) in enumerate(zip(prompt_logprobs, prompts, responses)):
        if plp is None or len(plp) != len(p) + len(r):
            got = "none" if plp is None else len(plp)
            raise ValueError(f"row {i}: prompt log-probs cover {got} tokens, the sequence has {len(p) + len(r)}; "
                             "request them with SamplingParams(prompt_logprobs=k) on prompt + response")
        steps = allowed[i] if allowed is not None else None
        row: list[float] = []
        for k, tok in enumerate(r):
            entry = plp[len(p) + k]
            lp = _logprob(entry, tok)
            toks = steps[k] if steps is not None and k < len(steps) else None
            if toks and len(toks) == 1:
                lp = 0.0 if toks[0] == tok else None  # the only choice: renormalised log-prob 0
            elif toks:
                alts = [_logprob(entry, a) for a in toks]
                if lp is None or tok not in toks or any(a is None for a in alts):
                    lp = None
                else:
                    top = max(alts)
                    lp = lp - (top + math.log(sum(math.exp(a - top) for a in alts)))
            if lp is None:
                break
            row.append(lp)
        if len(row) < len(r):
            unresolved.append(i)
            continue
        if r:
            logp[i, : len(r)] = torch.tensor(row, dtype=torch.float32)
        mask[i, : len(r)] = 1.0
    for i in unresolved:
        mask[i, : len(responses[i])] = 1.0
    if device is not None:
        logp, mask = logp.to(device), mask.to(device)
    return ScoredBatch(logp=logp, entropy=None, mask=mask), unresolved


def vllm_response_logprobs(
    engine,
    model,
    prompts: list[list[int]],
    responses: list[list[int]],
    *,
    pad_id: int,
    batch_size: int | None = None,
    allowed: list[list[list[int]] | None] | None = None,
    topk: int = 20,
    score: Callable[[list, list, list], ScoredBatch] | None = None,
) -> tuple[ScoredBatch, int]:
    """`response_logprobs(model, ...)` computed by `engine.prompt_logprobs` (a `VLLMBackend`), with
    the rows vLLM cannot score exactly (constrained rows whose allowed tokens fall outside the top-k)
    scored by `model` itself. Returns the batch and how many rows fell back.

    topk: prompt log-probs per position requested for constrained rows (unconstrained rows ask
        for 0: the scored token alone); larger resolves more rows and costs more host memory.
    score: `(prompts, responses, allowed) -> ScoredBatch` for those rows (the teacher passes its Scorer's);
        None: `response_logprobs` at temperature 1 in chunks of batch_size.
    """
    allowed = allowed if allowed is not None else [None] * len(prompts)
    seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
    ks = [0 if a is None else topk for a in allowed]
    device = next(model.parameters()).device
    out, unresolved = scored_from_prompt_logprobs(engine.prompt_logprobs(seqs, ks), prompts, responses, allowed,
                                                  device=device)
    if unresolved:
        p, r, a = ([xs[i] for i in unresolved] for xs in (prompts, responses, allowed))
        sub = score(p, r, a) if score is not None else response_logprobs(model, p, r, pad_id=pad_id,
                                                                          batch_size=batch_size, allowed=a)
        idx = torch.tensor(unresolved, dtype=torch.long, device=device)
        out.logp[idx, : sub.logp.shape[1]] = sub.logp.to(out.logp.dtype)
    return out, len(unresolved)


def select_teacher_engine(name: str, backend):
    """The engine that scores the teacher: None for the training-side forward ("train"), or the
    vLLM rollout engine ("vllm"; the same LLM and adapter that sampled the step)."""
    if name == "train":
        return None
    if name == "vllm":
        if not hasattr(backend, "prompt_logprobs"):
            raise ValueError("teacher.engine 'vllm' scores through the vLLM rollout engine, but the generation backend "
                             f"is {type(backend).__name__}; set model.generation_backend: vllm (on a CUDA machine) "
                             "or teacher.engine: train")
        return backend
    raise ValueError(f"unknown teacher.engine {name!r}; choose one of train, vllm")
