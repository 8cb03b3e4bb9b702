"""The Scorer: how every forward of a run scores responses, over the layouts of sdar.models.scoring (padded, length
bucketed, from a group's shared prefix KV) and sdar.models.packing (prefix trees in one forward), choosing the layout
per pass from its settings and the model."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sdar.models.packing import packed_response_logits, packed_response_logprobs, packs
from sdar.models.scored import ScoredBatch, forced, response_mask
from sdar.models.scoring import grouped_prefix_logprobs, response_logits, response_logprobs


@dataclass(frozen=True)
class Scorer:
    """How every forward of a run scores responses: the scoring passes (old_logp, the reference, the teacher),
    the update's forward with gradients, the DPO pairs' sums and the hint channel's logits. All at `temperature`,
    the rollout's (scores are those of the distribution the tokens were sampled from; the hint logits excepted,
    see `response_logits`), with shortcuts none of which changes a number beyond float rounding
    (tests/train/test_reference_parity.py; all on but in checks and benchmarks). `build_runtime` makes the run's one
    Scorer (`Scorer.of`); a caller passes a model and rows, never a temperature or a switch.

    batch_size: sequences per no-grad forward. prefix_cache: rows of one group (a task's turn-samples) continue
    from one KV cache of the prompt start they share. dedup: a pass forwards each distinct row once (the update's
    too: equal rows' losses then share one forward's output, and its gradient sums theirs).
    length_buckets: rows of similar length forwarded together. head_at_free_tokens: inside `scope()`, the output
    head runs only at the response tokens that are not forced. packed: a pass (an update micro-batch, the DPO
    pairs' sums, the hint channel's logits) is one forward of its rows' prefix trees, rows of pack_tokens positions
    (`sdar.models.packing`); a model whose attention takes no tree mask keeps the paths above. trim_forced_tails: a
    row's response goes through the forwards only up to its last token that is not forced (`needed_lengths`).
    """

    temperature: float = 1.0
    pad_id: int = 0
    batch_size: int | None = 16
    prefix_cache: bool = True
    dedup: bool = True
    length_buckets: bool = True
    head_at_free_tokens: bool = True
    packed: bool = False
    pack_tokens: int = 2048
    trim_forced_tails: bool = True

    @classmethod
    def of(cls, cfg, pad_id: int, device=None, **shortcuts: bool) -> Scorer:
        """The Scorer of a TrainConfig: its `scoring:` section at its rollout temperature (packed: auto per device),
        every shortcut taken unless `shortcuts` turns one off (sdar.train.runtime.Shortcuts)."""
        s = cfg.scoring
        return cls(temperature=cfg.rollout.temperature, pad_id=pad_id, batch_size=s.batch_size,
                   packed=cfg.resolved_packed(device), pack_tokens=s.pack_tokens, **shortcuts)

    def scope(self):
        """The context every forward of a step runs in (where the output head runs: `head_where_needed`)."""
        from sdar.models.logprobs import head_where_needed

        return head_where_needed(self.head_at_free_tokens)

    def score(self, model, prompts: list[list[int]], responses: list[list[int]], allowed, groups: list | None = None
              ) -> ScoredBatch:
        """No-grad log-probs [B, T] of every row's response. groups: a key per row whose rows share their prompt
        start (a task's turn-samples); with prefix_cache that start is encoded once per group."""
        trimmed = self._trimmed(responses, allowed)
        if trimmed is not None:
            return _untrimmed(self.score(model, prompts, *trimmed, groups), responses)
        if self._packs(model, prompts):
            return packed_response_logprobs(model, prompts, responses, pad_id=self.pad_id, budget=self.pack_tokens,
                                            allowed=allowed, temperature=self.temperature)
        if groups is not None and self.prefix_cache:
            return grouped_prefix_logprobs(model, prompts, responses, groups, pad_id=self.pad_id, batch_size=self.batch_size,
                                           allowed=allowed, temperature=self.temperature, dedup=self.dedup)
        return response_logprobs(model, prompts, responses, pad_id=self.pad_id, batch_size=self.batch_size, allowed=allowed,
                                 temperature=self.temperature, length_buckets=self.length_buckets, dedup=self.dedup)

    def with_grad(self, model, prompts: list[list[int]], responses: list[list[int]], allowed,
                  groups: list | None = None) -> ScoredBatch:
        """The update's forward: log-probs and entropies [B, T] with gradients (one micro-batch; groups as in
        `score`)."""
        trimmed = self._trimmed(responses, allowed)
        if trimmed is not None:
            return _untrimmed(self.with_grad(model, prompts, *trimmed, groups), responses)
        if self._packs(model, prompts):
            return packed_response_logprobs(model, prompts, responses, pad_id=self.pad_id, budget=self.pack_tokens,
                                            allowed=allowed, temperature=self.temperature, grad=True, with_entropy=True)
        if groups is not None and self.prefix_cache and len(prompts) > 1:
            return grouped_prefix_logprobs(model, prompts, responses, groups, pad_id=self.pad_id, allowed=allowed,
                                           temperature=self.temperature, grad=True, with_entropy=True, dedup=self.dedup)
        return response_logprobs(model, prompts, responses, pad_id=self.pad_id, with_entropy=True, grad=True,
                                 allowed=allowed, temperature=self.temperature, length_buckets=self.length_buckets,
                                 dedup=self.dedup)

    def _trimmed(self, responses, allowed):
        """(responses, allowed) cut after each row's last token that is not forced, or None when this Scorer does not
        trim or no row ends in forced tokens."""
        if not self.trim_forced_tails or allowed is None:
            return None
        keep = needed_lengths(responses, allowed)
        if all(k == len(r) for k, r in zip(keep, responses)):
            return None
        return ([r[:k] for r, k in zip(responses, keep)],
                [a[:k] if a is not None else None for a, k in zip(allowed, keep)])

    def _packs(self, model, prompts) -> bool:
        """Whether this pass runs packed: the switch is on, there are rows, and the model takes a tree mask."""
        return self.packed and bool(prompts) and packs(model)

    @property
    def scores_raw_logits(self) -> bool:
        """Whether this Scorer's log-probs are those of the raw logits (temperature 1): what an engine's prompt
        log-probs are (vLLM's), so that they can stand in for this Scorer's forward."""
        return self.temperature == 1.0

    def response_logits(self, model, prompts: list[list[int]], responses: list[list[int]], allowed,
                        grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The hint channel's forward: next-token logits float32 [B, T, V] at the positions that predict each
        row's response tokens (0 past a row's response; disallowed tokens of constrained steps at MASKED) and the
        response mask [B, T]; with gradients when `grad`. At temperature 1, not this Scorer's: the generalized JSD
        (`sdar.algos.generalized_jsd`) divides both sides by the arm's own `jsd_temperature`, as the channel
        always has."""
        if self._packs(model, prompts):
            return packed_response_logits(model, prompts, responses, pad_id=self.pad_id, budget=self.pack_tokens,
                                          allowed=allowed, grad=grad)
        return response_logits(model, prompts, responses, pad_id=self.pad_id, allowed=allowed, grad=grad)

    def summed(self, model, prompts: list[list[int]], responses: list[list[int]], allowed, grad: bool = False
               ) -> torch.Tensor:
        """[P] summed log-probs of each response after its prompt (forced tokens contribute log 1 = 0): the DPO
        term's sequence scores, with gradients when `grad`; one packed forward when this Scorer packs (a pair's
        chosen and rejected responses share their prompt, computed once)."""
        if not prompts:
            return torch.zeros(0)
        trimmed = self._trimmed(responses, allowed)
        if trimmed is not None:  # the tokens cut carry log-prob 0: the same sums
            responses, allowed = trimmed
        if self._packs(model, prompts):
            s = packed_response_logprobs(model, prompts, responses, pad_id=self.pad_id, budget=self.pack_tokens,
                                         allowed=allowed, temperature=self.temperature, grad=grad)
        else:
            s = response_logprobs(model, prompts, responses, pad_id=self.pad_id, grad=grad, allowed=allowed,
                                  batch_size=None if grad else self.batch_size, temperature=self.temperature)
        return (s.logp * s.mask).sum(dim=1)


def needed_lengths(responses: list[list[int]], allowed) -> list[int]:
    """Per row, the response tokens a forward needs: up to its last token that is not forced (a constrained step
    whose only allowed token is the one sampled). The tokens after it (the rest of an action its first tokens chose,
    the closing tags, end of turn) have log-prob 0 and entropy 0 under every model that scores them in the same
    allowed sets (policy, reference, teacher), and no gradient, so no loss term or statistic reads a position for
    them: a row of issue 46's SmolLM2 step ends in 5-7 such tokens, 3% of every pass's positions."""
    keep = []
    for j, r in enumerate(responses):
        steps = allowed[j] if allowed is not None else None
        n = len(r)
        while steps is not None and 0 < n <= len(steps) and forced(steps[n - 1], r[n - 1]):
            n -= 1
        keep.append(n)
    return keep


def _untrimmed(scored: ScoredBatch, responses: list[list[int]]) -> ScoredBatch:
    """A trimmed pass's scores on the full responses: log-probs and entropies 0 on the tokens cut (theirs exactly),
    the mask of every response token, as the untrimmed pass returns them."""
    T = max((len(r) for r in responses), default=0)
    pad = T - scored.logp.shape[1]

    def full(x):
        return None if x is None else torch.nn.functional.pad(x, (0, pad))

    return ScoredBatch(logp=full(scored.logp), entropy=full(scored.entropy),
                       mask=response_mask(responses, T, scored.mask.device))
