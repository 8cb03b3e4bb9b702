"""sdar.models.precision: a bfloat16 model's mixed precision on a CPU (the LoRA adapter's matmuls in bfloat16 under
autocast, its float32 weights and gradients kept; transformers' eager attention for small grad forwards, float32
scores for small no-grad ones), against the same policy with the contexts switched off; float32 models untouched;
every switch restored after each forward."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from peft.tuners.lora import LoraLayer

from sdar.models import ModelSpec, load_policy, token_logprobs
from sdar.models import precision
from sdar.models.kv_cache import cache_of, with_cache

TEXTS = [
    "<think>the mug is on the countertop</think><action>go to countertop 1</action>",
    "Your task is to: put a clean apple in fridge.",
    "go",  # mostly left padding: its padded query rows attend to nothing
]


@pytest.fixture(scope="module")
def batch(tokenizer):
    tokenizer.padding_side = "left"
    enc = tokenizer(TEXTS, return_tensors="pt", padding=True)
    assert enc["attention_mask"][2].sum() < enc["attention_mask"].shape[1] // 3
    return enc["input_ids"], enc["attention_mask"]


def policy(tok_dir, dtype: str):
    """A tiny LoRA policy whose adapter is not zero (B is zero at init: the adapter would add nothing to compare)."""
    pol = load_policy(ModelSpec(f"tiny:{tok_dir}", dtype=dtype, cpu_mixed_precision=True))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in pol.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    pol.model.train()
    return pol


def sdpa_calls(monkeypatch) -> list[int]:
    """The calls to PyTorch's sdpa kernels from here on, one entry each."""
    calls: list[int] = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def attention_layer(groups: int) -> torch.nn.Module:
    """What an attention function reads of its layer: `groups` query heads per key/value head, causal, eval mode."""
    layer = torch.nn.Module().eval()
    layer.num_key_value_groups, layer.is_causal = groups, True
    return layer


def off(monkeypatch):
    monkeypatch.setattr(precision, "contexts", lambda *a, **k: contextlib.ExitStack())


def logp_and_grads(pol, batch):
    pol.model.zero_grad(set_to_none=True)
    logp = token_logprobs(pol.model, *batch)[0]
    mask = batch[1][:, 1:].to(logp.dtype)  # log p of each real token after the first
    (logp * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in pol.model.named_parameters() if p.requires_grad}
    return logp.detach(), mask, grads


def seen_in_lora_layers(pol) -> list[tuple[bool, torch.dtype]]:
    """(autocast on, input dtype) at each LoRA adapter's first matmul (lora_A), recorded by hooks."""
    seen: list[tuple[bool, torch.dtype]] = []
    for m in pol.model.modules():
        if isinstance(m, LoraLayer):
            for a in m.lora_A.values():
                a.register_forward_pre_hook(lambda mod, args: seen.append((torch.is_autocast_enabled("cpu"), args[0].dtype)))
    return seen


def test_a_float32_model_runs_exactly_as_without_the_contexts(tok_dir, batch, monkeypatch):
    pol = policy(tok_dir, "float32")
    seen = seen_in_lora_layers(pol)
    logp, _, grads = logp_and_grads(pol, batch)
    assert seen and all(not autocast and dtype == torch.float32 for autocast, dtype in seen)
    off(monkeypatch)
    logp_off, _, grads_off = logp_and_grads(pol, batch)
    assert torch.equal(logp, logp_off)
    assert all(torch.equal(grads[n], grads_off[n]) for n in grads)


