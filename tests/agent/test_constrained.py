import math

import pytest
import torch

from sdar.agent.backends import TransformersBackend
from sdar.agent.constrained import ActionTrie, action_trie
from sdar.models import TinyModelConfig, build_tiny_model, train_tokenizer
from sdar.models.scoring import response_logprobs

ACTIONS = ["go to fridge 1", "go to fridge 2", "open drawer 1", "look"]


def test_trie_allows_exactly_the_continuations():
    t = ActionTrie([[1, 2, 9], [1, 3, 9], [4, 9]])
    assert sorted(t.allowed([])) == [1, 4]
    assert sorted(t.allowed([1])) == [2, 3]
    assert t.allowed([1, 2, 9]) == [] and t.allowed([7]) == []
    assert t.allowed_along([1, 3, 9]) == [[1, 4], [2, 3], [9]]


@pytest.fixture(scope="module")
def small():
    tok = train_tokenizer(["<action>" + a + "</action> please" for a in ACTIONS] * 20, vocab_size=300)
    torch.manual_seed(0)
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                   num_attention_heads=2, num_key_value_heads=1))
    return tok, model


@pytest.mark.parametrize("temperature", [1.0, 0.1])
def test_constrained_sampling_matches_the_scored_distribution(small, temperature):
    tok, model = small
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    trie = action_trie(tok, "household", ACTIONS, eos)
    prompt = tok("what now?", add_special_tokens=False)["input_ids"]
    backend = TransformersBackend(model, tok, batch_size=400)
    torch.manual_seed(1)
    gens = backend.generate([prompt] * 400, max_new_tokens=12, temperature=temperature, tries=[trie] * 400)
    texts = [g.text for g in gens]
    assert all(g.finished for g in gens)
    assert set(texts) <= {f"<action>{a}</action>" for a in ACTIONS}
    # the scorer's constrained log-prob of each action must be the sampler's probability
    seqs = {g.text: g.token_ids for g in gens}
    probs = {}
    for text, ids in seqs.items():
        lp = response_logprobs(model, [prompt], [ids], pad_id=tok.pad_token_id, allowed=[trie.allowed_along(ids)],
                               temperature=temperature)
        probs[text] = math.exp(lp.logp.sum().item())
    total = sum(math.exp(response_logprobs(
        model, [prompt], [tok(f"<action>{a}</action>", add_special_tokens=False)["input_ids"] + [eos]],
        pad_id=tok.pad_token_id,
        allowed=[trie.allowed_along(tok(f"<action>{a}</action>", add_special_tokens=False)["input_ids"] + [eos])],
        temperature=temperature,
    ).logp.sum().item()) for a in ACTIONS)
    assert total == pytest.approx(1.0, abs=1e-4)  # a proper distribution over the admissible actions
    if temperature != 1.0:  # the temperature must matter here, or this case would prove nothing
        at_one = {t: math.exp(response_logprobs(model, [prompt], [ids], pad_id=tok.pad_token_id,
                                                allowed=[trie.allowed_along(ids)]).logp.sum().item())
                  for t, ids in seqs.items()}
        assert max(abs(probs[t] - at_one[t]) for t in probs) > 0.1
    for text, p in probs.items():
        freq = texts.count(text) / len(texts)
        assert freq == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / len(texts)) + 0.01)


def test_prompt_lm_term_is_the_prompt_log_likelihood_and_trains(small):
    """prompt_lm=True returns, from the same forward, the summed log-probs of every prompt token
    after the first (hand-computed from the logits here); its gradient reaches the weights."""
    tok, model = small
    prompts = [tok("what now? please", add_special_tokens=False)["input_ids"],
               tok("now", add_special_tokens=False)["input_ids"]]
    responses = [tok("<action>look</action>", add_special_tokens=False)["input_ids"]] * 2
    out = response_logprobs(model, prompts, responses, pad_id=tok.pad_token_id, prompt_lm=True, grad=True)
    want, n = 0.0, 0
    with torch.no_grad():
        for p in prompts:
            logits = model(torch.tensor([p])).logits[0].float()
            logp = torch.log_softmax(logits, -1)
            want += sum(logp[i, p[i + 1]].item() for i in range(len(p) - 1))
            n += len(p) - 1
    assert out.prompt_tokens == n
    assert out.prompt_logp_sum.item() == pytest.approx(want, rel=1e-5, abs=1e-5)
    model.zero_grad()
    (-out.prompt_logp_sum).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    model.zero_grad()
    plain = response_logprobs(model, prompts, responses, pad_id=tok.pad_token_id)
    assert plain.prompt_logp_sum is None and plain.prompt_tokens == 0
    assert torch.allclose(plain.logp, out.logp.detach(), atol=1e-6)  # the response scores are unchanged


