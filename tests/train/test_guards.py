"""A bad update never poisons a run: non-finite weights are restored, never checkpointed, never resumed
from, and a run whose updates were mostly skipped fails with a message (issue: hardened training)."""

from __future__ import annotations

import pytest
import torch

from sdar.storage import open_store
from sdar.train.checkpoint import (COMPLETE_FILE, LATEST_MARKER, STATE_FILE, checkpoint_path, latest_checkpoint,
                                   list_checkpoints)
from sdar.train.guards import TrainingFailed
from sdar.train.strategy import WEIGHTS_FILE

from .conftest import SMALL, as_sets, make_trainer, small_config


def _weights(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def test_an_update_that_breaks_the_policy_is_restored_and_the_run_fails_loudly(tiny_ckpt, tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    # lr 1e30: Adam moves every weight by ~1e30, finite numbers whose forward overflows
    trainer = make_trainer(small_config(tmp_path, arm="sdar", steps=2, **{"optim.lr": 1e30}))
    before = _weights(trainer)
    with pytest.raises(TrainingFailed, match=r"updates were skipped.*optim.max_skipped_update_frac"):
        trainer.run()
    assert trainer.guard.skipped == trainer.guard.attempted >= 2
    after = _weights(trainer)
    assert all(torch.equal(before[n], after[n]) for n in before)  # restored, exactly
    # step 2 ran on healthy weights (a poisoned rollout would have raised in multinomial) and was saved
    store = open_store(str(tmp_path))
    assert latest_checkpoint(store)[0] == 2
    runs = MlflowClient(mlflow_uri).search_runs(
        [MlflowClient(mlflow_uri).get_experiment_by_name("household-tiny").experiment_id])
    assert runs[0].info.status == "FAILED"


def test_without_the_guard_the_same_update_breaks_the_next_rollout(tiny_ckpt, tmp_path):
    # what the guard prevents (and what happened before it): the next step's sampling fails
    trainer = make_trainer(small_config(tmp_path, arm="sdar", steps=2, **{"optim.lr": 1e30, "optim.guard_updates": False}, tracking=False))
    trainer.train_step(0)
    with pytest.raises(RuntimeError):
        trainer.train_step(1)


def test_a_run_whose_updates_never_hold_exits_3_with_one_line(tiny_ckpt, tmp_path, mlflow_uri, capsys):
    """Through `sdar train`: every update overflows the policy (lr 1e30), each is skipped, and the command exits 3
    with the guard's message, no traceback; a non-finite setting is refused before any step (exit 2)."""
    from sdar.cli import main

    sets = as_sets({**SMALL, "arm": "grpo", "optim.lr": 1e30})
    assert main(["train", "--config", "configs/household-tiny.yaml", "--output", str(tmp_path), *sets]) == 3
    err = capsys.readouterr().err
    assert "updates were skipped" in err and "optim.max_skipped_update_frac" in err and "Traceback" not in err
    assert main(["train", "--config", "configs/household-tiny.yaml", "--output", str(tmp_path / "nan"),
                 *as_sets({**SMALL, "arm_overrides.kl_coef": ".nan"})]) == 2
    assert "arm_overrides.kl_coef=nan is not a finite number" in capsys.readouterr().err
    assert not (tmp_path / "nan").exists()


def test_resume_passes_over_a_checkpoint_with_non_finite_weights(tiny_ckpt, tmp_path):
    make_trainer(small_config(tmp_path, arm="grpo", steps=2, tracking=False, **{"checkpoint.keep": 3})).run()
    store = open_store(str(tmp_path))
    assert [s for s, _ in list_checkpoints(store)] == [1, 2]
    # poison step 2's weights in place (as an unguarded run with a diverged update would have saved them)
    local = tmp_path / "poison"
    store.get_dir(checkpoint_path(2), local)
    weights = torch.load(local / WEIGHTS_FILE, weights_only=True)
    torch.save({k: v * float("nan") for k, v in weights.items()}, local / WEIGHTS_FILE)
    store.put_file(local / WEIGHTS_FILE, f"{checkpoint_path(2)}/{WEIGHTS_FILE}")
    resumed = make_trainer(small_config(tmp_path, arm="grpo", steps=3, tracking=False))
    assert resumed.resume() and resumed.step == 1
    assert all(torch.isfinite(p).all() for p in resumed.params)


def test_a_newer_complete_checkpoint_wins_over_a_stale_marker(tiny_ckpt, tmp_path):
    make_trainer(small_config(tmp_path, arm="grpo", steps=2, tracking=False, **{"checkpoint.keep": 3})).run()
    store = open_store(str(tmp_path))
    # killed between step 2's _COMPLETE.json and latest.json: the marker still names step 1
    store.write_json(LATEST_MARKER, {"step": 1, "path": checkpoint_path(1)})
    assert store.exists(f"{checkpoint_path(2)}/{COMPLETE_FILE}")
    assert latest_checkpoint(store) == (2, checkpoint_path(2))


# ---- resume is exact in the tracking store too ---------------------------------------------------------
def test_a_step_replayed_after_a_kill_is_not_logged_twice(tiny_ckpt, tmp_path, mlflow_uri, monkeypatch):
    from mlflow.tracking import MlflowClient

    import sdar.train.trainer as tr

    real = tr.Trainer.save_checkpoint

    def killed_at_3(self, step):
        if step == 3:  # step index 2 is logged, its checkpoint never written: the process dies here
            raise KeyboardInterrupt("kill")
        real(self, step)

    monkeypatch.setattr(tr.Trainer, "save_checkpoint", killed_at_3)
    with pytest.raises(KeyboardInterrupt):
        make_trainer(small_config(tmp_path, arm="grpo", steps=3, **{"checkpoint.every": 2})).run()
    monkeypatch.setattr(tr.Trainer, "save_checkpoint", real)
    summary = make_trainer(small_config(tmp_path, arm="grpo", steps=3, **{"checkpoint.every": 2})).run()
    client = MlflowClient(mlflow_uri)
    for key in ("loss/pg", "reward", "success", "tokens/forced_frac"):
        assert sorted(m.step for m in client.get_metric_history(summary["run_id"], key)) == [0, 1, 2], key


def test_two_runs_cannot_share_an_output_directory(tiny_ckpt, tmp_path):
    from sdar.train.loop import output_dir_lock

    trainer = make_trainer(small_config(tmp_path, arm="grpo", steps=1, tracking=False))
    with output_dir_lock(trainer.out):  # another run holds it
        with pytest.raises(RuntimeError, match=r"in use by another training run \(pid \d+\).*another output directory"):
            trainer.run()
    assert trainer.run()["steps"] == 1  # free again


def test_a_run_killed_before_its_first_checkpoint_is_closed_on_the_next_start(tiny_ckpt, tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    from sdar.tracking import Tracker

    # what kill -9 before the first checkpoint leaves: a RUNNING run that nothing will resume
    out = str((tmp_path).resolve())
    dead = Tracker("household-tiny", run_name="grpo-seed0", tags={"sdar.output_dir": out}).start()
    other = Tracker("household-tiny", run_name="elsewhere", tags={"sdar.output_dir": out + "-other"}).start()
    summary = make_trainer(small_config(tmp_path, arm="grpo", steps=1)).run()
    client = MlflowClient(mlflow_uri)
    assert client.get_run(dead.run_id).info.status == "KILLED"
    assert client.get_run(other.run_id).info.status == "RUNNING"  # another directory's run is left alone
    assert client.get_run(summary["run_id"]).info.status == "FINISHED"


def test_a_killed_upload_leaves_no_temporary_file_behind(tmp_path):
    from sdar.train.checkpoint import write_checkpoint

    store = open_store(str(tmp_path / "store"))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "w.pt").write_bytes(b"x" * 10)
    write_checkpoint(store, 1, ckpt)
    leftover = tmp_path / "store" / "checkpoints" / "step-000001" / ".w.pt.sdar-tmp-abc"
    leftover.write_bytes(b"half")  # kill -9 between the temp file and its rename
    write_checkpoint(store, 2, ckpt)
    assert not leftover.exists()
    assert not list((tmp_path / "store").rglob("*sdar-tmp*"))


# ---- a damaged newest checkpoint: resume falls back, says so, keeps the damaged one -----------------------
def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _scramble(path):  # the same size (the manifest's check passes), bytes that torch cannot read
    path.write_bytes(bytes(b ^ 0x5A for b in path.read_bytes()))


DAMAGE = {
    "weights truncated": (WEIGHTS_FILE, _truncate, "trainable.pt is"),
    "state truncated": (STATE_FILE, _truncate, "trainer_state.pt is"),
    "state scrambled": (STATE_FILE, _scramble, "trainer_state.pt does not load"),
    "weights missing": (WEIGHTS_FILE, lambda p: p.unlink(), "trainable.pt is missing"),
    "manifest garbage": (COMPLETE_FILE, lambda p: p.write_text("{not json"), "_COMPLETE.json does not read"),
}


@pytest.fixture(scope="module")
def two_steps(tiny_ckpt, tmp_path_factory):
    """A finished 2-step run with checkpoints at steps 1 and 2 (copied by each test before it damages one)."""
    out = tmp_path_factory.mktemp("two-steps")
    make_trainer(small_config(out, arm="grpo", steps=2, tracking=False, **{"checkpoint.keep": 3})).run()
    return out


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_resume_falls_back_from_a_damaged_newest_checkpoint(two_steps, tmp_path, kind, capsys):
    import shutil

    from sdar.train.checkpoint import DAMAGED_DIR, DAMAGED_FILE

    shutil.copytree(two_steps / "checkpoints", tmp_path / "checkpoints")
    name, damage, why = DAMAGE[kind]
    damage(tmp_path / checkpoint_path(2) / name)
    resumed = make_trainer(small_config(tmp_path, arm="grpo", steps=3, tracking=False, **{"checkpoint.keep": 3}))
    assert resumed.resume() and resumed.step == 1
    said = "".join(capsys.readouterr())
    assert "step-000002 cannot be loaded" in said and why in said and "kept, not deleted" in said, said
    # moved aside with the reason, never deleted; out of what resume and pruning look at
    (moved,) = (tmp_path / DAMAGED_DIR).iterdir()
    assert moved.name.startswith("step-000002-") and why in (moved / DAMAGED_FILE).read_text()
    assert (moved / name).exists() or name == WEIGHTS_FILE and kind == "weights missing"
    assert [s for s, _ in list_checkpoints(open_store(str(tmp_path)))] == [1]
    # and the run goes on from step 1 to its end
    assert resumed.run()["steps"] == 3
    assert [s for s, _ in list_checkpoints(open_store(str(tmp_path)))] == [1, 2, 3]
    assert moved.exists()


def test_resume_reads_past_a_garbage_marker(two_steps, tmp_path, capsys):
    import shutil

    shutil.copytree(two_steps / "checkpoints", tmp_path / "checkpoints")
    marker = tmp_path / LATEST_MARKER
    marker.write_bytes(b"\x00\x01 not a marker")
    resumed = make_trainer(small_config(tmp_path, arm="grpo", steps=3, tracking=False))
    assert resumed.resume() and resumed.step == 2
    assert "latest.json is not valid JSON" in "".join(capsys.readouterr())
    assert marker.read_bytes() == b"\x00\x01 not a marker"  # left for whoever looks


def test_no_loadable_checkpoint_is_an_error_naming_each(two_steps, tmp_path):
    import shutil

    shutil.copytree(two_steps / "checkpoints", tmp_path / "checkpoints")
    for step in (1, 2):
        _truncate(tmp_path / checkpoint_path(step) / WEIGHTS_FILE)
    resumed = make_trainer(small_config(tmp_path, arm="grpo", steps=3, tracking=False))
    with pytest.raises(RuntimeError, match=r"no checkpoint .* can be resumed from .*step-000002.*trainable.pt is .*step-000001"):
        resumed.resume()


def test_loading_a_damaged_checkpoint_for_evaluation_is_an_error_not_another_step(two_steps, tmp_path):
    import shutil

    from sdar.train.runtime import build_runtime

    shutil.copytree(two_steps / "checkpoints", tmp_path / "checkpoints")
    _scramble(tmp_path / checkpoint_path(2) / WEIGHTS_FILE)
    rt = build_runtime(small_config(tmp_path / "eval", arm="grpo", tracking=False), train=False)
    with pytest.raises(RuntimeError, match=r"newest checkpoint .*step-000002 cannot be loaded \(trainable.pt does not load"):
        rt.load_weights(str(tmp_path))


def test_checkpoints_sit_in_the_output_directory_and_an_older_runs_layout_still_resumes(two_steps, tmp_path):
    """<output>/checkpoints/step-NNNNNN (issue 44: not checkpoints/checkpoints/); a run written in the layout before
    (<output>/checkpoints/checkpoints/...) resumes and goes on in it, and evaluation finds its weights from the output
    directory or either checkpoints folder."""
    import shutil

    from sdar.train.checkpoint.checkpointer import checkpoint_stores
    from sdar.train.runtime import build_runtime

    assert (two_steps / checkpoint_path(2)).is_dir() and not (two_steps / "checkpoints" / "checkpoints").exists()
    old = tmp_path / "checkpoints"
    shutil.copytree(two_steps / "checkpoints", old / "checkpoints")  # how the same run was laid out before
    resumed = make_trainer(small_config(tmp_path, arm="grpo", steps=3, tracking=False, **{"checkpoint.keep": 3}))
    assert resumed.resume() and resumed.step == 2
    assert resumed.run()["steps"] == 3
    assert [s for s, _ in list_checkpoints(open_store(str(old)))] == [1, 2, 3]
    assert not (tmp_path / checkpoint_path(3)).exists()  # one layout per run, never both
    rt = build_runtime(small_config(tmp_path / "eval", arm="grpo", tracking=False), train=False)
    for where in (tmp_path, old, old / "checkpoints"):
        assert rt.load_weights(str(where)) == 3
    assert checkpoint_stores("s3://b/run/checkpoints/") == ["s3://b/run/checkpoints", "s3://b/run",
                                                           "s3://b/run/checkpoints/checkpoints"]
    assert checkpoint_stores("s3://checkpoints") == ["s3://checkpoints", "s3://checkpoints/checkpoints"]