def test_on_by_default_and_false_runs_a_bfloat16_model_as_peft_runs_it(tok_dir, batch):
    """model.cpu_mixed_precision is on unless switched off (ModelSpec and the config agree; records made before the
    field existed read as off): by default autocast reaches the adapter on its bfloat16 input; switched off, the
    adapter's input is cast to float32 (peft's own path) without autocast; on again, the forward is the first's to
    the bit."""
    from sdar.config import ADDED_DEFAULTS, TrainConfig

    assert TrainConfig().model.cpu_mixed_precision is True and ADDED_DEFAULTS["model.cpu_mixed_precision"] is False
    pol = load_policy(ModelSpec(f"tiny:{tok_dir}", dtype="bfloat16"))
    pol.model.train()
    seen = seen_in_lora_layers(pol)
    logp, _, _ = logp_and_grads(pol, batch)
    assert seen and all(autocast and dtype == torch.bfloat16 for autocast, dtype in seen)
    precision.install(pol.model, enabled=False)
    seen.clear()
    logp_off, _, _ = logp_and_grads(pol, batch)
    assert seen and all(not autocast and dtype == torch.float32 for autocast, dtype in seen)
    assert not torch.equal(logp, logp_off)
    precision.install(pol.model, enabled=True)
    again, _, _ = logp_and_grads(pol, batch)
    assert torch.equal(logp, again)


def test_bfloat16_runs_the_adapter_in_bfloat16_and_keeps_float32_weights_and_gradients(tok_dir, batch, monkeypatch):
    pol = policy(tok_dir, "bfloat16")
    lora = {n: p for n, p in pol.model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n and p.dtype == torch.float32 for n, p in lora.items())
    seen = seen_in_lora_layers(pol)
    logp, mask, grads = logp_and_grads(pol, batch)
    # every adapted layer ran under autocast on its bfloat16 input (peft's cast to float32 switched off)
    assert seen and all(autocast and dtype == torch.bfloat16 for autocast, dtype in seen)
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads.values())
    del seen[:]
    off(monkeypatch)  # peft's own float32 adapter path and the flash kernel
    logp_off, _, grads_off = logp_and_grads(pol, batch)
    assert all(not autocast and dtype == torch.float32 for autocast, dtype in seen)
    real = mask.bool()
    assert torch.isfinite(logp[real]).all()
    # the same numbers up to bfloat16 rounding of the adapter's path: log-probs within 0.05 nats, gradients aligned
    assert (logp - logp_off)[real].abs().max() < 5e-2
    flat, flat_off = (torch.cat([g[n].flatten() for n in sorted(g)]) for g in (grads, grads_off))
    assert torch.nn.functional.cosine_similarity(flat, flat_off, dim=0) > 0.999
    assert (flat - flat_off).norm() / flat_off.norm() < 0.05


