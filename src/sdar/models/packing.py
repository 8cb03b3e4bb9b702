"""Sequences packed as prefix trees: every position a batch's sequences share (a task's prompt start, the same
first turns, a trie of admissible actions) is forwarded once, in one forward for the whole batch.

The sequences, sorted, are cut into rows of at most `budget` positions; a row holds the prefix tree of its
sequences in depth-first order, each position with its depth as position id and a tree attention mask (it sees
its ancestors and itself only). A position's hidden state is then the one a plain causal forward of any sequence
through it computes (equal up to float rounding: other matrix shapes sum in another order).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from sdar.models.logits import keep_mask, process_logits
from sdar.models.logprobs import decoder_and_head, head_where_needed_on, logp_and_entropy
from sdar.models.scored import ScoredBatch, forced, response_mask

# the attention implementations that take a 4D mask as it is (transformers' masking_utils returns a 4D mask
# untouched): sdpa reads a bool mask (True = attend), eager adds a float one
TREE_MASK_ATTENTION = ("sdpa", "eager")


@dataclass
class Forest:
    """Sequences as prefix trees in R rows of W positions.

    ids, depth, end: long [R, W]: each position's token (pad_id past a row's nodes), its depth (the position id),
    and the column after its subtree (depth-first order: column j is an ancestor of column i, or i itself, iff
    j <= i < end[j]; a pad has end = its own column, so no position sees it).
    row_of[s], cols[s]: sequence s's row and the column of each of its tokens. positions: the nodes (real
    positions) over all rows."""

    ids: torch.Tensor
    depth: torch.Tensor
    end: torch.Tensor
    row_of: list[int]
    cols: list[list[int]]
    positions: int

    def mask(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tree attention mask [R, 1, W, W] for `model(attention_mask=...)`: bool (True = attend) or, with a
        float `dtype` (eager attention), 0 where attended and the dtype's lowest value elsewhere. A pad attends to
        its row's first position only (a finite state no real position reads); a real position attends to itself,
        which is how a meter tells them apart (the mask's diagonal)."""
        W, device = self.ids.shape[1], self.ids.device
        col = torch.arange(W, device=device)
        q, k = col.view(1, W, 1), col.view(1, 1, W)
        seen = (k <= q) & (q < self.end.unsqueeze(1))
        pad = (self.end <= col.view(1, W)).unsqueeze(-1) & (k == 0)  # [R, W, 1] & [1, 1, W]
        m = (seen | pad).unsqueeze(1)
        if dtype is None or dtype == torch.bool:
            return m
        return torch.zeros(m.shape, dtype=dtype, device=device).masked_fill_(~m, torch.finfo(dtype).min)

    def forward_kwargs(self, model) -> dict:
        """input_ids, attention_mask (the tree mask in the form the model's attention reads) and position_ids."""
        impl = tree_attention(model)
        dtype = None if impl == "sdpa" else next(model.parameters()).dtype
        return dict(input_ids=self.ids, attention_mask=self.mask(dtype), position_ids=self.depth)


