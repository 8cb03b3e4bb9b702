"""token_logprobs: equals log_softmax + gather, aligned to the next token, invariant to padding, fused backward exact."""

from __future__ import annotations

import pytest
import torch

from sdar.models import build_tiny_model, position_ids_from_mask, token_logprobs
from sdar.models.logprobs import logp_and_entropy

TEXTS = [
    "<think>the mug is on the countertop</think><action>go to countertop 1</action>",
    "You are in the middle of a room.",
    "<answer>apple</answer>",
]


@pytest.fixture(scope="module")
def model(tokenizer, small_cfg):
    return build_tiny_model(tokenizer, small_cfg, seed=3).eval()


def pad(seqs: list[list[int]], side: str, pad_id: int, extra: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(map(len, seqs)) + extra
    ids = torch.full((len(seqs), L), pad_id)
    mask = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        sl = slice(L - len(s), L) if side == "left" else slice(0, len(s))
        ids[i, sl] = torch.tensor(s)
        mask[i, sl] = 1
    return ids, mask


def unpadded(values: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Per sequence, the columns that score a real token from a real context, in order."""
    valid = (mask[:, 1:] * mask[:, :-1]).bool()
    return [values[i][valid[i]] for i in range(values.shape[0])]


def test_equals_hand_computation_and_alignment(model, tokenizer):
    ids = torch.tensor([tokenizer(TEXTS[0])["input_ids"]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        logp, ent = token_logprobs(model, ids, mask, return_entropy=True)
        logits = model(input_ids=ids).logits.float()
    log_probs = torch.log_softmax(logits, dim=-1)
    L = ids.shape[1]
    # column t-1 scores token t from the logits at t-1
    hand = torch.stack([log_probs[0, t - 1, ids[0, t]] for t in range(1, L)])
    torch.testing.assert_close(logp[0], hand, rtol=1e-5, atol=1e-5)
    hand_ent = -(log_probs.exp() * log_probs).sum(-1)[0, :-1]
    torch.testing.assert_close(ent[0], hand_ent, rtol=1e-5, atol=1e-5)
    assert logp.dtype == torch.float32 and logp.shape == (1, L - 1)
    assert (logp < 0).all()


def test_temperature_scales_logits(model, tokenizer):
    ids = torch.tensor([tokenizer(TEXTS[1])["input_ids"]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        logp, ent = token_logprobs(model, ids, mask, temperature=0.5, return_entropy=True)
        logits = model(input_ids=ids).logits.float()[:, :-1] / 0.5
    hand = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(logp, hand, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        _, ent1 = token_logprobs(model, ids, mask, temperature=1.0, return_entropy=True)
    assert (ent < ent1).all(), "a lower temperature sharpens the distribution"


def test_invariant_to_padding_side_and_amount(model, tokenizer):
    seqs = [tokenizer(t)["input_ids"] for t in TEXTS]
    with torch.no_grad():
        solo = [token_logprobs(model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long), return_entropy=True) for s in seqs]
        for side in ("left", "right"):
            for extra in (0, 5):
                ids, mask = pad(seqs, side, tokenizer.pad_token_id, extra)
                logp, ent = token_logprobs(model, ids, mask, return_entropy=True)
                for i, (lp, en) in enumerate(zip(unpadded(logp, mask), unpadded(ent, mask))):
                    torch.testing.assert_close(lp, solo[i][0][0], rtol=1e-4, atol=1e-5, msg=f"{side}+{extra} seq {i}")
                    torch.testing.assert_close(en, solo[i][1][0], rtol=1e-4, atol=1e-5)
                # columns touching padding are exactly 0
                invalid = ~(mask[:, 1:] * mask[:, :-1]).bool()
                assert (logp[invalid] == 0).all() and (ent[invalid] == 0).all()


def test_position_ids_skip_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 1, 2, 2, 2]]


def test_chunking_gives_the_same_numbers_and_gradients(model, tokenizer):
    seqs = [tokenizer(t)["input_ids"] for t in TEXTS]
    ids, mask = pad(seqs, "left", tokenizer.pad_token_id)
    grads = []
    outs = []
    for chunk in (None, 1, 2):
        model.zero_grad()
        logp, ent = token_logprobs(model, ids, mask, return_entropy=True, chunk_size=chunk)
        (logp.sum() + ent.sum()).backward()
        outs.append((logp.detach(), ent.detach()))
        grads.append(model.model.layers[0].self_attn.q_proj.weight.grad.clone())
    for (lp, en), g in zip(outs[1:], grads[1:]):
        torch.testing.assert_close(lp, outs[0][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(en, outs[0][1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g, grads[0], rtol=1e-4, atol=1e-6)
    model.zero_grad()


def test_fused_backward_matches_autograd():
    torch.manual_seed(0)
    z = torch.randn(4, 6, 9, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 9, (4, 6))
    assert torch.autograd.gradcheck(lambda z: logp_and_entropy(z, t, True), (z,))
    assert torch.autograd.gradcheck(lambda z: logp_and_entropy(z, t, False)[0], (z,))
    # against plain autograd with arbitrary upstream weights on both outputs
    w1, w2 = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    lp, h = logp_and_entropy(z, t)
    (g_fused,) = torch.autograd.grad((lp * w1).sum() + (h * w2).sum(), z)
    ls = torch.log_softmax(z, -1)
    lp2, h2 = ls.gather(-1, t[..., None]).squeeze(-1), -(ls.exp() * ls).sum(-1)
    (g_ref,) = torch.autograd.grad((lp2 * w1).sum() + (h2 * w2).sum(), z)
    torch.testing.assert_close(g_fused, g_ref)
    torch.testing.assert_close(lp, lp2)
    torch.testing.assert_close(h, h2)
    # bf16 logits are scored in float32
    lp_bf16, _ = logp_and_entropy(z.detach().to(torch.bfloat16), t)
    assert lp_bf16.dtype == torch.float32


def test_bad_inputs_are_explained(model):
    ids = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="must both be"):
        token_logprobs(model, ids, torch.ones(2, 5))
    with pytest.raises(ValueError, match="at least 2 tokens"):
        token_logprobs(model, ids[:, :1], torch.ones(2, 1))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(model, ids, torch.ones(2, 4), temperature=0)
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(model, ids, torch.ones(2, 4), chunk_size=0)


def _positions_forwarded(model):
    """A list that collects the padded positions (rows x width) of every forward of `model` (at its token
    embedding, which every way of calling the decoder passes), and its hook."""
    seen: list[int] = []
    hook = model.get_input_embeddings().register_forward_pre_hook(lambda module, args: seen.append(int(args[0].numel())))
    return seen, hook


def test_length_bucketed_scoring_gives_the_same_rows_in_the_same_order(model, tokenizer):
    import random

    from sdar.models.scoring import response_logprobs

    rng = random.Random(0)
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    prompts = [sum((ids[rng.randrange(3)] for _ in range(rng.randint(1, 6))), []) for _ in range(11)]
    responses = [ids[rng.randrange(3)][: rng.randint(1, 8)] for _ in range(11)]
    forwarded = {}
    for buckets in (False, True):
        seen, handle = _positions_forwarded(model)
        forwarded[buckets] = (response_logprobs(model, prompts, responses, pad_id=0, batch_size=3, with_entropy=True,
                                                length_buckets=buckets), sum(seen))
        handle.remove()
    (plain, plain_n), (bucketed, bucketed_n) = forwarded[False], forwarded[True]
    assert torch.equal(plain.mask, bucketed.mask)
    torch.testing.assert_close(bucketed.logp, plain.logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(bucketed.entropy, plain.entropy, atol=1e-5, rtol=0)
    # and the padded positions forwarded shrink: the longest row no longer sits in every batch, and no group
    # pads more than length_groups' slack (20%) beyond its real tokens, nor more than sorted chunks of 3 would
    lengths = sorted(len(p) + len(r) for p, r in zip(prompts, responses))
    chunks = sum(max(lengths[k : k + 3]) * len(lengths[k : k + 3]) for k in range(0, 11, 3))
    assert bucketed_n < plain_n and bucketed_n <= chunks
    assert bucketed_n <= 1.2 * sum(lengths)


@pytest.mark.parametrize("prefix_len", [0, 5])
def test_one_long_row_pads_only_its_own_group_when_scoring(model, prefix_len):
    """A pass's one long row (a turn with a long observation) among rows of similar length: no-grad scoring
    forwards it in its own group rather than padding a whole batch to it (16 rows of about 140 tokens and
    one of 227 in a batch of 16 forwarded 53% more positions than the rows hold), with the same numbers as one
    padded forward per batch; plain rows and rows continuing from a shared prefix alike."""
    import random

    from sdar.models.scoring import grouped_prefix_logprobs, response_logprobs

    rng = random.Random(2)
    start = [rng.randrange(5, 90) for _ in range(prefix_len)]
    lengths = [rng.randint(20, 24) for _ in range(15)] + [40]
    prompts = [start + [rng.randrange(5, 90) for _ in range(n - 3)] for n in lengths]
    responses = [[rng.randrange(5, 90) for _ in range(3)] for _ in lengths]
    real = sum(len(p) + len(r) - prefix_len for p, r in zip(prompts, responses))
    out = {}
    for buckets in (False, True):
        seen, handle = _positions_forwarded(model)
        if prefix_len:
            scored = grouped_prefix_logprobs(model, prompts, responses, [0] * len(prompts), pad_id=0, batch_size=16) \
                if buckets else response_logprobs(model, prompts, responses, pad_id=0, batch_size=16,
                                                   length_buckets=False)
        else:
            scored = response_logprobs(model, prompts, responses, pad_id=0, batch_size=16, length_buckets=buckets)
        handle.remove()
        out[buckets] = (scored, sum(seen))
    (plain, _), (grouped, n) = out[False], out[True]
    assert torch.equal(plain.mask, grouped.mask)
    torch.testing.assert_close(grouped.logp, plain.logp, atol=1e-5, rtol=0)
    # the shared prefix once, then every row's own tokens with at most length_groups' 20% slack
    assert n <= prefix_len + 1.2 * real
    assert n < 16 * (max(lengths) - prefix_len)  # a batch padded to the long row


def test_length_groups_close_on_row_count_and_padding():
    from sdar.models.scoring import length_groups

    lengths = [100, 10, 11, 12, 98, 13, 500]
    groups = length_groups(lengths, max_rows=3, slack=0.2)
    assert sorted(i for g in groups for i in g) == list(range(7))
    assert groups == [[1, 2, 3], [5], [4, 0], [6]]  # 3 rows max; 98 next to 13 would pad 2 x 98 > 1.2 x 111
    for g in groups:  # every group within its padding budget
        assert len(g) * max(lengths[i] for i in g) <= 1.2 * sum(lengths[i] for i in g) or len(g) == 1
    assert length_groups([], 4) == []
    assert length_groups([5, 5, 5], 8) == [[0, 1, 2]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_length_bucketed_training_forward_gives_the_same_loss_and_gradients(model, tokenizer, dtype):
    """The update's forward in groups of similar length: the same per-token log-probs, entropies, a loss over
    them and its gradient as one padded forward of the whole micro-batch."""
    import random

    from sdar.models.scoring import response_logprobs

    rng = random.Random(1)
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    prompts = [sum((ids[rng.randrange(3)] for _ in range(rng.choice([1, 1, 2, 8]))), []) for _ in range(9)]
    responses = [ids[rng.randrange(3)][: rng.randint(1, 8)] for _ in range(9)]
    import copy

    from sdar.models.scoring import length_groups

    assert len(length_groups([len(p) + len(r) for p, r in zip(prompts, responses)], 9)) > 1  # it does regroup
    m = copy.deepcopy(model).to(dtype)  # the fixture may be shared: a bf16 round trip would change its weights
    out, grads = {}, {}
    for buckets in (False, True):
        m.zero_grad(set_to_none=True)
        r = response_logprobs(m, prompts, responses, pad_id=0, with_entropy=True, grad=True,
                              length_buckets=buckets, prompt_lm=True)
        w = torch.linspace(-1, 1, r.logp.numel()).view_as(r.logp)
        loss = (r.logp * w * r.mask).sum() / r.mask.sum() + 0.1 * (r.entropy * r.mask).mean() \
            - 0.01 * r.prompt_logp_sum / r.prompt_tokens
        loss.backward()
        out[buckets] = (r, float(loss.detach()))
        grads[buckets] = [p.grad.detach().float().clone() for p in m.parameters() if p.grad is not None]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    plain, bucketed = out[False][0], out[True][0]
    assert torch.equal(plain.mask, bucketed.mask) and plain.prompt_tokens == bucketed.prompt_tokens
    torch.testing.assert_close(bucketed.logp, plain.logp, atol=tol, rtol=0)
    torch.testing.assert_close(bucketed.entropy, plain.entropy, atol=tol, rtol=0)
    assert out[True][1] == pytest.approx(out[False][1], abs=tol)
    assert len(grads[True]) == len(grads[False]) > 0
    for a, b in zip(grads[True], grads[False]):
        torch.testing.assert_close(a, b, atol=tol * 10, rtol=tol * 10)


def test_first_position_computes_only_the_needed_logits_with_the_same_numbers(model, tokenizer):
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    x, m = pad(ids, "right", 0)
    full_lp, full_ent = token_logprobs(model, x, m, return_entropy=True, temperature=0.7)
    for f in (1, 3, x.shape[1] - 2):
        lp, ent = token_logprobs(model, x, m, return_entropy=True, temperature=0.7, first_position=f)
        torch.testing.assert_close(lp[:, f:], full_lp[:, f:], atol=1e-5, rtol=0)
        torch.testing.assert_close(ent[:, f:], full_ent[:, f:], atol=1e-5, rtol=0)
        assert not lp[:, :f].any() and not ent[:, :f].any()
    # a constrained mask given for the kept positions only
    V = model.get_output_embeddings().weight.shape[0]
    allowed = torch.ones(x.shape[0], x.shape[1], V, dtype=torch.bool)
    allowed[:, 4, :5] = False
    whole, _ = token_logprobs(model, x, m, allowed=allowed)
    kept, _ = token_logprobs(model, x, m, allowed=allowed[:, 2:], first_position=2)
    torch.testing.assert_close(kept[:, 2:], whole[:, 2:], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="first_position"):
        token_logprobs(model, x, m, first_position=x.shape[1])


def test_prefix_trie_positions_counts_each_distinct_prefix_once():
    """The exact minimum of positions a causal forward computes: one per distinct non-empty prefix."""
    import random

    from sdar.models.scoring import prefix_trie_positions

    # 1, 1-2, 1-2-3, 1-2-4, 1-5 (the repeated row and the empty one add nothing)
    assert prefix_trie_positions([[1, 2, 3], [1, 2, 4], [1, 5], [1, 2, 3], []]) == 5
    assert prefix_trie_positions([]) == 0 and prefix_trie_positions([[7, 7, 7]]) == 3
    assert prefix_trie_positions([[1, 2], [2, 1]]) == 4  # nothing shared: every token
    rng = random.Random(0)
    for _ in range(50):
        seqs = [[rng.randrange(3) for _ in range(rng.randrange(8))] for _ in range(rng.randrange(1, 12))]
        assert prefix_trie_positions(seqs) == len({tuple(s[:k]) for s in seqs for k in range(1, len(s) + 1)})


class _SoftCapped(torch.nn.Module):
    """A causal LM whose logits are post-processed (soft-capped): not its head applied to its decoder's output."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def get_decoder(self):
        return self.inner.get_decoder()

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, **kw):
        out = self.inner(**kw)
        out.logits = 2.0 * torch.tanh(out.logits / 2.0)
        return out


def _hand_scores(model, prompts, responses, allowed, temperature):
    """Per row: the whole model's logits over the whole sequence, masked to the allowed tokens, log-softmaxed."""
    lps, ents = [], []
    for p, r, a in zip(prompts, responses, allowed):
        logits = model(input_ids=torch.tensor([p + r])).logits.float()[0] / temperature
        lp_row, ent_row = [], []
        for k, tok in enumerate(r):
            z = logits[len(p) - 1 + k]
            if a is not None and k < len(a) and a[k]:
                keep = torch.zeros_like(z, dtype=torch.bool)
                keep[a[k]] = True
                z = z.masked_fill(~keep, -1e9)
            logq = torch.log_softmax(z, -1)
            lp_row.append(logq[tok])
            ent_row.append(-(logq.exp() * logq).sum())
        lps.append(torch.stack(lp_row))
        ents.append(torch.stack(ent_row))
    return lps, ents


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scoring_runs_the_head_only_at_free_response_tokens_with_the_same_numbers_and_gradients(model, tokenizer, dtype):
    """Issue 14: a constrained step that allows exactly the sampled token (a forced token) has log-prob 0 and
    entropy 0 under the renormalised distribution, so scoring computes the output head only at the other response
    tokens. Log-probs, entropies and gradients equal the whole model's masked log-softmax (fp32 1e-5, bf16 3e-2),
    for plain and prefix-shared forwards, with rows unconstrained, partly forced and entirely forced."""
    import copy

    from sdar.models.logprobs import decoder_and_head, head_where_needed
    from sdar.models.scoring import response_logprobs, shared_prefix_logprobs

    m = copy.deepcopy(model).to(dtype).train()
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    prefix = ids[1][:4]
    prompts = [prefix + ids[1][4:], prefix + ids[2][:2], prefix + ids[0][:5], prefix + ids[2][:1]]
    responses = [ids[0][5:11], ids[0][11:15], ids[0][5:9], ids[0][1:4]]
    V = m.get_output_embeddings().weight.shape[0]
    allowed = [
        # forced, free (3 tokens), unconstrained (empty step), forced, free (2), and no steps left for the last
        [[responses[0][0]], [responses[0][1], 7, 9], [], [responses[0][3]], [responses[0][4], (responses[0][4] + 1) % V]],
        None,  # unconstrained row
        [[t] for t in responses[2]],  # every token forced
        [[responses[3][0]], [responses[3][1], 5], [responses[3][2]]],
    ]
    free = sum(1 for r, a in zip(responses, allowed) for k, t in enumerate(r)
               if not (a is not None and k < len(a) and a[k] == [t]))
    head_rows = []
    assert decoder_and_head(m) is not None  # the check (three positions) runs before the count
    m.get_output_embeddings().register_forward_pre_hook(lambda mod, a: head_rows.append(a[0].numel() // a[0].shape[-1]))
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    weights = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))

    def loss_of(lp, ent):
        return (lp * weights[:, : lp.shape[1]]).sum() + 0.3 * (ent * weights[:, : ent.shape[1]]).sum()

    hand_lp, hand_ent = _hand_scores(m, prompts, responses, allowed, 0.7)
    T = max(map(len, responses))
    hand_lp_t = torch.stack([torch.nn.functional.pad(x, (0, T - len(x))) for x in hand_lp])
    hand_ent_t = torch.stack([torch.nn.functional.pad(x, (0, T - len(x))) for x in hand_ent])
    loss_of(hand_lp_t, hand_ent_t).backward()
    hand_grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    for score in (lambda: response_logprobs(m, prompts, responses, pad_id=0, allowed=allowed, temperature=0.7,
                                            with_entropy=True, grad=True, length_buckets=False),
                  lambda: shared_prefix_logprobs(m, prefix, [p[len(prefix):] for p in prompts], responses, pad_id=0,
                                                 allowed=allowed, temperature=0.7, with_entropy=True, grad=True)):
        m.zero_grad(set_to_none=True)
        head_rows.clear()
        out = score()
        for i, r in enumerate(responses):
            torch.testing.assert_close(out.logp[i, : len(r)], hand_lp[i].detach(), atol=tol, rtol=0)
            torch.testing.assert_close(out.entropy[i, : len(r)], hand_ent[i].detach(), atol=tol, rtol=0)
            assert not out.logp[i, len(r):].any()
        assert not out.logp[2].any() and not out.entropy[2].any()  # the forced row: exactly 0
        assert sum(head_rows) == free  # the head ran at the free tokens only
        loss_of(out.logp, out.entropy).backward()
        for n, p in m.named_parameters():
            torch.testing.assert_close(p.grad, hand_grads[n], atol=tol * 10, rtol=tol * 10, msg=n)

    # switched off (scoring.head_at_free_tokens: false): the same numbers, the head over every response span
    with torch.no_grad():
        on = response_logprobs(m, prompts, responses, pad_id=0, allowed=allowed, temperature=0.7, with_entropy=True)
        head_rows.clear()
        with head_where_needed(False):
            off = response_logprobs(m, prompts, responses, pad_id=0, allowed=allowed, temperature=0.7,
                                    with_entropy=True)
    torch.testing.assert_close(off.logp, on.logp, atol=tol, rtol=0)
    torch.testing.assert_close(off.entropy, on.entropy, atol=tol, rtol=0)
    assert sum(head_rows) >= len(prompts) * max(map(len, responses)) > free

    # a batch of forced tokens only still gives a loss with a graph (zero gradient)
    m.zero_grad(set_to_none=True)
    only = response_logprobs(m, prompts[2:3], responses[2:3], pad_id=0, allowed=allowed[2:3], grad=True)
    assert not only.logp.any()
    only.logp.sum().backward()
    assert all(not p.grad.any() for p in m.parameters() if p.grad is not None)


def test_a_model_that_post_processes_its_logits_is_scored_whole(model, tokenizer):
    """The head-only-where-needed path applies where the logits are the head of the decoder's output; a model that
    soft-caps them fails that check and is scored from its own logits, with the same numbers as by hand."""
    from sdar.models.logprobs import decoder_and_head
    from sdar.models.scoring import response_logprobs

    capped = _SoftCapped(model).eval()
    assert decoder_and_head(capped) is None and decoder_and_head(model) is not None
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    prompts, responses = [ids[0][:6], ids[1][:4]], [ids[0][6:10], ids[1][4:7]]
    allowed = [[[responses[0][0]], [responses[0][1], 3]], None]
    with torch.no_grad():
        out = response_logprobs(capped, prompts, responses, pad_id=0, allowed=allowed, with_entropy=True)
        hand_lp, hand_ent = _hand_scores(capped, prompts, responses, allowed, 1.0)
        plain = response_logprobs(model, prompts, responses, pad_id=0, allowed=allowed)
    for i, r in enumerate(responses):
        torch.testing.assert_close(out.logp[i, : len(r)], hand_lp[i], atol=1e-5, rtol=0)
        torch.testing.assert_close(out.entropy[i, : len(r)], hand_ent[i], atol=1e-5, rtol=0)
    assert (out.logp - plain.logp).abs().max() > 1e-3  # the capping matters: the whole model's logits were used
