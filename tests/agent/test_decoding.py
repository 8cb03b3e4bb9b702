"""Jump-forward constrained sampling (issue 14.1): forced tokens skip the decode step and a row's run
of them goes through the model in one forward, with the same samples and log-probs as one token per
forward; the log-probs are the trainer's scores of the same tokens."""

from __future__ import annotations

import os
import random

import pytest
import torch

from sdar.agent.backends import TransformersBackend
from sdar.agent.constrained import action_trie
from sdar.agent.decoding import DecodeStats, constrained_sample, forward_overhead, length_buckets, prefix_groups
from sdar.models import TinyModelConfig, build_tiny_model, train_tokenizer
from sdar.models.logprobs import decoder_and_head
from sdar.models.scoring import response_logprobs
from tests.agent.row_oracle import processed_logprobs, sample_rows
from tests.models.test_logits import old_sampling

ACTIONS = ["go to fridge 1", "go to fridge 2", "go to countertop 1", "open drawer 1", "take apple 1 from fridge 1",
           "look", "inventory"]


@pytest.fixture(scope="module")
def small():
    tok = train_tokenizer(["<action>" + a + "</action> please" for a in ACTIONS] * 20, vocab_size=300)
    torch.manual_seed(0)
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                   num_attention_heads=2, num_key_value_heads=1)).eval()
    return tok, model


def _prompts(tok, n):
    texts = ["what now?", "you are in the kitchen. what now?", "go", "the fridge is closed; you see a drawer 1 here"]
    return [tok(texts[i % len(texts)], add_special_tokens=False)["input_ids"] for i in range(n)]


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_jump_forward_on_and_off_give_the_same_samples_and_logprobs(small, temperature):
    tok, model = small
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    full = action_trie(tok, "household", ACTIONS, eos)
    short = action_trie(tok, "household", ACTIONS[:3], eos)
    prompts = _prompts(tok, 12)
    tries = [full, short, None] * 4  # a mixed batch: two tries and a free row
    runs = {}
    for jump in (True, False):
        torch.manual_seed(7)
        st = DecodeStats()
        rows = constrained_sample(model, prompts, tries, max_new_tokens=40, temperature=temperature, top_p=1.0,
                                  eos_ids=[eos], pad_id=tok.pad_token_id, jump_forward=jump, stats=st)
        runs[jump] = (rows, st)
    (on, st_on), (off, st_off) = runs[True], runs[False]
    assert [r.token_ids for r in on] == [r.token_ids for r in off]
    for a, b in zip(on, off):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)
        assert a.forced == b.forced and a.finished == b.finished
    # the constrained rows are admissible actions; forced tokens have log-prob 0 (log 1)
    for r, t in zip(on, tries):
        if t is not None:
            assert r.finished and r.token_ids in t.sequences
            assert sum(lp == 0.0 for lp in r.logprobs) >= r.forced
    assert st_on.tokens == st_off.tokens and st_on.forced == st_off.forced > 0


def test_jump_forward_skips_the_forced_tokens_decode_steps(small):
    tok, model = small
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    trie = action_trie(tok, "household", ACTIONS, eos)
    prompts = _prompts(tok, 8)
    stats = {}
    for jump in (True, False):
        torch.manual_seed(5)
        stats[jump] = DecodeStats()
        rows = constrained_sample(model, prompts, [trie] * 8, max_new_tokens=40, temperature=1.0, top_p=1.0,
                                  eos_ids=[eos], pad_id=tok.pad_token_id, jump_forward=jump, stats=stats[jump])
    # one token per forward: as many forwards as the longest response, less the token after which it ended
    assert stats[False].forwards == max(len(r.token_ids) for r in rows) - 1
    # jump-forward: one forward per decision (a free token and the forced run after it)
    free = [len(r.token_ids) - r.forced for r in rows]
    assert stats[True].forwards <= max(free) and stats[True].forwards < stats[False].forwards / 2


def _grouped_prompts(tok):
    """A rollout chunk's shape: three tasks' groups (system prompt, task, step line shared within a group, the
    system prompt across groups), each row with its own observation, and one row that shares nothing."""
    system = "you are in the kitchen. reply with one action. "
    tasks = ["go to fridge 1 and look.", "take apple 1 from fridge 1, please.", "open drawer 1"]
    obs = ["what now?", "the fridge is closed; you see a drawer 1 here", "go", "you see a countertop 1"]
    rows = [system + t + " turn 3. " + o for t in tasks for o in obs] + ["inventory"]
    return [tok(r, add_special_tokens=False)["input_ids"] for r in rows]


