"""The vLLM rollout engine's parts that run without vLLM: backend selection and its errors, the
per-step LoRA adapter export, the trie as a vLLM per-request logits processor, vLLM outputs ->
`Generation`, and vLLM prompt log-probs -> the teacher's `ScoredBatch`.

vLLM itself ships CUDA-only wheels and cannot be installed on this CPU machine; what needs it
(`VLLMBackend.generate` / `prompt_logprobs` on a GPU) is exercised by benchmarks/bench_vllm.py.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass

import pytest
import torch
import yaml
from safetensors.torch import load_file

from sdar.agent.backends import (
    AdapterExporter,
    Generation,
    TransformersBackend,
    export_base_model,
    follows_trie,
    generation_from_vllm,
    make_backend,
    vllm_problems,
)
from sdar.agent.constrained import ActionTrie, TrieLogitsProcessor, TrieTokenFilter, action_trie
from sdar.config import load_config
from sdar.models import ModelSpec, load_policy, train_tokenizer
from sdar.models.scoring import response_logprobs
from sdar.teacher.vllm_scoring import (
    scored_from_prompt_logprobs,
    select_teacher_engine,
    vllm_response_logprobs,
)

ACTIONS = ["go to fridge 1", "go to fridge 2", "go to drawer 1", "open drawer 1", "look"]
SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "max_position_embeddings": 128}
VLLM_HERE = importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    texts = [f"<action>{a}</action> what now? you see a fridge 1 and a drawer 1." for a in ACTIONS] * 20
    d = tmp_path_factory.mktemp("tok")
    train_tokenizer(texts, vocab_size=320).save_pretrained(d)
    (d / "tiny-qwen2.yaml").write_text(yaml.safe_dump(SMALL))
    return d


def make_policy(tok_dir, seed=0):
    """The repo's tiny Qwen2 through the real loader, with a LoRA adapter moved off its zero init."""
    policy = load_policy(ModelSpec(f"tiny:{tok_dir}", lora_r=4, lora_alpha=8, seed=seed))
    step(policy)
    return policy


def step(policy, lr=5e-2):
    """One AdamW update of the adapter (what a trainer step does to it)."""
    ids = policy.tokenizer("<action>look</action> what now?", return_tensors="pt")["input_ids"]
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=lr)
    policy.model.train()
    policy.model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
    policy.model.eval()


@pytest.fixture(scope="module")
def policy(tok_dir):
    return make_policy(tok_dir)


# ---- selection and errors ---------------------------------------------------------------------
def test_config_selects_the_engine_and_rejects_unknown_vllm_keys():
    cfg = load_config(None, {"model.generation_backend": "vllm", "teacher.engine": "vllm",
                             "vllm.gpu_memory_utilization": 0.5, "vllm.max_lora_rank": 32, "vllm.dtype": "float16"})
    assert cfg.model.generation_backend == "vllm" and cfg.teacher.engine == "vllm"
    assert (cfg.vllm.gpu_memory_utilization, cfg.vllm.max_lora_rank, cfg.vllm.dtype) == (0.5, 32, "float16")
    assert cfg.vllm.enable_lora and cfg.vllm.logprobs_mode == "processed_logprobs"
    default = load_config(None)
    assert (default.model.generation_backend, default.teacher.engine) == ("transformers", "train")
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        load_config(None, {"vllm.gpu_mem": 0.5})


def test_make_backend_builds_transformers_and_names_the_choices(policy):
    backend = make_backend("transformers", policy)
    assert isinstance(backend, TransformersBackend) and backend.model is policy.model
    with pytest.raises(ValueError, match="choose one of transformers, vllm"):
        make_backend("vlm", policy)


@pytest.mark.skipif(VLLM_HERE, reason="vLLM and a GPU are present: the error under test cannot happen")
def test_choosing_vllm_without_it_says_what_to_install(policy):
    with pytest.raises(RuntimeError, match=r"pip install -e '\.\[gpu\]' on a CUDA machine") as err:
        make_backend("vllm", policy)
    assert "model.generation_backend: transformers" in str(err.value)


