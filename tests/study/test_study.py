"""`sdar study`: the spec, the resumable runner (real trainer, tiny model) and the analysis."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from sdar.train.checkpoint import checkpoint_path
from sdar.study import parse_spec
from sdar.study.analysis import (
    bootstrap_mean,
    load_results,
    outcome_matrix,
    paired_difference,
    success_rows,
    write_report,
)
from sdar.study.runner import StaleResult, StudyRunner
from sdar.tracking import find_runs
from tests.train.conftest import SMALL

SPEC = {"study": "t", "steps": 2, "eval_steps": [1, 2], "configs": {"household": "configs/household-tiny.yaml"},
        "matrices": [{"families": ["household"], "arms": ["grpo", "sdar"], "seeds": [0]}],
        "set": {**SMALL, "steps": None}}
SPEC["set"].pop("steps")


@pytest.mark.parametrize("change, message", [
    ({"bogus": 1}, "unknown key"),
    ({"eval_steps": [1, 3]}, "must lie in 1..2"),
    ({"eval_steps": [1]}, "end at steps=2"),
    ({"matrices": [{"families": ["shop"], "arms": ["grpo"], "seeds": [0]}]}, "no entry under configs"),
    ({"matrices": [{"families": ["household"], "arms": ["gpro"], "seeds": [0]}]}, "unknown arms ['gpro']"),
    ({"matrices": [{"families": ["household"], "arms": ["grpo"]}]}, "exactly the keys"),
    ({"set": {"seed": 3}}, "'seed' is set by the study itself"),
    ({"study": "a/b"}, "plain directory name"),
    ({"against": "t"}, "must name another study"),
    ({"against": "../x"}, "must name another study"),
])
def test_spec_errors_name_the_problem(change, message):
    with pytest.raises(ValueError, match=None) as exc:
        parse_spec({**SPEC, **change})
    assert message in str(exc.value)


def test_cells_group_the_arms_of_one_warm_start():
    spec = parse_spec({**SPEC, "configs": {"household": "x.yaml", "shop": "y.yaml"}, "matrices": [
        {"families": ["shop", "household"], "arms": ["sdar", "grpo"], "seeds": [1, 0]},
        {"families": ["household"], "arms": ["grpo", "composer"], "seeds": [0]}]})
    names = [c.name for c in spec.cells()]
    assert names == ["household/seed0/sdar", "household/seed0/grpo", "household/seed0/composer",
                     "household/seed1/sdar", "household/seed1/grpo", "shop/seed0/sdar", "shop/seed0/grpo",
                     "shop/seed1/sdar", "shop/seed1/grpo"]
    assert spec.warm_starts() == [("household", 0), ("household", 1), ("shop", 0), ("shop", 1)]


def test_the_fingerprint_ignores_where_and_how_fast_but_not_what():
    """A result stays fresh when only its output place, length or a same-numbers speed-up changes, and goes
    stale when something that shapes the numbers does (the committed household seed-0 runs keep theirs)."""
    from sdar.config import load_config
    from sdar.study.runner import cell_config, config_fingerprint

    base = load_config("configs/household-tiny.yaml")
    same = load_config("configs/household-tiny.yaml", {"scoring.merged_inference": False, "rollout.share_prefix": False,
                                                       "scoring.head_at_free_tokens": False,
                                                       "output_dir": "/elsewhere",
                                                       "steps": 90, "tracking": False})
    assert config_fingerprint(same) == config_fingerprint(base)
    for change in ({"optim.lr": 2e-3}, {"arm": "grpo"}, {"seed": 1}, {"rollout.temperature": 0.9},
                   {"warmstart.pretokenizer": "punct_space"}):  # a field added later counts off its default
        assert config_fingerprint(load_config("configs/household-tiny.yaml", change)) != config_fingerprint(base), change
    committed = json.loads(Path("docs/results/evidence/household/seed0/sdar.json").read_text())["fingerprint"]
    spec = parse_spec(yaml.safe_load(Path("configs/study/evidence.yaml").read_text()))
    cell = next(c for c in spec.cells() if c.name == "household/seed0/sdar")
    assert config_fingerprint(cell_config(spec, cell, Path("/tmp/w"))) == committed


def test_cpu_mixed_precision_counts_in_the_fingerprint_only_where_it_acts():
    """model.cpu_mixed_precision changes a bfloat16 model on a CPU alone: a float32 config's identity ignores it; a
    bfloat16 one's tells its default (true) from false, and false is what records made before the field read as
    (the committed SmolLM2 study, whose spec pins it false, keeps every fingerprint)."""
    from dataclasses import asdict

    from sdar.config import load_config
    from sdar.study.runner import cell_config, config_fingerprint

    tiny = "configs/household-tiny.yaml"
    assert load_config(tiny).model.dtype == "float32"
    assert config_fingerprint(load_config(tiny, {"model.cpu_mixed_precision": False})) == \
        config_fingerprint(load_config(tiny))
    smol = "configs/household-smollm2.yaml"
    on, off = load_config(smol), load_config(smol, {"model.cpu_mixed_precision": False})
    assert on.model.dtype == "bfloat16" and on.model.cpu_mixed_precision is True
    assert config_fingerprint(on) != config_fingerprint(off)
    assert config_fingerprint(load_config(smol, {"device": "cuda"})) == \
        config_fingerprint(load_config(smol, {"device": "cuda", "model.cpu_mixed_precision": False}))
    assert "cpu_mixed_precision" in asdict(off.model)  # present in the dict, dropped from the identity at false
    spec = parse_spec(yaml.safe_load(Path("configs/study/smollm2.yaml").read_text()))
    cells = list(spec.cells())
    assert len(cells) == 9
    for cell in cells:
        committed = json.loads((Path("docs/results/smollm2") / f"{cell.name}.json").read_text())["fingerprint"]
        assert config_fingerprint(cell_config(spec, cell, Path("/tmp/w"))) == committed, cell.name


def test_bootstrap_collapses_on_a_constant_and_matches_the_normal_interval():
    assert bootstrap_mean(np.full((3, 50), 0.25)) == (0.25, 0.25, 0.25)
    rng = np.random.default_rng(1)
    m = (rng.random((1, 400)) < 0.3).astype(float)  # one seed: the interval is over tasks only
    mean, lo, hi = bootstrap_mean(m)
    half = 1.96 * np.sqrt(mean * (1 - mean) / m.size)
    assert mean == m.mean()
    assert abs((hi - lo) / 2 - half) < 0.15 * half
    # seeds that disagree widen the interval beyond the task-only one
    m2 = np.vstack([m, np.clip(m + (rng.random((1, 400)) < 0.4), 0, 1)])
    _, lo2, hi2 = bootstrap_mean(m2)
    assert hi2 - lo2 > hi - lo


def test_paired_difference_mean_interval_and_shapes():
    a = np.zeros((2, 10))
    a[:, :3] = 1.0
    b = np.zeros((2, 10))
    mean, lo, hi = paired_difference(a, b)
    assert mean == pytest.approx(0.3) and 0.0 <= lo < 0.3 < hi <= 0.8
    assert paired_difference(a, a) == (0.0, 0.0, 0.0)  # pairing removes the shared task difficulty
    with pytest.raises(ValueError, match="one shape"):
        paired_difference(a, b[:1])


def test_study_runs_resumes_skips_and_reports(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    spec = parse_spec(SPEC, "test-spec")
    results, work = tmp_path / "results", tmp_path / "work"
    runner = StudyRunner(spec, results, work)
    assert [c.name for c in runner.run()] == ["household/seed0/grpo", "household/seed0/sdar"]

    warm = json.loads((results / "t/household/seed0/warmstart.json").read_text())
    assert set(warm) >= {"student", "teacher", "teacher_gap_free_tokens", "fingerprint"}
    assert len(warm["student"]["tasks"]) == SMALL["eval.tasks"]
    sdar = json.loads((results / "t/household/seed0/sdar.json").read_text())
    assert sorted(sdar["evals"]) == ["1", "2"] and [h["step"] for h in sdar["history"]] == [0, 1]
    tasks = sdar["evals"]["2"]["tasks"]
    assert list(tasks) == list(warm["student"]["tasks"])  # every run plays the same held-out tasks
    assert sdar["evals"]["2"]["success"] == sum(tasks.values()) / len(tasks)
    assert sdar["wall_s"]["total"] == pytest.approx(sdar["wall_s"]["train"] + sdar["wall_s"]["eval"], abs=0.11)

    # MLflow: one experiment, a parent run for the study, a child run per cell with its held-out evaluations
    runs = find_runs("study-t")
    parent = [r for r in runs if r.tags.get("sdar.kind") == "study"]
    assert len(parent) == 1
    children = [r for r in runs if r.parent_run_id == parent[0].run_id]
    assert sorted(r.run_name for r in children) == ["grpo-seed0", "sdar-seed0"]
    assert all("study_eval/success" in r.metrics for r in children)

    # the study's runs side by side from one printed URL, as a comparison's: the arms' runs carry the study's job
    from sdar.tracking.store import mlflow_client
    from sdar.tracking.ui import comparison_view
    from sdar.tracking.view import view_runs

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow_client(uri)
    client.delete_tag(children[0].run_id, "sdar.pipeline_job_id")  # a run logged before studies tagged their job
    view = StudyRunner(spec, results, work).view(port=5123)
    assert view["ui_command"] == f"sdar ui --tracking-uri {uri} --job study-t --port 5123"
    exp_id = client.get_run(parent[0].run_id).info.experiment_id
    assert view["view_url"].startswith(f"http://127.0.0.1:5123/#/experiments/{exp_id}/runs?")
    shown = {r.info.run_name: r for r in view_runs(uri, exp_id, "study-t")}
    assert sorted(shown) == ["grpo-seed0", "sdar-seed0", "warm-start-seed0"]  # the warm start: the bars' reference
    assert comparison_view(uri) == (exp_id, "study-t")  # `sdar ui` on the study's store opens the study
    # the view's charts read what the records say: held-out success at the last eval step, paired with the warm start
    assert shown["warm-start-seed0"].data.metrics["held-out success"] == pytest.approx(warm["student"]["success"])
    assert shown["sdar-seed0"].data.metrics["held-out success"] == pytest.approx(sdar["evals"]["2"]["success"])
    wins = sum(sdar["evals"]["2"]["tasks"][t] - w for t, w in warm["student"]["tasks"].items())
    assert shown["sdar-seed0"].data.metrics["held-out success - own warm start"] == pytest.approx(wins / len(tasks))
    assert len(client.get_metric_history(shown["sdar-seed0"].info.run_id, "training success")) == 2
    StudyRunner(spec, results, work).view()  # once per run: a second call logs nothing again
    assert len(client.get_metric_history(shown["sdar-seed0"].info.run_id, "held-out success")) == 1
    assert len(view_runs(uri, exp_id, "study-t")) == 3

    # a second invocation trains nothing
    assert StudyRunner(spec, results, work).run() == []
    assert [r["state"] for r in StudyRunner(spec, results, work).status()] == ["done", "done"]

    # interrupted after its first segment: the result file gone, the partial record and checkpoint kept
    partial = work / "t/household/seed0/sdar.partial.json"
    rec = dict(sdar)
    rec["evals"] = {"1": sdar["evals"]["1"]}
    rec.pop("history")
    partial.write_text(json.dumps(rec))
    (results / "t/household/seed0/sdar.json").unlink()
    ckpts = work / "t/household/seed0/sdar"  # the run's store: <output>/checkpoints/step-NNNNNN
    assert (ckpts / checkpoint_path(1)).is_dir() and (ckpts / checkpoint_path(2)).is_dir()
    shutil.rmtree(ckpts / checkpoint_path(2))  # the kill came before step 2's checkpoint: resume from step 1
    assert StudyRunner(spec, results, work).status()[1]["state"] == "partial"
    assert [c.name for c in StudyRunner(spec, results, work).run()] == ["household/seed0/sdar"]
    again = json.loads((results / "t/household/seed0/sdar.json").read_text())
    assert again["evals"]["2"]["tasks"] == sdar["evals"]["2"]["tasks"]  # the resumed run lands where it did
    assert [h["step"] for h in again["history"]] == [0, 1]
    assert not partial.exists()

    # the study grows to 3 steps: each run goes on from its checkpoint; the earlier evaluations are kept
    longer = parse_spec({**SPEC, "steps": 3, "eval_steps": [1, 2, 3]}, "test-spec")
    assert [c.name for c in StudyRunner(longer, results, work).run()] == ["household/seed0/grpo", "household/seed0/sdar"]
    grown = json.loads((results / "t/household/seed0/sdar.json").read_text())
    assert sorted(grown["evals"]) == ["1", "2", "3"] and grown["evals"]["2"] == again["evals"]["2"]
    assert grown["steps"] == 3 and [h["step"] for h in grown["history"]] == [0, 1, 2]

    # the grown runs' view: their held-out success at the new last eval step (run with the study's later segments)
    view_now = {r.info.run_name: r for r in view_runs(uri, exp_id, "study-t")}
    StudyRunner(longer, results, work).view()
    grown_run = client.get_run(view_now["sdar-seed0"].info.run_id)
    assert grown_run.data.metrics["held-out success"] == pytest.approx(grown["evals"]["3"]["success"])
    assert grown_run.data.tags["sdar.view_metrics"] == "3"

    # another config under the same study name: refused, naming the fix
    changed = parse_spec({**SPEC, "steps": 3, "eval_steps": [1, 2, 3], "set": {**SPEC["set"], "optim.lr": 5e-4}}, "test-spec")
    with pytest.raises(StaleResult, match="--redo-stale"):
        StudyRunner(changed, results, work).run()

    doc = tmp_path / "results.md"
    doc.write_text("# Results\n\nhand-written text\n")
    block = write_report(results / "t", doc)
    text = doc.read_text()
    assert "hand-written text" in text and "| sdar | 2 | 1 |" in block and "| sdar - grpo | 2 | 1 |" in block
    assert "| grpo - warm start | 1 | 1 | 4 |" in block
    assert (results / "t/figures/household.png").is_file()
    rows = success_rows(load_results(results / "t"), "household")
    assert [r["arm"] for r in rows][:2] == ["warm start (student)", "warm start (teacher)"]
    write_report(results / "t", doc)  # regenerating replaces the block, keeps the rest
    assert doc.read_text().count("<!-- study:t:begin -->") == 1 and "hand-written text" in doc.read_text()

    # a lost result whose checkpoints are past its first eval step: an error, not a mislabelled evaluation
    (results / "t/household/seed0/grpo.json").unlink()
    with pytest.raises(StaleResult, match="past eval step 1"):
        StudyRunner(longer, results, work).run()


def _traj(won, actions, refused=()):
    from sdar.agent.rollout import Trajectory, Turn

    turns = [Turn(view=None, prompt_ids=[], response_ids=[], response_text="", action=a, valid=True,
                  env_valid=i not in refused, reward=0.0) for i, a in enumerate(actions)]
    return Trajectory(task_id="t", task_type="x", group=0, skills="", turns=turns, won=won)


def test_failure_modes_place_each_failed_episode_at_its_furthest_stage():
    from sdar.study.runner import failure_modes

    trajs = [_traj(True, ["take apple 1 from table 1", "move apple 1 to fridge 1"]),
             _traj(False, ["go to table 1", "open drawer 1"], refused=(1,)),
             _traj(False, ["go to table 1", "take apple 1 from table 1"]),
             _traj(False, ["take mug 1 from shelf 1", "move mug 1 to table 1"]),
             _traj(False, ["go to shelf 1", "go to desk 1"])]
    f = failure_modes(trajs)
    assert f == {"failed": 4, "never_took": 2, "took_never_placed": 1, "placed_not_won": 1,
                 "refused_turn_share": 1 / 8}
    assert failure_modes([])["failed"] == 0 and failure_modes([])["refused_turn_share"] == 0.0


@pytest.mark.slow
@pytest.mark.skipif(not __import__("os").environ.get("SDAR_ALFWORLD_DATA"), reason="needs SDAR_ALFWORLD_DATA")
def test_transfer_plays_the_real_engine_and_lands_in_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    spec = parse_spec({**SPEC, "steps": 1, "eval_steps": [1],
                       "matrices": [{"families": ["household"], "arms": ["grpo"], "seeds": [0]}]}, "test-spec")
    results, work = tmp_path / "results", tmp_path / "work"
    runner = StudyRunner(spec, results, work)
    runner.run()
    written = runner.transfer(games=3, env_workers=2)  # the engine in two worker processes
    assert [p.name for p in written] == ["warmstart.transfer.json", "grpo.transfer.json"]
    rec = json.loads(written[1].read_text())
    assert rec["env_workers"] == 2
    # the engine in this process plays the same episodes as in the two workers
    from sdar.study.spec import Cell

    here = runner._transfer_one(Cell("household", "grpo", 0), None, "alfworld", "valid_seen", 3, env_workers=1)
    pooled = json.loads(written[0].read_text())
    assert here["student"]["tasks"] == pooled["student"]["tasks"] and here["env_workers"] == 1
    assert here["student"]["mean_length"] == pooled["student"]["mean_length"]
    assert rec["backend"] == "alfworld" and rec["split"] == "valid_seen" and rec["step"] == 1
    assert len(rec["student"]["tasks"]) == 3 and len(rec["teacher"]["tasks"]) == 3
    assert rec["student"]["failures"]["failed"] == 3 - sum(rec["student"]["tasks"].values())
    assert runner.transfer(games=3) == []  # kept, not played again
    block = write_report(results / "t", tmp_path / "results.md")
    assert "On the real engine (alfworld valid_seen" in block and "| warm start | 1 | 3 |" in block


def test_cli_status_and_only_filter(tmp_path, capsys):
    from sdar.cli import main
    from sdar.study.cli import _only
    from sdar.study.spec import Cell

    spec = tmp_path / "spec.yaml"
    spec.write_text("study: s\nsteps: 4\neval_steps: [2, 4]\nconfigs: {household: configs/household-tiny.yaml}\n"
                    "matrices: [{families: [household], arms: [grpo, sdar], seeds: [0, 1]}]\n")
    assert main(["study", "status", "--spec", str(spec), "--results", str(tmp_path / "r"),
                 "--work", str(tmp_path / "w"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(r["cell"], r["state"]) for r in rows] == [
        ("household/seed0/grpo", "pending"), ("household/seed0/sdar", "pending"),
        ("household/seed1/grpo", "pending"), ("household/seed1/sdar", "pending")]
    # a run trained to a whole checkpoint, nothing evaluated yet (running, or where a rerun resumes): started at
    # that step; an upload cut short (no COMPLETE marker) is not counted
    from sdar.train.checkpoint import COMPLETE_FILE, checkpoint_path

    for step, whole in ((2, True), (3, False)):
        ckpt = tmp_path / "w" / "s" / "household" / "seed1" / "sdar" / checkpoint_path(step)
        ckpt.mkdir(parents=True)
        if whole:
            (ckpt / COMPLETE_FILE).write_text("")
    assert main(["study", "status", "--spec", str(spec), "--results", str(tmp_path / "r"),
                 "--work", str(tmp_path / "w"), "--json"]) == 0
    shown = capsys.readouterr().out
    rows = json.loads(shown.strip().splitlines()[-1])
    assert [(r["state"], r["checkpoint"]) for r in rows] == [("pending", None)] * 3 + [("started", 2)]
    assert "step 2" in shown and "0/4 runs done" in shown
    keep = _only("arm=sdar,seed=0+1")
    assert [keep(Cell("household", a, s)) for a, s in (("sdar", 0), ("sdar", 1), ("grpo", 0))] == [True, True, False]
    with pytest.raises(SystemExit, match="keys family, arm, seed"):
        _only("step=3")


def test_a_seed_trains_only_on_the_warm_start_its_record_was_made_with(tmp_path, monkeypatch):
    """Arms are paired by seed, so a warm start rebuilt (an emptied cache, another machine) must be the same one
    bit for bit: the step-0 record carries its digest; older records are checked once by replaying their step-0
    student evaluation, then get the digest."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    one = {**SPEC, "steps": 1, "eval_steps": [1], "matrices": [{"families": ["household"], "arms": ["grpo"], "seeds": [0]}]}
    spec = parse_spec(one, "test-spec")
    results, work = tmp_path / "results", tmp_path / "work"
    StudyRunner(spec, results, work).run()
    warm_path, grpo = results / "t/household/seed0/warmstart.json", results / "t/household/seed0/grpo.json"
    warm = json.loads(warm_path.read_text())
    assert len(warm["warm_start_digest"]) == 16

    def rerun(edit):  # the run gone (its result and checkpoints), the step-0 record edited, the cell trained again
        rec = json.loads(warm_path.read_text())
        edit(rec)
        warm_path.write_text(json.dumps(rec))
        grpo.unlink()
        shutil.rmtree(work / "t/household/seed0/grpo")
        return StudyRunner(spec, results, work).run()

    # a record from before digests whose outcomes the warm start replays: trained, and the digest filled in
    assert [c.name for c in rerun(lambda r: r.pop("warm_start_digest"))] == ["household/seed0/grpo"]
    assert json.loads(warm_path.read_text())["warm_start_digest"] == warm["warm_start_digest"]

    # one task's recorded outcome differs from the replay: another warm start, refused before any training
    def flip(r):
        r.pop("warm_start_digest")
        task = next(iter(r["student"]["tasks"]))
        r["student"]["tasks"][task] = 1 - r["student"]["tasks"][task]

    with pytest.raises(StaleResult, match="does not replay the step-0 evaluation .*1 of 4 held-out tasks differ"):
        rerun(flip)
    assert not (work / "t/household/seed0/grpo").exists()

    # a recorded digest other than the rebuilt warm start's: refused
    warm_path.write_text(json.dumps({**warm, "warm_start_digest": "0" * 16}))
    with pytest.raises(StaleResult, match="is not the one .* records \\(digest 0000000000000000\\)"):
        StudyRunner(spec, results, work).run()
    warm_path.write_text(json.dumps(warm))
    assert [c.name for c in StudyRunner(spec, results, work).run()] == ["household/seed0/grpo"]