def test_prefix_groups_groups_the_rows_of_a_task_and_leaves_the_rest_whole(small):
    tok, _ = small
    prompts = _grouped_prompts(tok)
    plan = prefix_groups(prompts)
    groups = sorted(sorted(rows) for rows, _ in plan)
    assert groups == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12]]
    for rows, shared in plan:
        group = [prompts[i] for i in rows]
        whole = len(os.path.commonprefix(group)) if len(rows) > 1 else shared
        # the whole start the group shares, but never a row's last token (it predicts the first response token)
        assert shared == min(whole, min(len(p) for p in group) - 1) > 0
    assert prefix_groups(prompts[:1]) is None  # one row: nothing to share
    # a row no longer than the shared start keeps its last token: the start stops one short of it
    short = prefix_groups([prompts[0], prompts[0][:4], prompts[0][:4] + [7]])
    assert short is not None and all(s <= 3 for _, s in short)
    # rows that share nothing at all: no plan, the prompts go whole
    assert prefix_groups([[1, 2, 3], [4, 5, 6], [7, 8]]) is None


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_shared_prefix_prefill_gives_the_same_samples_and_logprobs(small, temperature):
    """share_prefix encodes each group's start once: fewer positions through the model, the same tokens, and
    log-probs equal within float rounding (1e-5)."""
    tok, model = small
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    full = action_trie(tok, "household", ACTIONS, eos)
    short = action_trie(tok, "household", ACTIONS[:3], eos)
    prompts = _grouped_prompts(tok)
    tries = ([full, short, None] * 5)[: len(prompts)]
    runs = {}
    for share in (True, False):
        torch.manual_seed(9)
        st = DecodeStats()
        rows = constrained_sample(model, prompts, tries, max_new_tokens=40, temperature=temperature, top_p=1.0,
                                  eos_ids=[eos], pad_id=tok.pad_token_id, share_prefix=share, stats=st)
        runs[share] = (rows, st)
    (on, st_on), (off, st_off) = runs[True], runs[False]
    assert [r.token_ids for r in on] == [r.token_ids for r in off]
    for a, b in zip(on, off):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)
        assert a.forced == b.forced and a.finished == b.finished
    width = max(len(p) for p in prompts)
    assert st_off.prefill_tokens == len(prompts) * width
    assert st_on.prefill_tokens < 0.8 * st_off.prefill_tokens and st_on.forwards == st_off.forwards


def _partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        for k in range(len(part)):
            yield part[:k] + [[first] + part[k]] + part[k + 1:]
        yield [[first]] + part


def test_length_buckets_cut_the_rows_where_a_forward_saves_more_positions_than_it_costs():
    """The rows of a prefill cut into forwards by length: the fewest positions (each forward padded to its longest
    row) plus `overhead` a forward, over every way of splitting the rows (brute force), and one forward in the
    rows' own order unless a cut pays."""
    assert length_buckets([5, 6, 5, 40], float("inf")) == [[0, 1, 2, 3]]
    assert length_buckets([5, 6, 5, 40], 10) == [[0, 2, 1], [3]]  # 3 x 6 + 40 + 2 x 10 = 78 < 4 x 40 + 10 = 170
    assert length_buckets([5, 6, 5, 40], 110) == [[0, 1, 2, 3]]  # 58 + 220 > 160 + 110
    assert length_buckets([7], 0) == [[0]]
    rng = random.Random(0)
    for _ in range(300):
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 7))]
        overhead = rng.choice([0, 3, 20, 200])
        runs = length_buckets(lengths, overhead)
        assert sorted(i for r in runs for i in r) == list(range(len(lengths)))

        def cost(runs):
            return sum(len(r) * max(lengths[i] for i in r) + overhead for r in runs)

        assert cost(runs) == min(cost(p) for p in _partitions(list(range(len(lengths)))))


def test_forward_overhead_is_a_layers_fixed_cost_in_its_positions(small):
    """On a CPU one more forward costs FORWARD_FLOPS_PER_LAYER over a position's FLOPs in a layer: about 85
    positions of SmolLM2-135M (its layer's shape, built here without its weights), tens of thousands of a tiny model
    (never worth a cut); off a CPU a prefill's rests stay one forward."""
    from transformers import LlamaConfig, LlamaForCausalLM

    smol = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=576, intermediate_size=1536, num_hidden_layers=1,
                                        num_attention_heads=9, num_key_value_heads=3))
    assert forward_overhead(smol, "cpu") == pytest.approx(6e8 / (2 * 3_540_096))
    assert 80 < forward_overhead(smol, torch.device("cpu")) < 90
    assert forward_overhead(small[1], "cpu") > 10_000
    assert forward_overhead(smol, "cuda") == float("inf")