def test_vllm_problems_name_each_missing_piece():
    assert vllm_problems(True, True) is None
    no_pkg, no_gpu, neither = vllm_problems(False, True), vllm_problems(True, False), vllm_problems(False, False)
    assert "not installed" in no_pkg and "CUDA device" not in no_pkg
    assert "no CUDA device" in no_gpu and "not installed" not in no_gpu
    assert "not installed" in neither and "no CUDA device" in neither
    assert all("pip install -e '.[gpu]'" in m for m in (no_pkg, no_gpu, neither))


@pytest.mark.skipif(VLLM_HERE, reason="vLLM and a GPU are present: the error under test cannot happen")
def test_trainer_with_vllm_chosen_fails_before_any_work(policy, tmp_path):
    from sdar.train import Trainer

    cfg = load_config(None, {"model.generation_backend": "vllm", "output_dir": str(tmp_path), "tracking": False})
    with pytest.raises(RuntimeError, match=r"\[gpu\]"):
        Trainer(cfg, policy=policy, env_factory=lambda: pytest.fail("no environment before the engine exists"))
    cfg = load_config(None, {"teacher.engine": "vllm", "output_dir": str(tmp_path), "tracking": False})
    with pytest.raises(ValueError, match="model.generation_backend: vllm"):
        Trainer(cfg, policy=policy, env_factory=lambda: pytest.fail("no environment before the engine exists"))


def test_select_teacher_engine(policy):
    backend = make_backend("transformers", policy)
    assert select_teacher_engine("train", backend) is None
    with pytest.raises(ValueError, match="teacher.engine: train"):
        select_teacher_engine("vllm", backend)
    with pytest.raises(ValueError, match="choose one of train, vllm"):
        select_teacher_engine("teacher", backend)


