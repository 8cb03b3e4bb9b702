"""The privileged-context teacher: the sampling policy itself with the task's skills in its
prompt, scoring the student's sampled tokens without gradient (one extra forward pass)."""

from sdar.teacher.scoring import ScoredBatch, free_token_mask, response_logprobs
from sdar.teacher.privileged import TeacherScorer

__all__ = ["ScoredBatch", "TeacherScorer", "free_token_mask", "response_logprobs"]