@pytest.mark.parametrize("grouped", [True, False], ids=["shared-starts", "nothing-shared"])
def test_a_long_prompt_gets_a_forward_of_its_own_with_the_same_samples_and_logprobs(small, monkeypatch, grouped):
    """A turn whose prompts include one much longer than the rest: with the forward's cost set low enough to cut
    (the tiny model's own never is), the long row goes in a forward of its own after the shared starts, the rest
    together, and the cache is assembled as one padded prefill's: the same tokens and log-probs (1e-5) as every
    prompt encoded whole, the same decode steps, fewer positions than the rests in one forward."""
    import sdar.agent.decoding as decoding

    tok, model = small
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    full = action_trie(tok, "household", ACTIONS, eos)
    if grouped:
        prompts = _grouped_prompts(tok)[:8]
        prompts[5] = prompts[5] + prompts[5][-8:] * 12  # its group's rows still share their start
    else:
        prompts = _prompts(tok, 4)  # four texts that begin differently
        prompts[3] = prompts[3] + prompts[1] * 10
    assert (prefix_groups(prompts) is not None) == grouped
    tries = ([full, None, full] * 3)[: len(prompts)]
    runs = {}
    for name, share, flops in [("whole", False, 6e8), ("one", True, 6e8), ("cut", True, 1.0)]:
        monkeypatch.setattr(decoding, "FORWARD_FLOPS_PER_LAYER", flops)
        torch.manual_seed(4)
        st = DecodeStats()
        rows = constrained_sample(model, prompts, tries, max_new_tokens=40, temperature=1.0, top_p=1.0,
                                  eos_ids=[eos], pad_id=tok.pad_token_id, share_prefix=share, stats=st)
        runs[name] = (rows, st)
    (whole, st_whole), (one, st_one), (cut, st_cut) = runs["whole"], runs["one"], runs["cut"]
    for other in (one, cut):
        assert [r.token_ids for r in other] == [r.token_ids for r in whole]
        for a, b in zip(other, whole):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)
            assert a.forced == b.forced and a.finished == b.finished
    assert st_cut.forwards == st_one.forwards == st_whole.forwards
    assert st_cut.prefill_tokens < 0.7 * st_one.prefill_tokens <= 0.7 * st_whole.prefill_tokens


@pytest.mark.parametrize("jump, share", [(True, True), (True, False), (False, False)], ids=["jump+share", "jump", "step"])
def test_sampler_logprobs_are_the_trainers_scores(small, jump, share):
    """What the sampler reports is what `response_logprobs` computes for the same tokens (the trie's
    renormalisation at the same temperature): the first PPO ratio is 1."""
    tok, model = small
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    trie = action_trie(tok, "household", ACTIONS, eos)
    prompts = _prompts(tok, 16)
    if share:
        prompts = _grouped_prompts(tok) + prompts[:3]
    backend = TransformersBackend(model, tok, batch_size=8, jump_forward=jump, share_prefix=share)
    torch.manual_seed(3)
    gens = backend.generate(prompts, max_new_tokens=40, temperature=0.8, tries=[trie] * len(prompts))
    responses = [g.token_ids for g in gens]
    scored = response_logprobs(model, prompts, responses, pad_id=tok.pad_token_id, temperature=0.8,
                               allowed=[trie.allowed_along(r) for r in responses])
    for i, g in enumerate(gens):
        n = len(g.token_ids)
        torch.testing.assert_close(torch.tensor(g.logprobs), scored.logp[i, :n].float(), rtol=0, atol=2e-5)
    assert backend.decode_stats.forced > 0


def test_the_sampled_frequencies_follow_the_renormalised_distribution(small):
    tok, model = small
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    trie = action_trie(tok, "household", ACTIONS, eos)
    prompt = _prompts(tok, 1)[0]
    n = 600
    torch.manual_seed(11)
    rows = constrained_sample(model, [prompt] * n, [trie] * n, max_new_tokens=40, temperature=1.0, top_p=1.0,
                              eos_ids=[eos], pad_id=tok.pad_token_id)
    seqs = {tuple(s) for s in trie.sequences}
    scored = response_logprobs(model, [prompt] * len(seqs), [list(s) for s in seqs], pad_id=tok.pad_token_id,
                               allowed=[trie.allowed_along(list(s)) for s in seqs])
    probs = dict(zip(seqs, (scored.logp * scored.mask).sum(1).exp().tolist()))
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-4)  # the trie's sequences carry all the mass
    for s, p in probs.items():
        freq = sum(tuple(r.token_ids) == s for r in rows) / n
        assert abs(freq - p) < 4 * (p * (1 - p) / n) ** 0.5 + 0.01, (s, freq, p)