# ---- the adapter, exported per step -------------------------------------------------------------
def live_lora(model) -> dict[str, torch.Tensor]:
    """The LoRA weights as peft names them on disk (the adapter name dropped)."""
    return {n.replace(".default", ""): p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_adapter_is_exported_under_a_new_id_exactly_when_it_changes(tok_dir, tmp_path):
    policy = make_policy(tok_dir)
    exp = AdapterExporter(tmp_path / "adapters", keep=2)
    v1 = exp.sync(policy.model)
    assert (v1.id, v1.name) == (1, "policy-1")
    files = {p.name for p in (tmp_path / "adapters" / "policy-1").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    conf = json.loads((tmp_path / "adapters" / "policy-1" / "adapter_config.json").read_text())
    assert (conf["r"], conf["lora_alpha"]) == (4, 8)
    saved = load_file(str(tmp_path / "adapters" / "policy-1" / "adapter_model.safetensors"))
    live = live_lora(policy.model)
    assert set(saved) == set(live) and all(torch.equal(saved[k], live[k]) for k in live)
    # no update, no export: vLLM keeps serving id 1
    assert exp.sync(policy.model) == v1 and len(list((tmp_path / "adapters").iterdir())) == 1
    ids = [v1.id]
    for _ in range(3):  # one optimizer step per RL step
        step(policy)
        v = exp.sync(policy.model)
        ids.append(v.id)
        saved = load_file(str(tmp_path / "adapters" / v.name / "adapter_model.safetensors"))
        live = live_lora(policy.model)
        assert all(torch.equal(saved[k], live[k]) for k in live)
    assert ids == [1, 2, 3, 4]
    # the weights really moved between versions, and only the newest `keep` directories remain
    assert not all(torch.equal(saved[k], load_file(str(tmp_path / "adapters" / "policy-3" /
                                                       "adapter_model.safetensors"))[k]) for k in saved)
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["policy-3", "policy-4"]
    # a checkpoint load (in-place copy) is a change too
    with torch.no_grad():
        next(p for p in policy.model.parameters() if p.requires_grad).add_(1.0)
    assert exp.sync(policy.model).id == 5


def test_exported_base_plus_adapter_is_the_live_policy(tok_dir, tmp_path):
    """What vLLM loads (base directory + adapter directory) computes the trainer's logits."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    policy = make_policy(tok_dir)
    base = export_base_model(policy, tmp_path / "base")
    assert (tmp_path / "base" / "config.json").is_file() and base == str(tmp_path / "base")
    adapter = AdapterExporter(tmp_path / "adapters").sync(policy.model)
    served = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter.path).eval()
    ids = policy.tokenizer("<action>open drawer 1</action> what now?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(served(input_ids=ids).logits, policy.model(input_ids=ids).logits,
                                   rtol=0, atol=1e-5)
        with policy.reference() as ref:  # and the base alone is the reference
            torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(base)(input_ids=ids).logits,
                                       ref(input_ids=ids).logits, rtol=0, atol=1e-5)


def test_export_base_model_reuses_a_named_checkpoint(policy, tmp_path):
    saved = tmp_path / "ckpt"
    policy._initial_weights().save_pretrained(saved)
    policy.tokenizer.save_pretrained(saved)
    named = load_policy(ModelSpec(str(saved), lora_r=4, lora_alpha=8))
    assert export_base_model(named, tmp_path / "unused") == str(saved)
    assert not (tmp_path / "unused").exists()


def test_exporter_refuses_a_model_without_adapter(policy, tmp_path):
    with pytest.raises(TypeError, match="model.lora: true"):
        AdapterExporter(tmp_path).export(policy.model.get_base_model())


# ---- constrained decoding as a vLLM per-request logits processor --------------------------------
def test_trie_filter_masks_exactly_the_disallowed_tokens_along_a_response(policy):
    tok = policy.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    trie = action_trie(tok, "household", ACTIONS, eos)
    V = len(tok)
    prompt = tok("what now?", add_special_tokens=False)["input_ids"]
    gen = torch.Generator().manual_seed(0)
    for action in ACTIONS:
        resp = tok(f"<action>{action}</action>", add_special_tokens=False)["input_ids"] + [eos]
        for k in range(len(resp)):
            logits = torch.randn(V, generator=gen)
            out = TrieTokenFilter(trie)(resp[:k], logits.clone())
            allowed = set(trie.allowed(resp[:k]))
            assert allowed and resp[k] in allowed
            finite = {i for i in range(V) if torch.isfinite(out[i])}
            assert finite == allowed  # every other token is -inf, none of these is
            assert torch.equal(out[sorted(allowed)], logits[sorted(allowed)])
            # and it is exactly the transformers processor's row
            hf = TrieLogitsProcessor([trie], len(prompt))(torch.tensor([prompt + resp[:k]]), logits.clone()[None])
            assert torch.equal(out, hf[0])
        done = torch.randn(V, generator=gen)
        assert torch.equal(TrieTokenFilter(trie)(resp, done.clone()), done)  # complete: left alone


def test_follows_trie_catches_an_unconstrained_sample(policy):
    tok = policy.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    trie = action_trie(tok, "household", ACTIONS, eos)
    assert all(follows_trie(trie, seq) for seq in trie.sequences)
    assert follows_trie(trie, trie.sequences[0][:3])  # cut by the token limit: still admissible so far
    free = tok("<action>go to sofa 9</action>", add_special_tokens=False)["input_ids"] + [eos]
    assert not follows_trie(trie, free)


def test_trie_crosses_to_the_engine_process_as_plain_token_lists(policy):
    tok = policy.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    trie = action_trie(tok, "household", ACTIONS, eos)
    rebuilt = ActionTrie(json.loads(json.dumps(trie.sequences)))  # what SamplingParams.extra_args carries
    for seq in trie.sequences:
        assert rebuilt.allowed_along(seq) == trie.allowed_along(seq)


def test_generation_from_vllm_cuts_and_decodes_like_transformers(policy):
    @dataclass
    class Logprob:  # vllm.sequence.Logprob's fields (vLLM cannot be installed here)
        logprob: float
        rank: int | None = None
        decoded_token: str | None = None

    tok = policy.tokenizer
    eos_ids = TransformersBackend(policy.model, tok).eos_ids
    body = tok("<action>look</action>", add_special_tokens=False)["input_ids"]
    ids = body + [eos_ids[0], body[0]]  # tokens after an EOS are never part of the response
    lps = [{t: Logprob(-0.1 * (j + 1), 1)} for j, t in enumerate(ids)]
    g = generation_from_vllm(ids, lps, eos_ids, tok)
    assert g == Generation(body + [eos_ids[0]], "<action>look</action>", True,
                           [pytest.approx(-0.1 * (j + 1)) for j in range(len(body) + 1)])
    unfinished = generation_from_vllm(body, None, eos_ids, tok)
    assert (unfinished.token_ids, unfinished.finished, unfinished.logprobs) == (body, False, None)


# ---- teacher scoring through prompt log-probs --------------------------------------------------
@dataclass
class Logprob:
    """Mimics `vllm.sequence.Logprob`. A hand-made stand-in is used ONLY because vLLM (CUDA-only
    wheels) cannot be installed on this machine; the structure follows vLLM's
    `RequestOutput.prompt_logprobs`: per prompt token, None for the first, else {token id: Logprob}
    with the scored token plus the top-k."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def vllm_shaped_prompt_logprobs(model, seq: list[int], k: int, scored: dict[int, float] | None = None):
    """What vLLM would return for `seq` with `prompt_logprobs=k`, computed with the tiny model
    itself (float32 log-softmax); `scored` overrides the scored token's value at given positions."""
    with torch.no_grad():
        lsm = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0].float(), dim=-1)
    out = [None]
    for j in range(1, len(seq)):
        row = lsm[j - 1]
        ranks = torch.argsort(row, descending=True)
        entry = {int(t): Logprob(float(row[t]), r + 1) for r, t in enumerate(ranks[:k].tolist())}
        tok = seq[j]
        value = scored.get(j, float(row[tok])) if scored else float(row[tok])
        entry[tok] = Logprob(value, int((row > row[tok]).sum()) + 1)
        out.append(entry)
    return out


