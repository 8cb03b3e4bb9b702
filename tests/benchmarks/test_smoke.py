"""Every benchmark in benchmarks/ runs at its smoke size and prints well-formed figures: one test per benchmark, each
running it as a person would (a subprocess from the repository root) and parsing what it prints. The figures' form
is checked, never their values. benchmarks/gpu_suite.sh is rehearsed in tests/benchmarks/test_gpu_suite.py, which
runs bench_train_step.py at its smoke size on every shape (tiny with the speed-ups on and off and the raw limits),
and bench_reliability.py runs section by section in tests/reliability/test_bench_reliability.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.bench_train_step import SMOKE
from tests.train.conftest import as_sets

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
# the benchmarks whose smoke run lives in another test file
ELSEWHERE = {"gpu_suite.sh": "tests/benchmarks/test_gpu_suite.py", "bench_train_step.py": "tests/benchmarks/test_gpu_suite.py",
             "bench_reliability.py": "tests/reliability/test_bench_reliability.py",
             # bench_reliability's pipeline and diskfull sections, driven by the tests of those faults
             "reliability_faults.py": "tests/pipeline/test_local_resume.py"}
# the miniature of household-tiny the training tests share (bench_train_step.py's SMOKE): its warm start is cached once
SMALL = as_sets(SMOKE)
NUMBER = re.compile(r"^[-+]?[\d,]*\.?\d+(?:e[-+]?\d+)?$")


def bench(script: str, *args: str, timeout_s: float = 300, env: dict | None = None) -> str:
    """Run benchmarks/<script> (Python, or bash for a .sh) with `args`; its stdout, after checking that it exited 0."""
    runner = ["bash"] if script.endswith(".sh") else [sys.executable]
    proc = subprocess.run([*runner, str(BENCHMARKS / script), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, "COLUMNS": "220", **(env or {})})
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def number(cell: str) -> float:
    """A printed figure as a float: 1,234.5 / 52.5% / 1.05x / **0.48** / 0.48 s; an error when it is none."""
    text = cell.strip().strip("*").removesuffix(" s").removesuffix("x").removesuffix("%").strip()
    assert NUMBER.match(text), f"not a figure: {cell!r}"
    return float(text.replace(",", ""))


def table_rows(text: str) -> list[list[str]]:
    """The cells of every data row of the tables in `text`: rich's (│ ... │) and markdown's (| ... |), without
    their header and rule rows."""
    rows = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        s = line.strip()
        if s.startswith("│"):
            rows.append([c.strip() for c in s.strip("│").split("│")])
        elif s.startswith("|") and not re.fullmatch(r"[|:\- ]+", s):
            following = lines[i + 1].strip() if i + 1 < len(lines) else ""
            if not re.fullmatch(r"\|[|:\- ]+", following):  # a markdown header is followed by its rule
                rows.append([c.strip() for c in s.strip("|").split("|")])
    return rows


def test_every_benchmark_has_a_smoke_run():
    files = {p.name for p in BENCHMARKS.iterdir() if p.suffix in (".py", ".sh") and not p.name.startswith("_")}
    tested = {name for name in files if f"test_{Path(name).stem}" in globals()}
    assert files - tested - set(ELSEWHERE) == set(), "a benchmark without a smoke test: add test_<its name> here"
    for name, where in ELSEWHERE.items():
        assert name in (ROOT / where).read_text() or name in (BENCHMARKS / "gpu_suite.sh").read_text(), \
            f"{where} no longer runs {name}"


def test_table_rows_and_number_parse_what_the_benchmarks_print():
    text = "┃ arm ┃ ms ┃\n│ grpo │ 1,234.5 │\n\n| a | b |\n|---|--:|\n| x | **0.48** |\n| y | 52.5% |"
    assert table_rows(text) == [["grpo", "1,234.5"], ["x", "**0.48**"], ["y", "52.5%"]]
    assert [number(c) for c in ("1,234.5", "**0.48**", "52.5%", "1.05x", "0.3 s")] == [1234.5, 0.48, 52.5, 1.05, 0.3]
    with pytest.raises(AssertionError):
        number("n/a")


def test_bench_loss():
    out = bench("bench_loss.py", "--batch", "4", "--seq", "32", "--vocab", "256", "--repeats", "1")
    rows = {r[0]: r for r in table_rows(out)}
    assert set(rows) == {"grpo", "grpo_opsd", "sdar"}
    for r in rows.values():
        assert len(r) == 5 and all(number(c) >= 0 for c in r[1:])
    assert re.search(r"SDAR/GRPO overhead ratio of the loss computation alone: \d+\.\d\dx", out)


@pytest.mark.slow
def test_bench_exit():
    """benchmarks/bench_exit.py: the real `sdar train` with the interpreter's final collections kept and skipped, a
    row each with the seconds from the last output to the exit and of the whole process, and the two ratios."""
    out = bench("bench_exit.py", "--repeats", "1", "--set", "rollout.max_turns=2")
    assert "--set rollout.max_turns=2" in out
    rows = {r[0]: r[1:] for r in table_rows(out)}
    assert set(rows) == {"kept", "skipped"}
    for cells in rows.values():
        assert len(cells) == 2 and 0 < number(cells[0]) < number(cells[1])
    assert re.search(r"^kept / skipped: last output to exit [\d.]+x, whole process [\d.]+x$", out, re.M)


def test_bench_model_update():
    out = bench("bench_model_update.py", "--batch", "2", "--seq", "32", "--repeats", "1", "--vocab", "300")
    figure = r"(lora|full)\s+params [\d.]+M \(trainable [\d.]+M\): min [\d.]+ s, median [\d.]+ s per update, " \
             r"\d+ tokens/s; CPU [\d.]+ s per thread"
    assert {m.group(1) for m in re.finditer(figure, out)} == {"lora", "full"}


def test_bench_scoring_head(tmp_path):
    out = bench("bench_scoring_head.py", "--models", "tiny", "--rows", "4", "--batch-size", "4", "--repeats", "1",
                "--json", str(tmp_path / "head.json"))
    assert re.search(r"tiny \(vocab \d+ x width \d+\), 4 rows, \d+% forced: score [\d.]+ s .* \([\d.]+x\); "
                     r"update [\d.]+ / [\d.]+ s \([\d.]+x\)", out)
    fig = json.loads((tmp_path / "head.json").read_text())["tiny"]
    assert all(fig[k] > 0 for k in ("score/on", "score/off", "update/on", "update/off"))


def test_bench_warmstart_sft(tmp_path):
    out = bench("bench_warmstart_sft.py", *SMALL, "--time-updates", "2", "--json", str(tmp_path / "sft.json"))
    assert re.search(r"\d+ examples, \d+ updates of \d+ \(\d+ epochs\)", out)
    assert re.search(r"ceilings at the same seconds per position: bucketing or packing [\d.]+x, .* [\d.]+x", out)
    fig = json.loads((tmp_path / "sft.json").read_text())
    assert fig["padded_positions"] >= fig["real_tokens"] >= fig["trie_positions"] > 0 and fig["s_per_update"] > 0


def test_bench_warmstart(tmp_path):
    out = bench("bench_warmstart.py", *SMALL, "--set", "eval.tasks=4", "--probe-episodes", "4",
                "--json", str(tmp_path / "ws.json"))
    assert re.search(r"student [\d.]+  teacher [\d.]+  \([-+][\d.]+ points\)  gap [-+][\d.]+  on 4 held-out tasks", out)
    assert re.search(r"^warm start (built by this run|loaded from the cache) \(its build took [\d.]+ s\)", out, re.M)
    assert re.search(r"^  all +[\d.]+ \( *\d+\) +([\d.]+ \( *\d+\)|-)$", out, re.M), out  # greedy accuracy, all turns
    fig = json.loads((tmp_path / "ws.json").read_text())
    assert 0 <= fig["student_success"] <= 1 and fig["greedy_accuracy"]["student"][1] > 0
    # the build's own seconds whether this run built the warm start or loaded it
    assert fig["warm_start"] in ("built by this run", "loaded from the cache"), fig["warm_start"]
    assert fig["build_s"] > 0 and fig["ready_s"] > 0


def test_bench_env_load():
    out = bench("bench_env_load.py", "--families", "household", "--sessions", "4", "--steps", "10", "--duration", "5")
    (row,) = [r for r in table_rows(out) if r[0] == "household"]
    assert len(row) == 11 and all(number(c) >= 0 for c in row[1:])
    assert "OK: no session lost, no cross-talk" in out


def test_bench_alfworld():
    out = bench("bench_alfworld.py", "--smoke")
    data = os.environ.get("SDAR_ALFWORLD_DATA")
    if not (data and Path(data).exists()):
        assert out.startswith("skipped: no ALFWorld games"), out
        return
    assert re.search(r"win rate\s+\d/1 = [\d.]+", out) and re.search(r"wall\s+[\d.]+ s \([\d.]+ games/min\)", out)
    # a game's line is progress (stderr) unless the game was lost: stdout is the stamped table in docs/
    assert "[   1] won " not in out
    assert ("[   1] LOST" in out) == bool(re.search(r"win rate\s+0/1", out))


def test_bench_vllm(tmp_path):
    out = bench("bench_vllm.py", "--dry", "--out", str(tmp_path / "vllm.json"))
    rows = {r[0]: r for r in table_rows(out)}
    assert all(number(c) >= 0 for c in rows["transformers"][1:])
    assert number(rows["teacher_train_s"][1]) > 0
    report = json.loads((tmp_path / "vllm.json").read_text())
    if report["skipped"]:  # no vLLM or no GPU here: it says so
        assert "vllm: skipped (" in out and "vllm" not in rows
    else:
        assert all(number(c) >= 0 for c in rows["vllm"][1:])


def check_train_step_figures(out: str, arms: set[str], modes: set[str]) -> None:
    """bench_train_step.py's tables: per arm and mode the three phases (and sdar's teacher pass) with seconds,
    forwards, tokens per forward, padding, host seconds and, for the rollout, host seconds per decode step; the step;
    SDAR/GRPO per phase when both arms ran."""
    assert re.search(r"^model \S+ \(.*[\d.]+M parameters, [\d.]+M trainable, \w+ on \w+", out, re.MULTILINE), out[:300]
    phases = [r for r in table_rows(out) if len(r) == 9]
    seen = {(r[0], r[1], r[2]) for r in phases}
    for arm in arms:
        for mode in modes:
            for phase in ("rollout", "score", "update", "**step**"):
                assert (arm, mode, phase) in seen, (arm, mode, phase)
    for r in phases:
        assert number(r[3]) >= 0 and number(r[4]) == int(number(r[4]))
        if r[2] == "**step**":
            continue
        assert number(r[5]) >= 0 and 0 <= number(r[6]) <= 100 and number(r[7]) >= 0
        if r[2] == "rollout":  # decode steps ran, each with its host seconds (the lookahead runs none)
            assert number(r[4]) > 0 and (r[8] == "-" if r[1] == "packed" else number(r[8]) > 0)
    if {"grpo", "sdar"} <= arms:
        ratios = {r[0]: r[1:] for r in table_rows(out) if len(r) == 1 + len(modes)}
        for phase in ("rollout seconds", "score seconds", "update seconds", "**step**"):
            assert all(number(c) > 0 for c in ratios[phase])
        assert re.search(r"SDAR/GRPO, speed-ups on: [\d.]+x per step; forwards \d+ against \d+", out)


def test_bench_precision(tmp_path):
    """bfloat16 against float32 on the same trajectories, the training tests' miniature (the tiny model)."""
    out = bench("bench_precision.py", "--config", "configs/household-tiny.yaml", "--smoke", *SMALL,
                "--json", str(tmp_path / "precision.json"))
    rows = {r[0]: r for r in table_rows(out)}
    for name in ("old_logp", "teacher logp", "gap"):
        (diff, bound) = rows[f"{name} per token (max / mean abs diff)"][3:5]
        assert all(number(x) >= 0 for x in diff.split(" / ") + bound.split(" / "))
    for key in ("sdar/gap_mean", "sdar/gate_mean", "loss/pg", "loss/sdar", "loss/total"):
        assert all(number(c) >= 0 or c.startswith("-") for c in rows[key][1:5]) and number(rows[key][3]) >= 0
    for name in ("the update's change of the policy's log-probs, in float32", "the update's change of the adapter's weights"):
        cos, ratio = (number(x) for x in rows[f"{name} (cosine / norm ratio)"][3].split(" / "))
        assert number(rows[f"{name} (cosine / norm ratio)"][1]) > 0  # float32's update moved something to compare
        assert 0.98 <= cos <= 1.0 + 1e-6 and abs(ratio - 1.0) <= 0.1
    assert re.search(r"bfloat16 against float32 on the same \d+ episodes \(\d+ turn-samples, \d+ choice tokens", out)
    assert "within every bound" in out
    assert json.loads((tmp_path / "precision.json").read_text())["failures"] == []