def test_the_committed_gpu_cells_are_their_specs_and_apart_from_the_cpu_study():
    """configs/study/evidence-cuda.yaml's committed results are fresh under it, and `device: cuda` keeps them out
    of the CPU study (their fingerprints differ from the same cells of configs/study/evidence.yaml)."""
    from sdar.study.runner import cell_config, config_fingerprint

    gpu = parse_spec(yaml.safe_load(Path("configs/study/evidence-cuda.yaml").read_text()))
    cpu = parse_spec(yaml.safe_load(Path("configs/study/evidence.yaml").read_text()))
    assert [c.name for c in gpu.cells()] == ["household/seed0/grpo", "household/seed0/grpo_opsd", "household/seed0/sdar"]
    for cell in gpu.cells():
        rec = json.loads(Path(f"docs/results/evidence-cuda/{cell.name}.json").read_text())
        fp = config_fingerprint(cell_config(gpu, cell, Path("/tmp/w")))
        assert rec["fingerprint"] == fp and sorted(rec["evals"]) == ["30", "60"] and len(rec["history"]) == 60
        assert rec["machine"]["cuda"] and fp != config_fingerprint(cell_config(cpu, cell, Path("/tmp/w")))
    # the GPU-sized study (point 6, not run yet) parses, and its cells are the GPU config's on cuda
    big = parse_spec(yaml.safe_load(Path("configs/study/evidence-gpu.yaml").read_text()))
    assert len(big.cells()) == 9 and big.configs == {"household": "configs/household-tiny-gpu.yaml"}
    cfg = cell_config(big, big.cells()[0], Path("/tmp/w"))
    assert cfg.device == "cuda" and cfg.tasks_per_step == 8 and cfg.eval.tasks == 240