def tree_attention(model) -> str | None:
    """The model's attention implementation when it takes a tree mask (`TREE_MASK_ATTENTION`), else None."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None) if config is not None else None
    return impl if impl in TREE_MASK_ATTENTION else None


def pack(seqs: list[list[int]], budget: int, pad_id: int, device=None) -> Forest:
    """The prefix trees of `seqs` in rows of at most `budget` positions (a sequence longer than that gets a row of
    its own). Sorted, each sequence adds its tokens after the longest prefix it shares with the one before it in
    its row, which lays the row's tree out depth first."""
    order = sorted(range(len(seqs)), key=lambda i: seqs[i])
    rows: list[tuple[list[int], list[int], list[int]]] = []
    row_of, cols = [0] * len(seqs), [[] for _ in seqs]
    ids: list[int] = []
    depth: list[int] = []
    end: list[int] = []
    stack: list[int] = []  # the columns of the open path (their subtrees not yet closed)
    prev: list[int] = []
    prev_cols: list[int] = []

    def close(upto: int) -> None:  # the open nodes at depth >= upto end here
        while len(stack) > upto:
            end[stack.pop()] = len(ids)

    for i in order:
        s = seqs[i]
        k = len(os.path.commonprefix([prev, s])) if ids else 0
        if ids and len(ids) + len(s) - k > budget:
            close(0)
            rows.append((ids, depth, end))
            ids, depth, end, stack, k = [], [], [], [], 0
        close(k)
        new = list(range(len(ids), len(ids) + len(s) - k))
        ids += s[k:]
        depth += range(k, len(s))
        end += [0] * len(new)
        stack += new
        row_of[i], cols[i] = len(rows), prev_cols[:k] + new
        prev, prev_cols = s, cols[i]
    if ids:
        close(0)
        rows.append((ids, depth, end))
    W = max((len(r[0]) for r in rows), default=0)
    out = [[], [], []]
    for r in rows:
        n = len(r[0])
        out[0].append(r[0] + [pad_id] * (W - n))
        out[1].append(r[1] + [0] * (W - n))
        out[2].append(r[2] + list(range(n, W)))  # a pad's subtree is empty
    ids_t, depth_t, end_t = (torch.tensor(x, dtype=torch.long, device=device).view(len(rows), W) for x in out)
    return Forest(ids_t, depth_t, end_t, row_of, cols, sum(len(r[0]) for r in rows))


def packed_hidden(model, forest: Forest, **kw):
    """The decoder's output over the forest (`model.get_decoder()`): last hidden states [R, W, H] and, with
    use_cache=True in kw, the KV cache of every position. None when the model's logits are not its output head on
    its decoder's states (`decoder_and_head`) or its attention does not take a tree mask."""
    split = decoder_and_head(model)
    if split is None or tree_attention(model) is None:
        return None
    return split[0](**forest.forward_kwargs(model), **kw)


def packs(model) -> bool:
    """Whether `model` can run a packed forward (its attention takes a tree mask and its head splits off)."""
    return tree_attention(model) is not None and decoder_and_head(model) is not None


def packed_response_logprobs(model, prompts: list[list[int]], responses: list[list[int]], *, pad_id: int,
                             budget: int, allowed: list[list[list[int]] | None] | None = None, temperature: float = 1.0,
                             grad: bool = False, with_entropy: bool = False, head_rows: int = 512):
    """`sdar.models.scoring.response_logprobs` of every row from ONE forward of their prefix trees (`pack`): each
    position the rows share (a prompt start, an identical row) is computed once, no padding but the rows' ends.
    The output head runs once per distinct position that predicts a response token that is not forced (as
    `head_where_needed`), then each row's own allowed set and the temperature apply (`process_logits`).
    Without grad the head and the softmax go `head_rows` positions at a time. Returns a `ScoredBatch`; the
    caller checks `packs(model)` first."""

    n, T = len(prompts), max((len(r) for r in responses), default=0)
    device = next(model.parameters()).device
    zero = torch.zeros(n, T, device=device)
    mask = response_mask(responses, T, device)
    forest = pack([p + r for p, r in zip(prompts, responses)], budget, pad_id, device)
    picks, node_of = _picks(forest, prompts, responses, allowed)
    with torch.enable_grad() if grad else torch.no_grad():
        hidden = packed_hidden(model, forest, use_cache=False).last_hidden_state
        if not picks:  # every token forced: a zero that keeps the graph (a loss still backpropagates)
            nothing = hidden.sum() * 0.0 if grad else 0.0
            return ScoredBatch(logp=zero + nothing, entropy=zero.clone() if with_entropy else None, mask=mask)
        head = decoder_and_head(model)[1]
        nodes = torch.tensor(list(node_of), device=device)  # [N, 2] distinct (row, column)
        states = hidden[nodes[:, 0], nodes[:, 1]]
        rows, ks, targets, sets, node = zip(*picks)
        step = len(picks) if grad else head_rows
        lps, ents = [], []
        for a in range(0, len(picks), step):
            sl = slice(a, a + step)
            at = torch.tensor(node[sl], device=device)
            logits = head(states[at])
            z = process_logits(logits, temperature=temperature, keep=keep_mask(list(sets[sl]), logits.shape[-1], device))
            lp, ent = logp_and_entropy(z, torch.tensor(targets[sl], device=device), with_entropy)
            lps.append(lp)
            ents.append(ent)
        where = (torch.tensor(rows, device=device), torch.tensor(ks, device=device))
        logp = zero.index_put(where, torch.cat(lps))
        entropy = zero.index_put(where, torch.cat(ents)) if with_entropy else None
    return ScoredBatch(logp=logp, entropy=entropy, mask=mask)


