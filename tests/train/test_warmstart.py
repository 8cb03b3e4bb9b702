"""Warm-start data: DART-style noise (perturbations executed, never imitated) and the cache key."""

from __future__ import annotations

import pytest

from sdar.config import load_config
from sdar.train.warmstart import expert_turns

CONFIG = "configs/household-tiny.yaml"


def _skipped_turns(turns):
    # turn indices within an episode: a perturbed turn leaves a gap (executed, not kept)
    gaps, prev = 0, None
    for t in turns:
        step = t["view"].step
        if prev is not None and step > prev:
            gaps += step - prev - 1
        prev = step
    return gaps


def test_noise_drops_the_perturbed_turns_and_keeps_the_experts_recovery():
    clean = expert_turns(load_config(CONFIG), 40, seed=3)
    noisy = expert_turns(load_config(CONFIG, {"warmstart.noise": 0.3}), 40, seed=3)
    assert _skipped_turns(clean) == 0
    # about 30% of the executed turns were perturbations and none of them is imitated
    skipped = _skipped_turns(noisy)
    assert 0.15 < skipped / (skipped + len(noisy)) < 0.45
    # every kept turn is the expert's action on the state shown, also right after a perturbation
    for t in clean + noisy:
        assert t["action"] in t["view"].admissible_actions


def test_noise_out_of_range_is_an_error_naming_the_key():
    with pytest.raises(ValueError, match=r"warmstart.noise=1.0 must be in \[0, 1\)"):
        expert_turns(load_config(CONFIG, {"warmstart.noise": 1.0}), 1, seed=0)


def test_cache_key_follows_the_prompt_wording_not_just_the_config(monkeypatch):
    from sdar.agent.memory import HouseholdMemory
    from sdar.train.warmstart import tiny_config, tiny_key

    cfg = load_config(CONFIG)
    key = tiny_key(cfg, tiny_config(cfg))
    assert key == tiny_key(cfg, tiny_config(cfg))  # deterministic
    assert key != tiny_key(load_config(CONFIG, {"warmstart.noise": 0.1}), tiny_config(cfg))
    assert key != tiny_key(load_config(CONFIG, {"warmstart.pretokenizer": "punct_space"}), tiny_config(cfg))
    # a code change to what the prompts say (here the memory's wording) must not reuse the old model
    render = HouseholdMemory.render
    monkeypatch.setattr(HouseholdMemory, "render", lambda self: render(self).replace("Seen:", "Visited:"))
    assert tiny_key(cfg, tiny_config(cfg)) != key


def test_decision_turns_are_take_and_go_to_off_the_search_frontier():
    from sdar.train.warmstart import is_decision

    turns = expert_turns(load_config(CONFIG), 60, seed=11)
    student = [t for t in turns if not t["privileged"]]
    for t in student:
        frontier = "Search next: go to " in t["view"].memory
        if t["action"].startswith("go to ") and frontier:
            # the listing-order expert always follows the frontier when it is shown: not a decision
            assert not is_decision(t)
        if t["action"].startswith("take "):
            assert is_decision(t)
    # some go-to turns of the student are decisions (appliance, target) and none are opens
    assert any(is_decision(t) and t["action"].startswith("go to ") for t in student)
    assert not any(is_decision(t) for t in turns if t["action"].startswith("open "))
    with pytest.raises(ValueError, match=r"warmstart.decision_repeats=0 is out of range: it must be >= 1"):
        expert_turns(load_config(CONFIG, {"warmstart.decision_repeats": 0}), 1, seed=0)


def test_shop_decision_turns_are_the_option_value_clicks():
    from sdar.train.warmstart import is_decision

    turns = expert_turns(load_config("configs/shop-tiny.yaml"), 40, seed=5)
    options = [t for t in turns if is_decision(t, "shop")]
    assert 0.2 < len(options) / len(turns) < 0.45  # measured: 31% of the turns
    for t in turns:
        on_item_page = t["view"].observation.endswith(" [SEP] Buy Now")
        value = t["action"][len("click["):-1]
        assert is_decision(t, "shop") == (on_item_page and value in t["view"].observation.split(" [SEP] ")
                                          and value not in ("buy now", "< prev", "back to search"))
    # search, result and buy turns are not decisions; nor is any shop turn by the household rule
    assert not any(is_decision(t, "shop") for t in turns if not t["action"].startswith("click[")
                   or t["action"] in ("click[buy now]", "click[item 1]"))
    assert not any(map(is_decision, turns))


