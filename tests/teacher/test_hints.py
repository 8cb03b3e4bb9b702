"""sdar.teacher.hints: every hint template renders from its arguments, and the hinted teacher's response
logits (the Scorer's `response_logits`) are those the scoring forward turns into log-probs."""

from __future__ import annotations

import pytest
import torch

from sdar.teacher.hints import hint_templates, render_hint

from .conftest import make_trainer, small_config


@pytest.mark.parametrize("family", ["household", "shop", "searchqa"])
def test_every_template_renders_from_its_arguments(family):
    for key, template in hint_templates(family).items():
        fields = [f.split("}")[0] for f in template.split("{")[1:]]
        text = render_hint(family, key, {f: f"<<{f}>>" for f in fields})
        assert "{" not in text and all(f"<<{f}>>" in text for f in fields)
        # a field the step did not carry shows as <field>, never as a crash or a KeyError
        assert render_hint(family, key, {}).count("<") >= len(fields)
    with pytest.raises(KeyError, match="no shop hint template 'shop/nope'"):
        render_hint("shop", "shop/nope")
    with pytest.raises(ValueError, match="no hint templates for family 'kitchen'"):
        render_hint("kitchen", "x")


def test_response_logits_match_response_logprobs(tiny_ckpt, tmp_path):
    from sdar.models.scoring import response_logprobs

    trainer = make_trainer(small_config(tmp_path, arm="grpo", tracking=False))
    tok = trainer.tokenizer
    prompts = [tok("go to fridge", add_special_tokens=False)["input_ids"], tok("look", add_special_tokens=False)["input_ids"]]
    responses = [tok("<action>look</action>", add_special_tokens=False)["input_ids"], [5, 6]]
    allowed = [None, [[5, 9], [6, 7]]]
    logits, mask = trainer.scorer.response_logits(trainer.model.eval(), prompts, responses, allowed)
    # the function the trainer called before the Scorer had the method gives the same numbers
    want = response_logprobs(trainer.model, prompts, responses, pad_id=trainer.pad_id, allowed=allowed)
    got = torch.log_softmax(logits, -1).gather(-1, torch.tensor(
        [r + [0] * (logits.shape[1] - len(r)) for r in responses]).unsqueeze(-1)).squeeze(-1) * mask
    torch.testing.assert_close(got, want.logp * want.mask, rtol=0, atol=1e-5)
    assert torch.equal(mask, want.mask)
