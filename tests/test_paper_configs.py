"""configs/paper/: the reference's ALFWorld, WebShop and search settings for Qwen2.5-1.5B/3B/7B, and
`sdar plan --config` reading them.

REFERENCE below is written from the reference's scripts (ZJU-REAL/SDAR examples/sdar_trainer/
run_{alfworld,webshop,search}_{3b,7b}.sh and verl/trainer/config/ppo_trainer.yaml for what they keep
at its default), not from our own files, so a config that drifts from the paper fails here."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sdar.cli import main as sdar_main
from sdar.config import load_config
from sdar.sizing import ARCHS, CONFIG_KEYS, settings_from_config

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "configs" / "paper"
SDAR = str(Path(sys.executable).parent / "sdar")

FAMILIES = ("alfworld", "webshop", "search")
SIZES = {"1.5b": "1.5B", "3b": "3B", "7b": "7B"}

# family -> (config key -> the reference's value). Script lines in the comments.
REFERENCE = {
    "alfworld": {
        "env.family": "household",  # env.env_name=alfworld/AlfredTWEnv
        "tasks_per_step": 16,  # train_data_size=16
        "group_size": 8,  # group_size=8 (env.rollout.n)
        "optim.lr": 1e-6,  # actor.optim.lr=1e-6
        "ppo.mini_batch_size": 256,  # actor.ppo_mini_batch_size=256
        "ppo.micro_batch_size": 32,  # actor.ppo_micro_batch_size_per_gpu=32
        "arm_overrides.kl_coef": 0.01,  # actor.kl_loss_coef=0.01
        "rollout.invalid_penalty": 0.1,  # actor.invalid_action_penalty_coef=0.1
        "rollout.max_turns": 50,  # env.max_steps=50
        "rollout.history": 2,  # ppo_trainer.yaml env.history_length: 2
        "rollout.max_prompt_tokens": 2048,  # data.max_prompt_length=2048
        "rollout.max_response_tokens": 512,  # data.max_response_length=512
        "rollout.require_think": True,  # alfworld/projection.py: no <think> -> invalid
        "eval.tasks": 128,  # val_data_size=128
        "eval.temperature": 0.4,  # val_kwargs.temperature=0.4
        "steps": 150,  # trainer.total_epochs=150 (one 16-row batch per epoch)
        "launch.nodes": 1,  # trainer.nnodes=1
        "launch.gpus_per_node": 8,  # trainer.n_gpus_per_node=8
    },
    "webshop": {
        "env.family": "shop",  # env.env_name=Webshop
        "tasks_per_step": 16,
        "group_size": 8,
        "optim.lr": 1e-6,
        "ppo.mini_batch_size": 64,  # actor.ppo_mini_batch_size=64
        "ppo.micro_batch_size": 8,  # actor.ppo_micro_batch_size_per_gpu=8
        "arm_overrides.kl_coef": 0.01,
        "rollout.invalid_penalty": 0.1,
        "rollout.max_turns": 15,  # env.max_steps=15
        "rollout.history": 2,
        "rollout.max_prompt_tokens": 4096,  # data.max_prompt_length=4096
        "rollout.max_response_tokens": 512,
        "rollout.require_think": True,  # webshop/projection.py: no <think> -> invalid
        "eval.tasks": 128,
        "eval.temperature": 0.4,
        "steps": 150,
        "launch.nodes": 1,
        "launch.gpus_per_node": 2,  # trainer.n_gpus_per_node=2
    },
    "search": {
        "env.family": "searchqa",  # env.env_name=search
        "tasks_per_step": 128,  # train_data_size=128
        "group_size": 8,
        "optim.lr": 1e-6,
        "ppo.mini_batch_size": 256,  # actor.ppo_mini_batch_size=256
        "ppo.micro_batch_size": 16,  # actor.ppo_micro_batch_size_per_gpu=16
        "arm_overrides.kl_coef": 0.001,  # actor.kl_loss_coef=0.001
        "rollout.invalid_penalty": 0.01,  # actor.invalid_action_penalty_coef=0.01
        "rollout.max_turns": 4,  # env.max_steps=4
        "rollout.history": 4,  # env.history_length=4
        "rollout.max_prompt_tokens": 4096,
        "rollout.max_response_tokens": 512,
        "rollout.require_think": False,  # search/projection.py checks <search>/<answer> only
        "eval.tasks": 512,  # val_data_size=512
        "eval.temperature": 0.0,  # no val_kwargs: ppo_trainer.yaml val_kwargs.temperature: 0 (greedy)
        "steps": 150,  # trainer.total_training_steps=150
        "launch.nodes": 1,
        "launch.gpus_per_node": 4,  # trainer.n_gpus_per_node=4
    },
}
# the same in every family (ppo_trainer.yaml defaults the scripts keep, and the model setup)
COMMON = {
    "optim.weight_decay": 0.01,  # actor.optim.weight_decay: 0.01
    "optim.grad_clip": 1.0,  # actor.grad_clip: 1.0
    "ppo.epochs": 1,  # actor.ppo_epochs: 1
    "ppo.shuffle_mini_batches": False,  # actor.shuffle: False
    "ppo.loss_normalisation": "micro_batch",  # verl dp_actor: loss / gradient_accumulation per micro-batch
    "arm": "sdar",  # main_sdar.py
    "arm_overrides.entropy_coef": 0.001,  # actor.entropy_coeff: 0.001
    "rollout.temperature": 1.0,  # rollout.temperature: 1.0
    "rollout.privileged_placement": "prefix",  # build_teacher_batch: skill prefix + prompt
    "rollout.penalize": "format",  # the projections judge the response's format only
    "rollout.constrained": False,  # the reference decodes freely
    "model.lora": False,  # model.lora_rank: 0
    "model.dtype": "bfloat16",
    "model.gradient_checkpointing": True,  # model.enable_gradient_checkpointing=True
    "model.generation_backend": "vllm",  # rollout.name=vllm
}


def cases():
    return [(fam, size) for fam in FAMILIES for size in SIZES]


def path_of(fam: str, size: str) -> Path:
    return PAPER / f"{fam}-qwen2.5-{size}.yaml"


def get(cfg, dotted: str):
    value = cfg
    for part in dotted.split("."):
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value


def test_paper_configs_are_the_nine_expected_files():
    assert sorted(p.name for p in PAPER.glob("*.yaml")) == sorted(
        path_of(f, s).name for f, s in cases()
    )


@pytest.mark.parametrize("fam, size", cases())
def test_paper_config_loads_and_matches_the_reference(fam, size):
    cfg = load_config(path_of(fam, size))
    assert cfg.model.name_or_path == f"Qwen/Qwen2.5-{SIZES[size]}-Instruct"
    for key, want in {**COMMON, **REFERENCE[fam]}.items():
        got = get(cfg, key)
        if isinstance(want, float):
            assert got == pytest.approx(want), key
        else:
            assert got == want, key
    # the teacher's budget holds the student's whole prompt plus room for the skills
    assert cfg.teacher.max_prompt_tokens > cfg.rollout.max_prompt_tokens


@pytest.mark.parametrize("fam", FAMILIES)
def test_1_5b_and_7b_differ_from_the_3b_only_in_the_model(fam):
    """The reference's 3B and 7B scripts differ only in the model path; the 1.5B is derived from
    the 3B and says so in its header."""
    def without_model(size):
        d = load_config(path_of(fam, size)).to_dict()
        d["model"].pop("name_or_path")
        d.pop("experiment")
        return d

    base = without_model("3b")
    for size in ("1.5b", "7b"):
        assert without_model(size) == base, size
    header = path_of(fam, "1.5b").read_text().split("\n\n")[0]
    assert "no 1.5B script" in header and f"run_{fam}_3b.sh" in header


@pytest.mark.parametrize("fam, size", cases())
def test_every_setting_line_cites_the_reference_or_says_it_is_ours(fam, size):
    text = path_of(fam, size).read_text()
    script = f"run_{fam}_{'3b' if size == '1.5b' else size}.sh"
    assert f"examples/sdar_trainer/{script}" in text
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#") or not line.strip():
            continue
        key, _, rest = line.partition(":")
        value, _, comment = rest.partition(" # ")
        if not value.strip():  # a mapping's header (env:, model:, ...)
            continue
        if not comment:  # the block comment right above it explains it
            assert lines[i - 1].lstrip().startswith("#"), line
            continue
        cites = (script, "ppo_trainer.yaml", ".py", "ours", "verl", "the reference")
        assert any(c in comment for c in cites), line


def test_teacher_budget_fits_the_longest_skills_of_each_family():
    """teacher.max_prompt_tokens - rollout.max_prompt_tokens is at least the privileged prefix of the family's
    longest skills text, in Qwen2.5 tokens (sdar's teacher refuses a prompt that would lose them)."""
    from sdar_envs.base import env_class
    from sdar.models.qwen import load_qwen_tokenizer

    tok = load_qwen_tokenizer()
    env_family = {"alfworld": "household", "webshop": "shop", "search": "searchqa"}
    for fam in FAMILIES:
        lib = env_class(env_family[fam]).skill_library()
        longest = max(
            len(tok.encode(f"[Privileged Skill Information]\n{lib.render(k)}\n\n",
                           add_special_tokens=False))
            for k in lib.keys()
        )
        for size in SIZES:
            cfg = load_config(path_of(fam, size))
            room = cfg.teacher.max_prompt_tokens - cfg.rollout.max_prompt_tokens
            assert room >= longest, (fam, longest)


def test_env_kwargs_are_options_of_the_environments():
    from dataclasses import fields

    from sdar_envs.searchqa.env import SearchQAConfig
    from sdar_envs.shop.env import ShopConfig

    known = {"webshop": {f.name for f in fields(ShopConfig)},
             "search": {f.name for f in fields(SearchQAConfig)}}
    for fam, size in cases():
        kwargs = load_config(path_of(fam, size)).env.kwargs
        if fam == "alfworld":
            assert kwargs == {"backend": "alfworld"}
        else:
            assert set(kwargs) <= known[fam], kwargs
    assert load_config(path_of("webshop", "3b")).env.kwargs["horizon"] == 15  # env.max_steps=15
    assert load_config(path_of("search", "3b")).env.kwargs["max_turns"] == 4  # env.max_steps=4


# --- sdar plan --config ---------------------------------------------------------------------------


@pytest.mark.parametrize("fam, size", cases())
def test_plan_settings_from_each_paper_config(fam, size):
    ref = REFERENCE[fam]
    read = settings_from_config(path_of(fam, size))
    assert read.model == f"Qwen/Qwen2.5-{SIZES[size]}-Instruct"
    assert read.skipped == {}
    s = read.settings
    assert set(s) <= set(CONFIG_KEYS)
    assert s["gpus"] == ref["launch.nodes"] * ref["launch.gpus_per_node"]
    assert s["seq_len"] == ref["rollout.max_prompt_tokens"] + ref["rollout.max_response_tokens"]
    assert s["micro_batch"] == ref["ppo.micro_batch_size"]
    assert (s["group_size"], s["tasks_per_step"], s["steps"]) == (8, ref["tasks_per_step"], 150)
    assert s["lora"] is False and s["checkpointing"] is True
    cfg = load_config(path_of(fam, size))
    assert s["teacher_extra_tokens"] == cfg.teacher.max_prompt_tokens - cfg.rollout.max_prompt_tokens


def plan_json(capsys, *args: str) -> tuple[int, dict]:
    rc = sdar_main(["plan", *args, "--json"])
    out = capsys.readouterr()
    assert rc in (0, 1), out.err
    return rc, json.loads(out.out)


def test_plan_cli_reads_the_config(capsys):
    _, data = plan_json(capsys, "--config", str(path_of("alfworld", "7b")))
    assert data["model"]["name"] == "Qwen2.5-7B"
    assert data["model"]["params"] == ARCHS["qwen2.5-7b"].params()
    assert "Qwen/Qwen2.5-7B-Instruct" in data["model"]["source"]
    s = data["settings"]
    assert (s["gpus"], s["seq_len"], s["micro_batch"]) == (8, 2560, 32)
    assert s["teacher_extra_tokens"] == 4096 - 2048
    assert (s["group_size"], s["tasks_per_step"], s["steps"], s["lora"]) == (8, 16, 150, False)
    assert data["config"]["model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert data["config"]["model_used"] is True
    assert data["config"]["read"]["seq_len"] == {"value": 2560, "from": CONFIG_KEYS["seq_len"]}
    assert data["config"]["overridden_by_flags"] == []

    _, search = plan_json(capsys, "--config", str(path_of("search", "3b")))
    assert search["model"]["name"] == "Qwen2.5-3B"
    ss = search["settings"]
    assert (ss["gpus"], ss["seq_len"], ss["tasks_per_step"]) == (4, 4096 + 512, 128)


def test_plan_flags_override_the_config(capsys):
    _, data = plan_json(capsys, "--config", str(path_of("webshop", "7b")), "--gpus", "8",
                        "--micro-batch", "1", "--lora", "--model", "qwen2.5-3b")
    s = data["settings"]
    assert (s["gpus"], s["micro_batch"], s["lora"]) == (8, 1, True)
    assert data["model"]["name"] == "Qwen2.5-3B"
    assert s["seq_len"] == 4608 and s["tasks_per_step"] == 16  # still the config's
    assert data["config"]["overridden_by_flags"] == ["gpus", "lora", "micro_batch", "model"]
    assert data["config"]["model_used"] is False and "gpus" not in data["config"]["read"]


def test_plan_without_a_config_keeps_its_defaults(capsys):
    _, data = plan_json(capsys, "--model", "qwen2.5-7b")
    s = data["settings"]
    assert (s["gpus"], s["seq_len"], s["micro_batch"]) == (8, 2560, 2)
    assert (s["lora"], s["checkpointing"]) == (False, True)
    assert "config" not in data


def test_plan_needs_a_model_or_a_config_and_names_an_unknown_model(capsys, tmp_path):
    assert sdar_main(["plan"]) == 2
    assert "--model" in capsys.readouterr().err
    cfg = tmp_path / "llama.yaml"
    cfg.write_text("model:\n  name_or_path: meta-llama/Llama-3.1-8B-Instruct\n"
                   "launch:\n  gpus_per_node: 8\n")
    assert sdar_main(["plan", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "meta-llama/Llama-3.1-8B-Instruct" in err and "unknown to the planner" in err
    assert "pass --model" in err
    assert sdar_main(["plan", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    # --model rescues a config whose model the planner does not know
    rc = sdar_main(["plan", "--config", str(cfg), "--model", "8b", "--json"])
    assert rc in (0, 1)
    assert json.loads(capsys.readouterr().out)["settings"]["gpus"] == 8


def test_plan_config_on_a_cpu_config_leaves_gpus_to_the_planner(capsys):
    _, data = plan_json(capsys, "--config", str(ROOT / "configs" / "household-tiny.yaml"))
    assert data["model"]["name"] == "tiny" and data["settings"]["gpus"] == 8
    assert "gpus" in data["config"]["not_read"]


def test_sdar_plan_config_console_script():
    cmd = [SDAR, "plan", "--config", str(path_of("alfworld", "3b")), "--width", "140"]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 1), out.stderr
    assert "settings from" in out.stdout and "alfworld-qwen2.5-3b.yaml" in out.stdout
    assert "Qwen2.5-3B" in out.stdout and "seq_len 2560" in out.stdout
