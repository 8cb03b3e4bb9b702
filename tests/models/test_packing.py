"""Packed forwards (issue 40 points 3, 4): a batch's sequences as prefix trees in one forward with a tree attention
mask score every row as the plain padded forward does (fp32, bf16; constrained and free rows; with gradients), each
shared position once, and the Scorer's passes run as one forward each."""

from __future__ import annotations

import copy

import pytest
import torch

from sdar.models import build_tiny_model
from sdar.models.logprobs import head_where_needed
from sdar.models.packing import pack, packed_response_logprobs, packs
from sdar.models.scorer import Scorer
from sdar.models.scoring import prefix_trie_positions, response_logprobs


@pytest.fixture(scope="module")
def model(tokenizer, small_cfg):
    return build_tiny_model(tokenizer, small_cfg, seed=5).eval()


def batch(vocab: int):
    """Rows shaped like a step's: a shared start, a group's identical first turns, rows alone, forced and free
    constrained steps, an unconstrained row."""
    g = torch.Generator().manual_seed(1)

    def rand(n):
        return torch.randint(5, vocab, (n,), generator=g).tolist()

    start = rand(12)
    prompts = [start + rand(4), None, start[:7] + rand(5), start + rand(1), rand(6), start + rand(4)]
    prompts[1] = list(prompts[0])
    responses = [rand(5), None, rand(3), rand(6), rand(2), rand(4)]
    responses[1] = list(responses[0])
    r = responses
    allowed = [[[r[0][0], 7, 8], [r[0][1]], [r[0][2], 9], [r[0][3]], [r[0][4], 5]], None,
               [[r[2][0]], [r[2][1], 6], [r[2][2]]], None, [[r[4][0], 11, 12], [r[4][1]]], [[r[5][k]] for k in range(4)]]
    return prompts, responses, allowed


def test_pack_lays_each_tree_out_once_with_depths_and_ancestors():
    seqs = [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 5], [1, 2], [7, 8, 9], [1, 6]]
    for budget in (100, 5):
        f = pack(seqs, budget, pad_id=0)
        assert f.positions == prefix_trie_positions(seqs) if budget == 100 else f.positions >= prefix_trie_positions(seqs)
        assert f.ids.shape[1] <= max(budget, max(map(len, seqs)))
        mask = f.mask()[:, 0]
        for s, (row, cols) in enumerate(zip(f.row_of, f.cols)):
            assert f.ids[row, cols].tolist() == seqs[s] and f.depth[row, cols].tolist() == list(range(len(seqs[s])))
            for k, c in enumerate(cols):  # a position sees exactly its sequence's earlier positions
                assert mask[row, c].nonzero().flatten().tolist() == sorted(cols[: k + 1])
        real = mask.diagonal(dim1=-2, dim2=-1)  # pads do not attend to themselves (what the meter counts)
        assert int(real.sum()) == f.positions
    f = pack(seqs, 100, pad_id=0)
    assert f.ids.shape == (1, prefix_trie_positions(seqs))
    eager = f.mask(torch.float32)
    assert torch.equal(eager == 0, f.mask())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("budget", [4096, 16])
def test_packed_scores_are_the_plain_forwards_with_gradients(model, dtype, budget):
    """One packed forward (or rows of 16 positions): the log-probs, entropies and gradients of the padded forward,
    constrained and free rows at temperature 0.7; forced tokens 0 as there."""
    m = copy.deepcopy(model).to(dtype).train()
    prompts, responses, allowed = batch(m.config.vocab_size)
    kw = dict(pad_id=0, allowed=allowed, temperature=0.7, grad=True, with_entropy=True)
    out, grads = [], []
    for run in (lambda: packed_response_logprobs(m, prompts, responses, budget=budget, **kw),
                lambda: response_logprobs(m, prompts, responses, length_buckets=False, **kw)):
        m.zero_grad(set_to_none=True)
        r = run()
        w = torch.linspace(-1, 1, r.logp.numel()).view_as(r.logp)
        ((r.logp * w * r.mask).sum() + 0.1 * (r.entropy * r.mask).sum()).backward()
        out.append(r)
        grads.append({n: p.grad.float().clone() for n, p in m.named_parameters() if p.grad is not None})
    tol = 2e-6 if dtype == torch.float32 else 3e-2
    (packed, plain), (g1, g0) = out, grads
    assert torch.equal(packed.mask, plain.mask)
    torch.testing.assert_close(packed.logp, plain.logp, rtol=0, atol=tol)
    torch.testing.assert_close(packed.entropy, plain.entropy, rtol=0, atol=tol)
    assert float(packed.logp.detach().abs().sum()) > 0
    assert g1.keys() == g0.keys() and g0
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=tol * 10, atol=tol * 10 * max(float(g0[n].abs().max()), 1e-6))


