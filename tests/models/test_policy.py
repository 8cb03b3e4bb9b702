"""load_policy / Policy: LoRA and full fine-tuning, the frozen reference, checkpoints, dtypes and loading errors."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from sdar.models import (
    ModelSpec,
    Policy,
    TinyModelConfig,
    build_tiny_model,
    load_policy,
    token_logprobs,
)

TEXTS = [
    "<think>the mug is on the countertop</think><action>go to countertop 1</action>",
    "Your task is to: put a clean apple in fridge.",
]


@pytest.fixture(scope="module")
def batch(tokenizer):
    enc = tokenizer(TEXTS, return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


@pytest.fixture(scope="module")
def base_logp(tok_dir, batch):
    """Log-probs of the tiny model `tiny:<tok_dir>` builds (seed 0), computed without any Policy."""
    tok = AutoTokenizer.from_pretrained(tok_dir)
    model = build_tiny_model(tok, TinyModelConfig.from_yaml(tok_dir / "tiny-qwen2.yaml"), seed=0).eval()
    with torch.no_grad():
        return token_logprobs(model, *batch)[0]


def logp_of(model, batch, grad=False):
    with torch.set_grad_enabled(grad):
        return token_logprobs(model, *batch)[0]


def update(policy: Policy, batch, lr: float = 1e-2) -> None:
    """One AdamW step that raises the batch's log-likelihood."""
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=lr)
    policy.model.train()
    (-logp_of(policy.model, batch, grad=True).mean()).backward()
    opt.step()
    opt.zero_grad()
    policy.model.eval()


def lora_param_count(cfg: TinyModelConfig, r: int) -> int:
    h, i = cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    per_layer = (h + h) + 2 * (h + kv) + (h + h) + 2 * (h + i) + (i + h)  # q, k, v, o, gate, up, down
    return cfg.num_hidden_layers * r * per_layer


def test_a_spec_from_a_run_config_carries_every_setting_the_two_share():
    """ModelSpec.from_config: each field ModelConfig and ModelSpec share, set away from its default, reaches the spec
    (a field added to both needs no edit to its callers: the warm start's loader, the benchmarks)."""
    import dataclasses

    from sdar.config import ModelConfig

    shared = {f.name for f in dataclasses.fields(ModelConfig)} & {f.name for f in dataclasses.fields(ModelSpec)}
    assert {"dtype", "lora", "lora_r", "lora_alpha", "lora_dropout", "gradient_checkpointing",
            "cpu_mixed_precision"} <= shared
    cfg = ModelConfig(name_or_path="smollm2", dtype="bfloat16", lora=False, lora_r=4, lora_alpha=8, lora_dropout=0.1,
                      gradient_checkpointing=True, cpu_mixed_precision=False)
    spec = ModelSpec.from_config(cfg, "/warm/start")
    for name in shared - {"name_or_path"}:
        assert getattr(spec, name) == getattr(cfg, name) != getattr(ModelSpec("x"), name), name
    assert spec.name_or_path == "/warm/start"
    changed = ModelSpec.from_config(cfg, "x", dtype="float32", lora=True)
    assert (changed.dtype, changed.lora, changed.lora_r) == ("float32", True, 4)
    with pytest.raises(ValueError, match="lora_r must be >= 1"):  # the spec's own checks still run
        ModelSpec.from_config(cfg, "x", lora=True, lora_r=0)


def test_lora_trains_only_the_adapter(tok_dir, small_cfg, batch):
    policy = load_policy(ModelSpec(f"tiny:{tok_dir}"))
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert names and all("lora_A" in n or "lora_B" in n for n in names)
    counts = policy.parameter_counts()
    assert counts["trainable"] == lora_param_count(small_cfg, 16) == sum(p.numel() for p in policy.trainable_parameters())
    assert counts["total"] > counts["trainable"]
    frozen = {n: p.detach().clone() for n, p in policy.model.named_parameters() if not p.requires_grad}
    update(policy, batch)
    assert all(torch.equal(p, frozen[n]) for n, p in policy.model.named_parameters() if n in frozen)
    assert policy.max_length == small_cfg.max_position_embeddings


