"""The per-row sampler, kept as the test oracle of the one sampler (`sdar.agent.decoding.constrained_sample`): each
live row's next token decided on its own, a softmax over the whole vocabulary per row and `torch.multinomial` from
the row's own generator, a forward per step. It was the CPU's default until issue 45 (rollout.sampler: rows); the
sampler now decides every row of a step in one batched pass and must draw exactly these tokens, with these log-probs
up to float rounding (tests/agent/test_decoding.py)."""

from __future__ import annotations

import torch

from sdar.agent.decoding import _decode_forward, _prefill
from sdar.agent.draws import row_generators
from sdar.agent.walk import Decoded, DecodeStats, forced_run
from sdar.models.logits import keep_mask, process_logits


def processed_logprobs(logits: torch.Tensor, allowed: list[int] | None, temperature: float, top_p: float) -> torch.Tensor:
    """log-probs [V] of the sampling distribution (`process_logits`: allowed tokens only, temperature, top-p);
    tokens that cannot be drawn have probability exactly 0."""
    keep = keep_mask([allowed], logits.shape[-1], logits.device)
    return torch.log_softmax(process_logits(logits, temperature=temperature, keep=None if keep is None else keep[0],
                                            top_p=top_p), dim=-1)


def next_chunk(trie, toks: list[int], last: torch.Tensor, gen: torch.Generator, temperature: float, top_p: float,
               eos: set[int], max_new_tokens: int, jump_forward: bool,
               processed=None) -> tuple[list[int], list[float], int]:
    """A row's next token (sampled from `last`, its next-token logits, unless the trie allows one token) and, with
    jump_forward, the run of forced tokens after it: (tokens, their log-probs, how many were forced). `processed`:
    the processing to sample from (default `processed_logprobs`)."""
    allowed = trie.allowed(toks) if trie is not None else None
    n_forced = 0
    if allowed is not None and len(allowed) == 1:
        tok, lp = allowed[0], 0.0
        n_forced += 1
    else:
        logp = (processed or processed_logprobs)(last, allowed or None, temperature, top_p)
        tok = int(torch.multinomial(logp.exp(), 1, generator=gen).item())
        lp = float(logp[tok])
    chunk, chunk_lp = [tok], [lp]
    if jump_forward:  # the run of forced tokens after it needs no decision: it joins this forward
        run = forced_run(trie, toks + chunk, eos, max_new_tokens)
        chunk += run
        chunk_lp += [0.0] * len(run)
        n_forced += len(run)
    return chunk, chunk_lp, n_forced


@torch.no_grad()
def sample_rows(model, prompts: list[list[int]], tries: list, *, max_new_tokens: int, temperature: float,
                top_p: float, eos_ids: list[int], pad_id: int, seeds: list[int], jump_forward: bool = True,
                share_prefix: bool = False, stats: DecodeStats | None = None, processed=None) -> list[Decoded]:
    """One response per prompt, each row's token decided on its own from its generator (seeded by `seeds[i]`)."""
    device = next(model.parameters()).device
    gens = row_generators(seeds, device)
    st = stats if stats is not None else DecodeStats()
    eos = set(eos_ids)
    B = len(prompts)
    past, last, attn, count, encoded = _prefill(model, prompts, pad_id, device, share_prefix)
    toks: list[list[int]] = [[] for _ in range(B)]
    lps: list[list[float]] = [[] for _ in range(B)]
    forced = [0] * B
    done = [False] * B
    st.prefill_tokens += encoded
    while not all(done):
        chunks: list[list[int]] = [[] for _ in range(B)]
        for i in range(B):
            if done[i]:
                continue
            chunk, chunk_lp, n_forced = next_chunk(tries[i], toks[i], last[i], gens[i], temperature, top_p, eos,
                                                   max_new_tokens, jump_forward, processed)
            forced[i] += n_forced
            toks[i] += chunk
            lps[i] += chunk_lp
            if chunk[-1] in eos or len(toks[i]) >= max_new_tokens:
                done[i] = True
            else:
                chunks[i] = chunk
        if all(done):
            break
        past, last, attn, count = _decode_forward(model, chunks, pad_id, past, attn, count)
        st.forwards += 1
    st.forced += sum(forced)
    st.tokens += sum(len(t) for t in toks)
    return [Decoded(toks[i], lps[i], bool(toks[i]) and toks[i][-1] in eos, forced[i]) for i in range(B)]
