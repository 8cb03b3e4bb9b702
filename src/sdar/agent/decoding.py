"""The transformers backend's one sampler (`constrained_sample`), for constrained and free rows alike: every live
row's next token decided in one batched pass per step (`sdar.agent.draws`), on a KV cache decode step by step
(layout "batched") or from one packed forward of every admissible response (layout "lookahead",
`sdar.agent.lookahead`); the per-row reference it matches is the test oracle tests/agent/row_oracle.py.

Jump-forward: where the action trie allows exactly one next token, the token is appended without a decode step, and a row's whole run of forced tokens goes through the model
in one extended forward (KV cache kept). About 80% of household-tiny's response tokens are forced.

Each row draws its free tokens from its own generator (seeded from the global RNG, or from `seeds`: one per row,
which an evaluation draws from each episode's own generator), so a row's sample depends only on its own
distributions: jump-forward on and off give the same tokens and log-probs.

The prefill can share prompt starts (`share_prefix`): the rows of a chunk that begin alike (a task's group
of rollouts at the same turn: system prompt, task and step lines) encode that start once, and every row
continues from its group's KV cache; only the last position's logits are computed. The rows' rests go in forwards
of rows of similar length (`length_buckets`: on a CPU, a much longer prompt gets a forward of its own when that
saves more positions than a forward costs). Same samples and log-probs as encoding every prompt whole, up to float
rounding (another matrix shape sums in another order).
Log-probs are of the distribution sampled from (trie mask, temperature, top-p: `sdar.models.logits.process_logits`,
the function the trainer scores with, at the rollout temperature and the same allowed sets; equal when top_p = 1).
"""

from __future__ import annotations

import torch

from sdar.agent.draws import decide, row_generators
from sdar.agent.lookahead import lookahead_sample
from sdar.agent.walk import Decoded, DecodeStats, RowWalk
from sdar.models.kv_cache import cache_of, with_cache
from sdar.models.logprobs import decoder_and_head, position_ids_from_mask
from sdar.models.packing import packs
from sdar.models.padding import padded

LAYOUTS = ("batched", "lookahead")  # the sampler's forward layouts (rollout.sampler less auto)


def _lcp(a: list[int], b: list[int]) -> int:
    n, k = min(len(a), len(b)), 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def prefix_groups(prompts: list[list[int]]) -> list[tuple[list[int], int]] | None:
    """How to share prompt starts in one prefill: groups of rows with the start length each group shares (the
    last prompt token stays in every row's own part). Rows sorted by prompt are cut into groups wherever two
    neighbours share fewer than t tokens, for every t that occurs; rows left alone share the start common to
    all. The grouping that runs the fewest padded positions wins; None when none runs fewer than the rows whole."""
    B = len(prompts)
    if B < 2:
        return None
    width = max(len(p) for p in prompts)
    order = sorted(range(B), key=lambda i: prompts[i])
    adjacent = [_lcp(prompts[a], prompts[b]) for a, b in zip(order, order[1:])]
    common = min(min(adjacent), min(len(p) for p in prompts) - 1)

    def cost(groups):  # padded positions: the group starts' forward, then every row's rest
        return len(groups) * max(s for _, s in groups) + B * max(len(prompts[i]) - s for rows, s in groups for i in rows)

    def grouped_at(t: int):
        runs, cur = [], [order[0]]
        for i, k in zip(order[1:], adjacent):
            if k >= t:
                cur.append(i)
            else:
                runs.append(cur)
                cur = [i]
        runs.append(cur)
        groups = []
        for rows in runs:
            if len(rows) > 1:
                shared = min(min(_lcp(prompts[rows[0]], prompts[i]) for i in rows[1:]),
                             min(len(prompts[i]) for i in rows) - 1)
                groups.append((rows, shared))
        alone = [rows[0] for rows in runs if len(rows) == 1]
        if alone:  # the rows that share nothing beyond the common start continue from it together
            groups += [(alone, common)] if common > 0 else [([i], len(prompts[i]) - 1) for i in alone]
        return groups if all(s > 0 for _, s in groups) else None

    candidates = [g for g in (grouped_at(t) for t in sorted(set(adjacent)) if t > 0) if g]
    best = min(candidates, key=cost, default=None)
    return best if best is not None and cost(best) < B * width else None