@pytest.mark.serial  # its ratio to a matmul rate measured in the same run needs the cores to itself
def test_bench_layouts_smollm2(tmp_path):
    """`bench_train_step.py --model smollm2`: SmolLM2-135M-Instruct's real weights (no warm start in household-tiny),
    one step of 2 tasks; the floor table: positions, floor seconds and the multiple of it per phase. Run as
    benchmarks/bench_layouts_smollm2.sh runs it (one process per layout in LAYOUTS, each under its own heading with
    its own figures file), with the one layout the script maps itself: plain, mode on with sdar.models.precision off."""
    env = {"PYTHON": sys.executable, "OUT": str(tmp_path), "CONFIG": "configs/household-tiny.yaml", "LAYOUTS": "plain"}
    out = bench("bench_layouts_smollm2.sh", "--smoke", "--arms", "grpo", timeout_s=600, env=env)
    sections = re.split(r"^layout (\w+) \(one process\):$", out, flags=re.MULTILINE)[1:]
    assert sections[::2] == ["plain"]
    assert [p.name for p in tmp_path.glob("layouts_smollm2_*.json")] == ["layouts_smollm2_plain.json"]
    figures = json.loads((tmp_path / "layouts_smollm2_plain.json").read_text())
    assert figures["overrides"]["model.cpu_mixed_precision"] is False and set(figures["rows"]) == {"grpo/on"}
    assert re.search(r"model smollm2 \(139\.4M parameters, [\d.]+M trainable, float32 on cpu\)", out), out[:400]
    assert re.search(r"N = 10[0-9]\.\dM weights\) at the matrix-multiply rate of the row's dtype measured in this run "
                     r"\([\d,]+ GFLOP/s in float32; 2048 x 2048\)", out)
    floor = [r for r in table_rows(out) if len(r) == 7 and r[0] == "grpo"]
    assert [r[2] for r in floor] == ["rollout", "score", "update", "**step**"]
    for r in floor[:3]:
        assert number(r[3]) > 0 and number(r[4]) > 0 and number(r[6]) >= 1.0  # never faster than the floor
    # --ops (on for smollm2): where one more update's seconds go, by op, each part's share of the profiled time
    ops = [r for r in table_rows(out) if len(r) == 8 and r[0] == "grpo"]
    assert [r[2] for r in ops[:5]] == ["linear layers", "LoRA adapter", "output head", "attention", "everything else"]
    assert ops[5][2].startswith("**update** (wall ")
    assert abs(sum(number(r[4].rstrip("%")) for r in ops[:5]) - 100) <= 3
    assert abs(sum(number(r[3]) for r in ops[:5]) - number(ops[5][3])) <= 0.03
    assert number(ops[0][7]) > 0.5 and number(ops[1][5]) > 0  # the adapter's matmuls are found by their rank
    # the linear layers' FLOPs, read off the profiled shapes, are the floor's: the update's positions with gradients
    # x 4N and its no-grad ones (the finite check after each optimizer step) x 2N, to the first layer's backward (its
    # input, the embeddings, needs no gradient: 1 of 30 layers' 2N)
    row = figures["rows"]["grpo/on"]
    u, fl = row["phases"]["update"], row["flops_per_position"]
    assert 0 < u["grad_positions"] < u["positions"]
    expected = u["grad_positions"] * fl["train"] + (u["positions"] - u["grad_positions"]) * fl["forward"]
    assert 0.97 <= row["ops"]["parts"]["linear layers"]["flops"] / expected <= 1.01, (row["ops"], expected)


