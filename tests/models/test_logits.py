"""process_logits: the one logits processing gives what each of the four copies it replaced gave (scoring, the
prompt-LM pass, sampling, the hint channel), in float32 and bf16, with and without allowed tokens, top-p < 1 and = 1."""

from __future__ import annotations

import pytest
import torch

from sdar.models.logits import MASKED, keep_mask, process_logits
from sdar.models.logprobs import logp_and_entropy

V = 64
SETS = [None, [3, 7, 8], [5], [], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], None]


# ---- the four copies as they were (issue 39 point 3), kept here as the reference --------------------------
def old_scoring(logits, sets, temperature):
    """sdar.models.scoring._response_scores: float32, / temperature, disallowed at -1e9 (rows [N, V])."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if any(t is not None for t in sets):
        keep = torch.ones(logits.shape, dtype=torch.bool)
        for n, toks in enumerate(sets):
            if toks is not None:
                keep[n] = False
                keep[n, toks] = True
        logits = logits.masked_fill(~keep, -1e9)
    return logits


def old_chunk(logits, allowed, temperature):
    """sdar.models.logprobs._chunk_logprobs: the same on [b, L, V] with a bool [b, L, V] allowed mask."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if allowed is not None:
        logits = logits.masked_fill(~allowed, -1e9)
    return logits


def old_sampling(logits, allowed, temperature, top_p):
    """tests/agent/row_oracle.processed_logprobs before process_logits: -inf outside the allowed set, / temperature, top-p, log-softmax."""
    z = logits.float()
    if allowed is not None:
        keep = torch.full_like(z, float("-inf"))
        idx = torch.tensor(allowed, dtype=torch.long, device=z.device)
        keep[idx] = z[idx]
        z = keep
    z = z / temperature
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, descending=False)
        cum = torch.softmax(sorted_z, dim=-1).cumsum(dim=-1)
        drop = cum <= (1.0 - top_p)
        drop[-1] = False
        z = z.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    return torch.log_softmax(z, dim=-1)


def old_hint(logits, keep):
    """sdar.teacher.hints.response_logits: float32, disallowed at -1e9, no temperature."""
    logits = logits.float()
    if keep is not None:
        logits = logits.masked_fill(~keep, -1e9)
    return logits


def _logits(dtype, shape=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = shape or (len(SETS), V)
    return (torch.randn(*shape, generator=g) * 3).to(dtype)


DTYPES = [torch.float32, torch.bfloat16]
# a GPU sorts the nucleus with another algorithm: the same draws there too
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
@pytest.mark.parametrize("constrained", [True, False])
def test_scoring_and_the_prompt_lm_pass_are_unchanged(dtype, temperature, constrained):
    sets = SETS if constrained else [None] * len(SETS)
    z = _logits(dtype)
    got = process_logits(z, temperature=temperature, keep=keep_mask(sets, V))
    assert got.dtype == torch.float32
    assert torch.equal(got, old_scoring(z, [s or None for s in sets], temperature))
    # the whole-sequence pass: [b, L, V] with a positional mask
    zz = _logits(dtype, (2, len(SETS), V), seed=1)
    allowed = None if not constrained else torch.stack([keep_mask(SETS, V)] * 2)
    assert torch.equal(process_logits(zz, temperature=temperature, keep=allowed), old_chunk(zz, allowed, temperature))
    # and so the scores and entropies of `logp_and_entropy` on them
    target = torch.tensor([s[0] if s else 4 for s in SETS])
    for a, b in zip(logp_and_entropy(got, target), logp_and_entropy(old_scoring(z, [s or None for s in sets], temperature),
                                                                   target)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.5])
@pytest.mark.parametrize("allowed", [None, [3, 7, 8, 20, 41], [5]])
def test_sampling_gives_the_same_draws_and_logprobs(device, dtype, temperature, top_p, allowed):
    for seed in range(4):
        z = _logits(dtype, (V,), seed=seed).to(device)
        keep = keep_mask([allowed], V, device)
        new = torch.log_softmax(process_logits(z, temperature=temperature, keep=None if keep is None else keep[0],
                                               top_p=top_p), -1)
        old = old_sampling(z, allowed, temperature, top_p)
        can = torch.isfinite(old)
        # every token that can be drawn: the same log-prob to the last bit; the others: probability exactly 0
        assert torch.equal(new[can], old[can]) and torch.equal(new.exp(), old.exp())
        assert (new[~can] < MASKED / 2).all()
        draws = [torch.multinomial(p.exp(), 50, replacement=True,
                                   generator=torch.Generator(device=device).manual_seed(seed)) for p in (new, old)]
        assert torch.equal(*draws)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_hint_channel_is_unchanged(dtype):
    z = _logits(dtype, (2, len(SETS), V))
    keep = torch.stack([keep_mask(SETS, V)] * 2)
    assert torch.equal(process_logits(z, keep=keep), old_hint(z, keep))
    assert torch.equal(process_logits(z), old_hint(z, None))


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_scoring_and_sampling_fills_give_the_same_distribution(temperature):
    """Scoring filled -1e9 after the division, sampling -inf before it: the allowed tokens' log-probs agree."""
    z = _logits(torch.float32)
    for n, toks in enumerate(SETS):
        scored = torch.log_softmax(old_scoring(z[n : n + 1], [toks or None], temperature)[0], -1)
        sampled = old_sampling(z[n], toks or None, temperature, 1.0)
        allowed = toks or list(range(V))
        assert torch.equal(scored[allowed], sampled[allowed])
        assert torch.equal(scored.exp(), sampled.exp())


def test_gradients_and_the_callers_logits_are_untouched():
    z32 = _logits(torch.float32).requires_grad_()
    keep = keep_mask(SETS, V)
    before = z32.detach().clone()
    for temperature in (1.0, 0.7):
        got = process_logits(z32, temperature=temperature, keep=keep)
        want = old_scoring(z32, [s or None for s in SETS], temperature)
        g_got, = torch.autograd.grad((got.log_softmax(-1)[:, 0]).sum(), z32)
        g_want, = torch.autograd.grad((want.log_softmax(-1)[:, 0]).sum(), z32)
        assert torch.equal(g_got, g_want)
    assert torch.equal(z32.detach(), before)
    zb = _logits(torch.bfloat16).requires_grad_()
    got = process_logits(zb, temperature=0.7, keep=keep)
    (g,) = torch.autograd.grad(got.log_softmax(-1)[:, 0].sum(), zb)
    assert g.dtype == torch.bfloat16 and torch.isfinite(g.float()).all()


def test_keep_mask_and_bad_temperatures():
    assert keep_mask([None, [], None], V) is None
    keep = keep_mask([None, [2, 4], []], 6)
    assert keep.tolist() == [[True] * 6, [False, False, True, False, True, False], [True] * 6]
    with pytest.raises(ValueError, match="temperature must be > 0"):
        process_logits(torch.zeros(3), temperature=0.0)
    # top-p keeps the smallest set over p, and at least the most likely token
    lp = torch.log_softmax(process_logits(torch.tensor([0.0, 1.0, 2.0, 3.0]), top_p=0.6), -1)
    assert lp[:3].exp().eq(0).all() and lp[3] == pytest.approx(0.0)
    lp = torch.log_softmax(process_logits(torch.tensor([0.0, 1.0, 2.0, 3.0]), top_p=1e-6), -1)
    assert lp[3] == pytest.approx(0.0)
