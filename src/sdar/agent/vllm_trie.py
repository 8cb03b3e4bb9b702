"""Constrained decoding inside vLLM's V1 engine: a logits-processor plug-in that vLLM loads by name
in its engine process and applies per request from the trie passed in `SamplingParams.extra_args`.

Imports vllm at module level: only `VLLMBackend` (and vLLM's engine) import this module.
"""

from __future__ import annotations

from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from sdar.agent.constrained import ActionTrie, TrieTokenFilter

# the SamplingParams.extra_args key holding a request's admissible token sequences (list[list[int]])
TRIE_ARG = "sdar_trie"
# what VLLMBackend passes as LLM(logits_processors=[...]): vLLM imports it in the engine process
PROCESSOR_FQCN = "sdar.agent.vllm_trie:TrieAdapterLogitsProcessor"


class TrieAdapterLogitsProcessor(AdapterLogitsProcessor):
    """V1 batch-level wrapper of the per-request `TrieTokenFilter` (requests without a trie are free).

    V1 rejects per-request callables in SamplingParams (they cannot cross to the engine process), so
    the trie travels as plain token lists in extra_args and is rebuilt here once per request.
    """

    def is_argmax_invariant(self) -> bool:
        # masking changes the argmax: it must run before greedy sampling and before temperature
        return False

    def new_req_logits_processor(self, params):
        seqs = (getattr(params, "extra_args", None) or {}).get(TRIE_ARG)
        return None if seqs is None else TrieTokenFilter(ActionTrie(seqs))