# a forward's own cost on a CPU, whatever its length (its ops' dispatch, its weights read once), with the copies a
# cut adds to the cache: about what 6e8 FLOPs of a decoder layer's matmuls cost. SmolLM2-135M in bfloat16 on 2
# cores: 19.5 ms for a one-token forward against 0.48 ms a position at 256 (about 40 positions); 85 by this rule.
FORWARD_FLOPS_PER_LAYER = 6e8


def forward_overhead(model, device) -> float:
    """What one more forward costs, in positions of `model`'s decoder: FORWARD_FLOPS_PER_LAYER over a position's
    FLOPs in one layer (2 x its weights), so a small model's forward (overhead-bound) is rarely worth splitting. Off a
    CPU, infinite: a GPU forward of a rollout's size pays little for its padding, and one forward keeps its layout."""
    from sdar.models.precision import decoders

    if torch.device(device).type != "cpu":
        return float("inf")
    stacks = decoders(model)
    if not stacks or not len(stacks[0].layers):
        return float("inf")
    weights = sum(p.numel() for p in stacks[0].layers[0].parameters())
    return FORWARD_FLOPS_PER_LAYER / (2 * max(weights, 1))


def length_buckets(lengths: list[int], overhead: float) -> list[list[int]]:
    """Rows cut into forwards by length: the rows sorted by length, cut into runs so that the positions they run
    (each run padded to its longest row) plus `overhead` positions a forward are the fewest (exact, by dynamic
    programming over the cuts). One run (all rows, in their own order) unless a cut saves more than a forward costs:
    one long prompt among short ones (a turn whose observation lists a room) no longer pads every row to its length."""
    B = len(lengths)
    order = sorted(range(B), key=lambda i: (lengths[i], i))
    L = [lengths[i] for i in order]
    best, cut = [0.0] + [float("inf")] * B, [0] * (B + 1)
    for j in range(1, B + 1):
        for i in range(j):  # the run order[i:j], padded to L[j - 1]
            c = best[i] + (j - i) * L[j - 1] + overhead
            if c < best[j]:
                best[j], cut[j] = c, i
    runs, j = [], B
    while j:
        runs.append(order[cut[j]:j])
        j = cut[j]
    return [list(range(B))] if len(runs) <= 1 else runs[::-1]