def test_decision_repeats_multiply_exactly_the_decision_examples(tmp_path, monkeypatch):
    from sdar.train import warmstart

    from .conftest import small_config

    seen = {}

    def fake_sft(model, examples, **kw):  # the data is what is under test, not the optimiser
        seen.setdefault("n", []).append(len(examples))
        return {"sft_updates": 0}

    monkeypatch.setattr(warmstart, "sft", fake_sft)
    for repeats in (1, 3):
        cfg = small_config(tmp_path / str(repeats), **{"warmstart.decision_repeats": repeats})
        warmstart.build_tiny_checkpoint(cfg, tmp_path / f"ckpt{repeats}")
    turns = warmstart.expert_turns(small_config(tmp_path), 24, seed=1)  # the SFT's episodes (seed + 1)
    decisions = sum(map(warmstart.is_decision, turns))
    assert decisions > 0 and seen["n"] == [len(turns), len(turns) + 2 * decisions]


def test_the_alfworld_backend_keeps_the_sim_trained_warm_start(monkeypatch):
    # evaluating on the official games (`sdar eval --backend alfworld --split valid_seen`, or the
    # same as --set overrides) must find the cached sim-trained model, not train one on the engine
    from sdar.train.warmstart import tiny_config, tiny_key, warmstart_config

    monkeypatch.delenv("SDAR_ALFWORLD_DATA", raising=False)  # the warm start never touches the games
    cfg = load_config(CONFIG)
    assert warmstart_config(cfg) is cfg  # a sim config maps to itself: existing caches stay valid
    key = tiny_key(cfg, tiny_config(cfg))
    for ov in ({"env.kwargs.backend": "alfworld", "env.eval_split": "valid_seen"},
               {"env.kwargs.backend": "alfworld", "env.kwargs.workers": 2, "env.kwargs.data_dir": "/games",
                "env.train_split": "valid_train"},
               {"env.eval_split": "valid_seen"}):
        engine = load_config(CONFIG, ov)
        assert tiny_key(engine, tiny_config(engine)) == key, ov
        assert warmstart_config(engine).env == cfg.env
    # what the warm start imitates comes from the sim (sim task ids, its two experts) either way
    turns = expert_turns(load_config(CONFIG, {"env.kwargs.backend": "alfworld"}), 3, seed=5)
    assert [t["action"] for t in turns] == [t["action"] for t in expert_turns(cfg, 3, seed=5)]
    # a sim setting still shapes the warm start
    harder = load_config(CONFIG, {"env.kwargs.backend": "alfworld", "env.kwargs.difficulty.max_steps": 12})
    assert tiny_key(harder, tiny_config(harder)) != key


def test_fields_added_later_keep_the_keys_of_what_was_built_before(monkeypatch):
    """A field added after warm starts were cached (config.ADDED_DEFAULTS) leaves the cache key as it was at its
    neutral default: the key equals the one computed with the field absent from the config, as older code did."""
    import dataclasses

    from sdar import config as config_mod
    from sdar.train.warmstart import tiny_config, tiny_key

    cfg = load_config(CONFIG)
    key = tiny_key(cfg, tiny_config(cfg))
    assert config_mod.ADDED_DEFAULTS["warmstart.pretokenizer"] == "qwen2"
    for dotted, neutral in config_mod.ADDED_DEFAULTS.items():  # each entry is its field's neutral value: its default,
        head, _, name = dotted.rpartition(".")                 # or its "before" where the default changed what runs
        f = next(f for f in dataclasses.fields(getattr(config_mod.TrainConfig(), head)) if f.name == name)
        expected = f.metadata["before"] if "before" in f.metadata else getattr(getattr(config_mod.TrainConfig(), head), name)
        assert neutral == expected, dotted
    assert config_mod.ADDED_DEFAULTS["model.cpu_mixed_precision"] is False  # on by default, off in older records
    real_asdict = dataclasses.asdict

    def older_asdict(obj, *a, **kw):  # the config as code before the field saw it
        d = real_asdict(obj, *a, **kw)
        if isinstance(obj, config_mod.WarmStartConfig):
            d.pop("pretokenizer")
        return d

    monkeypatch.setattr("sdar.train.warm_cache.asdict", older_asdict)
    assert tiny_key(cfg, tiny_config(cfg)) == key
    with pytest.raises(ValueError, match="warmstart.pretokenizer='bpe' is not one of qwen2, punct_space"):
        load_config(CONFIG, {"warmstart.pretokenizer": "bpe"})


