"""Mixed precision for a bfloat16 model on a CPU: how its decoder's forwards run, decided per forward.

On unless switched off (`model.cpu_mixed_precision: false`, `ModelSpec.cpu_mixed_precision`, both default true).
On the same trajectories (benchmarks/bench_precision.py, SmolLM2) its update is the closer to float32's of the two
bfloat16 paths in each batch measured: on one it changes the policy within a cosine of 0.9994 of float32's update,
where plain bfloat16 (peft's own path) reads 0.854; on another, with a policy gradient, neither keeps float32's (0.68
against 0.66). The attention kernel of the grad forwards decides the first: with the CPU flash kernel in bfloat16 the first mini-batch's gradient has 0.12x float32's
norm and a cosine of 0.64 with it, with the math kernel 0.998 (autocast alone changes neither). On a plain
log-likelihood both kernels' gradients are within a cosine of 0.9996 of float32's; an RL loss's per-token gradients
nearly cancel (advantages sum to zero within a group), and its small sum is what bfloat16's rounding must keep.
bfloat16's own view of an update (the loss terms and statistics the update's forwards read) is rounded further:
docs/training.md, "Does bfloat16 keep what SDAR reads?".

A model loaded in bfloat16 (`model.dtype: bfloat16`) keeps its LoRA adapter, and so its gradients and AdamW state, in
float32 (peft's `autocast_adapter_dtype`). Left alone, every adapted layer then casts its bfloat16 input to float32
and runs the adapter's two matmuls in float32, and on this CPU (avx512_bf16) that is a third of the update's time.
Inside the decoder's forward `torch.autocast` runs those matmuls in bfloat16 on bfloat16 copies of the float32
weights, the way mixed-precision LoRA training does (accelerate's `prepare_model` wraps the forward in the same
autocast), and peft's own switch (`peft.helpers.disable_input_dtype_casting`) leaves each layer's input in bfloat16
rather than casting it to float32 for autocast to cast back; the gradients still land on the float32 adapter. Nothing else in the decoder changes dtype: the base
weights are bfloat16 already, and the norms, the rotary embedding and the softmax keep their own float32 casts.

With gradients on, the attention is transformers' eager attention (`eager_attention`: the model's
`_attn_implementation` for that forward): the scores a bfloat16 matmul, their softmax in float32, the probabilities
bfloat16, as Hugging Face models compute it in bfloat16 without a fused kernel. Until 2026-12-01 it was PyTorch's
math kernel, which on a CPU casts a bfloat16 attention to float32 whole: its batched matmuls ran at the float32 rate
(2.6 s of issue 46's 13 s update against 0.8 s now). On the same trajectories (benchmarks/bench_precision.py,
SmolLM2's warm start, 2 tasks x 2 rollouts) the eager update is the closer to float32's in both batches measured:
arm sdar seed 0, its change of the policy's log-probs at a cosine of 0.9995 with float32's (the math kernel 0.9976)
and of the adapter's weights 0.990 (0.975); arm grpo seed 1, 0.768 (0.550) and 0.856 (0.809). The CPU flash kernel's
bfloat16 backward is both slower and further off (a first mini-batch's gradient at a cosine of 0.64 with float32's).
Eager attention holds the attention matrix for the backward, so it is taken only while that matrix stays small
(`EAGER_ATTENTION_ELEMENTS` per layer) and the mask is the one transformers builds (2-D or none; a packed row's
tree mask, built for the sdpa kernels, takes the math kernel); longer forwards keep the flash kernel.

No-grad forwards (sampling, scoring, the merged inference module's and the plain reference's too) take
`no_grad_attention` under the same conditions, on the main thread (oneDNN's setting it changes is process-wide) and
with torch 2.9 or later: what the CPU flash kernel computes (float32 scores, exact products of
the bfloat16 values; their softmax in float32; the weights rounded to bfloat16 unnormalised, the largest exactly 1;
a float32 sum; normalised and rounded once), as two matmuls that oneDNN runs at the bfloat16 rate, where the flash
kernel runs its bfloat16 blocks at about 120 GFLOP/s on this CPU (no AMX). On issue 46's step (SmolLM2 untrained,
2 tasks x 2 rollouts, the same batch, five rounds in turn in one process) the score phase took 7.33 s against 7.95
(median); on that batch the teacher's and the reference's log-probs are as far from float32's as flash's (over the
53 free tokens: the teacher a mean 0.025 nats against 0.023, the largest 0.117 against 0.123; the reference 0.020
against 0.026, 0.091 against 0.091). Eager's bfloat16 scores were tried there and dropped: single tokens' old
log-probs moved further from float32's (0.17 nats at the largest against flash's 0.06), and those are what the gate
and the ratio read. Under activation
checkpointing only autocast applies (the recomputation in the backward must match the forward, and torch restores
autocast alone there).

float32 models, and any model on another device, run exactly as before (CUDA's choices are its own kernels'; this
is measured on the CPU only: benchmarks/bench_train_step.py --model smollm2, docs/benchmarks.md)."""

