"""A step's metrics, as MLflow and the history get them: the update's losses and statistics (means over its
optimizer steps), the episodes' rewards and rates, tokens, times, the teacher's gap, the channels' counts; combined
over the ranks (`distributed.reduce_step_metrics`), each a mean over what its name says."""

from __future__ import annotations

from sdar.agent.rollout import episode_reward
from sdar.models.scoring import free_token_mask
from sdar.train import distributed
from sdar.train.batch import StepBatch, UpdateResult
from sdar.train.channels import PairChannel, replay_counts
from sdar.train.runtime import masked_mean


def step_metrics(cfg, b: StepBatch, u: UpdateResult, step_s: float, *, teacher, skipped: int,
                 replay: PairChannel | None, dist) -> dict[str, float]:
    """The step's metrics over every rank. teacher: the run's `TeacherScorer` (its vLLM fallback share); skipped:
    the run's skipped updates so far; replay: channel 3, when the arm has it."""
    trajs, turns, allowed, n = b.rollouts.trajs, b.rollouts.batch.turns, b.allowed, len(b.prompts)
    sites = sum(1 for t in turns if t.hint_template_key)
    choice = free_token_mask(allowed, b.old.mask)  # the tokens constrained decoding left a choice at
    gap = None if b.teacher is None else b.teacher.logp - b.old.logp
    out = {k: v / max(u.updates, 1) for k, v in u.sums.items()}
    groups = b.rollouts.groups
    out.update({
        "reward": sum(episode_reward(tr, cfg.env.family, cfg.reward) for tr in trajs) / len(trajs),
        "env_reward": sum(tr.reward for tr in trajs) / len(trajs),
        "success": sum(tr.won for tr in trajs) / len(trajs),
        # a group is one task's rollouts; when its rewards are all equal, every turn-sample of it has advantage 0
        # and no policy-gradient term reads it (TRL's frac_reward_zero_std): over every group rolled out this step
        "groups/zero_std_frac": groups.flat / groups.rolled if groups.rolled else float("nan"),
        "groups/rolled_out": float(groups.rolled),  # more than tasks_per_step only with rollout.filter_groups
        "groups/zero_std_trained": float(groups.flat_trained),
        "episode_length": sum(tr.length for tr in trajs) / len(trajs),
        "invalid_action_rate": sum(not (t.valid and t.env_valid) for t in turns) / max(len(turns), 1),
        "format_error_rate": sum(not t.format_valid for t in turns) / max(len(turns), 1),
        # accepted actions the environment marked as making no progress (revisits, non-task objects, ...)
        "no_progress_rate": sum(t.env_valid and bool(t.error_kind) and t.valid for t in turns) / max(len(turns), 1),
        "turn_samples": float(n), "tokens_per_s": sum(map(len, b.responses)) / max(b.rollouts.seconds, 1e-9),
        "time/rollout_s": b.rollouts.seconds, "time/score_s": b.seconds, "time/update_s": u.seconds,
        "time/step_s": step_s,
        # forced: response tokens constrained decoding allowed no alternative to (left out of the loss and of
        # every sdar/*, pg/* and loss/* statistic when rollout.mask_forced_tokens)
        "tokens/forced_frac": 1.0 - float(choice.sum()) / max(float(b.old.mask.sum()), 1.0),
        "tokens/free": float(b.free.sum()),
        "teacher/gap_free_tokens": float("nan") if gap is None else masked_mean(gap, choice),
        "teacher/gap_all_tokens": float("nan") if gap is None else masked_mean(gap, b.old.mask),
        "teacher/vllm_fallback_frac": teacher.fallback_frac,
        "updates": float(u.updates), "skipped_updates": float(skipped),
        # turn-samples at error sites (marked by the environment with a hint template), every arm
        "hint/error_sites": float(sites), "hint/error_site_rate": sites / max(n, 1),
    })
    counts = {"trajectories": len(trajs), "groups": groups.rolled, "turns": len(turns), "rows": n,
              "tokens": float(b.old.mask.sum()), "free_tokens": float(choice.sum()), "teacher_turns": teacher.scored_turns}
    if replay is not None:  # what the replay this step took counted (its means are over these)
        out.update(replay.metrics())
        out["replay/pairs_in_loss"] = float(len(b.pairs) if b.pairs is not None else 0)
        counts.update({**replay_counts(out), "replay_trajectories_total": float(replay.replayed)})
    return distributed.reduce_step_metrics(out, counts, dist)
