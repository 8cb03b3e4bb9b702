"""The update phase of a step: ppo.epochs passes over the step's rows (every rank's, in one global order), a
mini-batch per optimizer step, each cut into micro-batches whose losses accumulate gradients; the ranks' gradients
are summed, clipped and stepped, and an update that breaks the weights is undone (`sdar.train.guards`).

Each loss term of a micro-batch is weighted by this rank's share of its own denominator: the policy's terms by the
rank's part of the micro-batch's policy tokens, the hint channel by its part of the hint tokens, the replay DPO by
its part of the micro-batch's pairs; summed over the ranks, the weighted losses are one process's."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from sdar.algos import LossBatch, compose_loss
from sdar.algos.arms import LOSS_TERMS, metric_term
from sdar.models.scored import pick
from sdar.train.batch import StepBatch, UpdateResult
from sdar.train.channels import HintChannel, PairChannel
from sdar.train.distributed import RowSplit
from sdar.train.guards import UpdateGuard
from sdar.train.strategy import Strategy

PRESENT = "present:"  # a mini-batch metric's companion: the summed weight of the micro-batches (and ranks) that had it


def micro_batches(split: RowSplit, rows: list[int], size: int, agg: str, normalisation: str
                  ) -> list[tuple[list[int], float]]:
    """The micro-batches of mini-batch `rows` (global row ids, in order) and this rank's weight for the loss
    it computes on each, aggregated (`agg`) over that micro-batch's rows.

    micro_batch: the mini-batch's loss is the mean of its micro-batches' losses (the reference: verl's
        dp_actor.update_policy divides each micro-batch's token-mean by gradient_accumulation);
    mini_batch: one aggregation over the whole mini-batch's tokens, split for memory only.
    Summed over ranks (alone: as they are), the weighted losses give the mini-batch's loss exactly.
    """
    if normalisation not in ("micro_batch", "mini_batch"):
        raise ValueError(f"ppo.loss_normalisation={normalisation!r} is not one of micro_batch, mini_batch")
    parts = [rows[k : k + size] for k in range(0, len(rows), size)]
    if normalisation == "micro_batch":
        return [(part, split.share(part, agg) / len(parts)) for part in parts]
    return [(part, split.share(part, agg, within=rows)) for part in parts]


def finish_metrics(summed: dict[str, float]) -> dict[str, float]:
    """The mini-batch's metrics from their weighted sums over micro-batches and ranks: a term only some micro-batches
    carry (replay pairs) is a mean over those (its sum scaled by the whole weight over the weight it had)."""
    whole = summed.get(PRESENT + "loss/total", 0.0)
    out = {}
    for k, v in summed.items():
        if k.startswith(PRESENT):
            continue
        had = summed.get(PRESENT + k, whole)
        out[k] = v * (whole / had) if 0.0 < had < whole else v
    return out


@dataclass
class UpdateState:
    """What the update computes while it walks a step: old_logp [B, T] with the rows its first forward fills (the
    weights have not moved yet: that forward is old_logp), the rows still to fill, the micro-batch it is at (pair g
    rides in micro-batch g mod M of every epoch), and which of this rank's pairs ride in each."""

    old_logp: torch.Tensor
    reuse: set[int]
    slots: dict[int, list[int]] = field(default_factory=dict)  # micro-batch -> this rank's pairs (local indices)
    slot_totals: dict[int, int] = field(default_factory=dict)  # micro-batch -> every rank's pairs in it
    micro_index: int = 0


class Updater:
    """The update phase over the policy's trainable `params`, with the run's optimizer, strategy and guard."""

    def __init__(self, *, cfg, arm, policy, scorer, optimizer, params: list, strategy: Strategy, guard: UpdateGuard,
                 hints: HintChannel | None, say) -> None:
        self.cfg, self.arm, self.policy, self.scorer = cfg, arm, policy, scorer
        self.optimizer, self.params, self.strategy, self.guard, self.hints, self.say = \
            optimizer, params, strategy, guard, hints, say
        self.normalisation = arm.normalisation(cfg.ppo.loss_normalisation)

    @property
    def model(self):
        return self.policy.model

    def run(self, step: int, b: StepBatch) -> UpdateResult:
        """ppo.epochs passes over the step's rows, a mini-batch each."""
        t0, size = time.perf_counter(), self.cfg.ppo.mini_batch_size
        state = UpdateState(old_logp=b.old.logp.clone(), reuse=set(b.reuse))
        if b.split.n_pairs:
            state.slots, state.slot_totals = self.pair_slots(b.split, list(b.orders[0]))
        sums: dict[str, float] = {}
        updates = 0
        for order in b.orders:
            state.micro_index = 0  # pairs ride in micro-batch g mod M of every epoch
            for start in range(0, b.split.n, size):
                metrics = self._mini_batch(step, b, state, list(order[start : start + size]))
                if metrics is not None:
                    updates += 1
                    for k, v in metrics.items():
                        sums[k] = sums.get(k, 0.0) + float(v)
        return UpdateResult(MappingProxyType(sums), updates, time.perf_counter() - t0)

    def pair_slots(self, split: RowSplit, first_order: list[int]) -> tuple[dict[int, list[int]], dict[int, int]]:
        """Channel 3: the step's pair g (its index over the ranks) rides in micro-batch g mod M of every epoch (M
        micro-batches per epoch): this rank's pairs by micro-batch (local indices), and every rank's count in each."""
        cfg, size = self.cfg, self.cfg.ppo.mini_batch_size
        n_micro = max(sum(len(micro_batches(split, first_order[s : s + size], cfg.ppo.micro_batch_size,
                                            self.arm.aggregation, self.normalisation))
                          for s in range(0, split.n, size)), 1)
        slots: dict[int, list[int]] = {}
        for p in range(split.pairs[split.rank]):
            slots.setdefault((split.pair_offset + p) % n_micro, []).append(p)
        totals: dict[int, int] = {}
        for g in range(split.n_pairs):
            totals[g % n_micro] = totals.get(g % n_micro, 0) + 1
        return slots, totals

    def _mini_batch(self, step: int, b: StepBatch, state: UpdateState, rows: list[int]) -> dict[str, float] | None:
        """One optimizer step on mini-batch `rows` (global ids): its micro-batches' losses and gradients, then the
        update; its metrics (weighted means over the mini-batch), or None when the update was skipped."""
        self.optimizer.zero_grad(set_to_none=True)
        with self.strategy.gathered(self.policy):  # fsdp: the gradients accumulate whole, then one reduce-scatter
            metrics, finite = self._accumulate(b, state, rows)
            self.strategy.finish_backward(self.model, self.scorer.pad_id)
        return self._apply(step, b, state, rows, metrics, finite)

    def _accumulate(self, b: StepBatch, state: UpdateState, rows: list[int]) -> tuple[dict[str, float], bool]:
        """The gradients of mini-batch `rows`, micro-batch by micro-batch (this rank's share of each term), and its
        weighted metrics, each beside the weight it was summed with (`PRESENT`, for `finish_metrics`); False when a
        micro-batch's loss was not finite (the update is then skipped)."""
        finite, metrics, split, agg = True, {}, b.split, self.arm.aggregation
        parts = micro_batches(split, rows, self.cfg.ppo.micro_batch_size, agg, self.normalisation)
        for part, weight in parts:
            mb, pair_idx = split.local(part), state.slots.get(state.micro_index, [])
            base = 1.0 / len(parts) if self.normalisation == "micro_batch" else split.fraction(part, rows, agg)
            scales = {}
            if sum(split.hint_tokens[i] for i in part):  # error sites in this micro-batch, on some rank
                scales["hint_jsd"] = base * split.share(part, agg, counts="hint_tokens")
            if state.slot_totals.get(state.micro_index):  # pairs ride in this micro-batch, on some rank
                scales["replay_dpo"] = base * len(pair_idx) / state.slot_totals[state.micro_index]
            # a rank with no rows of this micro-batch still forms its (empty) loss: every rank then reports the
            # same metric names to the reduction
            total, part_metrics = self._micro_loss(b, state, mb, pair_idx, scales, weight)
            state.micro_index += 1
            if not bool(torch.isfinite(total)):
                finite = False  # the update is skipped; the other micro-batches still report metrics
            elif (mb or pair_idx) and finite and total.requires_grad:
                total.backward()
            for k, (v, w) in part_metrics.items():  # (the weighted value, the weight it carries)
                metrics[k] = metrics.get(k, 0.0) + v
                metrics[PRESENT + k] = metrics.get(PRESENT + k, 0.0) + w
        if state.reuse:  # a micro-batch never ran (non-finite loss): score its rows now, unmoved
            rest = sorted(state.reuse)
            got = self.scorer.score(self.model, pick(b.prompts, rest), pick(b.responses, rest), pick(b.allowed, rest))
            state.old_logp[torch.tensor(rest), : got.logp.shape[1]] = got.logp
            state.reuse = set()
        return metrics, finite

    def _apply(self, step: int, b: StepBatch, state: UpdateState, rows: list[int], metrics: dict[str, float],
               finite: bool) -> dict[str, float] | None:
        """Sum the ranks' gradients, clip and step; skip the update (None) when the loss, the gradient or the
        weights after it are not finite, restoring the weights of before it."""
        self.guard.attempted += 1
        if not finite:
            self.optimizer.zero_grad(set_to_none=True)
        # metrics are already weighted: summed over ranks they are the mini-batch's
        finite, metrics = self.strategy.reduce(self.params, metrics, finite)
        metrics = finish_metrics(metrics)
        why = None if finite else "non-finite loss, update skipped"
        gn = self.strategy.clip(self.params, self.cfg.optim.grad_clip) if finite else None
        if gn is not None and not torch.isfinite(gn):
            why = "non-finite gradient, update skipped"
        if why is None and not self.guard.step(self.optimizer, self.params,
                                               lambda: self._healthy(b, _shortest(b, b.split.local(rows)))):
            why = "the update made the weights or the policy's log-probs non-finite; restored the weights of before it"
        if why is not None:
            self.guard.skip(self.optimizer)
            self.say(f"[yellow]step {step}: {why}[/yellow]")
            return None
        return {**metrics, "grad_norm": gn}

    def _healthy(self, b: StepBatch, rows: list[int]) -> bool:
        """On every rank: the trainable weights are finite and the policy scores `rows` (local) to finite log-probs
        (weights that are finite but huge, lr far too high, overflow in the forward and would fail the next
        rollout)."""
        from sdar.train import distributed
        from sdar.train.fsdp import local

        with self.strategy.gathered(self.policy):
            ok = all(bool(torch.isfinite(local(p.detach())).all()) for p in self.params)  # this rank's (shards)
            if ok and rows:
                scored = self.scorer.score(self.model, pick(b.prompts, rows), pick(b.responses, rows),
                                           pick(b.allowed, rows))
                ok = bool(torch.isfinite(scored.logp).all())
        return distributed.all_true(ok, self.strategy.dist)

    def _micro_loss(self, b: StepBatch, state: UpdateState, mb: list[int], pair_idx: list[int],
                    scales: dict[str, float], weight: float):
        """The arm's composed loss on local rows `mb` (one forward with grad), over their free tokens, plus
        the DPO term on the replay pairs `pair_idx` of this step when this micro-batch carries some, each term
        weighted for this rank: the policy's terms by `weight`, the terms named in `scales` by theirs. Returns the
        weighted loss and each metric as (weighted value, weight)."""
        cur = self.scorer.with_grad(self.model, pick(b.prompts, mb), pick(b.responses, mb), pick(b.allowed, mb),
                                    groups=pick(b.groups, mb))
        T = cur.logp.shape[1]
        idx = torch.tensor(mb, dtype=torch.long)
        fill = [j for j, i in enumerate(mb) if i in state.reuse]
        if fill:  # first forward on unchanged weights: it is old_logp (exact), no separate pass needed
            rows = torch.tensor([mb[j] for j in fill], dtype=torch.long)
            state.old_logp[rows, :T] = cur.logp.detach()[torch.tensor(fill)].to(state.old_logp.device)
            state.reuse -= {mb[j] for j in fill}
        channels = {}
        if self.hints is not None:
            channels.update(self.hints.inputs(self.model, b.prompts, b.responses, b.allowed, b.free, b.hint_prompts,
                                              mb, cur.logp.device).loss_fields())
        if pair_idx and self.arm.replay_coef != 0.0:
            channels.update(PairChannel.inputs(self.model, self.scorer, b.pairs, list(pair_idx)).loss_fields())
        batch = LossBatch(
            logp=cur.logp, old_logp=state.old_logp[idx, :T], advantages=b.rollouts.advantages[idx].to(cur.logp.device),
            mask=cur.mask * b.free[idx, :T].to(cur.mask.device),
            ref_logp=None if b.ref is None else b.ref.logp[idx, :T],
            teacher_logp=None if b.teacher is None else b.teacher.logp[idx, :T],
            entropy=cur.entropy, budget=self.cfg.rollout.max_response_tokens, **channels,
        )
        if all(v == weight for v in scales.values()):  # every term weighted alike (always alone): one product
            total, metrics = compose_loss(self.arm, batch)
            return total * weight, {k: (weight * float(v), weight) for k, v in metrics.items()}
        total, metrics = compose_loss(self.arm, batch, scales={**{t: weight for t in LOSS_TERMS}, **scales})
        out = {}
        for k, v in metrics.items():
            w = weight if k == "loss/total" else scales.get(metric_term(k), weight)
            # loss/total comes weighted term by term already; its presence counts as the policy's
            out[k] = (float(v) if k == "loss/total" else w * float(v), w)
        return total, out


def _shortest(b: StepBatch, rows: list[int]) -> list[int]:
    """The shortest of `rows` (prompt and response), as a list of one or none: the update guard's check scores it,
    the cheapest forward."""
    return [min(rows, key=lambda i: len(b.prompts[i]) + len(b.responses[i]))] if rows else []