class PromptLogprobEngine:
    """A stand-in for `VLLMBackend.prompt_logprobs` (vLLM cannot be installed here): vLLM-shaped
    prompt log-probs from the tiny model. Records the top-k each row asked for."""

    def __init__(self, model):
        self.model, self.asked = model, []

    def prompt_logprobs(self, sequences, topk):
        self.asked = list(topk)
        return [vllm_shaped_prompt_logprobs(self.model, s, k) for s, k in zip(sequences, topk)]


@pytest.fixture(scope="module")
def turns(policy):
    """Prompts of different lengths, responses that are admissible actions, their allowed tokens."""
    tok = policy.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    trie = action_trie(tok, "household", ACTIONS, eos)
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in
               ("what now?", "you see a fridge 1 and a drawer 1. what now?", "look", "what now? what now?")]
    responses = [tok(f"<action>{a}</action>", add_special_tokens=False)["input_ids"] + [eos]
                 for a in ("go to fridge 2", "open drawer 1", "look", "go to drawer 1")]
    allowed = [trie.allowed_along(r) for r in responses]
    return prompts, responses, allowed


def test_prompt_logprobs_become_the_training_side_scores(policy, turns):
    prompts, responses, _ = turns
    model = policy.model.eval()
    ref = response_logprobs(model, prompts, responses, pad_id=policy.tokenizer.pad_token_id)
    # feed the mock the trainer's own log-probs of the scored tokens: the conversion must place each
    # one at its [row, response position], exactly
    plps = [vllm_shaped_prompt_logprobs(model, p + r, 0, {len(p) + k: float(ref.logp[i, k]) for k in range(len(r))})
            for i, (p, r) in enumerate(zip(prompts, responses))]
    out, unresolved = scored_from_prompt_logprobs(plps, prompts, responses)
    assert unresolved == [] and out.entropy is None
    assert torch.equal(out.logp, ref.logp) and torch.equal(out.mask, ref.mask)
    assert out.logp.shape == (len(prompts), max(len(r) for r in responses))
    # and from vLLM's own numbers (a separate forward), the same up to float error
    plps = [vllm_shaped_prompt_logprobs(model, p + r, 0) for p, r in zip(prompts, responses)]
    torch.testing.assert_close(scored_from_prompt_logprobs(plps, prompts, responses)[0].logp, ref.logp,
                               rtol=0, atol=1e-5)