def test_bench_train_step_on_a_local_checkpoint_directory(tmp_path, qwen2_checkpoint):
    """`--model DIR`: a user's own checkpoint as transformers saves it (here a small Qwen2 with the Qwen2.5 vocabulary),
    its real weights, the floor and the update's ops on as for smollm2; a directory without config.json is refused
    before anything runs, naming what it needs."""
    out = bench("bench_train_step.py", "--model", str(qwen2_checkpoint), "--smoke", "--arms", "grpo",
                "--json", str(tmp_path / "step.json"), timeout_s=300)
    assert re.search(rf"model {re.escape(str(qwen2_checkpoint))} \([\d.]+M parameters, [\d.]+M trainable, float32 on "
                     r"cpu\)", out), out[:400]
    floor = [r for r in table_rows(out) if len(r) == 7 and r[0] == "grpo"]
    assert [r[2] for r in floor] == ["rollout", "score", "update", "**step**"]
    # positions and seconds; the floor itself rounds to 0.000 s at this width, its multiple is of the unrounded floor
    assert all(number(r[3]) > 0 and number(r[5]) > 0 and number(r[6]) >= 1.0 for r in floor[:3])
    ops = [r for r in table_rows(out) if len(r) == 8 and r[0] == "grpo"]
    assert [r[2] for r in ops[:5]] == ["linear layers", "LoRA adapter", "output head", "attention", "everything else"]
    record = json.loads((tmp_path / "step.json").read_text())
    assert record["model"] == str(qwen2_checkpoint) and record["layers"] is None
    # the decoder's linear weights the floor counts are the checkpoint's: 2 layers of q, k, v, o and the MLP
    width, mlp, kv = 64, 128, 2 * 16
    per_layer = width * width * 2 + width * kv * 2 + 3 * width * mlp
    assert record["rows"]["grpo/on"]["flops_per_position"]["linear_weights"] == 2 * per_layer
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "bench_train_step.py"), "--model", str(tmp_path / "empty")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "a directory without config.json" in proc.stderr, proc.stderr[-2000:]
    assert "or a local checkpoint directory as transformers saves one" in proc.stderr