def test_top_p_keeps_the_smallest_set_over_p():
    logits = torch.tensor([0.0, 1.0, 2.0, 3.0])
    lp = processed_logprobs(logits, None, 1.0, 0.6)
    p = torch.softmax(logits, -1)  # [0.032, 0.087, 0.237, 0.644]: 0.644 >= 0.6 alone
    # a token that cannot be drawn has probability exactly 0 (its logit at MASKED, finite)
    assert lp[:3].exp().eq(0).all() and lp[3] == pytest.approx(0.0)
    lp = processed_logprobs(logits, [0, 1, 2], 2.0, 1.0)  # allowed set, then temperature
    want = torch.log_softmax(torch.tensor([0.0, 0.5, 1.0]), -1)
    torch.testing.assert_close(lp[:3], want)
    assert lp[3].exp() == 0 and float(p.sum()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        constrained_sample(None, [[1]], [None], max_new_tokens=1, temperature=0.0, top_p=1.0, eos_ids=[0], pad_id=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_samples_and_logprobs_are_those_of_the_processing_before_process_logits(small, dtype, top_p):
    """Issue 39 point 3: sampling through `process_logits` draws the tokens, with the log-probs, that its own
    copy of the processing (-inf outside the allowed set, then temperature, then top-p) drew (the per-row oracle
    with each processing; test_the_sampler_draws_the_per_row_oracles_tokens_and_logprobs ties the sampler to it)."""
    import copy

    tok, model = small
    model = copy.deepcopy(model).to(dtype)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    tries = [action_trie(tok, "household", ACTIONS, eos), None, action_trie(tok, "household", ACTIONS[:3], eos)] * 3
    new, old = (sample_rows(model, _prompts(tok, 9), tries, max_new_tokens=12, temperature=0.7, top_p=top_p,
                            eos_ids=[eos], pad_id=tok.pad_token_id, seeds=list(range(9)), processed=processed)
                for processed in (processed_logprobs, old_sampling))
    assert [r.token_ids for r in new] == [r.token_ids for r in old]
    assert [r.logprobs for r in new] == [r.logprobs for r in old]
    assert any(lp != 0.0 for r in new for lp in r.logprobs)


def _run(model, tok, prompts, tries, **kw):
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    st = DecodeStats()
    rows = constrained_sample(model, prompts, tries, max_new_tokens=30, eos_ids=[eos], pad_id=tok.pad_token_id,
                              stats=st, seeds=list(range(len(prompts))), **kw)
    return rows, st


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_the_sampler_draws_the_per_row_oracles_tokens_and_logprobs(small, dtype, top_p):
    """Issues 40.4 and 45.1: the one sampler, in both its layouts (a batched decision per decode step; the
    lookahead's one packed forward of the prompts and their tries), draws the tokens the per-row oracle draws
    (tests/agent/row_oracle.py: a softmax and a torch.multinomial per row), with its log-probs up to float
    rounding; constrained and free rows, jump_forward and share_prefix on and off."""
    import copy

    tok, model = small
    model = copy.deepcopy(model).to(dtype)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    tries = ([action_trie(tok, "household", ACTIONS, eos), action_trie(tok, "household", ACTIONS[:3], eos), None] * 5)
    prompts = _grouped_prompts(tok)
    tries = tries[: len(prompts)]
    ref = sample_rows(model, prompts, tries, max_new_tokens=30, temperature=0.7, top_p=top_p, eos_ids=[eos],
                      pad_id=tok.pad_token_id, seeds=list(range(len(prompts))))
    tol = 1e-5 if dtype == torch.float32 else 5e-3
    for sampler, jump, share in (("batched", True, False), ("batched", False, True), ("batched", True, True),
                                 ("lookahead", True, True), ("lookahead", False, False)):
        rows, _ = _run(model, tok, prompts, tries, temperature=0.7, top_p=top_p, sampler=sampler, jump_forward=jump,
                       share_prefix=share)
        assert [r.token_ids for r in rows] == [r.token_ids for r in ref], (sampler, jump, share)
        assert [(r.forced, r.finished) for r in rows] == [(r.forced, r.finished) for r in ref]
        for a, b in zip(rows, ref):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=tol)
    assert any(lp != 0.0 for r in ref for lp in r.logprobs) and any(t is None for t in tries)


def test_lookahead_samples_a_turn_of_constrained_rows_in_one_forward(small):
    """The lookahead runs the prompts and every admissible response once (a group's identical rows share every
    position) and no decode step; the sampler's log-probs are still the trainer's scores."""
    tok, model = small
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    trie = action_trie(tok, "household", ACTIONS, eos)
    prompts = _grouped_prompts(tok)
    # the once-per-model check that the head splits off (two probe forwards, made by whichever test asks first)
    assert decoder_and_head(model) is not None
    calls = []
    hook = model.get_decoder().register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        rows, st = _run(model, tok, prompts, [trie] * len(prompts), temperature=0.8, top_p=1.0, sampler="lookahead")
    finally:
        hook.remove()
    assert len(calls) == 1 and st.forwards == 0 and st.forced > 0
    _, st_steps = _run(model, tok, prompts, [trie] * len(prompts), temperature=0.8, top_p=1.0, sampler="batched")
    assert st_steps.forwards >= 2
    responses = [r.token_ids for r in rows]
    scored = response_logprobs(model, prompts, responses, pad_id=tok.pad_token_id, temperature=0.8,
                               allowed=[trie.allowed_along(r) for r in responses])
    for i, r in enumerate(rows):
        torch.testing.assert_close(torch.tensor(r.logprobs), scored.logp[i, : len(r.token_ids)], rtol=0, atol=2e-5)
    with pytest.raises(ValueError, match="unknown sampler 'rows'; choose one of batched, lookahead"):
        _run(model, tok, prompts, [trie] * len(prompts), temperature=0.8, top_p=1.0, sampler="rows")
    with pytest.raises(ValueError, match="unknown sampler 'fast'"):
        _run(model, tok, prompts, [trie] * len(prompts), temperature=0.8, top_p=1.0, sampler="fast")


@pytest.mark.parametrize("vocab", [300, 151936])
def test_batched_draws_are_torch_multinomials(vocab):
    """sdar.agent.draws.decide: every row's token is the one torch.multinomial draws from the row's processed
    distribution with the row's generator, and each generator ends where multinomial leaves it."""
    from sdar.agent.draws import decide, row_generators

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, vocab, generator=g) * 3
    sets = [None, [3, 17, 250, 9], None, [250, 4], [5, 6, 7, 8, 9, 10, 11], None]
    for top_p in (1.0, 0.9):
        gens, ref_gens = row_generators(range(6), "cpu"), row_generators(range(6), "cpu")
        toks, lps = decide(sets, gens, temperature=0.7, top_p=top_p, vocab=vocab, logits=logits)
        for i, s in enumerate(sets):
            lp = processed_logprobs(logits[i], s, 0.7, top_p)
            want = int(torch.multinomial(lp.exp(), 1, generator=ref_gens[i]))
            assert toks[i] == want and lps[i] == pytest.approx(float(lp[want]), abs=1e-6)
            if s is None:
                assert lps[i] == float(lp[want])  # free rows: the same float ops, bit for bit
            assert torch.equal(gens[i].get_state(), ref_gens[i].get_state())


def test_a_distribution_that_is_not_finite_is_refused_as_multinomial_refuses_it():
    """The batched draw takes an argmax of p / q, which would pick a token from nan logits where torch.multinomial
    (the per-row oracle's draw) raises: it raises too, for free and constrained rows (a diverged update's next
    rollout fails loudly: tests/train/test_guards.py)."""
    from sdar.agent.draws import decide, row_generators

    logits = torch.randn(3, 50)
    for bad, sets in ((float("nan"), [None, None, [3, 4]]), (float("inf"), [[3, 4], None, [5, 6, 7]])):
        poisoned = logits.clone()
        poisoned[1] = bad
        poisoned[2, 3:8] = bad
        with pytest.raises(RuntimeError, match=r"cannot sample: the next-token distribution of 2 of 3 deciding rows"):
            decide(sets, row_generators(range(3), "cpu"), temperature=1.0, top_p=1.0, vocab=50, logits=poisoned)
    toks, _ = decide([None, None, [3, 4]], row_generators(range(3), "cpu"), temperature=1.0, top_p=1.0, vocab=50,
                     logits=logits)
    assert toks[2] in (3, 4)
