"""sdar.teacher.privileged: the teacher's prompt is the student's own ids plus the privileged prefix (either
placement), an over-budget prompt is an error naming the setting, and the per-task prefix cache scores what
the plain forward scores."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sdar.agent.prompts import PromptBuilder, TurnView, chat_ids, prefix_ids, teacher_prompt_ids

from .conftest import make_trainer, small_config


@pytest.fixture(scope="module")
def qwen_tokenizer():
    """The real Qwen2.5 vocabulary and chat template (what the reference's models use)."""
    from sdar.models.qwen import load_qwen_tokenizer

    return load_qwen_tokenizer()


def _view(n_history: int) -> TurnView:
    return TurnView(task="put a clean mug in coffeemachine", step=n_history, max_steps=50,
                    observation="You arrive at countertop 1. On the countertop 1, you see a mug 1.",
                    history=[(f"observation number {k} " * 6, f"go to cabinet {k}") for k in range(n_history)])


def test_teacher_ids_are_the_prefix_then_the_students_very_ids(qwen_tokenizer):
    b = PromptBuilder("household", history=2)
    student = chat_ids(qwen_tokenizer, b.messages(_view(3), history=1))  # the student kept one pair
    teacher = teacher_prompt_ids(qwen_tokenizer, b, _view(3), student, 1, "Search countertops first.", "prefix")
    head = prefix_ids(qwen_tokenizer, "Search countertops first.")
    assert teacher == head + student
    assert qwen_tokenizer.decode(teacher).startswith("[Privileged Skill Information]\nSearch countertops first.\n\n<|im_start|>system")
    # the reference decodes the student prompt and re-encodes prefix + text: the same ids
    text = "[Privileged Skill Information]\nSearch countertops first.\n\n" + qwen_tokenizer.decode(student)
    assert qwen_tokenizer.encode(text, add_special_tokens=False) == teacher


def test_teacher_in_user_placement_keeps_the_students_history(qwen_tokenizer):
    b = PromptBuilder("household", history=2)
    view = _view(3)
    student = chat_ids(qwen_tokenizer, b.messages(view, history=0))  # the student dropped both pairs
    teacher = qwen_tokenizer.decode(teacher_prompt_ids(qwen_tokenizer, b, view, student, 2, "SKILLS", "user"))
    assert "observation number" not in teacher and "SKILLS" in teacher
    assert teacher.index("SKILLS") > teacher.index("<|im_start|>user")
    with pytest.raises(ValueError, match="privileged placement"):
        teacher_prompt_ids(qwen_tokenizer, b, view, student, 2, "SKILLS", "system")


def test_teacher_prompt_over_budget_is_an_error_naming_the_setting(tiny_ckpt, tmp_path):
    trainer = make_trainer(small_config(tmp_path, arm="sdar", steps=1, tracking=False))
    trajs = trainer.collect(0)
    trainer.teacher.max_prompt_tokens = max(len(t.prompt_ids) for tr in trajs for t in tr.turns)
    with pytest.raises(ValueError, match="teacher.max_prompt_tokens"):
        trainer.teacher.prompts(trajs)


@pytest.mark.parametrize("placement", ["prefix", "user"])
def test_the_teachers_prefix_cache_gives_the_plain_forwards_logprobs(tiny_ckpt, tmp_path, placement):
    """Issue 14.3: the start every teacher prompt of a task shares (system prompt and skills, in either
    placement) encoded once and its KV reused for every turn-sample gives the log-probs of the plain
    forward (fp32, 1e-5), constrained rows and a temperature other than 1 included."""
    trainer = make_trainer(small_config(tmp_path, arm="sdar", steps=1, tracking=False,
                                   **{"rollout.privileged_placement": placement}))
    trajs = trainer.collect(0)
    assert len({tr.skills for tr in trajs}) > 1 and sum(len(tr.turns) for tr in trajs) > len(trajs)
    scorer = trainer.teacher.scorer
    for temperature in (1.0, 0.7):
        trainer.teacher.scorer = dataclasses.replace(scorer, temperature=temperature, prefix_cache=True)
        import sdar.models.scoring as pv

        calls = []
        real = pv.shared_prefix_logprobs
        pv.shared_prefix_logprobs = lambda *a, **k: calls.append(len(a[2])) or real(*a, **k)
        try:
            cached = trainer.teacher.score(trainer.model, trajs)
        finally:
            pv.shared_prefix_logprobs = real
        # one shared prefix per task, reused by all its turn-samples
        assert len(calls) == len({tr.task_id for tr in trajs}) and sum(calls) == sum(len(tr.turns) for tr in trajs)
        trainer.teacher.scorer = dataclasses.replace(scorer, temperature=temperature, prefix_cache=False)
        plain = trainer.teacher.score(trainer.model, trajs)
        assert torch.equal(cached.mask, plain.mask)
        torch.testing.assert_close(cached.logp, plain.logp, rtol=0, atol=1e-5)
        assert float((plain.logp * plain.mask).abs().sum()) > 0
    # the reference pass groups the student's prompts the same way
    from sdar.models.scoring import response_logprobs
    from sdar.models.scoring import grouped_prefix_logprobs

    flat = [(tr.task_id, t) for tr in trajs for t in tr.turns]
    args = ([t.prompt_ids for _, t in flat], [t.response_ids for _, t in flat])
    with trainer.policy.reference() as ref:
        grouped = grouped_prefix_logprobs(ref, *args, [g for g, _ in flat], pad_id=trainer.pad_id, batch_size=16,
                                          allowed=[t.allowed for _, t in flat], temperature=0.7)
        plain = response_logprobs(ref, *args, pad_id=trainer.pad_id, batch_size=16,
                                  allowed=[t.allowed for _, t in flat], temperature=0.7)
    torch.testing.assert_close(grouped.logp, plain.logp, rtol=0, atol=1e-5)