def test_every_smoke_run_is_the_one_miniature():
    """bench_vs_trl.py keeps a copy of the miniature (bench_train_step.py's SMOKE, which the tests and bench_exit.py
    import), so that editing one does not stale the other's tables: the two must stay the same size, or the smoke
    runs would build a second warm start."""
    from benchmarks import bench_vs_trl

    assert {k: v for k, v in bench_vs_trl.SMOKE.items() if k != "warmstart.eval_tasks"} == SMOKE


@pytest.mark.slow
def test_bench_vs_trl(tmp_path):
    """TRL's GRPOTrainer and sdar's grpo interleaved on the tests' miniature: the same tasks at every step (what each
    side's rollout played), both sides' step figures, the settings table side by side, and held-out success of the
    warm start and of each side with their paired differences."""
    out = bench("bench_vs_trl.py", "--smoke", "--steps", "1", "--eval-tasks", "2", "--json", str(tmp_path / "vs.json"),
                "--equal-time-max-steps", "3", timeout_s=600)
    data = json.loads((tmp_path / "vs.json").read_text())
    sdar, trl = data["rows"]["sdar"], data["rows"]["trl"]
    assert len(sdar) == len(trl) == 2  # a warm-up step and a timed one each
    for ours, theirs in zip(sdar, trl):
        assert ours["tasks"] == theirs["tasks"] and len(ours["tasks"]) == 1
        assert ours["episodes"] == theirs["episodes"] == 2
        assert ours["step_s"] > 0 and theirs["step_s"] > 0 and ours["trained_tokens"] > 0 and theirs["trained_tokens"] > 0
    assert sdar[0]["tasks"] != sdar[1]["tasks"]
    settings = {r[0]: r[1:] for r in table_rows(out) if len(r) == 3}
    assert settings["tasks x group per step"] == ["1 x 2", "1 x 2"]
    assert settings["turn limit"] == ["rollout.max_turns 3", "max_tool_calling_iterations 3"]
    assert settings["learning rate"][0].split()[0] == settings["learning rate"][1].split()[0]
    sides = {r[0]: r[1:] for r in table_rows(out) if len(r) == 6}
    assert set(sides) == {"sdar", "trl"}
    for cells in sides.values():
        s, tokens, rate = number(cells[0]), number(cells[1]), number(cells[2])
        assert s > 0 and tokens > 0 and abs(rate - tokens / s) <= 0.05 * rate + 0.1
    assert re.search(r"sdar / TRL seconds per step: \*\*[\d.]+x\*\*", out)
    # sdar's further steps within TRL's wall-clock (none when sdar's steps were not the faster), then evaluated
    equal = ["sdar at TRL's time"] if data["equal_time"] else []
    trl_s = sum(r["step_s"] for r in trl)
    if equal:
        assert [r["step"] for r in data["equal_time"]] == list(range(2, 2 + len(data["equal_time"])))
        assert sum(r["step_s"] for r in sdar) + sdar[-1]["step_s"] <= trl_s  # the first further step fit
        assert f"Within TRL's wall-clock of {trl_s:.1f} s sdar took {len(data['equal_time'])} more step(s)" in out
        assert len(data["equal_time"]) <= 3 and data["equal_time_cap"] == 3
    policies = {r[0]: r[1:] for r in table_rows(out) if len(r) == 4}
    assert set(policies) == {"warm start", "sdar", "trl", *equal}
    assert set(data["evals"]) == {"warm start", "sdar", "trl", *equal}
    for ev in data["evals"].values():
        assert len(ev["constrained"]["won"]) == len(ev["free"]["won"]) == 2
    pairs = ("sdar - trl", "sdar - warm start", "trl - warm start", *(f"{e} - trl" for e in equal))
    diffs = {r[0]: r[1:] for r in table_rows(out) if r[0] in pairs}
    assert len(diffs) == 3 + len(equal)