def _picks(forest: Forest, prompts, responses, allowed):
    """The scored response tokens: (row, response index, target token, allowed tokens or None, index of its
    position in `node_of`), and node_of: the distinct (forest row, column) positions whose logits they read."""
    skip_forced = head_where_needed_on()
    node_of: dict[tuple[int, int], int] = {}
    picks = []
    for j, (p, r) in enumerate(zip(prompts, responses)):
        if len(p) < 1:
            raise ValueError(f"row {j} has an empty prompt: the first response token is predicted from the last prompt token")
        steps = allowed[j] if allowed is not None else None
        for k, tok in enumerate(r):
            toks = steps[k] if steps is not None and k < len(steps) else None
            if skip_forced and forced(toks, tok):
                continue  # log-prob 0, entropy 0, no gradient: no head
            at = (forest.row_of[j], forest.cols[j][len(p) - 1 + k])
            picks.append((j, k, tok, toks or None, node_of.setdefault(at, len(node_of))))
    return picks, node_of


def packed_response_logits(model, prompts: list[list[int]], responses: list[list[int]], *, pad_id: int, budget: int,
                           allowed: list[list[list[int]] | None] | None = None, grad: bool = False
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """`sdar.models.scoring.response_logits` from ONE forward of the rows' prefix trees: float32 logits [B, T, V] at
    the positions that predict each row's response tokens (0 past a row's response; a constrained step's disallowed
    tokens at MASKED; temperature 1) and the response mask [B, T]. The head runs once per distinct position."""
    B, T = len(prompts), max((len(r) for r in responses), default=0)
    device = next(model.parameters()).device
    forest = pack([p + r for p, r in zip(prompts, responses)], budget, pad_id, device)
    node_of: dict[tuple[int, int], int] = {}
    picked = []  # (row, response index, allowed tokens or None, index of its position in node_of)
    for j, (p, r) in enumerate(zip(prompts, responses)):
        if len(p) < 1:
            raise ValueError(f"row {j} has an empty prompt: the first response token is predicted from the last prompt token")
        steps = allowed[j] if allowed is not None else None
        for k in range(len(r)):
            at = (forest.row_of[j], forest.cols[j][len(p) - 1 + k])
            picked.append((j, k, steps[k] if steps is not None and k < len(steps) else None, node_of.setdefault(at, len(node_of))))
    head = decoder_and_head(model)[1]
    with torch.set_grad_enabled(grad):
        hidden = packed_hidden(model, forest, use_cache=False).last_hidden_state
        if not picked:  # no response token: the vocabulary from one position (and a graph that keeps a loss alive)
            z = head(hidden[:1, -1]).float()
            return z.new_zeros(B, T, z.shape[-1]) + (z.sum() * 0.0 if grad else 0.0), response_mask(responses, T, device)
        nodes = torch.tensor(list(node_of), device=device)
        states = hidden[nodes[:, 0], nodes[:, 1]]
        rows, ks, sets, node = zip(*picked)
        logits = head(states[torch.tensor(node, device=device)])
        z = process_logits(logits, keep=keep_mask(list(sets), logits.shape[-1], device))
        out = z.new_zeros(B, T, z.shape[-1]).index_put((torch.tensor(rows, device=device), torch.tensor(ks, device=device)), z)
    return out, response_mask(responses, T, device)