def test_the_composer_arms_are_compared_with_grpo_and_sdar_on_the_committed_runs():
    """The committed household seed-0 Composer runs: each Composer arm against grpo, sdar_composer also against
    sdar (what channels 2 and 3 add to SDAR); the paired mean is the difference of the two success rates."""
    from sdar.study.analysis import difference_rows, load_results

    r = load_results("docs/results/evidence")
    rows = {(x["a"], x["b"], x["step"]): x for x in difference_rows(r, "household")}
    for arm in ("grpo_hint", "grpo_replay", "composer", "sdar_composer"):
        assert (arm, "grpo", 60) in rows and (arm, "warm start", 60) in rows
    assert {(a, b) for a, b, _ in rows if b == "sdar"} == {("sdar_composer", "sdar")}
    root = Path("docs/results/evidence/household")
    diffs = []
    for seed_dir in sorted(root.glob("seed*")):
        got = {arm: json.loads((seed_dir / f"{arm}.json").read_text())["evals"]["60"]["success"]
               for arm in ("sdar", "sdar_composer") if (seed_dir / f"{arm}.json").is_file()}
        if len(got) == 2:
            diffs.append(got["sdar_composer"] - got["sdar"])
    row = rows[("sdar_composer", "sdar", 60)]
    # the same 120 tasks per seed: the paired mean is the mean over seeds of the two success rates' difference
    assert row["seeds"] == len(diffs) >= 1 and row["ci"][0] == pytest.approx(sum(diffs) / len(diffs))
    assert row["ci"][1] <= row["ci"][0] <= row["ci"][2]


