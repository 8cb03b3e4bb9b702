"""The privileged-context teacher: the sampling policy itself with the task's skills in its
prompt, scoring the student's sampled tokens without gradient (one extra forward pass), and the
hinted teacher of Composer channel 2."""

from sdar.teacher.privileged import TeacherScorer

__all__ = ["TeacherScorer"]