def test_vs_trl_takes_sdar_steps_only_while_they_fit_in_trls_time():
    """bench_vs_trl's equal wall-clock: a further sdar step only when the last one's seconds fit in what is left of
    TRL's clock, at most `cap` of them (a fake trainer on a fake clock: the budget's arithmetic, not a model)."""
    from types import SimpleNamespace

    sys.path.insert(0, str(BENCHMARKS))
    try:
        from bench_vs_trl import equal_time_steps
    finally:
        sys.path.pop(0)
    now = [0.0]

    class Trainer:
        def __init__(self, seconds):
            self.seconds, self.steps = seconds, []

        def train_step(self, step):
            self.steps.append(step)
            now[0] += self.seconds[len(self.steps) - 1]
            return SimpleNamespace(metrics={"success": 0.25})

    rows = {"trl": [{"step_s": 10.0}, {"step_s": 10.0}], "sdar": [{"step_s": 4.0}, {"step_s": 4.0}]}
    quiet = SimpleNamespace(print=lambda *a, **k: None)
    ours = Trainer([4.0, 4.0, 4.0, 4.0])  # 8 s spent of TRL's 20: three more 4 s steps fit exactly
    extra = equal_time_steps(ours, rows, 2, cap=8, console=quiet, clock=lambda: now[0])
    assert ours.steps == [2, 3, 4] and [r["step_s"] for r in extra] == [4.0, 4.0, 4.0]
    assert [r["step"] for r in extra] == [2, 3, 4] and extra[0]["success"] == 0.25
    ours = Trainer([5.0, 5.0, 5.0])  # a slower step: 13, 18, and a third (18 + 5 > 20) is not taken
    assert len(equal_time_steps(ours, rows, 2, cap=8, console=quiet, clock=lambda: now[0])) == 2
    ours = Trainer([4.0] * 3)
    assert len(equal_time_steps(ours, rows, 2, cap=1, console=quiet, clock=lambda: now[0])) == 1  # the cap
    ours = Trainer([1.0] * 20)  # no cap (0): TRL's clock alone stops them, 8 + 12 x 1 s = 20 s
    assert len(equal_time_steps(ours, rows, 2, cap=0, console=quiet, clock=lambda: now[0])) == 12
    slow = {"trl": rows["trl"], "sdar": [{"step_s": 11.0}, {"step_s": 11.0}]}  # sdar the slower: nothing more
    assert equal_time_steps(Trainer([1.0]), slow, 2, cap=8, console=quiet, clock=lambda: now[0]) == []