def _prefill(model, prompts: list[list[int]], pad_id: int, device, share_prefix: bool, decoder=None):
    """The prompts through the model: (KV cache, next-token logits [B, V] (with `decoder`, the model's decoder:
    its last hidden states [B, H] instead), attention mask so far [B, W], positions so far [B], padded positions
    run). Left padding; with share_prefix the starts rows share go through once per group (`prefix_groups`), and
    the rest of each row in forwards of rows of similar length (`length_buckets`): the cache holds each row's group
    start, then its own rest: [pad, start][pad, rest] (masked pads, positions from the real tokens)."""
    B = len(prompts)
    if not share_prefix:  # the full output as before share_prefix existed: "off" reproduces earlier runs bit for bit
        ids, attn = padded(prompts, pad_id, left=True)
        ids, attn = ids.to(device), attn.to(device)
        pos = position_ids_from_mask(attn)
        if decoder is not None:
            out = decoder(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
            return cache_of(out), out.last_hidden_state[:, -1], attn, attn.sum(-1), B * ids.shape[1]
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
        return cache_of(out), out.logits[:, -1, :], attn, attn.sum(-1), B * ids.shape[1]
    from transformers import DynamicCache

    # only the last position's logits (the rest are never read)
    run, kw = (decoder, {}) if decoder is not None else (model, {"logits_to_keep": 1})
    groups = prefix_groups(prompts)
    shared, start, encoded = [0] * B, None, 0
    if groups is not None:
        group_of = [0] * B
        for g, (rows, s) in enumerate(groups):
            for i in rows:
                group_of[i], shared[i] = g, s
        pids, pmask = padded([prompts[rows[0]][:s] for rows, s in groups], pad_id, left=True)
        pids, pmask = pids.to(device), pmask.to(device)
        start = cache_of(run(input_ids=pids, attention_mask=pmask, position_ids=position_ids_from_mask(pmask),
                             use_cache=True, **kw))
        idx = torch.tensor(group_of, device=device)
        encoded = pids.numel()
    rests = [p[shared[i]:] for i, p in enumerate(prompts)]
    ids, smask = padded(rests, pad_id, left=True)
    W = ids.shape[1]
    ids, smask = ids.to(device), smask.to(device)
    base = torch.tensor(shared, device=device)
    attn = smask if start is None else torch.cat([pmask.index_select(0, idx), smask], dim=1)
    pos = base.unsqueeze(1) + position_ids_from_mask(smask)
    buckets = length_buckets([len(r) for r in rests], forward_overhead(model, device))
    keys = values = last = None
    for rows in buckets:
        r = torch.tensor(rows, device=device)
        cols = W - max(len(rests[i]) for i in rows)  # the run's first column: its longest rest starts there
        past = {}
        if start is not None:
            g = idx.index_select(0, r)
            past = with_cache(DynamicCache([(layer.keys.index_select(0, g), layer.values.index_select(0, g))
                                            for layer in start.layers]))
        out = run(input_ids=ids[r, cols:], attention_mask=attn[r, cols:] if start is None else
                  torch.cat([pmask.index_select(0, g), smask[r, cols:]], dim=1),
                  position_ids=pos[r, cols:], **past, use_cache=True, **kw)
        encoded += len(rows) * (W - cols)
        here = out.last_hidden_state[:, -1] if decoder is not None else out.logits[:, -1, :]
        if len(buckets) == 1:
            return cache_of(out), here, attn, base + smask.sum(-1), encoded
        if last is None:  # the whole batch's rests, each run's written into its rows' last columns
            last = here.new_zeros(B, here.shape[-1])
            keys = [layer.keys.new_zeros(B, layer.keys.shape[1], W, layer.keys.shape[3]) for layer in cache_of(out).layers]
            values = [layer.values.new_zeros(B, layer.values.shape[1], W, layer.values.shape[3])
                      for layer in cache_of(out).layers]
        last[r] = here
        P = 0 if start is None else pmask.shape[1]
        for k, v, layer in zip(keys, values, cache_of(out).layers):
            k[r, :, cols:] = layer.keys[:, :, P:]
            v[r, :, cols:] = layer.values[:, :, P:]
    if start is not None:
        keys = [torch.cat([layer.keys.index_select(0, idx), k], dim=2) for layer, k in zip(start.layers, keys)]
        values = [torch.cat([layer.values.index_select(0, idx), v], dim=2) for layer, v in zip(start.layers, values)]
    return DynamicCache(list(zip(keys, values))), last, attn, base + smask.sum(-1), encoded


def _decode_forward(model, chunks: list[list[int]], pad_id: int, past, attn: torch.Tensor, count: torch.Tensor,
                    decoder=None):
    """One forward of every live row's new tokens (`chunks`, [] for finished rows) on the cache: (cache, each row's
    next-token logits (with `decoder`: its last hidden states), attention mask, real tokens so far)."""
    device = attn.device
    step_ids, step_mask = padded(chunks, pad_id)
    B, L = step_ids.shape
    step_ids, step_mask = step_ids.to(device), step_mask.to(device)
    step_pos = count.unsqueeze(1) + torch.arange(L, device=device).unsqueeze(0)
    attn = torch.cat([attn, step_mask], dim=1)
    at = torch.tensor([max(len(c), 1) - 1 for c in chunks], device=device)
    if decoder is not None:
        out = decoder(input_ids=step_ids, attention_mask=attn, position_ids=step_pos, **with_cache(past), use_cache=True)
        return cache_of(out), out.last_hidden_state[torch.arange(B, device=device), at], attn, count + step_mask.sum(-1)
    out = model(input_ids=step_ids, attention_mask=attn, position_ids=step_pos, **with_cache(past), use_cache=True)
    return cache_of(out), out.logits[torch.arange(B, device=device), at, :], attn, count + step_mask.sum(-1)


@torch.no_grad()
def constrained_sample(model, prompts: list[list[int]], tries: list, *, max_new_tokens: int, temperature: float,
                       top_p: float, eos_ids: list[int], pad_id: int, jump_forward: bool = True,
                       share_prefix: bool = False, stats: DecodeStats | None = None,
                       seeds: list[int] | None = None, sampler: str = "batched", pack_tokens: int = 2048) -> list[Decoded]:
    """Sample one response per prompt; `tries[i]` (an `ActionTrie` or None) constrains row i.

    jump_forward: feed each row's run of forced tokens in one forward (False: one token per forward,
    the same tokens and log-probs). temperature must be > 0 (greedy decoding takes `model.generate`).
    share_prefix: encode the prompt starts rows share once per group (`prefix_groups`); the same tokens and
    log-probs up to float rounding.
    seeds: row i's generator seed (None: drawn from the global RNG, B draws per call, as training rollouts do).
    sampler: the forward layout (rollout.sampler, resolved): batched = a decode step per decision on a KV cache;
    lookahead = the rows with a trie run their prompt and every admissible response in one packed forward
    (`sdar.agent.lookahead`, rows of pack_tokens positions): no decode step at all. Either way every live row's
    token is decided in one batched pass (`sdar.agent.draws.decide`) and the same tokens and log-probs come out, up
    to float rounding: those the per-row reference draws (tests/agent/row_oracle.py).
    """
    if temperature <= 0:
        raise ValueError(f"constrained_sample samples: temperature must be > 0, got {temperature}")
    if sampler not in LAYOUTS:
        raise ValueError(f"unknown sampler {sampler!r}; choose one of {', '.join(LAYOUTS)}")
    device = next(model.parameters()).device
    B = len(prompts)
    # one generator per row, seeded from the global stream: a row's draws do not depend on the batch
    if seeds is None:
        seeds = torch.randint(0, 2**62, (B,), dtype=torch.long).tolist()
    elif len(seeds) != B:
        raise ValueError(f"constrained_sample got {len(seeds)} seeds for {B} prompts; pass one seed per prompt")
    gens = row_generators(seeds, device)
    st = stats if stats is not None else DecodeStats()
    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, eos=set(eos_ids), pad_id=pad_id,
              jump_forward=jump_forward, share_prefix=share_prefix, st=st)
    if sampler == "lookahead" and packs(model):
        ahead = [i for i, t in enumerate(tries) if t is not None]
        rest = [i for i, t in enumerate(tries) if t is None]
        out: list[Decoded | None] = [None] * B
        for i, row in zip(ahead, lookahead_sample(model, [prompts[i] for i in ahead], [tries[i] for i in ahead],
                                                  [gens[i] for i in ahead], budget=pack_tokens, **kw) if ahead else []):
            out[i] = row
        for i, row in zip(rest, _sample_batched(model, [prompts[i] for i in rest], [None] * len(rest),
                                                [gens[i] for i in rest], **kw) if rest else []):
            out[i] = row
        return out
    return _sample_batched(model, prompts, tries, gens, **kw)


