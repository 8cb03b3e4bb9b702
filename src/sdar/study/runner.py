"""Run a study's cells, resumably: a finished cell is skipped, an interrupted one resumes.

Layout (results are small JSON, meant to be committed; the work directory holds checkpoints and MLflow):

    <results>/<study>/spec.json                      the spec this directory's results came from
    <results>/<study>/<family>/seed<s>/warmstart.json the warm start at step 0: student and teacher, per task
    <results>/<study>/<family>/seed<s>/<arm>.json     one run: evaluations at eval_steps (per task), history
    <work>/<study>/<family>/seed<s>/<arm>/            the run's output directory (checkpoints, final policy)
    <work>/<study>/mlflow.db                          MLflow: experiment study-<name>, a parent run per study,
                                                      a child run per cell (unless MLFLOW_TRACKING_URI is set)

A cell is trained in segments, one per eval step: the trainer runs to the segment's end (resuming
from its newest checkpoint: a killed run loses at most `checkpoint.every` steps), the policy is
evaluated on the family's held-out tasks with per-task outcomes kept (the paired analysis needs
them), the partial record is saved, then the next segment resumes from the checkpoint. Every run of a
family plays the same held-out tasks (`sdar.eval.tasks`), with the same evaluation sampling seed per
seed, so differences between arms are paired by seed and task.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from sdar.config import drop_added_defaults, flat_layout
from sdar.console import make_console
from sdar.storage import open_store
from sdar.study.spec import Cell, StudySpec
from sdar.tracking import PIPELINE_JOB_TAG, Tracker, default_tracking_uri, prepare_sqlite_store

# the per-step metrics a result keeps (the analysis's curves); the full history stays in MLflow
HISTORY_KEYS = (
    "step", "success", "reward", "invalid_action_rate", "loss/entropy", "loss/kl", "sdar/gap_mean",
    "teacher/gap_free_tokens", "teacher/gap_all_tokens", "sdar/gate_mean", "sdar/pos_gap_frac",
    "tokens/forced_frac", "hint/error_site_rate", "groups/zero_std_frac", "groups/rolled_out", "time/step_s",
)
RESULT_VERSION = 1
# settings that do not change what a run computes: a result made under other values is still valid
_NOT_IDENTITY = ("steps", "output_dir", "experiment", "parent_run_id", "tracking", "report_to", "checkpoint_uri",
                 "eval_every", "checkpoint_every",
                 # shortcuts whose on/off runs give the same samples and statistics (tests/train/test_reference_parity.py),
                 # retired as settings (sdar.config.compat.RETIRED; identities keep them at True): the older ones stay
                 # in, the committed results' fingerprints were taken with them
                 "merged_inference", "rollout.share_prefix", "dedup_scoring", "head_at_free_tokens",
                 # the sampler and the scoring layout (auto: chosen per device; the same numbers up to float rounding)
                 "rollout.sampler", "scoring.packed", "scoring.pack_tokens")


class StaleResult(RuntimeError):
    """A committed result was made under another config than the spec now gives."""


def run_dir(work: Path, cell: Cell) -> Path:  # the run's checkpoints, history and final policy
    return work / cell.family / f"seed{cell.seed}" / cell.arm


def cell_config(spec: StudySpec, cell: Cell, work: Path, steps: int | None = None, parent_run_id: str | None = None):
    """The TrainConfig of `cell`: the family's config, the study's overrides, the cell's arm and seed."""
    from sdar.config import load_config

    overrides = {**spec.overrides_for(cell.family), "arm": cell.arm, "seed": cell.seed,
                 "steps": steps or spec.steps, "eval.every": 0, "experiment": f"study-{spec.name}",
                 "output_dir": str(run_dir(work, cell))}
    if parent_run_id:
        overrides["parent_run_id"] = parent_run_id
    return load_config(spec.configs[cell.family], overrides)