def test_a_forward_takes_sdars_attention_only_while_its_matrix_is_small(tok_dir):
    pol = policy(tok_dir, "bfloat16")
    (decoder,) = precision.decoders(pol.model)
    config = decoder.config
    assert config._attn_implementation == "sdpa"
    heads = config.num_attention_heads
    small = torch.zeros(4, 32, dtype=torch.long)
    side = int((precision.EAGER_ATTENTION_ELEMENTS / heads) ** 0.5) + 1  # one row whose matrix is just over the limit
    large = torch.zeros(1, side, dtype=torch.long)
    flash = torch.backends.cuda.flash_sdp_enabled  # the global switch sdpa_kernel sets, whatever the device
    assert flash()
    with precision.contexts(decoder, small):
        assert torch.is_autocast_enabled("cpu") and config._attn_implementation == "eager" and flash()
    with precision.contexts(decoder, small, 0, torch.ones(4, 32)):  # the padding mask transformers expands itself
        assert config._attn_implementation == "eager"
    with precision.contexts(decoder, small, 0, torch.ones(4, 1, 32, 32, dtype=torch.bool)):  # a mask built for sdpa
        assert config._attn_implementation == "sdpa" and not flash()  # the math kernel reads that form
    with precision.contexts(decoder, large):
        assert torch.is_autocast_enabled("cpu") and config._attn_implementation == "sdpa" and flash()
    with precision.contexts(decoder, torch.zeros(1, side // 2, dtype=torch.long), past=2 * side):  # cached keys count
        assert config._attn_implementation == "sdpa" and flash()
    no_grad = precision.NO_GRAD_ATTENTION
    with torch.no_grad():
        with precision.contexts(decoder, small):
            assert torch.is_autocast_enabled("cpu") and config._attn_implementation == no_grad and flash()
        with precision.contexts(decoder, small, 0, torch.ones(4, 32)):
            assert config._attn_implementation == no_grad
        with precision.contexts(decoder, small, 0, torch.ones(4, 1, 32, 32, dtype=torch.bool)):
            assert config._attn_implementation == "sdpa" and flash()  # a mask built for sdpa: its own kernels
        with precision.contexts(decoder, large):
            assert config._attn_implementation == "sdpa" and flash()
    assert not torch.is_autocast_enabled("cpu") and config._attn_implementation == "sdpa" and flash()
    config._attn_implementation = "eager"  # a user's own choice is kept, and restored as it was
    with precision.contexts(decoder, small):
        assert config._attn_implementation == "eager" and flash()
    with torch.no_grad(), precision.contexts(decoder, small):
        assert config._attn_implementation == "eager"
    assert config._attn_implementation == "eager"


def test_the_eager_attention_is_what_a_grad_forward_runs_and_reads_the_padding(tok_dir, batch, monkeypatch):
    """A real forward with gradients calls no sdpa kernel, one without over the size limit calls it in every layer;
    the eager forward's log-probs are the sdpa forward's up to bfloat16 rounding, the left-padded row's included."""
    pol = policy(tok_dir, "bfloat16")
    calls = sdpa_calls(monkeypatch)
    logp = token_logprobs(pol.model, *batch)[0]
    assert logp.requires_grad and calls == []
    monkeypatch.setattr(precision, "EAGER_ATTENTION_ELEMENTS", 0)  # every forward over the limit: flash
    with torch.no_grad():
        logp_sdpa = token_logprobs(pol.model, *batch)[0]
    assert len(calls) == pol.model.config.num_hidden_layers
    real_tokens = batch[1][:, 1:].bool()
    assert (logp.detach() - logp_sdpa)[real_tokens].abs().max() < 5e-2
    assert (logp.detach() - logp_sdpa)[real_tokens].abs().max() > 0  # two ways of rounding, not one path twice


@pytest.mark.parametrize("past", [0, 37])
def test_the_no_grad_attention_computes_what_the_flash_kernel_computes(past):
    """A no-grad forward's attention, on grouped query heads (3 per key/value head, as SmolLM2's) with an attention
    sink (every query's largest weight on the first key, as trained models put it), a left-padded row whose first
    queries attend to nothing, after `past` cached keys: as close to float32's attention on the same bfloat16 values
    as the CPU flash kernel, on average and at the largest, finite where every key is masked, and not the kernel's
    own output (its own computation)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    gen = torch.Generator().manual_seed(0)
    rows, queries, keys = 3, 48, 48 + past
    q, k, v = (torch.randn(rows, heads, n, 64, generator=gen) for heads, n in ((9, queries), (3, keys), (3, keys)))
    q[..., 0], k[:, :, 0, 0] = 6.0, 6.0  # the sink
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    mask = torch.ones(queries, keys, dtype=torch.bool).tril(past)[None, None].repeat(rows, 1, 1, 1)
    mask[0, :, :, : past + 5] = False  # row 0: 5 left pads after its cache (none before: its queries see nothing)
    layer = attention_layer(3)
    with torch.no_grad():
        ours, weights = precision.no_grad_attention(layer, q, k, v, mask, scaling=0.125)
        flash, _ = sdpa_attention_forward(layer, q, k, v, mask, scaling=0.125)
        exact, _ = sdpa_attention_forward(layer, q.float(), k.float(), v.float(), mask, scaling=0.125)
    assert weights is None and ours.dtype == torch.bfloat16 and torch.isfinite(ours).all()
    seen = mask[:, 0].any(-1)  # [rows, queries]: the query rows with a key to attend to
    err, err_flash = ((x.float() - exact)[seen].abs() for x in (ours, flash))
    assert err.mean() <= 1.05 * err_flash.mean() and err.max() <= 1.05 * err_flash.max()
    assert not torch.equal(ours, flash)
    with torch.no_grad():  # no mask (nothing padded): the plain causal one after the cache
        ours, _ = precision.no_grad_attention(layer, q, k, v, None, scaling=0.125)
        exact, _ = sdpa_attention_forward(layer, q.float(), k.float(), v.float(), mask[1:2], scaling=0.125)
    assert (ours.float() - exact).abs().max() <= 1.05 * err_flash.max()


def test_the_no_grad_forward_runs_sdars_attention_within_bfloat16_rounding_of_flash(tok_dir, batch, monkeypatch):
    """A real no-grad forward calls no sdpa kernel, and its log-probs are the flash kernel's (the same forward over
    the size limit) up to bfloat16 rounding, the left-padded row's included."""
    pol = policy(tok_dir, "bfloat16")
    calls = sdpa_calls(monkeypatch)
    with torch.no_grad():
        logp = token_logprobs(pol.model, *batch)[0]
        assert calls == []
        monkeypatch.setattr(precision, "EAGER_ATTENTION_ELEMENTS", 0)  # every forward over the limit: flash
        logp_sdpa = token_logprobs(pol.model, *batch)[0]
    assert len(calls) == pol.model.config.num_hidden_layers
    real_tokens = batch[1][:, 1:].bool()
    assert (logp - logp_sdpa)[real_tokens].abs().max() < 5e-2
    assert (logp - logp_sdpa)[real_tokens].abs().max() > 0  # two ways of rounding, not one path twice


def test_every_switch_is_restored_after_a_forward_and_after_one_that_fails(tok_dir, batch):
    pol = policy(tok_dir, "bfloat16")
    layers = [m for m in pol.model.modules() if isinstance(m, LoraLayer)]

    def restored():
        return (not torch.is_autocast_enabled("cpu") and torch.backends.cuda.flash_sdp_enabled()
                and pol.model.config._attn_implementation == "sdpa"
                and all(m.cast_input_dtype_enabled for m in layers))

    logp_and_grads(pol, batch)
    assert restored()
    with pytest.raises(IndexError):
        pol.model(input_ids=torch.full((1, 4), 10**6))  # an id past the vocabulary fails inside the decoder
    assert restored()
    (decoder,) = precision.decoders(pol.model)
    assert getattr(decoder, "_sdar_precision_contexts") == []


def test_a_deep_copy_runs_its_own_weights_under_the_same_precision(tok_dir, batch):
    pol = policy(tok_dir, "bfloat16")
    twin = copy.deepcopy(pol.model)
    with torch.no_grad():
        for name, p in twin.named_parameters():
            if "lora_B" in name:
                p.mul_(2.0)
    seen = seen_in_lora_layers(pol)  # the original's hooks: the copy's forward must not run the original
    with torch.no_grad():
        a = token_logprobs(pol.model, *batch)[0]
        del seen[:]
        b = token_logprobs(twin, *batch)[0]
    assert not seen
    assert not torch.equal(a, b)
    (decoder,) = precision.decoders(twin)
    assert getattr(decoder, "_sdar_precision_contexts") == []


def test_a_forward_after_cached_keys_counts_them(tok_dir, monkeypatch):
    """The hook reads the cache the decoder is called with (a prefix's keys and values reused by every row)."""
    pol = policy(tok_dir, "bfloat16")
    calls = []
    real = precision.contexts
    monkeypatch.setattr(precision, "contexts", lambda dec, tokens, past=0, mask=None: calls.append((tuple(tokens.shape), past))
                        or real(dec, tokens, past, mask))
    ids = torch.randint(5, 100, (1, 7))
    with torch.no_grad():
        cache = cache_of(pol.model(input_ids=ids, use_cache=True))
    pol.model(input_ids=torch.randint(5, 100, (1, 3)), **with_cache(cache), use_cache=True)
    assert calls == [((1, 7), 0), ((1, 3), 7)]


def test_activation_checkpointing_recomputes_under_the_same_precision(tok_dir, batch, monkeypatch):
    """Checkpointing recomputes each layer in the backward, outside the forward's hooks (torch restores autocast
    there, not the attention kernel or peft's switch, so a checkpointing decoder keeps the flash kernel): it runs, and
    its numbers match a run without checkpointing up to the two kernels' bfloat16 rounding."""
    pol = policy(tok_dir, "bfloat16")
    ckpt = load_policy(ModelSpec(f"tiny:{tok_dir}", dtype="bfloat16", gradient_checkpointing=True,
                                 cpu_mixed_precision=True))
    ckpt.model.load_state_dict(pol.model.state_dict())
    ckpt.model.train()
    logp, _, grads = logp_and_grads(pol, batch)
    logp_c, _, grads_c = logp_and_grads(ckpt, batch)
    real = batch[1][:, 1:].bool()
    assert (logp - logp_c)[real].abs().max() < 5e-2
    flat, flat_c = (torch.cat([g[n].flatten() for n in sorted(g)]) for g in (grads, grads_c))
    assert torch.isfinite(flat_c).all()
    assert (flat - flat_c).norm() / flat.norm() < 0.05


def test_the_no_grad_attention_is_flash_where_torch_cannot_run_its_matmuls_at_the_bfloat16_rate(monkeypatch):
    """Before torch 2.9 (no `torch.backends.mkldnn.matmul.fp32_precision`) a no-grad forward keeps sdpa's kernel."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v = (torch.randn(1, h, 8, 16).bfloat16() for h in (4, 2, 2))
    monkeypatch.setattr(precision, "_mkldnn_matmul", lambda: None)
    with torch.no_grad():
        ours, _ = precision.no_grad_attention(attention_layer(2), q, k, v, None, scaling=0.25)
        flash, _ = sdpa_attention_forward(attention_layer(2), q, k, v, None, scaling=0.25, is_causal=True)
    assert torch.equal(ours, flash)


def test_the_no_grad_attention_leaves_the_process_wide_setting_to_the_main_thread():
    """oneDNN's fp32_precision is process-wide: off the main thread (a teacher pool's server thread) the attention is
    sdpa's, bit for bit, and the setting is never changed there; on the main thread it is restored after."""
    import threading

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v = (torch.randn(1, h, 8, 16).bfloat16() for h in (4, 2, 2))
    setting = torch.backends.mkldnn.matmul.fp32_precision
    out = {}

    def run():
        with torch.no_grad():
            out["thread"] = precision.no_grad_attention(attention_layer(2), q, k, v, None, scaling=0.25)[0]

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    with torch.no_grad():
        flash, _ = sdpa_attention_forward(attention_layer(2), q, k, v, None, scaling=0.25, is_causal=True)
        main, _ = precision.no_grad_attention(attention_layer(2), q, k, v, None, scaling=0.25)
    assert torch.equal(out["thread"], flash) and not torch.equal(main, flash)
    assert torch.backends.mkldnn.matmul.fp32_precision == setting


def test_the_no_grad_attention_leaves_a_float_mask_to_sdpa():
    """A mask other than sdpa's boolean one (an additive float mask passed by a caller) runs sdpa's own kernel."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v = (torch.randn(1, h, 8, 16).bfloat16() for h in (4, 2, 2))
    additive = torch.zeros(1, 1, 8, 8, dtype=torch.bfloat16).masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(),
                                                                         float("-inf"))
    with torch.no_grad():
        ours, _ = precision.no_grad_attention(attention_layer(2), q, k, v, additive, scaling=0.25)
        flash, _ = sdpa_attention_forward(attention_layer(2), q, k, v, additive, scaling=0.25)
    assert torch.equal(ours, flash)
