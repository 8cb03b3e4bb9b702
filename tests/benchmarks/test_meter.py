"""benchmarks/_shared.py's ForwardMeter counts what a decoder really forwards: every module object of the decoder's
class (a copy included), positions and the real tokens the attention mask marks, forwards on a KV cache, each in
the phase that ran it."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
try:
    from _shared import QWEN25_SHAPES, ForwardMeter
finally:
    sys.path.pop(0)


def tiny_qwen():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1)).eval()


def test_forwards_positions_padding_and_decode_steps_per_phase():
    from sdar.models.kv_cache import cache_of, with_cache

    model = tiny_qwen()
    other = copy.deepcopy(model)  # what the trainer's merged or reference copies are: another object, same class
    ids = torch.randint(0, 50, (2, 5))
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])  # left padding: 3 of 10 positions
    with ForwardMeter.of(model) as meter, torch.no_grad():
        with meter.phase("rollout"):
            out = model(input_ids=ids, attention_mask=mask, use_cache=True)
            step_mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
            model(input_ids=out.logits[:, -1:].argmax(-1), attention_mask=step_mask,
                  **with_cache(cache_of(out)), use_cache=True)
        with meter.phase("score"):
            other(input_ids=ids, attention_mask=torch.ones_like(ids))
        model(input_ids=ids)  # outside any phase
    rollout, score = meter.figures["rollout"], meter.figures["score"]
    assert (rollout.forwards, rollout.positions, rollout.real, rollout.decode_steps) == (2, 12, 9, 1)
    assert rollout.padding == 1 - 9 / 12 and rollout.tokens_per_forward == 6
    assert (score.forwards, score.positions, score.real, score.decode_steps) == (1, 10, 10, 0)
    assert meter.figures["other"].forwards == 1
    assert 0 < rollout.model_s <= rollout.seconds and rollout.host_s >= 0
    # the hooks are gone after the meter
    model(input_ids=ids)
    assert meter.figures["other"].forwards == 1


def test_published_shapes_are_written_out_whole():
    for shape, fields in QWEN25_SHAPES.items():
        assert fields["vocab_size"] == 151936 and fields["tie_word_embeddings"], shape
        assert fields["hidden_size"] % fields["num_attention_heads"] == 0
    assert (QWEN25_SHAPES["qwen2.5-0.5b"]["hidden_size"], QWEN25_SHAPES["qwen2.5-0.5b"]["num_hidden_layers"]) == (896, 24)
    assert (QWEN25_SHAPES["qwen2.5-1.5b"]["hidden_size"], QWEN25_SHAPES["qwen2.5-1.5b"]["num_hidden_layers"]) == (1536, 28)
