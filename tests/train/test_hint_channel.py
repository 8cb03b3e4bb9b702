"""Composer channel 2 (issue 13.1/13.3): hints at environment-marked error sites, the hinted teacher
context, and the generalized-JSD term on exactly the error turns' response tokens."""

from __future__ import annotations

import pytest
import torch

from sdar.algos import generalized_jsd
from sdar.teacher.hints import HINT_HEADER, hint_prompt_ids, render_hint

from .conftest import make_trainer, small_config


def test_the_hinted_context_is_the_students_plus_the_hint(tiny_ckpt, tmp_path):
    trainer = make_trainer(small_config(tmp_path, arm="grpo_hint", tracking=False))
    tok = trainer.tokenizer
    from sdar.agent.prompts import chat_ids

    student = chat_ids(tok, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "go"}])
    hint = render_hint("household", "household/go_to_first", {"receptacle": "fridge 1"})
    teacher = hint_prompt_ids(tok, student, hint)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    k = max(i for i, t in enumerate(student) if t == end)
    added = tok(HINT_HEADER + hint, add_special_tokens=False)["input_ids"]
    assert teacher == student[:k] + added + student[k:]
    assert "fridge 1" in tok.decode(teacher) and tok.decode(teacher).endswith(tok.decode(student[k:]))
    with pytest.raises(ValueError, match="no <\\|im_end\\|> token"):
        hint_prompt_ids(tok, tok("go to fridge", add_special_tokens=False)["input_ids"], hint)


def _unconstrained(tmp_path, arm):
    # without constrained decoding the small warm start's actions are often rejected: error sites
    return small_config(tmp_path, arm=arm, steps=1, tracking=False, **{"ppo.mini_batch_size": 100000, "ppo.micro_batch_size": 100000,
                        "rollout.constrained": False, "rollout.max_response_tokens": 16})


def test_jsd_is_nonzero_exactly_on_error_turn_tokens(tiny_ckpt, tmp_path, monkeypatch):
    import sdar.train.update as tr

    trainer = make_trainer(_unconstrained(tmp_path, "grpo_hint"))
    seen = []
    real = tr.compose_loss

    def capture(arm, batch, **kw):
        seen.append(batch)
        return real(arm, batch, **kw)

    monkeypatch.setattr(tr, "compose_loss", capture)
    steps = []
    real_score = trainer.score_phase
    monkeypatch.setattr(trainer, "score_phase", lambda step, r: steps.append(real_score(step, r)) or steps[-1])
    m = trainer.train_step(0).metrics
    (batch,) = seen
    sites = steps[0].hint_prompts
    assert m["hint/error_sites"] == len(sites) > 0 and 0 < m["hint/error_site_rate"] <= 1
    # one row per error site, masked on its response tokens; the JSD there is positive (the hint
    # changes the teacher's distribution), and it is 0 on every position outside the mask
    assert batch.hint_mask.shape[0] == len(sites)
    assert batch.hint_student_logits.requires_grad and not batch.hint_teacher_logits.requires_grad
    mask = batch.hint_mask
    per_tok = torch.zeros_like(mask)
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            one = torch.zeros_like(mask)
            one[i, t] = 1.0
            per_tok[i, t] = generalized_jsd(batch.hint_student_logits.detach(), batch.hint_teacher_logits, one,
                                            beta=0.5)
    assert (per_tok[mask > 0] > 0).all()
    assert m["loss/hint_jsd"] == pytest.approx(float((per_tok * mask).sum() / mask.sum()), rel=1e-4)
    # the gradient of the term reaches the policy
    total = generalized_jsd(batch.hint_student_logits, batch.hint_teacher_logits, mask)
    assert total.grad_fn is not None


def test_arms_without_the_channel_count_error_sites_but_do_not_distill(tiny_ckpt, tmp_path):
    m = make_trainer(_unconstrained(tmp_path, "grpo")).train_step(0).metrics
    assert m["hint/error_sites"] > 0 and "loss/hint_jsd" not in m


def test_error_sites_survive_the_trajectory_file(tiny_ckpt, tmp_path):
    """A replayed trajectory (the DAG's rollout -> teacher_replay) renders the same hints as the live one."""
    from sdar.eval.report import read_trajectories, write_trajectories

    trainer = make_trainer(_unconstrained(tmp_path, "grpo"))
    trajs = trainer.collect(0)
    write_trajectories(tmp_path / "t.jsonl", trajs, "household")
    back = read_trajectories(tmp_path / "t.jsonl")
    live = [(t.error_kind, t.hint_template_key, t.error_args) for tr in trajs for t in tr.turns]
    assert [(t.error_kind, t.hint_template_key, t.error_args) for tr in back for t in tr.turns] == live
    assert any(key for _, key, _ in live)  # the case is exercised
