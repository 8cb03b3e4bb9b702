"""The Composer channels' inputs to the loss, each from one typed provider: channel 2 (hint distillation at the
error sites the environment marked) and channel 3 (DPO on the pairs the teacher pool's replay returns). A provider
hands the update a frozen value whose `loss_fields()` are the `sdar.algos.LossBatch` fields of its term."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sdar.agent.rollout import TurnBatch
from sdar.models.scored import pick
from sdar.train import distributed
from sdar.train.distributed import DistContext
from sdar.train.replay import PairSet, ReplayChannel, read_pair_set


@dataclass(frozen=True)
class HintInputs:
    """Channel 2's inputs for a micro-batch's error-site rows: the student's next-token logits (with grad) and the
    hinted teacher's (no grad) [b, T, V] on that turn's response tokens, and the mask [b, T] of their free tokens
    (an empty mask, JSD 0, when the micro-batch holds no error site)."""

    student_logits: torch.Tensor
    teacher_logits: torch.Tensor
    mask: torch.Tensor

    def loss_fields(self) -> dict[str, torch.Tensor]:
        return {"hint_student_logits": self.student_logits, "hint_teacher_logits": self.teacher_logits,
                "hint_mask": self.mask}


class HintChannel:
    """Composer channel 2: which rows are error sites (a step the environment marked with a hint template), the
    hinted teacher context of each (the student's prompt with the rendered hint inserted at that turn), and the
    logits the generalized JSD compares."""

    def __init__(self, family: str, tokenizer, scorer) -> None:
        self.family, self.tokenizer, self.scorer = family, tokenizer, scorer

    def sites(self, batch: TurnBatch) -> dict[int, list[int]]:
        """Error-site row -> its hinted teacher prompt."""
        from sdar.teacher.hints import hint_prompt_ids, render_hint

        return {i: hint_prompt_ids(self.tokenizer, batch.prompts[i], render_hint(self.family, t.hint_template_key,
                                                                                  t.error_args))
                for i, t in enumerate(batch.turns) if t.hint_template_key}

    def inputs(self, model, prompts, responses, allowed, free: torch.Tensor, hinted, rows: list[int],
               device: torch.device) -> HintInputs:
        """The inputs of local rows `rows` (their error sites among them): the student's logits with grad, the
        hinted teacher's without (same weights, eval mode); the JSD is over their free tokens only."""
        err = [i for i in rows if i in hinted]
        if not err:
            z = torch.zeros(1, 1, 1, device=device)
            return HintInputs(z, z, torch.zeros(1, 1, device=z.device))
        resp, allow = pick(responses, err), pick(allowed, err)
        s_logits, hmask = self.scorer.response_logits(model, pick(prompts, err), resp, allow, grad=True)
        was_training = model.training
        model.eval()
        try:
            t_logits, _ = self.scorer.response_logits(model, [hinted[i] for i in err], resp, allow)
        finally:
            model.train(was_training)
        T = hmask.shape[1]
        return HintInputs(s_logits, t_logits, hmask * free[torch.tensor(err), :T].to(hmask.device))


@dataclass(frozen=True)
class PairInputs:
    """Channel 3's inputs for the pairs a micro-batch carries: summed log-probs [P] of the chosen and the rejected
    response under the policy (with grad) and under the frozen reference."""

    chosen_logp: torch.Tensor
    rejected_logp: torch.Tensor
    ref_chosen_logp: torch.Tensor
    ref_rejected_logp: torch.Tensor

    def loss_fields(self) -> dict[str, torch.Tensor]:
        return {"dpo_chosen_logp": self.chosen_logp, "dpo_rejected_logp": self.rejected_logp,
                "dpo_ref_chosen_logp": self.ref_chosen_logp, "dpo_ref_rejected_logp": self.ref_rejected_logp}


class PairChannel:
    """Composer channel 3 inside a run: each step's frozen trajectories go to the teacher pool (`ReplayChannel`);
    the pairs it returns enter the loss a step later, pairs handed in by file (the DAG's teacher_replay step) with
    the first step's. Under torchrun each rank replays its own trajectories; the step's pairs are numbered over the
    ranks in rank order (`RowSplit.pair_offset`)."""

    def __init__(self, cfg, *, family: str, builder, tokenizer, constrained: bool, out_dir, console,
                 dist: DistContext) -> None:
        self.dist, self.console = dist, console
        self.replays = ReplayChannel(cfg, family=family, builder=builder, tokenizer=tokenizer, constrained=constrained,
                                  out_dir=out_dir, console=console, lag=cfg.lag)
        self.given: PairSet | None = None
        if cfg.pairs_path and dist.is_main:  # they join the step once: rank 0 brings them (first, as alone)
            self.given = read_pair_set(cfg.pairs_path)
            console.print(f"replay: {len(self.given)} DPO pairs from {cfg.pairs_path} join the first step's loss")

    def submit(self, trajs) -> None:
        self.replays.submit(trajs)

    def due(self, policy, scorer) -> PairSet | None:
        """This step's pairs (the previous step's replay, after pairs handed in for the first step), with the frozen
        reference's summed log-probs taken once; None when there are none."""
        pairs = self.replays.take()
        if self.given is not None:
            given, self.given = self.given, None
            if pairs is not None:
                given.extend(pairs)
            pairs = given
        if pairs is None or not len(pairs):
            return None
        with policy.reference() as ref_model:
            pairs.ref_chosen = scorer.summed(ref_model, pairs.prompts, pairs.chosen, pairs.chosen_allowed)
            pairs.ref_rejected = scorer.summed(ref_model, pairs.prompts, pairs.rejected, pairs.rejected_allowed)
        return pairs

    @staticmethod
    def inputs(model, scorer, pairs: PairSet, sel: list[int]) -> PairInputs:
        """The policy's summed log-probs of pairs `sel` (with grad) beside the reference's."""
        chosen = scorer.summed(model, pick(pairs.prompts, sel), pick(pairs.chosen, sel),
                               pick(pairs.chosen_allowed, sel), grad=True)
        rejected = scorer.summed(model, pick(pairs.prompts, sel), pick(pairs.rejected, sel),
                                 pick(pairs.rejected_allowed, sel), grad=True)
        idx = torch.tensor(sel)
        return PairInputs(chosen, rejected, pairs.ref_chosen[idx].to(chosen.device),
                          pairs.ref_rejected[idx].to(rejected.device))

    def metrics(self) -> dict[str, float]:
        return self.replays.metrics()

    @property
    def replayed(self) -> int:
        return self.replays.replayed

    # ---- checkpoints ----------------------------------------------------------------------------------------------
    def pending(self) -> list[dict[str, Any]]:
        """The replays not yet in a loss (lag 1: the last step's), every rank's pairs in rank order (the
        single-process order) with each rank's statistics: what a checkpoint keeps. A collective."""
        mine = [(pairs.to_records(), stats) for pairs, stats in self.replays.pending()]
        ranks = distributed.all_gather(mine, self.dist)
        return [{"records": [r for rank in ranks for r in rank[e][0]], "stats": [rank[e][1] for rank in ranks]}
                for e in range(len(mine))]

    def restore(self, pending: list[dict[str, Any]] | None, step: int) -> None:
        """Queue a checkpoint's pending replays, each rank a contiguous block of their pairs (at any number of ranks:
        blocks in rank order are the saved order); rank 0 reports their statistics, combined over the ranks that
        wrote them. Pairs handed in by file joined the first step, before any checkpoint: not again."""
        if step > 0:
            self.given = None
        entries = []
        for entry in pending or []:
            block = distributed.contiguous_block(len(entry["records"]), self.dist)
            stats = {}
            if self.dist.is_main:
                stats = distributed.combine_metrics([(st, replay_counts(st)) for st in entry["stats"]])
                stats.pop("replay/cost_per_trajectory_usd", None)  # of the pools that wrote it: the new pool's is due
            entries.append((PairSet.from_records([entry["records"][i] for i in block]), stats))
        self.replays.restore(entries)

    def close(self) -> None:
        self.replays.close()


def replay_counts(stats: dict[str, float]) -> dict[str, float]:
    """What a replay's rates are means over (`distributed.WEIGHTED_BY`), from its own statistics."""
    turns = float(stats.get("replay/turns", 0.0))
    return {"replay_turns": turns, "replay_agreed": float(stats.get("replay/agreement_rate", 0.0)) * turns,
            "replay_trajectories": float(stats.get("replay/trajectories", 0.0))}