def test_bench_layouts_smollm2_refuses_an_unknown_layout_before_any_run(tmp_path):
    """(A run of one layout, SmolLM2 through bench_train_step.py: test_bench_layouts_smollm2.)"""
    env = {"PYTHON": sys.executable, "CONFIG": "configs/household-tiny.yaml"}
    refused = subprocess.run(["bash", str(BENCHMARKS / "bench_layouts_smollm2.sh"), "--smoke"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, **env, "OUT": str(tmp_path / "refused"), "LAYOUTS": "on packd"})
    assert refused.returncode == 2 and "unknown layout 'packd'" in refused.stderr and "on batched packed plain" in \
        refused.stderr and refused.stdout == "" and not (tmp_path / "refused").exists()


@pytest.mark.slow
def test_bench_omp_wait():
    """Every run of this tree, whatever its OpenMP wait, alone or two at once, plays the same trajectories (the same
    gaps); the before run (HEAD exported from git) runs too; the seconds are figures and the ratios print."""
    out = bench("bench_omp_wait.py", "--model", "", "--dtype", "", "--before", "HEAD", "--before-dtype", "",
                "--steps", "2", "--waits", "passive,spin", "--shared", "spin", *SMALL, timeout_s=600)
    rows = table_rows(out)
    assert [(r[0], r[3], int(r[4])) for r in rows] == [("before", "passive", 1), ("alone", "passive", 1),
                                                      ("alone", "spin 1000", 1), ("shared", "spin 1000", 2),
                                                      ("shared", "spin 1000", 2)]
    for r in rows:
        assert len(r) == 9 and number(r[6]) > 0 and all(number(c) > 0 for c in r[5].split(", "))
    # this tree's runs (the before run is HEAD's committed code, which a working tree under change may not equal)
    assert len({r[7] for r in rows[1:]}) == 1, "the same config and code must play the same trajectories under any wait"
    assert re.search(r"^alone: spin 1000 / passive seconds per step [\d.]+x$", out, re.M)
    # against this tree's fastest wait alone, whichever it was (at the miniature's 0.1-0.3 s a step, either)
    assert re.search(r"^before \(HEAD, config, passive\) / this tree \(config, (passive|spin 1000), alone\): "
                     r"[\d.]+x faster", out, re.M), out