def test_sft_batches_are_the_batches_the_sft_runs(monkeypatch):
    """`sft_batches` (what benchmarks/bench_warmstart_sft.py measures) cuts each epoch into batches from
    length-sorted windows of a random permutation, every example once, and `sft` trains on exactly those
    batches in that order, epoch after epoch."""
    import random
    from types import SimpleNamespace

    import torch

    from sdar.train import warmstart

    rng = random.Random(1)
    lengths = [rng.randrange(3, 40) for _ in range(150)]
    batches = warmstart.sft_batches(lengths, 4, torch.Generator().manual_seed(5))
    assert sorted(i for b in batches for i in b) == list(range(150)) and max(map(len, batches)) == 4
    # a batch lies inside one window of 16 batches and holds neighbours in length order there
    again = warmstart.sft_batches(lengths, 4, torch.Generator().manual_seed(5))
    assert again == batches and warmstart.sft_batches(lengths, 4, torch.Generator().manual_seed(6)) != batches
    order = torch.randperm(150, generator=torch.Generator().manual_seed(5)).tolist()
    for b in batches:
        window = {order.index(i) // 64 for i in b}
        assert len(window) == 1
        w = window.pop()
        ranked = sorted(order[64 * w : 64 * w + 64], key=lengths.__getitem__)
        pos = [ranked.index(i) for i in b]
        assert pos == list(range(pos[0], pos[0] + len(b)))

    # sft consumes them: the prompts of every update, two epochs, are those batches' prompts in order
    examples = [([100 + i] * lengths[i], [1, 2], None) for i in range(150)]
    seen = []

    def fake_scoring(model, prompts, responses, **kw):
        seen.append([p[0] - 100 for p in prompts])
        return SimpleNamespace(logp=torch.zeros(len(prompts), 2, requires_grad=True), mask=torch.ones(len(prompts), 2),
                               prompt_tokens=0)

    monkeypatch.setattr("sdar.train.imitation.response_logprobs", fake_scoring)  # the SFT loop's own module
    model = torch.nn.Linear(1, 1)
    warmstart.sft(model, examples, pad_id=0, epochs=2, lr=0.1, batch_size=4, seed=5)
    g = torch.Generator().manual_seed(5)
    full = [len(p) + len(r) for p, r, _ in examples]
    assert seen == warmstart.sft_batches(full, 4, g) + warmstart.sft_batches(full, 4, g)


def test_the_warm_start_and_an_evaluation_show_their_progress_in_a_log(tmp_path):
    import io

    from rich.console import Console

    from sdar.progress import LINE
    from sdar.train.warmstart import build_tiny_checkpoint

    from .conftest import SMALL, make_trainer, small_config

    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    build_tiny_checkpoint(small_config(tmp_path / "run"), tmp_path / "ws", console)
    phases = {LINE.search(x)["label"] for x in out.getvalue().splitlines() if LINE.search(x)}
    assert phases == {"warm start: tokenizer's expert episodes", "warm start: expert episodes", "warm start: SFT"}
    trainer = make_trainer(small_config(tmp_path / "eval", tracking=False))
    out.seek(0)
    out.truncate()
    from sdar.eval import evaluate

    res = evaluate(trainer.backend, trainer.tokenizer, trainer.env_factory, trainer.eval_tasks, trainer.rollout_cfg,
                   batch_episodes=2, console=console)
    lines = [LINE.search(x) for x in out.getvalue().splitlines() if LINE.search(x)]
    assert [m["label"] for m in lines] == ["evaluating"] * len(lines) and lines[-1]["done"] == str(res.n) == str(SMALL["eval.tasks"])
