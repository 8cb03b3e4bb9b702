"""Privileged teacher scoring: each turn's student prompt with the task's skills added (never rebuilt
with other history), then the student's sampled response scored under it (no gradient, batched)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sdar.agent.prompts import PromptBuilder, prefix_ids, teacher_prompt_ids
from sdar.agent.rollout import Trajectory, TurnBatch
from sdar.models.scored import ScoredBatch
from sdar.models.scorer import Scorer


@dataclass
class TeacherScorer:
    """Scores turns under the student's own prompt plus `"[Privileged Skill Information]\\n{skills}\\n\\n"`.

    placement: "prefix" (the reference: in front of the chat-templated student prompt, so the teacher's
    ids are the prefix's followed by the student's, token for token) or "user" (the same turn, with the
    same history pairs as the student, the skills at the start of the user message).
    max_prompt_tokens: the teacher's prompt budget. The teacher's context is the student's by
    construction, so nothing is ever dropped from it: a turn whose privileged prompt does not fit raises
    an error naming teacher.max_prompt_tokens (the reference cuts the prompt from the left, i.e. the
    skills first; this project never scores a teacher that lost its skills).
    student_has_skills: the student's prompts already carry the skills (skill_grpo); the teacher's
    prompt is then the student's own.
    scorer: the run's `Scorer` (the rollout temperature and the scoring switches; with prefix_cache a task's
    teacher prompts share their start, skills included, which is encoded once).
    engine: None scores with the training-side forward; a `VLLMBackend` scores through vLLM's prompt
    log-probs (`sdar.teacher.vllm_scoring`), falling back to the forward per row where the
    constrained renormalisation needs tokens outside vLLM's top-`engine_topk` (counted in
    `fallback_turns`).
    """

    builder: PromptBuilder
    tokenizer: object
    scorer: Scorer = field(default_factory=Scorer)
    max_prompt_tokens: int = 2048
    scored_turns: int = 0
    # the exact privileged text the teacher saw: {task_type: {task_id: text}} (what privileged_skills.json logs)
    skills_seen: dict[str, dict[str, str]] = field(default_factory=dict)
    engine: object | None = None
    engine_topk: int = 20
    engine_turns: int = 0
    fallback_turns: int = 0
    placement: str = "prefix"
    student_has_skills: bool = False

    def prompts(self, batch: TurnBatch | list[Trajectory]) -> list[list[int]]:
        """The teacher's prompt ids of every row of `batch` (a TurnBatch, or the trajectories it is made of)."""
        batch = batch if isinstance(batch, TurnBatch) else TurnBatch.of(batch)
        for traj in batch.trajectories:
            self.skills_seen.setdefault(traj.task_type, {}).setdefault(traj.task_id, traj.skills)
        out = []
        heads: dict[str, list[int]] = {}  # the skills prefix's ids, tokenized once per distinct skills text
        for turn, k in zip(batch.turns, batch.traj_of_row):
            traj = batch.trajectories[k]
            if self.student_has_skills:
                ids = list(turn.prompt_ids)
            else:
                head = None
                if self.placement == "prefix":
                    if traj.skills not in heads:
                        heads[traj.skills] = prefix_ids(self.tokenizer, traj.skills)
                    head = heads[traj.skills]
                ids = teacher_prompt_ids(self.tokenizer, self.builder, turn.view, turn.prompt_ids,
                                         turn.history_dropped, traj.skills, self.placement, skills_ids=head)
            if len(ids) > self.max_prompt_tokens:
                raise ValueError(
                    f"the teacher's prompt for task {traj.task_id!r} needs {len(ids)} tokens (the student's "
                    f"{len(turn.prompt_ids)} plus the privileged skills), over teacher.max_prompt_tokens="
                    f"{self.max_prompt_tokens}; raise teacher.max_prompt_tokens to at least "
                    "rollout.max_prompt_tokens + the skills' length, or shorten the skills (env.kwargs.skills)")
            self.scored_turns += 1
            out.append(ids)
        return out

    def score(self, model, batch: TurnBatch | list[Trajectory]) -> ScoredBatch:
        """Teacher log-probs [B, T] of every row's response (B = the batch's turn-samples, in trajectory order),
        under the scorer's softmax(logits / temperature) (the rollout temperature, as the student's are scored)."""
        batch = batch if isinstance(batch, TurnBatch) else TurnBatch.of(batch)
        prompts = self.prompts(batch)
        responses, allowed, sc = batch.responses, batch.allowed, self.scorer
        if self.engine is not None and sc.scores_raw_logits:
            # vLLM's prompt log-probs are those of the raw logits; other temperatures are scored here
            from sdar.teacher.vllm_scoring import vllm_response_logprobs

            out, fell_back = vllm_response_logprobs(self.engine, model, prompts, responses, pad_id=sc.pad_id,
                                                    allowed=allowed, topk=self.engine_topk,
                                                    score=lambda p, r, a: sc.score(model, p, r, a))
            self.engine_turns += len(prompts)
            self.fallback_turns += fell_back
            return out
        if self.engine is not None:  # every turn falls back to the trainer's forward: count them
            self.engine_turns += len(prompts)
            self.fallback_turns += len(prompts)
        # the turn-samples of one task share the start of their teacher prompts (system prompt and skills:
        # placement prefix puts the skills before the chat, user at the start of the user message)
        groups = [batch.trajectories[k].task_id + "\0" + batch.trajectories[k].skills for k in batch.traj_of_row]
        return sc.score(model, prompts, responses, allowed, groups=groups)

    @property
    def fallback_frac(self) -> float:
        """Share of engine-scored turns that needed the training-side forward (NaN without an engine)."""
        return self.fallback_turns / self.engine_turns if self.engine_turns else float("nan")
