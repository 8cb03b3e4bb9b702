"""`sdar size` (sdar.sizing): parameter counts, bytes per role, fit verdicts, instances and cost, checked against
hand calculations written out below (GiB = 2**30 B)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sdar.sizing import (
    ARCHS,
    GiB,
    SizingError,
    SizingSettings,
    activation_bytes_per_layer,
    size_run,
    memory_budget,
    resolve_model,
    run_cost,
)

SDAR = str(Path(sys.executable).parent / "sdar")


def sdar(*args: str) -> subprocess.CompletedProcess:
    """Run the installed `sdar` console script; the exit status is checked by the test."""
    return subprocess.run([SDAR, *args], check=False, capture_output=True, text=True, timeout=120)


Q15, Q3, Q7 = ARCHS["qwen2.5-1.5b"], ARCHS["qwen2.5-3b"], ARCHS["qwen2.5-7b"]


def item(budget, role, name_start):
    found = [i for i in budget.items if i.role == role and i.name.startswith(name_start)]
    assert len(found) == 1, [i.name for i in budget.items if i.role == role]
    return found[0]


def phase(budget, name):
    return next(p for p in budget.phases if p.phase == name)


# --- parameter counts -----------------------------------------------------------------------------


def test_qwen25_1_5b_params_by_hand():
    # h=1536, 28 layers, 12 heads x 128, 2 KV heads (kv width 256), MLP 8960, vocab 151936, tied
    q = 1536 * 1536 + 1536  # q_proj weight + bias
    k = v = 1536 * 256 + 256
    o = 1536 * 1536
    mlp = 3 * 1536 * 8960
    norms = 2 * 1536
    layer = q + k + v + o + mlp + norms
    assert layer == 46_797_824
    total = 28 * layer + 151936 * 1536 + 1536  # layers + embedding (tied lm_head) + final norm
    assert total == 1_543_714_304 == Q15.params()


def test_qwen25_3b_params_by_hand():
    layer = (
        (2048 * 2048 + 2048) + 2 * (2048 * 256 + 256) + 2048 * 2048 + 3 * 2048 * 11008 + 2 * 2048
    )
    assert layer == 77_076_992
    total = 36 * layer + 151936 * 2048 + 2048
    assert total == 3_085_938_688 == Q3.params()


def test_qwen25_7b_params_by_hand():
    # h=3584, 28 heads x 128, 4 KV heads (kv width 512), MLP 18944, vocab 152064, lm_head untied
    layer = (
        (3584 * 3584 + 3584) + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944 + 2 * 3584
    )
    assert layer == 233_057_792
    total = 28 * layer + 2 * 152064 * 3584 + 3584  # embedding + lm_head + final norm
    assert total == 7_615_616_512 == Q7.params()


@pytest.mark.parametrize("key", sorted(k for k in ARCHS if k != "tiny"))
def test_params_match_published_totals_within_1_percent(key):
    a = ARCHS[key]
    assert a.params() == pytest.approx(a.published_params, rel=0.01)


def test_params_and_lora_match_transformers_and_peft():
    """The formulas against the real modules, built on the meta device (no memory)."""
    torch = pytest.importorskip("torch")
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    for a in (Q15, ARCHS["smollm2-135m"]):
        config_cls, model_cls = (
            (Qwen2Config, Qwen2ForCausalLM) if a.qkv_bias else (LlamaConfig, LlamaForCausalLM)
        )
        cfg = config_cls(
            hidden_size=a.hidden,
            num_hidden_layers=a.layers,
            num_attention_heads=a.heads,
            num_key_value_heads=a.kv_heads,
            intermediate_size=a.intermediate,
            vocab_size=a.vocab,
            tie_word_embeddings=a.tie_embeddings,
        )
        with torch.device("meta"):
            model = model_cls(cfg)
        assert sum(p.numel() for p in model.parameters()) == a.params()
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        peft_model = get_peft_model(model, LoraConfig(r=16, target_modules=targets))
        assert sum(p.numel() for p in peft_model.parameters() if p.requires_grad) == a.lora_params(
            16
        )


# --- bytes ----------------------------------------------------------------------------------------


def test_lora_r16_adapter_sizes_by_hand():
    # LoRA on a linear (in, out) adds A [r, in] + B [out, r] = r * (in + out)
    r = 16
    per_layer_15 = r * (
        (1536 + 1536) * 2 + (1536 + 256) * 2 + (1536 + 8960) * 3
    )  # q,o; k,v; gate,up,down
    assert per_layer_15 == 659_456
    assert Q15.lora_params(r) == 28 * per_layer_15 == 18_464_768
    per_layer_3 = r * ((2048 + 2048) * 2 + (2048 + 256) * 2 + (2048 + 11008) * 3)
    assert Q3.lora_params(r) == 36 * per_layer_3 == 29_933_568
    per_layer_7 = r * ((3584 + 3584) * 2 + (3584 + 512) * 2 + (3584 + 18944) * 3)
    assert Q7.lora_params(r) == 28 * per_layer_7 == 40_370_176


def test_kv_cache_bytes_by_hand():
    # 2 (K and V) * layers * kv_heads * head_dim * 2 B (bf16), per token
    assert Q15.kv_bytes_per_token() == 2 * 28 * 2 * 128 * 2 == 28_672
    assert Q3.kv_bytes_per_token() == 2 * 36 * 2 * 128 * 2 == 36_864
    assert Q7.kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2 == 57_344
    # the paper's rollout batch: 16 tasks x G=8 = 128 sequences of 2560 tokens
    assert 128 * 2560 * Q7.kv_bytes_per_token() / GiB == pytest.approx(17.5)


def test_full_finetune_bytes_per_gpu_7b_on_8_gpus():
    budget = memory_budget(Q7, SizingSettings(gpus=8, gpu_mem=80))
    P = 7_615_616_512
    assert item(budget, "actor", "weights bf16").bytes == 2 * P / 8
    assert item(budget, "actor", "gradients bf16").bytes == 2 * P / 8
    assert item(budget, "actor", "master weights fp32").bytes == 4 * P / 8
    assert item(budget, "actor", "Adam").bytes == 8 * P / 8 == 7_615_616_512
    assert item(budget, "reference", "frozen").bytes == 2 * P / 8
    assert item(budget, "teacher", "weights").bytes == 0  # the actor's weights
    # sdar's FSDP keeps the weights whole through each phase (sdar.train.fsdp.gathered) and the update's gradients
    # whole until its reduce-scatter; the reference is gathered for the scoring phase
    assert item(budget, "actor", "FSDP whole weights").bytes == 2 * P
    assert item(budget, "actor", "FSDP whole grads").bytes == 2 * P
    assert item(budget, "reference", "FSDP whole weights").bytes == 2 * P
    # activations, micro-batch 2 x 2560 tokens; one layer saves 12h + 4kv + 8I bytes per token
    tok = 2 * 2560
    assert activation_bytes_per_layer(Q7, 1) == 12 * 3584 + 4 * 512 + 8 * 18944 == 196_608
    assert item(budget, "actor", "activations, checkpointing").bytes == tok * (
        28 * 2 * 3584 + 196_608 + 4 * 3584
    )
    assert item(budget, "actor", "activations, no checkpointing").bytes == tok * (
        28 * 196_608 + 4 * 3584
    )
    # logits: three fp32 [tokens, vocab] tensors in the update
    assert item(budget, "actor", "logits").bytes == 3 * 4 * tok * 152064 == 9_342_812_160
    # vLLM reservation = 0.35 x 80 GiB, split into weights + runtime + KV pool
    vllm = sum(i.bytes for i in budget.items if i.role == "rollout" and i.phases)
    assert vllm == pytest.approx(0.35 * 80 * GiB)
    # phase peaks
    resident = (2 + 2 + 4 + 8 + 2) * P / 8  # actor state + reference
    assert phase(budget, "rollout").bytes == pytest.approx(resident + 2 * P + 0.35 * 80 * GiB)
    update = resident + 2 * P + 2 * P + tok * (28 * 2 * 3584 + 196_608 + 4 * 3584) + 9_342_812_160
    assert phase(budget, "update").bytes == pytest.approx(update)
    assert update / GiB == pytest.approx(54.99, abs=0.01)
    assert budget.fits and budget.peak / GiB == pytest.approx(58.15, abs=0.01)


def test_teacher_scoring_bytes_use_the_longer_context():
    s = SizingSettings(gpus=8, gpu_mem=80, teacher_extra_tokens=1024)
    budget = memory_budget(Q7, s)
    t_tok = 2 * (2560 + 1024)
    assert item(budget, "teacher", "K/V").bytes == 57_344 * t_tok
    assert item(budget, "teacher", "logits").bytes == 6 * t_tok * 152064
    longer = memory_budget(Q7, SizingSettings(gpus=8, gpu_mem=80, teacher_extra_tokens=4096))
    assert phase(longer, "teacher").bytes > phase(budget, "teacher").bytes


def test_lora_reference_costs_nothing_and_adapter_state_is_16_bytes_per_param():
    budget = memory_budget(Q3, SizingSettings(gpus=1, gpu_mem=80, lora=True))
    assert item(budget, "reference", "base").bytes == 0
    assert item(budget, "actor", "base weights").bytes == 2 * 3_085_938_688
    assert item(budget, "actor", "LoRA").bytes == 16 * 29_933_568


# --- fit verdicts ---------------------------------------------------------------------------------


def test_7b_full_finetune_on_one_80gb_gpu_does_not_fit():
    budget = memory_budget(Q7, SizingSettings(gpus=1, gpu_mem=80))
    # unsharded: 2+2+4+8 B actor + 2 B reference = 18 B/param = 127.7 GiB before any activation
    assert 18 * 7_615_616_512 / GiB == pytest.approx(127.67, abs=0.01)
    assert not budget.fits
    assert all(not p.fits for p in budget.phases)


def test_7b_lora_on_one_80gb_gpu_fits():
    budget = memory_budget(Q7, SizingSettings(gpus=1, gpu_mem=80, lora=True))
    resident = 2 * 7_615_616_512 + 16 * 40_370_176  # frozen bf16 base + fp32 adapter/grads/Adam
    rollout = resident + 0.35 * 80 * GiB
    assert rollout / GiB == pytest.approx(42.79, abs=0.01)  # <= 72 GiB usable (80 - 10%)
    assert phase(budget, "rollout").bytes == pytest.approx(rollout)
    tok = 2 * 2560
    update = resident + tok * (28 * 2 * 3584 + 196_608 + 4 * 3584) + 12 * tok * 152064
    assert phase(budget, "update").bytes == pytest.approx(update)
    assert budget.fits
    # one vLLM replica: its 0.35 x 80 GiB hold 14.2 GiB weights, not all 128 x 2560-token KV caches
    assert budget.rollout["replicas"] == 1 and budget.rollout["waves"] == 2


def test_weights_that_do_not_fit_say_so_and_suggest_fixes():
    sizing = size_run("qwen2.5-7b", gpus=1, gpu_mem=12)
    assert not sizing.fits
    assert any("bf16 weights alone" in p for p in sizing.memory.problems)
    assert sizing.suggestions and any("bigger instance" in s for s in sizing.suggestions)
    assert sizing.recommendation is None


def test_full_finetune_suggests_lora_and_more_gpus():
    sizing = size_run("qwen2.5-7b", gpus=1, gpu_mem=80)
    text = " ".join(sizing.suggestions)
    assert "--lora" in text and "--gpus" in text


def test_no_shard_and_no_checkpointing_cost_more():
    base = memory_budget(Q7, SizingSettings(gpus=8))
    assert memory_budget(Q7, SizingSettings(gpus=8, shard=False)).peak > base.peak
    no_ckpt = memory_budget(Q7, SizingSettings(gpus=8, checkpointing=False))
    assert phase(no_ckpt, "update").bytes > phase(base, "update").bytes


def test_split_mode_puts_vllm_on_its_own_gpus():
    budget = memory_budget(Q7, SizingSettings(gpus=8, colocate=False))
    assert phase(budget, "rollout").gpus == 4 and phase(budget, "update").gpus == 4
    # the rollout GPUs hold only vLLM: 0.85 x 80 GiB
    assert phase(budget, "rollout").bytes == pytest.approx(0.85 * 80 * GiB)
    # the training state is sharded 4 ways, not 8
    assert item(budget, "actor", "Adam").bytes == 8 * 7_615_616_512 / 4


# --- instances and cost ---------------------------------------------------------------------------


def test_recommends_the_cheapest_80gb_node_for_7b_on_8_gpus():
    sizing = size_run("qwen2.5-7b", gpus=8, gpu_mem=80)
    rec = sizing.recommendation
    assert rec["instance"] == "p4de.24xlarge" and rec["instances"] == 1
    names = [a["instance"] for a in sizing.alternatives]
    assert "p5.48xlarge" in names and "g5.48xlarge" not in names  # 24 GiB A10G cards are too small


def test_recommends_24gb_cards_when_they_are_asked_for_and_fit():
    sizing = size_run("qwen2.5-1.5b", gpus=8, gpu_mem=24)
    assert sizing.fits and sizing.recommendation["gpu_mem"] >= 24
    assert sizing.recommendation["instance"] == "g6.48xlarge"


def test_cost_arithmetic_on_demand_vs_spot():
    s = SizingSettings(gpus=8, steps=150, step_seconds=600, spot_discount=0.6, spot_overhead=0.1)
    from sdar.sizing import INSTANCE_BY_NAME

    c = run_cost(s, INSTANCE_BY_NAME["p4de.24xlarge"])
    hours = 150 * 600 / 3600
    assert c["hours"] == hours == 25.0
    assert c["on_demand_cost"] == pytest.approx(25.0 * 40.966 * 1)
    assert c["spot_cost"] == pytest.approx(25.0 * 1.1 * 40.966 * (1 - 0.6))
    # 16 GPUs on 8-GPU nodes: two instances; an explicit spot price replaces the discount
    c2 = run_cost(
        SizingSettings(
            gpus=16, steps=10, step_seconds=360, spot_price=20.0, spot_overhead=0.0, runs=3
        ),
        INSTANCE_BY_NAME["p4de.24xlarge"],
    )
    assert c2["instances"] == 2
    assert c2["on_demand_cost"] == pytest.approx(3 * 10 * 360 / 3600 * 40.966 * 2)
    assert c2["spot_cost"] == pytest.approx(3 * 1.0 * 20.0 * 2)


def test_spot_flag_ranks_by_spot_and_price_override():
    sizing = size_run("qwen2.5-7b", gpus=8, spot=True, price=10.0)
    assert sizing.recommendation["on_demand_hourly"] == 10.0
    assert sizing.recommendation["spot_hourly"] == pytest.approx(4.0)


# --- model resolution and bad input ---------------------------------------------------------------


def test_model_names_sizes_and_config_files(tmp_path):
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct")[0] is Q7
    a, note = resolve_model("7b")
    assert a is Q7 and "nearest" in note
    assert resolve_model("3.1e9")[0] is Q3
    big, note = resolve_model("30b")
    assert "generic" in note and big.params() == pytest.approx(30e9, rel=0.05)
    cfg = {
        "model_type": "qwen2",
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    a, note = resolve_model(str(tmp_path))
    assert a.params() == Q15.params() and str(tmp_path) in note


@pytest.mark.parametrize(
    "model, settings, message",
    [
        ("qwen9-7b", {}, "known models: Qwen2.5-0.5B"),
        ("7", {}, "with a unit"),
        ("qwen2.5-7b", {"gpus": 0}, "--gpus must be > 0"),
        ("qwen2.5-7b", {"gpus": -2}, "--gpus must be > 0"),
        ("qwen2.5-7b", {"gpu_mem": 0}, "--gpu-mem must be > 0"),
        ("qwen2.5-7b", {"gpus": 1, "colocate": False}, "at least 2 GPUs"),
        ("qwen2.5-7b", {"instance": "p9.huge"}, "p4de.24xlarge"),
        ("qwen2.5-7b", {"rollout_tp": 3}, "--rollout-tp 3"),
    ],
)
def test_bad_input_errors(model, settings, message):
    with pytest.raises(SizingError, match=message.replace(".", r"\.")):
        size_run(model, **settings)


# --- the command line -----------------------------------------------------------------------------


def test_cli_prints_the_table():
    out = sdar("plan", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu-mem", "80")
    assert out.returncode == 0, out.stderr
    for text in (
        "actor",
        "reference",
        "rollout",
        "teacher",
        "Adam m, v fp32",
        "FITS",
        "p4de.24xlarge",
    ):
        assert text in out.stdout


def test_cli_json_parses():
    out = sdar("plan", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu-mem", "80", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["fits"] is True and data["model"]["params"] == 7_615_616_512
    assert data["recommendation"]["instance"] == "p4de.24xlarge"
    assert {p["phase"] for p in data["phases"]} == {"rollout", "teacher", "update"}


def test_cli_errors_and_no_fit_exit_codes():
    bad = sdar("plan", "--model", "llama-9000", "--gpus", "8")
    assert bad.returncode == 2 and "known models" in bad.stderr and "Traceback" not in bad.stderr
    zero = sdar("plan", "--model", "7b", "--gpus", "0")
    assert zero.returncode == 2 and "--gpus must be > 0" in zero.stderr
    small = sdar("plan", "--model", "7b", "--gpus", "1", "--gpu-mem", "12")
    assert small.returncode == 1
    assert "DOES NOT FIT" in small.stdout and "bigger instance" in small.stdout


def test_size_is_the_command_and_plan_its_alias(capsys):
    from sdar.cli import main

    assert main(["size", "--model", "qwen2.5-7b", "--json"]) == 0
    size = json.loads(capsys.readouterr().out)
    assert main(["plan", "--model", "qwen2.5-7b", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == size
    assert main(["size", "--model", "llama-9000"]) == 2
    assert capsys.readouterr().err.startswith("sdar size: error: unknown model 'llama-9000'")