def test_lora_reference_is_the_base_before_and_after_an_update(tok_dir, batch, base_logp):
    policy = load_policy(ModelSpec(f"tiny:{tok_dir}"))
    # LoRA B starts at zero: the untrained policy is the base model
    torch.testing.assert_close(logp_of(policy.model, batch), base_logp, rtol=0, atol=1e-6)
    update(policy, batch)
    after = logp_of(policy.model, batch)
    mask = batch[1][:, 1:].bool()
    assert (after - base_logp)[mask].abs().max() > 1e-2
    assert after[mask].mean() > base_logp[mask].mean(), "the update raised the batch likelihood"
    policy.model.train()
    with policy.reference() as ref:
        assert ref is policy.model and not ref.training and not torch.is_grad_enabled()
        torch.testing.assert_close(logp_of(ref, batch), base_logp, rtol=0, atol=1e-6)
    # leaving the block restores the adapter and the train mode
    assert policy.model.training
    policy.model.eval()
    torch.testing.assert_close(logp_of(policy.model, batch), after, rtol=0, atol=1e-6)
    with pytest.raises(RuntimeError, match="boom"), policy.reference():
        raise RuntimeError("boom")
    torch.testing.assert_close(logp_of(policy.model, batch), after, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_plain_inference_is_the_merged_adapter_and_the_shared_base(tok_dir, batch, dtype):
    """Issue 14 (scoring.merged_inference): the no-grad module is a plain transformers model holding base + the adapter's
    delta, the same log-probs as the peft module, refreshed in place after every update and never rebuilt when
    nothing moved; the reference is the base weights themselves (shared tensors), bit-identical to the disabled
    adapter."""
    from peft import PeftModel

    policy = load_policy(ModelSpec(f"tiny:{tok_dir}", dtype=dtype))
    assert policy.inference_model() is policy.model  # off by default: the peft module itself
    with policy.reference() as ref:
        disabled = logp_of(ref, batch)
    policy.plain_inference = True
    tol = 1e-5 if dtype == "float32" else 2e-2
    mask = batch[1][:, 1:].bool()
    for k in range(2):  # after each update the same module holds the new merged weights
        update(policy, batch)
        merged = policy.inference_model()
        assert not isinstance(merged, PeftModel) and not any(p.requires_grad for p in merged.parameters())
        assert not any("lora" in n for n, _ in merged.named_parameters())
        if k == 0:
            first, q = merged, merged.get_submodule("model.layers.0.self_attn.q_proj").weight
            ptr = q.data_ptr()
        assert merged is first and q.data_ptr() == ptr  # refreshed in place, no new module per step
        want = logp_of(policy.model, batch)
        got = logp_of(merged, batch)
        assert (want - base_logp_of(policy, batch))[mask].abs().max() > 1e-2  # the adapter has moved
        torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=tol)
    before = q.clone()
    assert policy.inference_model() is first and torch.equal(q, before)  # nothing moved: nothing rebuilt
    with policy.reference() as ref:
        assert ref is not policy.model and not isinstance(ref, PeftModel)
        assert torch.equal(logp_of(ref, batch), disabled)  # the base, bit for bit
        emb = ref.get_input_embeddings().weight
        assert emb.data_ptr() == policy.model.get_base_model().get_input_embeddings().weight.data_ptr()


def base_logp_of(policy: Policy, batch):
    with policy.model.disable_adapter():
        return logp_of(policy.model, batch)


def test_plain_inference_without_lora_is_the_model_itself(tok_dir, batch):
    policy = load_policy(ModelSpec(f"tiny:{tok_dir}", lora=False))
    policy.plain_inference = True
    assert policy.inference_model() is policy.model


