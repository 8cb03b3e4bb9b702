"""Scorer.response_logits, the hint channel's forward: the logits the channel took from its own full forward
before it went through the Scorer (float32 and bf16, constrained or not), the log-probs `response_logprobs` scores,
with gradients when asked."""

from __future__ import annotations

import copy

import pytest
import torch

from sdar.models import build_tiny_model
from sdar.models.logprobs import head_where_needed, position_ids_from_mask
from sdar.models.scorer import Scorer, needed_lengths
from sdar.models.scoring import allowed_mask, response_logprobs


def full_forward_logits(model, prompts, responses, *, pad_id, allowed=None):
    """sdar.teacher.hints.response_logits as it was: every position's logits, masked, then the response ones."""
    B, T = len(prompts), max((len(r) for r in responses), default=0)
    L = max(len(p) + len(r) for p, r in zip(prompts, responses))
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    att = torch.zeros(B, L, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        att[i, : len(p) + len(r)] = 1
    logits = model(input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att), use_cache=False).logits.float()
    if allowed is not None and any(a is not None for a in allowed):
        logits = logits.masked_fill(~allowed_mask(prompts, responses, allowed, L, logits.shape[-1]), -1e9)
    V = logits.shape[-1]
    return torch.stack([torch.cat([logits[i, len(p) - 1 : len(p) - 1 + len(r)], logits.new_zeros(T - len(r), V)])
                        for i, (p, r) in enumerate(zip(prompts, responses))])


@pytest.fixture(scope="module")
def model(tokenizer, small_cfg):
    return build_tiny_model(tokenizer, small_cfg, seed=3).eval()


def rows(vocab: int):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, vocab, (n,), generator=g).tolist() for n in (7, 12, 3, 9)]
    responses = [torch.randint(5, vocab, (n,), generator=g).tolist() for n in (4, 1, 6, 3)]
    allowed = [None, [[5, 9, responses[1][0]]], [[responses[2][0]], [1, 2, responses[2][1]]], None]
    return prompts, responses, allowed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("constrained", [True, False])
@pytest.mark.parametrize("head_at_free_tokens", [True, False])
def test_response_logits_are_the_channels_old_logits(model, tokenizer, dtype, constrained, head_at_free_tokens):
    prompts, responses, allowed = rows(len(tokenizer))
    allowed = allowed if constrained else None
    m = copy.deepcopy(model).to(dtype)
    with torch.no_grad(), head_where_needed(head_at_free_tokens):
        want = full_forward_logits(m, prompts, responses, pad_id=0, allowed=allowed)
        got, mask = Scorer(temperature=0.7).response_logits(m, prompts, responses, allowed)
    # the same numbers to the last bit here (a shape-dependent matmul may round differently on other hardware);
    # temperature 1 whatever the Scorer's: the JSD divides by its own jsd_temperature
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert got.dtype == torch.float32 and got.shape == (4, 6, want.shape[-1])
    assert mask.tolist() == [[1.0] * len(r) + [0.0] * (6 - len(r)) for r in responses]


def test_response_logits_give_the_scored_logprobs_with_gradients(model, tokenizer):
    prompts, responses, allowed = rows(len(tokenizer))
    logits, mask = Scorer().response_logits(model, prompts, responses, allowed, grad=True)
    assert logits.requires_grad
    want = response_logprobs(model, prompts, responses, pad_id=0, allowed=allowed)
    target = torch.tensor([r + [0] * (logits.shape[1] - len(r)) for r in responses])
    got = torch.log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1) * mask
    torch.testing.assert_close(got.detach(), want.logp * want.mask, rtol=0, atol=1e-5)
    got.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        assert not Scorer().response_logits(model, prompts, responses, allowed)[0].requires_grad


@pytest.mark.parametrize("packed", [False, True])
def test_trimmed_forced_tails_score_what_the_full_responses_score(model, tokenizer, packed):
    """Scorer.trim_forced_tails: rows ending in forced tokens (one allowed token, the one sampled) forward only up to
    their last free token; the log-probs, entropies and mask of every response token, and the gradient through them,
    are the full pass's (forced tokens: log-prob 0, entropy 0), on every path (prefix groups, packed), and a
    row that is forced throughout keeps its mask."""
    g = torch.Generator().manual_seed(1)
    V = model.get_output_embeddings().weight.shape[0]
    prompts = [torch.randint(5, V, (n,), generator=g).tolist() for n in (9, 9, 6, 11)]
    prompts[1][:4] = prompts[0][:4]  # rows 0 and 1 share a start (one group)
    responses = [torch.randint(5, V, (n,), generator=g).tolist() for n in (6, 5, 4, 3)]

    def forced_from(k, r):  # a free first k tokens (three allowed), then every token forced
        return [[5, 6, r[i]] if i < k else [r[i]] for i in range(len(r))]

    allowed = [forced_from(2, responses[0]), forced_from(1, responses[1]), None, forced_from(0, responses[3])]
    assert needed_lengths(responses, allowed) == [2, 1, 4, 0]
    groups = ["a", "a", "b", "c"]
    out = {}
    for trim in (True, False):
        scorer = Scorer(pad_id=0, temperature=0.7, trim_forced_tails=trim, packed=packed, pack_tokens=64)
        model.zero_grad()
        with scorer.scope():
            s = scorer.with_grad(model, prompts, responses, allowed, groups=groups)
            (s.logp.sum() + s.entropy.sum()).backward()
            n = scorer.score(model, prompts, responses, allowed, groups=groups)
            sums = scorer.summed(model, prompts, responses, allowed)
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        out[trim] = (s, n, sums, grads)
    (s1, n1, u1, g1), (s0, n0, u0, g0) = out[True], out[False]
    for a, b in ((s1, s0), (n1, n0)):
        assert a.logp.shape == b.logp.shape == (4, 6)
        torch.testing.assert_close(a.logp, b.logp, atol=1e-5, rtol=0)
        torch.testing.assert_close(a.mask, b.mask, atol=0, rtol=0)
    torch.testing.assert_close(s1.entropy, s0.entropy, atol=1e-5, rtol=0)
    torch.testing.assert_close(u1, u0, atol=1e-5, rtol=0)
    assert len(g1) == len(g0) > 0
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert float(s0.logp[3].detach().abs().sum()) == 0.0 and s1.mask[3].sum() == 3  # forced throughout: log-prob 0, masked in