def test_constrained_rows_are_renormalised_over_the_allowed_tokens(policy, turns):
    prompts, responses, allowed = turns
    model = policy.model.eval()
    ref = response_logprobs(model, prompts, responses, pad_id=policy.tokenizer.pad_token_id, allowed=allowed)
    V = len(policy.tokenizer)
    plps = [vllm_shaped_prompt_logprobs(model, p + r, V) for p, r in zip(prompts, responses)]
    out, unresolved = scored_from_prompt_logprobs(plps, prompts, responses, allowed)
    assert unresolved == []
    torch.testing.assert_close(out.logp, ref.logp, rtol=0, atol=1e-5)
    assert torch.equal(out.mask, ref.mask)
    # one allowed token: exactly 0, as the masked training-side softmax gives
    for i, a in enumerate(allowed):
        for k, toks in enumerate(a):
            if len(toks) == 1:
                assert out.logp[i, k].item() == 0.0 == ref.logp[i, k].item()
    # only the scored token returned (k = 0): rows that branch cannot be renormalised -> unresolved
    plps0 = [vllm_shaped_prompt_logprobs(model, p + r, 0) for p, r in zip(prompts, responses)]
    _, unresolved = scored_from_prompt_logprobs(plps0, prompts, responses, allowed)
    branching = [i for i, a in enumerate(allowed) if any(len(t) > 1 for t in a)]
    assert unresolved == branching and branching


@pytest.mark.parametrize("topk", [0, 2, 10_000])
def test_vllm_teacher_scores_equal_the_training_side_with_per_row_fallback(policy, turns, topk):
    prompts, responses, allowed = turns
    model = policy.model.eval()
    pad = policy.tokenizer.pad_token_id
    rows_allowed = [allowed[0], None, allowed[2], allowed[3]]  # a mix of constrained and free turns
    ref = response_logprobs(model, prompts, responses, pad_id=pad, allowed=rows_allowed)
    engine = PromptLogprobEngine(model)
    out, fell_back = vllm_response_logprobs(engine, model, prompts, responses, pad_id=pad, allowed=rows_allowed,
                                            topk=topk)
    torch.testing.assert_close(out.logp, ref.logp, rtol=0, atol=1e-5)
    assert torch.equal(out.mask, ref.mask)
    assert engine.asked == [topk, 0, topk, topk]  # free turns ask for the scored token alone
    if topk == 10_000:
        assert fell_back == 0
    if topk == 0:
        assert fell_back == sum(any(len(t) > 1 for t in a) for a in rows_allowed if a is not None)


def test_misaligned_prompt_logprobs_are_an_error(policy, turns):
    prompts, responses, _ = turns
    plps = [vllm_shaped_prompt_logprobs(policy.model, p, 0) for p in prompts]  # prompt only, response missing
    with pytest.raises(ValueError, match="prompt log-probs cover"):
        scored_from_prompt_logprobs(plps, prompts, responses)