def config_fingerprint(cfg) -> str:
    """A hash of everything in `cfg` that shapes a run's numbers (not where it writes or how long it runs)."""
    # the flat layout the committed results were fingerprinted in; fields newer than them at their neutral default
    d = drop_added_defaults(flat_layout(cfg.to_dict()))
    for key in _NOT_IDENTITY:  # "section.field" names a field of a section
        head, _, field_name = key.partition(".")
        (d.get(head, {}) if field_name else d).pop(field_name or head, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def warm_start_digest(cfg) -> str | None:
    """A hash of the warm start's tensors (names, dtypes, shapes, bytes: the tiny checkpoint's weights, a pretrained
    model's adapter or weights); None when the config trains a named model as it is (the name is its identity). Two
    builds of one recipe that differ in any bit get different digests: at this scale such a difference moves held-out
    success by several points."""
    from sdar.train.warmstart import warm_start_path

    where = warm_start_path(cfg)
    if where is None:
        return None
    import torch
    from safetensors import safe_open

    h = hashlib.sha256()
    for f in sorted(where.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in sorted(st.keys()):
                t = st.get_tensor(k).contiguous()
                h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def eval_record(result, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """An EvalResult as JSON, with the outcome of every task (1 = won) in the order played."""
    return {**result.to_dict(), "tasks": {t.task_id: int(bool(t.won)) for t in result.trajectories}, **(extra or {})}


def failure_modes(trajectories) -> dict[str, Any]:
    """Where household episodes fail, from their actions: never took an object (searching), took one but
    never put one down (carrying), put one down and still lost (placed wrong, or the task's other steps
    missing: clean/heat/cool/light, a second object); with the share of failed turns the env refused."""
    failed = [t for t in trajectories if not t.won]
    stages = {"never_took": 0, "took_never_placed": 0, "placed_not_won": 0}
    refused = turns = 0
    for t in failed:
        actions = [x.action or "" for x in t.turns]
        took = any(a.startswith("take ") for a in actions)
        placed = any(a.startswith(("put ", "move ")) for a in actions)
        stages["placed_not_won" if placed else "took_never_placed" if took else "never_took"] += 1
        refused += sum(not (x.valid and x.env_valid) for x in t.turns)
        turns += len(t.turns)
    return {"failed": len(failed), **stages, "refused_turn_share": refused / turns if turns else 0.0}


def _warm_dir(cfg) -> Path | None:
    from sdar.train.warmstart import warm_start_path

    return warm_start_path(cfg)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def machine() -> dict[str, Any]:
    import torch

    return {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


class StudyRunner:
    """Runs the cells of `spec` into `results` (JSON) using `work` (checkpoints, MLflow)."""

    def __init__(self, spec: StudySpec, results: str | Path, work: str | Path, console=None,
                 commit: bool = False, redo_stale: bool = False) -> None:
        self.spec = spec
        self.results = Path(results) / spec.name
        self.work = Path(work).expanduser().resolve() / spec.name
        self.console = console or make_console(stderr=True)
        self.commit = commit
        self.redo_stale = redo_stale
        self.parent_run_id: str | None = None
        self._warm_checked: set[tuple[str, int]] = set()

    # ---- paths ----------------------------------------------------------------------------
    def result_path(self, cell: Cell) -> Path:
        return self.results / cell.family / f"seed{cell.seed}" / f"{cell.arm}.json"

    def warmstart_path(self, family: str, seed: int) -> Path:
        return self.results / family / f"seed{seed}" / "warmstart.json"

    def partial_path(self, cell: Cell) -> Path:
        return self.work / cell.family / f"seed{cell.seed}" / f"{cell.arm}.partial.json"

    # ---- state ----------------------------------------------------------------------------
    def status(self) -> list[dict[str, Any]]:
        """Each cell: done / partial (some steps evaluated) / started (trained to a checkpoint: running, or where a
        rerun resumes) / pending, with the step of its newest whole checkpoint and its wall time when done."""
        from sdar.train.checkpoint import list_checkpoints

        out = []
        for cell in self.spec.cells():
            done, part = _read_json(self.result_path(cell)), _read_json(self.partial_path(cell))
            out_dir = run_dir(self.work, cell)
            ckpts = list_checkpoints(open_store(str(out_dir))) if out_dir.is_dir() else []
            state = ("done" if done and self.complete(done) else "partial" if (done or part)
                     else "started" if ckpts else "pending")
            rec = done or part or {}
            out.append({"cell": cell.name, "state": state, "evaluated": sorted(int(s) for s in rec.get("evals", {})),
                        "checkpoint": ckpts[-1][0] if ckpts else None, "wall_s": rec.get("wall_s", {}).get("total")})
        return out

    def complete(self, rec: dict[str, Any]) -> bool:
        return all(str(s) in rec.get("evals", {}) for s in self.spec.eval_steps)

    def _check_fresh(self, path: Path, rec: dict[str, Any], fingerprint: str) -> bool:
        """True when `rec` was made under the current config; raises (or, with redo_stale, returns False) if not."""
        if rec.get("fingerprint") == fingerprint and rec.get("version") == RESULT_VERSION:
            return True
        if self.redo_stale:
            self.console.print(f"{path}: made under another config; running it again (--redo-stale)")
            return False
        raise StaleResult(
            f"{path} was made under another config (fingerprint {rec.get('fingerprint')}, now {fingerprint}): the "
            "family's config, the study's set/family_set or the code's result format changed since. Run with "
            "--redo-stale to replace it, or give the study another name to keep both")

    # ---- MLflow -----------------------------------------------------------------------------
    def _open_parent(self) -> None:
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            os.environ["MLFLOW_TRACKING_URI"] = prepare_sqlite_store(self.work / "mlflow.db")
        state_path = self.work / "parent_run.json"
        state = _read_json(state_path) or {}
        uri = default_tracking_uri()
        resume = state.get("run_id") if state.get("tracking_uri") == uri else None
        tracker = Tracker(f"study-{self.spec.name}", run_name=f"study-{self.spec.name}", resume_run_id=resume,
                          tags={"sdar.kind": "study", "sdar.study": self.spec.name,
                                PIPELINE_JOB_TAG: self.job_id}).start()  # the cells' runs inherit it: the view
        if resume is None and tracker.enabled:
            tracker.log_params({"spec": self.spec.path, "steps": self.spec.steps,
                                "eval_steps": ",".join(map(str, self.spec.eval_steps)),
                                "cells": len(self.spec.cells())})
        self.parent_run_id = tracker.run_id
        self._parent = tracker
        if tracker.run_id:
            _write_json(state_path, {"run_id": tracker.run_id, "tracking_uri": uri})

    @property
    def job_id(self) -> str:
        """The id the study's runs carry as their job (PIPELINE_JOB_TAG): `sdar ui --job` and the view select by it."""
        return f"study-{self.spec.name}"

    def view(self, port: int = 5000) -> dict[str, str] | None:
        """The study's runs side by side in MLflow, as `sdar run --local` shows a comparison: {job_id, ui_command,
        view_url}, or None before the study has logged anything (sdar.study.view.study_view)."""
        from sdar.study.view import study_view

        return study_view(self, port)

    def _close_parent(self, status: str) -> None:
        parent = getattr(self, "_parent", None)
        if parent is not None:
            parent.end(status)

    # ---- the study --------------------------------------------------------------------------
    def run(self, only: Callable[[Cell], bool] | None = None, max_runs: int | None = None) -> list[Cell]:
        """Run every pending cell (those `only` accepts), at most `max_runs`; returns the cells trained now."""
        self.work.mkdir(parents=True, exist_ok=True)
        _write_json(self.results / "spec.json", {"study": self.spec.name, "spec_path": self.spec.path,
                                                 "steps": self.spec.steps, "eval_steps": self.spec.eval_steps,
                                                 "configs": self.spec.configs, "matrices": self.spec.matrices,
                                                 "set": self.spec.overrides, "family_set": self.spec.family_overrides,
                                                 **({"against": self.spec.against} if self.spec.against else {})})
        cells = [c for c in self.spec.cells() if only is None or only(c)]
        self._open_parent()
        trained: list[Cell] = []
        status = "FAILED"
        try:
            for cell in cells:
                if max_runs is not None and len(trained) >= max_runs:
                    break
                self.ensure_warm_start_eval(cell.family, cell.seed)
                if self.run_cell(cell):
                    trained.append(cell)
            status = "FINISHED"
        finally:
            self._close_parent(status)
        return trained

    def ensure_warm_start_eval(self, family: str, seed: int) -> dict[str, Any]:
        """The step-0 point of a (family, seed): the warm start's student and teacher on the held-out tasks."""
        from sdar.train.runtime import build_runtime
        from sdar.train.warmstart import ensure_warm_start

        path = self.warmstart_path(family, seed)
        cfg = cell_config(self.spec, Cell(family, "grpo", seed), self.work)
        fingerprint = config_fingerprint(cfg)
        rec = _read_json(path)
        if rec is not None and self._check_fresh(path, rec, fingerprint):
            return rec
        t0 = time.perf_counter()
        ensure_warm_start(cfg, self.console)
        t_build = time.perf_counter() - t0
        rt = build_runtime(cfg, train=False)
        self.console.print(f"[{family} seed {seed}] evaluating the warm start on {len(rt.eval_tasks)} held-out tasks")
        t1 = time.perf_counter()
        student = rt.evaluate()
        teacher = rt.evaluate(privileged=True)
        gap = rt.teacher_gap(student.trajectories)
        rec = {"version": RESULT_VERSION, "study": self.spec.name, "family": family, "seed": seed,
               "fingerprint": fingerprint, "warm_start_digest": warm_start_digest(cfg), "step": 0,
               "student": eval_record(student),
               "teacher": eval_record(teacher), "teacher_gap_free_tokens": gap,
               "wall_s": {"warm_start_build_or_load": round(t_build, 1), "eval": round(time.perf_counter() - t1, 1)},
               "machine": machine()}
        _write_json(path, rec)
        self.console.print(f"[{family} seed {seed}] warm start: student {student.success:.3f}, teacher "
                           f"{teacher.success:.3f} ({student.n} tasks)")
        self.commit_files([path, self.results / "spec.json"], f"study {self.spec.name}: {family} seed {seed} warm start")
        return rec

    def check_warm_start(self, family: str, seed: int) -> None:
        """Refuse to train a cell on a warm start other than the one its seed's step-0 record (and every finished
        run of that seed) was made with: arms are paired by seed, so they must share the warm start bit for bit.
        A warm start is rebuilt whenever the cache is gone (another machine, a cleaned cache); the record's digest
        says whether the rebuild is the same. Records from before digests are checked once by replaying their
        step-0 student evaluation (the same tasks and sampling seeds): the same outcome on every task, and the
        digest is filled in."""
        if (family, seed) in self._warm_checked:
            return
        from sdar.train.runtime import Shortcuts, build_runtime

        path = self.warmstart_path(family, seed)
        cfg = cell_config(self.spec, Cell(family, "grpo", seed), self.work)
        digest, rec = warm_start_digest(cfg), _read_json(path)
        if digest is None or rec is None:
            self._warm_checked.add((family, seed))
            return
        known = rec.get("warm_start_digest")
        if known is None:
            self.console.print(f"[{family} seed {seed}] {path.name} predates warm-start digests: replaying its "
                               "step-0 student evaluation to check that the warm start built here is the same one")
            recorded = rec["student"]["tasks"]

            def replay_differs(shortcuts: Shortcuts) -> list[str]:
                replay = eval_record(build_runtime(cfg, train=False, shortcuts=shortcuts).evaluate())["tasks"]
                return sorted(t for t in set(recorded) | set(replay) if recorded.get(t) != replay.get(t))

            differ = replay_differs(Shortcuts())
            # a record made before a same-numbers shortcut (merged_inference, share_prefix) was sampled without it;
            # their log-probs agree within 1e-5 only, and a sample flipped by that is not another warm start: replay
            # as the record may have been made
            for older in (Shortcuts(share_prefix=False), Shortcuts(share_prefix=False, merged_inference=False)):
                if not differ:
                    break
                differ = replay_differs(older)
            if differ:
                raise StaleResult(
                    f"{family} seed {seed}: the warm start built here (at "
                    f"{_warm_dir(cfg)}) does not replay the step-0 evaluation in {path} ({len(differ)} of "
                    f"{len(recorded)} held-out tasks differ, e.g. {differ[:3]}): it is another warm start than the "
                    "one this seed's finished runs were trained from, so new runs would not be paired with them. Build "
                    "it where the record was made (same torch, CPU kind and thread count), or give the study another name")
            rec["warm_start_digest"] = digest
            _write_json(path, rec)
            self.commit_files([path], f"study {self.spec.name}: {family} seed {seed} warm start digest (replayed)")
        elif known != digest:
            raise StaleResult(
                f"{family} seed {seed}: the warm start built here (at {_warm_dir(cfg)}, digest {digest}) is not the "
                f"one {path} records (digest {known}): new runs would not be paired with this seed's finished ones. "
                "Build it where the record was made (same torch, CPU kind and thread count), or give the study another name")
        self._warm_checked.add((family, seed))

    def run_cell(self, cell: Cell) -> bool:
        """Train and evaluate one cell to the study's steps; False when it was already done."""
        from sdar.train import Trainer
        from sdar.train.warmstart import ensure_warm_start

        path, partial = self.result_path(cell), self.partial_path(cell)
        cfg = cell_config(self.spec, cell, self.work, parent_run_id=self.parent_run_id)
        fingerprint = config_fingerprint(cfg)
        done = _read_json(path)
        if done is not None and not self._check_fresh(path, done, fingerprint):
            done = None  # --redo-stale: made under another config, run again
        if done is not None and self.complete(done):
            return False
        part = _read_json(partial)
        if part is not None and part.get("fingerprint") != fingerprint:
            part = None  # another config's partial run: start over
        # a finished run of a shorter study (steps raised since) goes on from its evaluations and checkpoint
        rec = part or done or {"version": RESULT_VERSION, "study": self.spec.name, "family": cell.family, "arm": cell.arm,
                       "seed": cell.seed, "fingerprint": fingerprint, "steps": self.spec.steps, "evals": {},
                       "wall_s": {"train": 0.0, "eval": 0.0}, "machine": machine()}
        ensure_warm_start(cfg, self.console)
        self.check_warm_start(cell.family, cell.seed)
        history: list[dict[str, Any]] = []
        for target in self.spec.eval_steps:
            if str(target) in rec["evals"]:
                continue
            self.console.print(f"[{cell.name}] training to step {target}")
            t0 = time.perf_counter()
            trainer = Trainer(replace(cfg, steps=target), console=self.console)
            summary = trainer.run()
            if trainer.step != target:  # its checkpoint is past this eval step: evaluating would mislabel it
                raise StaleResult(
                    f"{cell.name}: the run's newest checkpoint is at step {trainer.step}, past eval step {target} that "
                    f"{path} lacks; delete {cfg.resolved_output_dir()} (or run with another study name) to train "
                    "it again")
            rec["wall_s"]["train"] += time.perf_counter() - t0
            rec["run_id"] = summary.get("run_id")
            history = summary["history"]
            t1 = time.perf_counter()
            ev = trainer.evaluate()
            rec["wall_s"]["eval"] += time.perf_counter() - t1
            rec["evals"][str(target)] = eval_record(ev, {"step": target})
            self._log_eval(rec.get("run_id"), ev, target)
            _write_json(partial, rec)
            self.console.print(f"[{cell.name}] step {target}: held-out success {ev.success:.3f} "
                               f"[{ev.ci95[0]:.3f}, {ev.ci95[1]:.3f}] on {ev.n} tasks")
            del trainer
        if not history:  # every eval step was recorded by an earlier invocation: read the history back
            hist_file = Path(cfg.resolved_output_dir()) / "history.json"
            history = json.loads(hist_file.read_text()) if hist_file.is_file() else []
        rec["steps"] = self.spec.steps
        rec["history"] = [{k: h[k] for k in HISTORY_KEYS if k in h} for h in history]
        rec["wall_s"] = {k: round(v, 1) for k, v in rec["wall_s"].items() if k != "total"}
        rec["wall_s"]["total"] = round(rec["wall_s"]["train"] + rec["wall_s"]["eval"], 1)
        _write_json(path, rec)
        partial.unlink(missing_ok=True)
        self.commit_files([path], f"study {self.spec.name}: {cell.name} ({self.spec.steps} steps)")
        return True

    # ---- transfer to the real engine (household) ------------------------------------------------
    def transfer_path(self, family: str, seed: int, who: str) -> Path:
        return self.results / family / f"seed{seed}" / f"{who}.transfer.json"

    def transfer(self, backend: str = "alfworld", split: str = "valid_seen",
                 only: Callable[[Cell], bool] | None = None, games: int | None = None,
                 env_workers: int = 1) -> list[Path]:
        """Evaluate the household warm starts and every finished household run's final policy on the real
        engine's `split` (all of its games, or the first `games` stratified over task types), student and
        teacher, per task type and with where episodes fail. Runs whose checkpoints are gone from the work
        directory are reported and skipped; finished evaluations are kept. env_workers: engine processes the
        episodes are spread over (the ALFWorld backend's `workers`; 1 = in this process; other backends always
        run in this process): the same episodes, faster, since the engine's resets and steps are Python that
        threads of one process take in turn."""
        if env_workers < 1:
            raise ValueError(f"env_workers={env_workers} must be >= 1 (1 runs the engine in this process)")
        written = []
        for family, seed in self.spec.warm_starts():
            if family != "household":
                continue
            cells = [c for c in self.spec.cells() if c.family == family and c.seed == seed and (only is None or only(c))]
            for who, cell in [("warmstart", Cell(family, "grpo", seed))] + [(c.arm, c) for c in cells]:
                path = self.transfer_path(family, seed, who)
                done = _read_json(self.result_path(cell)) if who != "warmstart" else {}
                if path.is_file() or done is None or (who != "warmstart" and not self.complete(done)):
                    continue
                out = None if who == "warmstart" else self.work / family / f"seed{seed}" / cell.arm
                if out is not None and not (out / "checkpoints").is_dir():
                    self.console.print(f"[yellow]{cell.name}: no checkpoints in {out}; not evaluated on {backend}[/yellow]")
                    continue
                rec = self._transfer_one(cell, out, backend, split, games, env_workers)
                rec["who"] = who
                _write_json(path, rec)
                written.append(path)
                self.commit_files([path], f"study {self.spec.name}: {family} seed {seed} {who} on {backend} {split}")
        return written

    def _transfer_one(self, cell: Cell, out: Path | None, backend: str, split: str,
                      games: int | None, env_workers: int = 1) -> dict[str, Any]:
        from sdar.train.runtime import build_runtime
        from sdar.train.warmstart import ensure_warm_start

        workers = env_workers if backend == "alfworld" else 1  # other backends have no engine processes
        cfg = cell_config(self.spec, cell, self.work)
        cfg = replace(cfg, eval=replace(cfg.eval, tasks=games or 10**6, task_ids=[]), tracking=False,
                      env=replace(cfg.env, eval_split=split, kwargs={**cfg.env.kwargs, "backend": backend,
                                                                     **({"workers": workers} if workers > 1 else {})}))
        ensure_warm_start(cfg, self.console)
        rt = build_runtime(cfg, train=False)
        step = rt.load_weights(str(out)) if out is not None else 0
        self.console.print(f"[{cell.family} seed {cell.seed}] {cell.arm if out else 'warm start'} (step {step}) on "
                           f"{len(rt.eval_tasks)} {backend} {split} games")
        t0 = time.perf_counter()
        student, teacher = rt.evaluate(), rt.evaluate(privileged=True)
        return {"version": RESULT_VERSION, "family": cell.family, "seed": cell.seed, "step": step, "backend": backend,
                "split": split, "student": {**eval_record(student), "failures": failure_modes(student.trajectories)},
                "teacher": {**eval_record(teacher), "failures": failure_modes(teacher.trajectories)},
                "wall_s": round(time.perf_counter() - t0, 1), "env_workers": workers}

    def _log_eval(self, run_id: str | None, ev, step: int) -> None:
        """The held-out evaluation into the cell's MLflow run (at the step it was taken)."""
        if not run_id:
            return

        with Tracker(f"study-{self.spec.name}", resume_run_id=run_id) as t:
            t.log_metrics(ev.metrics("study_eval"), step=step - 1)

    def commit_files(self, paths: list[Path], message: str) -> None:
        """git-commit these result files alone (with --commit): results land as they arrive."""
        if not self.commit:
            return
        files = [str(Path(p).resolve()) for p in paths if p.exists()]
        git = ["git", "-C", str(self.results.resolve())]  # the repository that holds the results
        for attempt in range(5):  # another git process (an editor, a helper) may hold the index lock
            add = subprocess.run([*git, "add", "--", *files], capture_output=True, text=True, check=False)
            done = add.returncode == 0 and subprocess.run(
                [*git, "commit", "-q", "-m", message, "--", *files], capture_output=True, text=True, check=False).returncode in (0, 1)
            if done:
                return
            time.sleep(2 + 3 * attempt)
        self.console.print(f"[yellow]could not commit {files}: {add.stderr.strip()}[/yellow]")