def _sample_batched(model, prompts, tries, gens, *, max_new_tokens, temperature, top_p, eos, pad_id, jump_forward,
                    share_prefix, st) -> list[Decoded]:
    """Every live row's next token decided in one batched pass per step (`sdar.agent.draws.decide`), from the
    decoder's last hidden states through the head where the model splits into the two, a forward per step."""
    device = next(model.parameters()).device
    split = decoder_and_head(model)
    decoder, head = split if split is not None else (None, None)
    past, last, attn, count, encoded = _prefill(model, prompts, pad_id, device, share_prefix, decoder=decoder)
    st.prefill_tokens += encoded
    rows = RowWalk(len(prompts), tries, eos, max_new_tokens, jump_forward)
    vocab = head.out_features if head is not None else last.shape[-1]

    def draw(need: list[int], sets: list) -> tuple[list[int], list[float]]:
        at = torch.tensor(need, device=device)
        source = {"states": last[at], "head": head} if decoder is not None else {"logits": last[at]}
        return decide(sets, [gens[i] for i in need], temperature=temperature, top_p=top_p, vocab=vocab, **source)

    while (chunks := rows.step(draw)) is not None:
        past, last, attn, count = _decode_forward(model, chunks, pad_id, past, attn, count, decoder=decoder)
        st.forwards += 1
    return rows.decoded(st)