from __future__ import annotations

import contextlib
import functools
import threading

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from sdar.models.kv_cache import CACHE_KEY

# the largest attention matrix (rows x heads x queries x keys) a grad forward computes in eager form: 16M elements,
# about 96 MB a layer held for the backward (the softmax's float32 output and the bfloat16 probabilities; SmolLM2's
# update: 4.4M)
EAGER_ATTENTION_ELEMENTS = 16 * 2**20

_HOOKED = "_sdar_precision_contexts"


def install(model: torch.nn.Module, enabled: bool = True) -> torch.nn.Module:
    """Run every forward of `model`'s decoder stacks under `contexts` (hooks on the decoders themselves, so each
    way of calling them, the whole model or its decoder alone, copies made by deepcopy, gets them); `enabled`
    False leaves every forward as peft runs it (`model.cpu_mixed_precision: false`). Idempotent."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in decoders(model):
        module._sdar_precision = enabled
        if hasattr(module, _HOOKED):
            continue
        setattr(module, _HOOKED, [])
        module._sdar_adapted = any(isinstance(m, BaseTunerLayer) for m in module.modules())
        module.register_forward_pre_hook(_enter, with_kwargs=True)
        module.register_forward_hook(_leave, with_kwargs=True, always_call=True)
    return model


def decoders(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder stacks inside `model`: transformers modules with a list of layers and token embeddings."""
    from transformers import PreTrainedModel

    return [m for m in model.modules() if isinstance(m, PreTrainedModel)
            and isinstance(getattr(m, "layers", None), torch.nn.ModuleList) and hasattr(m, "embed_tokens")]


def contexts(decoder: torch.nn.Module, tokens: torch.Tensor | None, past: int = 0,
             mask: torch.Tensor | None = None) -> contextlib.ExitStack:
    """The contexts one forward of `decoder` over `tokens` ([rows, queries] ids or [rows, queries, width] embeddings,
    after `past` cached positions, with the attention `mask` it is given) runs under: none unless the decoder is
    bfloat16 on a CPU and installed enabled."""
    stack = contextlib.ExitStack()
    if not getattr(decoder, "_sdar_precision", True):
        return stack
    weight = next(decoder.parameters(), None)
    if weight is None or weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
        return stack
    stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
    if getattr(decoder, "gradient_checkpointing", False) and decoder.training:
        # activation checkpointing recomputes each layer in the backward, outside this forward: torch restores
        # autocast there, not a kernel choice or peft's switch, and a recomputation must match its forward
        return stack
    if getattr(decoder, "_sdar_adapted", False):
        from peft.helpers import disable_input_dtype_casting

        stack.enter_context(disable_input_dtype_casting(decoder))
    if tokens is not None:
        rows, queries = tokens.shape[0], tokens.shape[1]
        heads = int(getattr(decoder.config, "num_attention_heads", 1))
        small = rows * heads * queries * (queries + past) <= EAGER_ATTENTION_ELEMENTS
        built = mask is None or mask.dim() == 2  # transformers builds the mask for the attention that runs
        if torch.is_grad_enabled() and small:
            if built:
                stack.enter_context(eager_attention(decoder.config))
            else:  # a mask built for the sdpa kernels (a packed row's tree): math, which reads the same form
                stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
        elif small and built:
            stack.enter_context(_attention(decoder.config, NO_GRAD_ATTENTION))
    return stack


# the no-grad forwards' attention, registered with transformers (`_register`) with sdpa's boolean masks
NO_GRAD_ATTENTION = "sdar_cpu_no_grad"


def eager_attention(config):
    """transformers' eager attention for the forwards inside: the scores a bfloat16 matmul, their softmax in float32,
    the probabilities bfloat16."""
    return _attention(config, "eager")


@contextlib.contextmanager
def _attention(config, name: str):
    """Attention implementation `name` for the forwards inside (the config's `_attn_implementation`, which the
    decoder reads at each forward, for its mask and its layers' attention). Left alone unless the model runs sdpa
    (a user's choice of another implementation is kept)."""
    before = getattr(config, "_attn_implementation", None)
    if before != "sdpa":
        yield
        return
    if name == NO_GRAD_ATTENTION:
        _register()
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