def test_full_finetuning_keeps_a_frozen_copy(tok_dir, batch, base_logp):
    policy = load_policy(ModelSpec(f"tiny:{tok_dir}", lora=False))
    counts = policy.parameter_counts()
    assert counts["trainable"] == counts["total"]
    update(policy, batch, lr=1e-3)
    after = logp_of(policy.model, batch)
    mask = batch[1][:, 1:].bool()
    assert (after - base_logp)[mask].abs().max() > 1e-2
    with policy.reference() as ref:
        assert ref is not policy.model
        assert not any(p.requires_grad for p in ref.parameters())
        torch.testing.assert_close(logp_of(ref, batch), base_logp, rtol=0, atol=1e-6)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_save_load_round_trip(tmp_path, tok_dir, batch, base_logp, lora):
    policy = load_policy(ModelSpec(f"tiny:{tok_dir}", lora=lora))
    update(policy, batch, lr=1e-2 if lora else 1e-3)
    trained = logp_of(policy.model, batch)
    out = policy.save(tmp_path / "ckpt")
    files = {p.name for p in out.iterdir()}
    assert {"tokenizer.json", "sdar_policy.json", "base"} <= files
    if lora:
        assert {"adapter_config.json", "adapter_model.safetensors"} <= files and "config.json" not in files
    else:
        assert {"config.json", "model.safetensors"} <= files
    meta = json.loads((out / "sdar_policy.json").read_text())
    assert meta["lora"] is lora and meta["base"] == "base"

    resumed = Policy.load(out)
    resumed.model.eval()
    torch.testing.assert_close(logp_of(resumed.model, batch), trained, rtol=0, atol=1e-6)
    with resumed.reference() as ref:
        # the reference stays the initial model, not the checkpoint's weights
        torch.testing.assert_close(logp_of(ref, batch), base_logp, rtol=0, atol=1e-6)
    assert resumed.parameter_counts() == policy.parameter_counts()
    # a resumed policy keeps training and checkpoints again on its own
    update(resumed, batch, lr=1e-3)
    again = Policy.load(resumed.save(tmp_path / "ckpt2"))
    again.model.eval()
    torch.testing.assert_close(logp_of(again.model, batch), logp_of(resumed.model, batch), rtol=0, atol=1e-6)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_a_lora_checkpoint_as_the_start_is_also_the_reference(tmp_path, tok_dir, batch, base_logp, lora, checkpointing):
    """Issue 12.4: starting from a LoRA checkpoint, KL pulls toward that checkpoint (merged), not
    toward the base it was trained from: at step 0 ref_logp == old_logp."""
    start = load_policy(ModelSpec(f"tiny:{tok_dir}", gradient_checkpointing=checkpointing))
    update(start, batch, lr=1e-2)
    trained = logp_of(start.model, batch)
    mask = batch[1][:, 1:].bool()
    assert (trained - base_logp)[mask].abs().max() > 1e-2
    out = start.save(tmp_path / "start")

    policy = load_policy(ModelSpec(str(out), lora=lora))
    policy.model.eval()
    old_logp = logp_of(policy.model, batch)
    with policy.reference() as ref:
        ref_logp = logp_of(ref, batch)
    torch.testing.assert_close(old_logp[mask], trained[mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(ref_logp[mask], old_logp[mask], rtol=0, atol=1e-6)
    assert (ref_logp - base_logp)[mask].abs().max() > 1e-2, "the reference is the start, not the old base"
    # the start's directory reloads the merged start: a checkpoint names it instead of copying the weights
    assert policy.is_lora is lora and policy.base_source == str(out)
    if lora:  # a fresh adapter: zero at the start, the only trainable tensors
        names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
        assert names and all("lora_" in n for n in names)
    # training moves the policy away; the reference stays at the start, also after save and load
    update(policy, batch, lr=1e-2 if lora else 1e-3)
    saved = policy.save(tmp_path / "next")
    assert not (saved / "base").exists()
    resumed = Policy.load(saved)
    with resumed.reference() as ref:
        torch.testing.assert_close(logp_of(ref, batch)[mask], trained[mask], rtol=0, atol=1e-5)


def test_local_checkpoint_loads_through_the_same_path(tmp_path, tokenizer, small_cfg, batch):
    model = build_tiny_model(tokenizer, small_cfg, seed=11).eval()
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    expected = logp_of(model, batch)
    for lora in (True, False):
        policy = load_policy(ModelSpec(str(tmp_path / "m"), lora=lora))
        policy.model.eval()
        torch.testing.assert_close(logp_of(policy.model, batch), expected, rtol=0, atol=1e-6)
        assert policy.tokenizer.chat_template == tokenizer.chat_template
        assert policy.base_source == str(tmp_path / "m")
    # a base that a path reloads is referenced, not copied
    out = load_policy(ModelSpec(str(tmp_path / "m"))).save(tmp_path / "ckpt")
    assert not (out / "base").exists()
    assert json.loads((out / "sdar_policy.json").read_text())["base"] == str(tmp_path / "m")


def test_bfloat16_is_close_to_float32(tok_dir, batch):
    fp32 = load_policy(ModelSpec(f"tiny:{tok_dir}"))
    bf16 = load_policy(ModelSpec(f"tiny:{tok_dir}", dtype="bfloat16"))
    assert next(bf16.model.get_base_model().parameters()).dtype == torch.bfloat16
    a, b = logp_of(fp32.model, batch), logp_of(bf16.model, batch)
    mask = batch[1][:, 1:].bool() & batch[1][:, :-1].bool()
    assert b.dtype == torch.float32
    diff = (a - b)[mask].abs()
    assert diff.mean() < 0.02 and diff.max() < 0.1
    update(bf16, batch)  # LoRA backward and step run in bf16
    assert (logp_of(bf16.model, batch) - b)[mask].abs().max() > 1e-2


def test_gradient_checkpointing_gives_the_same_gradients(tok_dir, batch):
    grads = []
    for ckpt in (False, True):
        policy = load_policy(ModelSpec(f"tiny:{tok_dir}", gradient_checkpointing=ckpt))
        policy.model.train()
        torch.manual_seed(0)
        for p in policy.trainable_parameters():  # non-zero B so every adapter gets gradient
            torch.nn.init.normal_(p, std=0.02)
        (-logp_of(policy.model, batch, grad=True).mean()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.trainable_parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-7)
    assert grads[0].abs().sum() > 0


def test_hub_id_without_network_fails_fast_and_clearly(monkeypatch):
    from sdar.models.policy import ModelUnavailable

    # "sdar-test-org/no-such-model" is in no local HF cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailable, match=r"not in the local Hugging Face cache \(/.+\) and HF_HUB_OFFLINE is set"):
        load_policy(ModelSpec("sdar-test-org/no-such-model"))
    # online mode, hub endpoint down: a closed loopback port stands in for "no network"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    t0 = time.perf_counter()
    with pytest.raises(ModelUnavailable, match=rf"127.0.0.1:{port} is unreachable .*pass that local directory"):
        load_policy(ModelSpec("sdar-test-org/no-such-model"))
    assert time.perf_counter() - t0 < 30, "no minute of retries against a dead network"


def test_loading_errors_are_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither an existing directory nor a hub id"):
        load_policy(ModelSpec(str(tmp_path / "missing" / "model")))
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_policy(ModelSpec(str(tmp_path)))
    with pytest.raises(FileNotFoundError, match="tokenizer directory .* does not exist"):
        load_policy(ModelSpec(f"tiny:{tmp_path / 'nope'}"))
    with pytest.raises(ValueError, match="unknown dtype 'fp16'; choose one of float32, bfloat16"):
        ModelSpec("smollm2", dtype="fp16")
    with pytest.raises(FileNotFoundError, match="not a checkpoint written by Policy.save"):
        Policy.load(tmp_path)
    with pytest.raises(ValueError, match=r"unknown model setting\(s\) \['lora_rank'\]"):
        ModelSpec.from_dict({"name_or_path": "smollm2", "lora_rank": 8})


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_command_on_a_model_that_is_not_here_ends_with_one_line_on_rank_0(rank, tmp_path):
    """`sdar train` on a hub id that is not cached, offline: exit 6 with one line saying where it looked and what to
    do, no traceback; under torchrun only rank 0 says it (each rank used to print a traceback)."""
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RANK": rank}
    proc = subprocess.run([sys.executable, "-m", "sdar.cli", "train", "--config", "configs/household-tiny.yaml",
                           "--output", str(tmp_path), "--set", "model.name_or_path=sdar-test-org/no-such-model",
                           "--set", "steps=1", "--set", "tracking=false"], cwd=Path(__file__).resolve().parents[2],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 6, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if "sdar-test-org/no-such-model" in ln]
    if rank == "0":
        assert len(lines) == 1 and lines[0].startswith("sdar train: hub model 'sdar-test-org/no-such-model' is not in "
                                                       "the local Hugging Face cache (")
        assert "pass that local directory" in lines[0]
    else:
        assert lines == []