def _transfer_rec(seed: int, who: str, outcomes: list[int]) -> dict:
    tasks = {f"g{i}": o for i, o in enumerate(outcomes)}
    student = {"success": sum(outcomes) / len(outcomes), "tasks": tasks, "per_type": {"x": {"success": 0.0, "n": 0}},
               "failures": {"failed": outcomes.count(0), "never_took": outcomes.count(0), "took_never_placed": 0,
                            "placed_not_won": 0, "refused_turn_share": 0.0}}
    return {"family": "household", "seed": seed, "who": who, "step": 0 if who == "warmstart" else 60,
            "backend": "alfworld", "split": "valid_seen",
            "student": student, "teacher": {"success": 0.5}}


def test_transfer_differences_pair_each_policy_with_its_own_warm_start():
    """Policy - warm start on the real engine: paired by seed and game, over the seeds where both were played."""
    from sdar.study.analysis import Runs, transfer_difference_rows, transfer_lines

    r = Runs(name="t", spec={})
    r.transfer[("household", 0, "warmstart")] = _transfer_rec(0, "warmstart", [1, 0, 0, 0])
    r.transfer[("household", 1, "warmstart")] = _transfer_rec(1, "warmstart", [1, 1, 0, 0])
    r.transfer[("household", 2, "warmstart")] = _transfer_rec(2, "warmstart", [0, 0, 0, 0])
    r.transfer[("household", 0, "grpo")] = _transfer_rec(0, "grpo", [1, 1, 1, 0])   # +2 games at seed 0
    r.transfer[("household", 1, "grpo")] = _transfer_rec(1, "grpo", [0, 1, 0, 0])   # -1 game at seed 1
    r.transfer[("household", 2, "sdar")] = _transfer_rec(2, "sdar", [0, 0, 1, 0])   # one seed only
    r.transfer[("household", 3, "grpo_opsd")] = _transfer_rec(3, "grpo_opsd", [1, 1, 1, 1])  # no warm start: no row
    rows = {x["a"]: x for x in transfer_difference_rows(r, "household")}
    assert set(rows) == {"grpo", "sdar"} and rows["grpo"]["b"] == "warm start"
    assert rows["grpo"]["seeds"] == 2 and rows["grpo"]["tasks"] == 4
    assert rows["grpo"]["ci"][0] == pytest.approx((2 - 1) / 8)  # (+2 - 1) games over 2 seeds x 4 games
    assert rows["sdar"]["seeds"] == 1 and rows["sdar"]["ci"][0] == pytest.approx(0.25)
    lo, hi = rows["grpo"]["ci"][1:]
    assert lo <= 0.125 <= hi
    text = "\n".join(transfer_lines(r, "household"))
    assert "| grpo | 2 | 4 | 0.500 [" in text and "| 0.750, 0.250 |" in text  # pooled student, per seed
    assert "| warm start | 3 | 4 | 0.250 [" in text and "| 0.250, 0.500, 0.000 |" in text
    assert "| grpo - warm start | 2 | 4 | +0.125 [" in text and "grpo_opsd - warm start" not in text


