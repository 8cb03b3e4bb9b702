"""Constrained sampling with no decode step: a row's prompt and every response its trie admits go through the model
in one packed forward (`sdar.models.packing`: each prompt start and each trie branch once, a tree attention mask),
so the logits of every decision a row can face are there before the first one is drawn. A turn of constrained
rows is then one forward and a head per decision, whatever its number of decisions (the decode loop's forwards,
one per decision, go: what keeps a GPU busy instead of waiting on launches). The same draws as decoding step by
step (`sdar.agent.walk.RowWalk`, `sdar.agent.draws.decide`), so the same tokens and log-probs up to float
rounding.
"""

from __future__ import annotations

import torch

from sdar.agent.walk import Decoded, DecodeStats, RowWalk
from sdar.agent.draws import decide
from sdar.models.logprobs import decoder_and_head
from sdar.models.packing import pack, packed_hidden


def lookahead_sample(model, prompts: list[list[int]], tries: list, gens: list[torch.Generator], *, budget: int,
                     max_new_tokens: int, temperature: float, top_p: float, eos: set[int], pad_id: int,
                     jump_forward: bool, share_prefix: bool, st: DecodeStats) -> list[Decoded]:
    """One response per prompt, each row constrained by its trie (`tries[i]`, never None), rows of the packed
    forward at most `budget` positions. jump_forward and share_prefix change nothing here (no decode step; every
    shared position is computed once anyway); accepted so that every sampler takes the same settings."""
    device = next(model.parameters()).device
    # each admissible response as far as a decision can read it: not its last token (EOS predicts nothing) and not
    # past the token limit
    seqs, owner = [], []
    for i, (p, trie) in enumerate(zip(prompts, tries)):
        for s in trie.sequences:
            seqs.append(p + s[: max(min(len(s), max_new_tokens) - 1, 0)])
            owner.append(i)
    forest = pack(seqs, budget, pad_id, device)
    hidden = packed_hidden(model, forest, use_cache=False).last_hidden_state  # [R, W, H]
    st.prefill_tokens += forest.ids.numel()
    head = decoder_and_head(model)[1]
    mine = [[] for _ in prompts]
    for k, i in enumerate(owner):
        mine[i].append(k)

    def node(i: int, toks: list[int]) -> tuple[int, int]:
        """The forest position of row i's last token so far (the one whose state predicts its next token)."""
        P, n = len(prompts[i]), len(toks)
        for k in mine[i]:
            if len(seqs[k]) >= P + n and seqs[k][P : P + n] == toks:
                return forest.row_of[k], forest.cols[k][P + n - 1]
        raise ValueError(f"row {i} left its trie at {toks}: its tokens are not an admissible response's start")

    def draw(need: list[int], sets: list) -> tuple[list[int], list[float]]:
        at = torch.tensor([node(i, rows.toks[i]) for i in need], device=device)
        return decide(sets, [gens[i] for i in need], temperature=temperature, top_p=top_p, vocab=head.out_features,
                      states=hidden[at[:, 0], at[:, 1]], head=head)

    rows = RowWalk(len(prompts), tries, eos, max_new_tokens, jump_forward=True)
    while rows.step(draw) is not None:
        pass
    return rows.decoded(st)
