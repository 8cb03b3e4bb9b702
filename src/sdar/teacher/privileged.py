"""Privileged teacher scoring: each turn's prompt rebuilt with the task's skills prepended,
then the student's sampled response scored under it (no gradient, batched)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sdar.agent.prompts import PromptBuilder, fit_prompt_ids
from sdar.teacher.scoring import ScoredBatch, response_logprobs


@dataclass
class TeacherScorer:
    """Scores turns under `"[Privileged Skill Information]\\n{skills}\\n\\n" + student prompt`.

    max_prompt_tokens: the teacher's prompt budget. When the privileged prompt does not fit,
    history pairs are dropped, never the skills; every such turn is counted in
    `truncated_turns` (reported as `teacher/truncated_frac`), and a turn that cannot fit
    even with no history raises an error instead of silently losing its skills.
    engine: None scores with the training-side forward; a `VLLMBackend` scores through vLLM's prompt
    log-probs (`sdar.teacher.vllm_scoring`), falling back to the forward per row where the
    constrained renormalisation needs tokens outside vLLM's top-`engine_topk` (counted in
    `fallback_turns`).
    """

    builder: PromptBuilder
    tokenizer: object
    max_prompt_tokens: int = 2048
    batch_size: int = 16
    truncated_turns: int = 0
    scored_turns: int = 0
    skills_by_type: dict[str, str] = field(default_factory=dict)
    engine: object | None = None
    engine_topk: int = 20
    engine_turns: int = 0
    fallback_turns: int = 0

    def prompts(self, trajectories) -> list[list[int]]:
        out = []
        for traj in trajectories:
            self.skills_by_type.setdefault(traj.task_type, traj.skills)
            for turn in traj.turns:
                ids, dropped = fit_prompt_ids(self.tokenizer, self.builder, turn.view, self.max_prompt_tokens,
                                              skills=traj.skills)
                # dropping more history than the student did is a truncation the teacher suffered
                if dropped > turn.history_dropped:
                    self.truncated_turns += 1
                self.scored_turns += 1
                out.append(ids)
        return out

    def score(self, model, trajectories, pad_id: int, temperature: float = 1.0) -> ScoredBatch:
        """Teacher log-probs [N_turns, T] of every turn's response, in trajectory order, under
        softmax(logits / temperature) (the rollout temperature, as the student's are scored)."""
        prompts = self.prompts(trajectories)
        responses = [t.response_ids for traj in trajectories for t in traj.turns]
        allowed = [t.allowed for traj in trajectories for t in traj.turns]
        if self.engine is not None and temperature == 1.0:
            # vLLM's prompt log-probs are those of the raw logits; other temperatures are scored here
            from sdar.teacher.vllm_scoring import vllm_response_logprobs

            out, fell_back = vllm_response_logprobs(self.engine, model, prompts, responses, pad_id=pad_id,
                                                    batch_size=self.batch_size, allowed=allowed, topk=self.engine_topk)
            self.engine_turns += len(prompts)
            self.fallback_turns += fell_back
            return out
        if self.engine is not None:  # every turn falls back to the trainer's forward: count them
            self.engine_turns += len(prompts)
            self.fallback_turns += len(prompts)
        return response_logprobs(model, prompts, responses, pad_id=pad_id, batch_size=self.batch_size,
                                 allowed=allowed, temperature=temperature)

    @property
    def truncated_frac(self) -> float:
        return self.truncated_turns / max(self.scored_turns, 1)

    @property
    def fallback_frac(self) -> float:
        """Share of engine-scored turns that needed the training-side forward (NaN without an engine)."""
        return self.fallback_turns / self.engine_turns if self.engine_turns else float("nan")