def _eval(outcomes: list[int]) -> dict:
    return {"success": sum(outcomes) / len(outcomes), "tasks": {f"t{i}": o for i, o in enumerate(outcomes)}}


def _study_dir(root: Path, name: str, warm: dict, runs: dict, digest: str = "d0", against: str | None = None) -> Path:
    """A study's results as the runner writes them: warm[seed] = outcomes, runs[(arm, seed)] = {step: outcomes}."""
    d = root / name
    (d / "household").mkdir(parents=True)
    (d / "spec.json").write_text(json.dumps({"study": name, "steps": 16, "eval_steps": [8, 16],
                                             **({"against": against} if against else {})}))
    for seed, outcomes in warm.items():
        (d / "household" / f"seed{seed}").mkdir(exist_ok=True)
        (d / "household" / f"seed{seed}" / "warmstart.json").write_text(json.dumps(
            {"family": "household", "seed": seed, "warm_start_digest": digest, "student": _eval(outcomes),
             "teacher": _eval([1] * len(outcomes))}))
    for (arm, seed), evals in runs.items():
        (d / "household" / f"seed{seed}").mkdir(exist_ok=True)
        (d / "household" / f"seed{seed}" / f"{arm}.json").write_text(json.dumps(
            {"family": "household", "seed": seed, "arm": arm, "evals": {str(k): _eval(v) for k, v in evals.items()}}))
    return d