@pytest.mark.parametrize("constrained", [False, True], ids=["free", "trie"])
def test_checkpoint_generation_defaults_do_not_reach_the_sampler(small, tmp_path, constrained):
    """Issue 12.3: a checkpoint whose generation_config.json sets a repetition penalty and top-k
    (as Qwen2.5-Instruct's does) samples from exactly the distribution the trainer scores: the
    sampler's log-prob of every token equals `response_logprobs` at the rollout temperature, so the
    first PPO ratio (exp(sampler logp - old_logp)) is 1. Before the fix the penalty shifted repeated
    tokens' log-probs."""
    from transformers import AutoModelForCausalLM

    from sdar.agent.backends import sampling_config

    import copy

    tok, model = small
    model = copy.deepcopy(model)
    model.generation_config.update(do_sample=True, repetition_penalty=2.0, top_k=3, no_repeat_ngram_size=2)
    model.save_pretrained(tmp_path / "ckpt")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    assert loaded.generation_config.repetition_penalty == 2.0, "the checkpoint carries the penalty"
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    trie = action_trie(tok, "household", ACTIONS, eos) if constrained else None
    prompt = tok("what now? go to fridge go to fridge", add_special_tokens=False)["input_ids"]
    backend = TransformersBackend(loaded, tok, batch_size=64, record_logprobs=True)
    torch.manual_seed(3)
    temperature = 0.7
    gens = backend.generate([prompt] * 64, max_new_tokens=16, temperature=temperature, top_p=1.0,
                            tries=[trie] * 64 if constrained else None)
    responses = [g.token_ids for g in gens]
    repeats = sum(len(r) - len(set(r)) for r in responses)
    assert repeats > 0, "some token repeats, so a repetition penalty would show"
    scored = response_logprobs(loaded, [prompt] * 64, responses, pad_id=tok.pad_token_id, temperature=temperature,
                               allowed=[trie.allowed_along(r) for r in responses] if constrained else None)
    for i, g in enumerate(gens):
        n = len(g.token_ids)
        assert len(g.logprobs) == n
        torch.testing.assert_close(torch.tensor(g.logprobs), scored.logp[i, :n].float(), rtol=0, atol=2e-5)
    # greedy decoding is model.generate's (sampling is the one sampler's, which reads no generation_config): its
    # recorded scores are the unprocessed log-softmax, so no checkpoint default reached it either
    greedy = backend.generate([prompt] * 2, max_new_tokens=16, temperature=0.0, tries=[trie] * 2 if constrained else None)
    responses = [g.token_ids for g in greedy]
    scored = response_logprobs(loaded, [prompt] * 2, responses, pad_id=tok.pad_token_id, temperature=1.0,
                               allowed=[trie.allowed_along(r) for r in responses] if constrained else None)
    for i, g in enumerate(greedy):
        n = len(g.token_ids)
        torch.testing.assert_close(torch.tensor(g.logprobs), scored.logp[i, :n].float(), rtol=0, atol=2e-5)
    assert all(len(r) > len(set(r)) for r in responses), "greedy repeats a token, so a repetition penalty would show"
    # the configuration itself spells out every processor-adding setting as neutral
    cfg = sampling_config(temperature, 1.0, max_new_tokens=4, eos_ids=[eos], pad_id=0)
    assert (cfg.repetition_penalty, cfg.top_k, cfg.no_repeat_ngram_size, cfg.typical_p) == (1.0, 0, 0, 1.0)
    assert loaded.generation_config.repetition_penalty == 2.0, "the model's own config is restored after sampling"