def test_the_scorer_packs_a_pass_into_one_forward(model):
    """scoring.packed: score and with_grad are one forward each, the same numbers as the grouped path (head at
    free tokens on and off); a model whose attention takes no tree mask keeps the plain path."""
    prompts, responses, allowed = batch(model.config.vocab_size)
    groups = [0, 0, 0, 0, 1, 0]
    calls = []
    hook = model.get_decoder().register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        for head in (True, False):
            with head_where_needed(head):
                plain = Scorer(temperature=0.7).score(model, prompts, responses, allowed, groups=groups)
                calls.clear()
                packed = Scorer(temperature=0.7, packed=True).score(model, prompts, responses, allowed, groups=groups)
                assert len(calls) == 1
                torch.testing.assert_close(packed.logp, plain.logp, rtol=0, atol=2e-6)
        calls.clear()
        Scorer(packed=True).with_grad(model, prompts, responses, allowed, groups=groups)
        assert len(calls) == 1
    finally:
        hook.remove()
    # the DPO term's sequence sums: one packed forward, the plain path's sums and gradients
    sums, grads = [], []
    m = copy.deepcopy(model).train()
    scorer = Scorer(temperature=0.7, packed=True)
    scorer.summed(m, prompts, responses, allowed)  # the model's probes (its head, its attention) once, uncounted
    for scorer in (scorer, Scorer(temperature=0.7)):
        m.zero_grad(set_to_none=True)
        calls.clear()
        hook = m.get_decoder().register_forward_pre_hook(lambda *a: calls.append(1))
        try:
            total = scorer.summed(m, prompts, responses, allowed, grad=True)
        finally:
            hook.remove()
        (total * torch.arange(1.0, len(prompts) + 1)).sum().backward()
        sums.append(total.detach())
        grads.append({n: q.grad.clone() for n, q in m.named_parameters() if q.grad is not None})
        if scorer.packed:
            assert len(calls) == 1
    torch.testing.assert_close(sums[0], sums[1], rtol=0, atol=2e-5)
    assert float(sums[1].abs().sum()) > 0 and grads[1]
    for n in grads[1]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=2e-5, atol=2e-5 * max(float(grads[1][n].abs().max()), 1e-6))
    # the hint channel's logits [B, T, V]: one packed forward, the plain path's logits and gradients
    outs, grads = [], []
    for scorer in (Scorer(packed=True), Scorer()):
        m.zero_grad(set_to_none=True)
        logits, mask = scorer.response_logits(m, prompts, responses, allowed, grad=True)
        w = torch.linspace(-1, 1, logits.numel()).view_as(logits)
        (torch.log_softmax(logits, -1).clamp(min=-50) * w * mask[..., None]).sum().backward()
        outs.append((logits.detach(), mask))
        grads.append({n: q.grad.clone() for n, q in m.named_parameters() if q.grad is not None})
    (l1, m1), (l0, m0) = outs
    assert torch.equal(m1, m0) and l1.shape == l0.shape and float(l0.abs().sum()) > 0
    torch.testing.assert_close(l1, l0, rtol=0, atol=2e-5)
    for n in grads[1]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=2e-5, atol=2e-5 * max(float(grads[1][n].abs().max()), 1e-6))
    assert packs(model)
    eager = copy.deepcopy(model)
    eager.config._attn_implementation = "eager"
    torch.testing.assert_close(Scorer(packed=True).score(eager, prompts, responses, allowed).logp,
                               Scorer().score(model, prompts, responses, allowed).logp, rtol=0, atol=2e-6)
    other = copy.deepcopy(model)
    other.config._attn_implementation = "flash_attention_2"
    assert not packs(other)