def test_a_study_against_the_one_it_varies_pairs_each_run_with_the_same_arm_and_seed(tmp_path):
    """`against`: each run minus the same arm at the same seed in the other study, paired by seed and task (by hand
    below), the warm starts first; a run the other study lacks gets no row; a study that ran no grpo is also paired
    with the other's grpo; the report carries the table."""
    from sdar.study.analysis import against_rows

    base = _study_dir(tmp_path, "slow", warm={0: [1, 0, 0, 1], 1: [1, 1, 0, 0]},
                      runs={("grpo", 0): {8: [1, 0, 0, 0], 16: [0, 0, 0, 0]}, ("grpo", 1): {8: [1, 1, 0, 0], 16: [1, 0, 0, 0]},
                            ("sdar", 0): {8: [1, 0, 0, 1], 16: [1, 0, 0, 1]}})
    here = _study_dir(tmp_path, "fast", warm={0: [1, 0, 0, 1], 1: [1, 1, 0, 0]}, against="slow",
                      runs={("grpo", 0): {8: [1, 0, 0, 1], 16: [1, 1, 0, 1]}, ("grpo", 1): {8: [1, 1, 0, 0], 16: [1, 1, 0, 0]},
                            ("sdar", 0): {8: [1, 0, 0, 1], 16: [0, 0, 0, 1]}, ("sdar", 1): {8: [0, 0, 0, 0], 16: [0, 0, 0, 0]}})
    rows = {(x["a"], x["step"]): x for x in against_rows(load_results(here), load_results(base), "household")}
    assert set(rows) == {("warm start (fast)", 0), ("grpo (fast)", 8), ("grpo (fast)", 16), ("sdar (fast)", 8),
                         ("sdar (fast)", 16)}
    assert rows[("warm start (fast)", 0)]["ci"] == (0.0, 0.0, 0.0) and rows[("warm start (fast)", 0)]["b"] == \
        "warm start (slow)"
    g16 = rows[("grpo (fast)", 16)]  # seed 0: 3 of 4 against 0 of 4; seed 1: 2 against 1
    assert g16["b"] == "grpo (slow)" and g16["seeds"] == 2 and g16["tasks"] == 4
    assert g16["ci"][0] == pytest.approx((3 + 1) / 8) and g16["per_seed"] == [0.75, 0.25]
    assert g16["ci"][1] <= g16["ci"][0] <= g16["ci"][2]
    s16 = rows[("sdar (fast)", 16)]  # seed 1 has no sdar run in "slow": seed 0 alone
    assert s16["seeds"] == 1 and s16["ci"][0] == pytest.approx(-0.25) and s16["per_seed"] == [-0.25]

    block = write_report(here, tmp_path / "results.md", figure_dir=tmp_path / "fig")  # the spec's `against`
    assert "Against study `slow` (each run minus the same arm at the same seed there" in block
    assert "the same warm start at every seed both evaluated (0, 1)" in block
    assert "| grpo (fast) - grpo (slow) | 16 | 2 | 4 | +0.500 [" in block and "| +0.750, +0.250 |" in block
    assert "| warm start (fast) - warm start (slow) | 0 | 2 | 4 | +0.000 [+0.000, +0.000] | +0.000, +0.000 |" in block
    assert "Against study" not in write_report(base, tmp_path / "results.md", figure_dir=tmp_path / "fig")
    # a study without grpo of its own (one arm rerun) is also paired with the other study's grpo
    alone = _study_dir(tmp_path, "alone", warm={0: [1, 0, 0, 1], 1: [1, 1, 0, 0]}, against="slow",
                       runs={("sdar", 0): {16: [1, 1, 1, 1]}, ("sdar", 1): {16: [1, 1, 0, 0]}})
    pairs = {(x["a"], x["b"], x["step"]): x for x in against_rows(load_results(alone), load_results(base), "household")}
    assert set(pairs) == {("warm start (alone)", "warm start (slow)", 0), ("sdar (alone)", "sdar (slow)", 16),
                          ("sdar (alone)", "grpo (slow)", 16)}  # "alone" evaluated step 16 only
    vs_grpo = pairs[("sdar (alone)", "grpo (slow)", 16)]  # seed 0: 4 of 4 against 0; seed 1: 2 against 1
    assert vs_grpo["seeds"] == 2 and vs_grpo["per_seed"] == [1.0, 0.25] and vs_grpo["ci"][0] == pytest.approx(5 / 8)
    assert pairs[("sdar (alone)", "sdar (slow)", 16)]["seeds"] == 1  # seed 1 has no sdar in "slow"
    assert "and minus slow's grpo, which this study did not run" in write_report(alone, tmp_path / "a.md",
                                                                                  figure_dir=tmp_path / "fig")
    # ... unless that study ran no grpo either: the header then claims no such rows
    no_grpo = _study_dir(tmp_path, "bare", warm={0: [1, 0, 0, 1]}, runs={("sdar", 0): {16: [0, 0, 0, 1]}})
    lone_rows = against_rows(load_results(alone), load_results(no_grpo), "household")
    assert {(x["a"], x["b"]) for x in lone_rows} == {("warm start (alone)", "warm start (bare)"),
                                                    ("sdar (alone)", "sdar (bare)")}
    lone = write_report(alone, tmp_path / "a.md", figure_dir=tmp_path / "fig", against="bare")
    assert "| sdar (alone) - sdar (bare) | 16 | 1 | 4 | +0.750 [" in lone and "'s grpo" not in lone
    # another warm start is said; a study that is not there is an error naming it and the way out
    other = _study_dir(tmp_path, "other", warm={0: [1, 0, 0, 1]}, runs={("grpo", 0): {16: [0, 0, 0, 0]}}, digest="d1")
    assert "different warm starts at seed(s) 0" in write_report(here, tmp_path / "r.md", tmp_path / "fig",
                                                                against="other")
    nameless = json.loads((other / "household" / "seed0" / "warmstart.json").read_text())
    del nameless["warm_start_digest"]
    (other / "household" / "seed0" / "warmstart.json").write_text(json.dumps(nameless))
    assert "whether the warm starts are the same weights is unknown" in write_report(here, tmp_path / "r.md",
                                                                                     tmp_path / "fig", against="other")
    with pytest.raises(FileNotFoundError, match="compared against study gone, whose results are not in .*drop `against`"):
        write_report(here, tmp_path / "r.md", tmp_path / "fig", against="gone")
    # held-out tasks that differ cannot be paired
    (other / "household" / "seed0" / "warmstart.json").write_text(json.dumps(
        {"family": "household", "seed": 0, "warm_start_digest": "d0", "student": _eval([1, 0, 0]),
         "teacher": _eval([1, 1, 1])}))
    with pytest.raises(ValueError, match="studies fast and other evaluated household on different held-out tasks"):
        against_rows(load_results(here), load_results(other), "household")


