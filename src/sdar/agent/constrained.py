"""Constrained decoding over the admissible actions: the policy can only emit one of them.

A tiny model that must spell actions freely mostly produces inadmissible ones; constrained to a
token trie of the admissible responses it picks among valid actions, and the trainer scores the
same constrained (renormalised) distribution, so the RL update stays exactly on-policy.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from sdar.agent.parsing import format_action


class ActionTrie:
    """A prefix tree of token sequences (one per admissible response, each ending in EOS)."""

    def __init__(self, sequences: list[list[int]]) -> None:
        # kept as plain lists: what crosses a process boundary (vLLM's engine rebuilds the trie from them)
        self.sequences = [[int(t) for t in seq] for seq in sequences]
        self.root: dict[int, dict] = {}
        for seq in self.sequences:
            node = self.root
            for tok in seq:
                node = node.setdefault(tok, {})

    def allowed(self, prefix: list[int]) -> list[int]:
        """Tokens that may follow `prefix` ([] once a sequence is complete or off the tree)."""
        node = self.root
        for tok in prefix:
            node = node.get(tok)
            if node is None:
                return []
        return list(node)

    def allowed_along(self, seq: list[int]) -> list[list[int]]:
        """For each position k of `seq`, the tokens that were allowed in place of seq[k]."""
        out, node = [], self.root
        for tok in seq:
            out.append(list(node) if node is not None else [])
            node = node.get(tok) if node is not None else None
        return out


def action_trie(tokenizer, family: str, actions: list[str], eos_id: int) -> ActionTrie:
    """The trie of `format_action(family, a) + EOS` for every admissible action `a`."""
    seqs = [tokenizer(format_action(family, a), add_special_tokens=False)["input_ids"] + [eos_id] for a in actions]
    return ActionTrie(seqs)


class TrieLogitsProcessor(LogitsProcessor):
    """Masks every token a row's trie does not allow next (rows without a trie are free)."""

    def __init__(self, tries: list[ActionTrie | None], prompt_width: int) -> None:
        self.tries, self.prompt_width = tries, prompt_width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        generated = input_ids[:, self.prompt_width :].tolist()
        for i, trie in enumerate(self.tries):
            if trie is None:
                continue
            allowed = trie.allowed(generated[i])
            if not allowed:  # finished (EOS emitted); generate pads the row from here
                continue
            keep = scores[i, allowed].clone()
            scores[i] = float("-inf")
            scores[i, allowed] = keep
        return scores


class TrieTokenFilter:
    """One request's constraint as vLLM's per-request logits-processor function:
    `(output_ids, logits [V]) -> logits` with every token the trie does not allow next at -inf.

    The same masking as `TrieLogitsProcessor` (a row of it), so vLLM samples from the renormalised
    distribution that `sdar.models.scoring.allowed_mask` makes the trainer score. Used directly as a V0
    `SamplingParams.logits_processors` entry, and wrapped per request by
    `sdar.agent.vllm_trie.TrieAdapterLogitsProcessor` on the V1 engine.
    """

    def __init__(self, trie: ActionTrie) -> None:
        self.trie = trie

    def __call__(self, output_ids, logits: torch.Tensor) -> torch.Tensor:
        allowed = self.trie.allowed(list(output_ids))
        if not allowed:  # complete (EOS emitted) or off the tree: the engine stops the request anyway
            return logits
        idx = torch.tensor(allowed, dtype=torch.long, device=logits.device)
        keep = logits.index_select(-1, idx)
        logits.fill_(float("-inf"))
        logits.index_copy_(-1, idx, keep)
        return logits