def _causal(attention_mask, queries: int, keys: int, device) -> torch.Tensor:
    """The boolean mask [rows or 1, 1, queries, keys] (True: attend) of a forward: transformers' own, or the plain
    causal one it leaves out when nothing is padded (the queries are the last `queries` of the keys)."""
    if attention_mask is not None:
        return attention_mask
    return torch.ones(queries, keys, dtype=torch.bool, device=device).tril(keys - queries)[None, None]


def _unsupported(attention_mask, kwargs) -> bool:
    """Whether a layer asks for what `no_grad_attention` does not compute (a mask other than sdpa's boolean one, a
    sliding window, soft-capping, attention sinks): it then runs transformers' sdpa."""
    return (attention_mask is not None and attention_mask.dtype != torch.bool) or \
        any(kwargs.get(k) is not None for k in ("sliding_window", "softcap", "s_aux"))


def no_grad_attention(module, query, key, value, attention_mask, scaling=None, dropout: float = 0.0, **kwargs):
    """A no-grad forward's attention for bfloat16 queries, keys and values, per key/value head, computed as the CPU
    flash kernel computes it: the scores in float32 (exact products of the bfloat16 values), their softmax in float32,
    the weights rounded to bfloat16 as exp(score - the row's largest), so that the largest is exactly 1, against the
    values with a float32 sum, then normalised and rounded once. oneDNN runs both float32 matmuls at the bfloat16
    rate (`torch.backends.mkldnn.matmul.fp32_precision`: their inputs rounded to bfloat16, which the scores' inputs
    already are), where the flash kernel runs its blocks at about a sixth of that rate on this CPU (no AMX)."""
    mkldnn = _mkldnn_matmul()
    # oneDNN's setting is process-wide: set and restored on the main thread only (no two sections interleave; a
    # teacher pool's server threads keep sdpa). A float32 matmul another thread runs inside a section takes it too
    if (_unsupported(attention_mask, kwargs) or dropout or query.dtype != torch.bfloat16 or mkldnn is None
            or threading.current_thread() is not threading.main_thread()):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    b, h, q, d = query.shape
    kv_heads, k = key.shape[1], key.shape[2]
    g = h // kv_heads
    scaling = d ** -0.5 if scaling is None else scaling
    before = mkldnn.fp32_precision
    mkldnn.fp32_precision = "bf16"
    try:
        with torch.autocast("cpu", enabled=False):  # autocast would run these matmuls in bfloat16
            s = torch.matmul(query.reshape(b, kv_heads, g * q, d).float(), key.float().transpose(2, 3))
            s = s.view(b, kv_heads, g, q, k).mul_(scaling)
            # the lowest float32, not -inf: a query row with nothing to attend to (left padding) stays finite
            s.masked_fill_(~_causal(attention_mask, q, k, query.device)[:, :, None], torch.finfo(torch.float32).min)
            p = torch.softmax(s, dim=-1)
            top = p.amax(dim=-1, keepdim=True)  # 1 / the row's sum of exp(score - its largest)
            out = torch.matmul(p.div_(top).view(b, kv_heads, g * q, k), value.float())
            out = out.view(b, kv_heads, g, q, d).mul_(top)
    finally:
        mkldnn.fp32_precision = before
    return out.view(b, h, q, d).to(query.dtype).transpose(1, 2).contiguous(), None


def _mkldnn_matmul():
    """torch's oneDNN matmul settings, whose `fp32_precision` runs a float32 matmul at the bfloat16 rate (torch 2.9
    and later), or None."""
    matmul = getattr(torch.backends.mkldnn, "matmul", None)
    return matmul if hasattr(matmul, "fp32_precision") else None


@functools.cache
def _register() -> None:
    """`no_grad_attention` in transformers' attention and mask registries (once a process), with sdpa's boolean
    masks."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NO_GRAD_ATTENTION, no_grad_attention)
    AttentionMaskInterface.register(NO_GRAD_ATTENTION, sdpa_mask)


def _past_length(cache) -> int:
    if cache is None:
        return 0
    if hasattr(cache, "get_seq_length"):
        return int(cache.get_seq_length())
    return int(cache[0][0].shape[-2]) if len(cache) else 0  # legacy tuples


def _enter(module, args, kwargs):
    tokens = kwargs.get("input_ids")
    if tokens is None:
        tokens = kwargs.get("inputs_embeds")
    if tokens is None and args:
        tokens = args[0]
    mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
    getattr(module, _HOOKED).append(contexts(module, tokens, _past_length(kwargs.get(CACHE_KEY)),
                                             mask if torch.is_tensor(mask) else None))


def _leave(module, args, kwargs, output):
    stack = getattr(module, _HOOKED)
    if stack:
        stack.pop().close()