def test_a_study_whose_against_is_not_there_is_said_at_once_and_reported_without_it(tmp_path, capsys):
    """`sdar study run --report` warns before any training that the study it is compared against has no results
    beside it, and writes the report without that table; `sdar study report` stops with one line naming it."""
    from sdar.cli import main

    spec = tmp_path / "spec.yaml"
    spec.write_text("study: s\nagainst: gone\nsteps: 4\neval_steps: [2, 4]\n"
                    "configs: {household: configs/household-tiny.yaml}\n"
                    "matrices: [{families: [household], arms: [grpo], seeds: [0]}]\n")
    doc = tmp_path / "results.md"
    assert main(["study", "run", "--spec", str(spec), "--results", str(tmp_path / "r"), "--work", str(tmp_path / "w"),
                 "--max-runs", "0", "--report", str(doc)]) == 0
    err = capsys.readouterr().err
    assert "warning: study s is compared against study gone, whose results are not in" in " ".join(err.split())
    assert err.index("warning") < err.index("run(s) trained now")
    assert "Study `s`" in doc.read_text() and "Against study" not in doc.read_text()
    assert json.loads((tmp_path / "r" / "s" / "spec.json").read_text())["against"] == "gone"
    with pytest.raises(SystemExit, match=r"^error: study s is compared against study gone, .*drop `against`$"):
        main(["study", "report", "--results", str(tmp_path / "r"), "--study", "s", "--doc", str(doc)])
    with pytest.raises(SystemExit, match=r"^error: .*nothere holds no study results"):
        main(["study", "report", "--results", str(tmp_path / "r"), "--study", "nothere", "--doc", str(doc)])


@pytest.mark.parametrize("spec, base, tasks", [("smollm2-lr3e-5", "smollm2", 48), ("smollm2-filtered", "smollm2", 48),
                                              ("hint-alpha", "evidence", 120)])
def test_the_committed_studies_pair_with_the_study_they_vary_run_for_run(spec, base, tasks):
    """The committed specs that vary another study name it; on the committed results each finished run's row is
    its success minus the same arm and seed's there (the same held-out tasks), its interval paired_difference's over
    the two outcome matrices built here from the JSON, and the warm starts are equal."""
    from sdar.study.analysis import against_rows
    from sdar.study.spec import load_spec

    s = load_spec(f"configs/study/{spec}.yaml")
    assert s.against == base
    here, there = load_results(f"docs/results/{s.name}"), load_results(f"docs/results/{base}")
    assert here.spec["against"] == base  # the results directory's spec.json says it too
    rows = against_rows(here, there, "household")
    assert rows[0]["a"] == f"warm start ({s.name})" and rows[0]["tasks"] == tasks and rows[0]["ci"] == (0.0, 0.0, 0.0)
    assert len(rows) > 1
    for row in rows[1:]:
        arm, other, step = row["a"].split(" (")[0], row["b"].split(" (")[0], str(row["step"])
        assert row["a"] == f"{arm} ({s.name})" and row["b"] == f"{other} ({base})"
        assert other == arm or (other == "grpo" and "grpo" not in here.arms("household"))
        seeds = here.seeds("household", arm)
        a = [here.runs[("household", x, arm)]["evals"][step] for x in seeds]
        b = [there.runs[("household", x, other)]["evals"][step] for x in seeds]
        assert row["per_seed"] == pytest.approx([x["success"] - y["success"] for x, y in zip(a, b)])
        order = list(a[0]["tasks"])
        assert row["ci"] == pytest.approx(paired_difference(outcome_matrix(a, order), outcome_matrix(b, order)))
        assert row["ci"][0] == pytest.approx(np.mean(row["per_seed"]))
    at = {(r["a"], r["b"], r["step"]): [f"{x:+.3f}" for x in r["ci"]] for r in rows}
    if spec == "hint-alpha":  # the figures docs/results.md quoted from a hand-written script before `against` existed
        assert at[("grpo_hint (hint-alpha-0.01)", "grpo_hint (evidence)", 60)] == ["+0.308", "+0.142", "+0.492"]
        assert at[("grpo_hint (hint-alpha-0.01)", "grpo (evidence)", 60)] == ["+0.054", "-0.042", "+0.142"]
    else:  # a study that ran grpo itself is paired arm for arm only
        assert all(r["a"].split(" (")[0] == r["b"].split(" (")[0] for r in rows)


@pytest.mark.parametrize("path", sorted(Path("configs/study").glob("*.yaml")), ids=lambda p: p.name)
def test_every_study_spec_parses_and_builds_each_cells_config(path, tmp_path):
    """A committed spec whose cells do not load fails here, not hours into a run."""
    from sdar.study.runner import cell_config

    spec = parse_spec(yaml.safe_load(path.read_text()), str(path))
    cells = spec.cells()
    assert cells
    for cell in cells:
        cfg = cell_config(spec, cell, tmp_path)
        assert (cfg.arm, cfg.seed) == (cell.arm, cell.seed)
        for key, value in spec.overrides_for(cell.family).get("arm_overrides", {}).items():
            assert getattr(cfg.resolved_arm(), key) == value


def test_a_study_of_several_families_names_each_run_with_its_family(tmp_path):
    """evidence.yaml's shape (household, shop, search-QA): every family has a `grpo-seed0`, so the view names each
    run with its family. The records are written by hand (the view reads only their evaluations and run ids); the
    runs are real MLflow runs in a real sqlite store."""
    from sdar.tracking import prepare_sqlite_store
    from sdar.tracking.store import mlflow_client
    from sdar.tracking.view import view_runs

    spec = parse_spec({**SPEC, "configs": {"household": "configs/household-tiny.yaml", "shop": "configs/shop-tiny.yaml"},
                       "matrices": [{"families": ["household", "shop"], "arms": ["grpo"], "seeds": [0]}]})
    runner = StudyRunner(spec, tmp_path / "results", tmp_path / "work")
    uri = prepare_sqlite_store(tmp_path / "mlflow.db")
    client = mlflow_client(uri)
    exp = client.create_experiment("study-t")
    parent = client.create_run(exp, run_name="study-t").info.run_id
    runner.work.mkdir(parents=True)
    (runner.work / "parent_run.json").write_text(json.dumps({"tracking_uri": uri, "run_id": parent}))
    tasks = {"household": {"a": 1, "b": 0, "c": 1}, "shop": {"x": 0, "y": 0, "z": 1}}
    for cell in spec.cells():
        run = client.create_run(exp, run_name=f"{cell.arm}-seed{cell.seed}", tags={
            "mlflow.parentRunId": parent, "arm": cell.arm, "family": cell.family})
        client.set_terminated(run.info.run_id, "FINISHED")
        ev = {"success": sum(tasks[cell.family].values()) / 3, "tasks": tasks[cell.family]}
        for path, rec in ((runner.warmstart_path(cell.family, cell.seed), {"student": {**ev, "success": 1 / 3}}),
                          (runner.result_path(cell), {"evals": {"1": ev, "2": ev}, "run_id": run.info.run_id,
                                                      "history": []})):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(rec))
    view = runner.view()
    shown = {r.info.run_name: r for r in view_runs(uri, exp, view["job_id"])}
    assert sorted(shown) == ["grpo-household-seed0", "grpo-shop-seed0", "warm-start-household-seed0",
                             "warm-start-shop-seed0"]
    assert shown["grpo-household-seed0"].data.metrics["held-out success"] == pytest.approx(2 / 3)
    assert shown["grpo-shop-seed0"].data.metrics["held-out success"] == pytest.approx(1 / 3)
    assert runner.view() == view  # a second call renames nothing twice
    assert sorted(r.info.run_name for r in view_runs(uri, exp, view["job_id"])) == sorted(shown)
