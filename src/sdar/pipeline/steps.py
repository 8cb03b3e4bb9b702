"""The work of the comparison pipeline's steps, as plain functions: each takes plain values (paths, dicts,
numbers; a step's output files are paths it writes) and returns plain values, so the KFP components in
components/ only parse their inputs, call one function here and write what it returns to their outputs
(KFP Metrics, artifact metadata). The env service's steps (launch_envs, teardown_envs) are in
sdar.pipeline.services.

Every step that plays or scores a policy builds its config through `step_overrides` (the run's JSON
overrides, then the step's arm, seed, family, model, checkpoint and env server) and `prepare_step`
(load_config -> the warm start -> build_runtime). Light at import: torch, MLflow and the trainer are
imported by the functions that use them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from sdar.lifecycle import skip_the_final_collection
from sdar.pipeline.jobs import once_per_job
from sdar.tracking import default_tracking_uri
from sdar.tracking.comparison import log_comparison

# the KFP task processes that run these steps (and sdar.pipeline.services's) exit as soon as they are done
skip_the_final_collection()


# ---- the config of a step ------------------------------------------------------------------------
def read_json(path: str | os.PathLike | None) -> dict[str, Any]:
    """The JSON object at `path`; {} for None or "" (an optional input left out, e.g. no endpoints)."""
    return json.loads(Path(path).read_text()) if path else {}


def write_json(path: str | os.PathLike, data: Any) -> None:
    """`data` as indented JSON at `path`, its directory made first."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1))


def step_overrides(overrides: str | Mapping[str, Any] | None = "{}", *, arm: str = "", seed: int | None = None,
                   tracking: bool | None = None, output_dir: str = "", family: str = "", model: str = "",
                   checkpoint: str = "", url: str = "", sizes: Mapping[str, int] | None = None,
                   extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The dotted config overrides of one pipeline step: the run's `overrides` (a JSON object, as every
    component receives them: a KFP dict parameter would turn ints into floats; or a dict), then the step's
    own keys, which win over them.

    arm / seed / tracking / output_dir: the step's arm, seed, MLflow switch and run directory (""/None:
    leave the config's). family / model: "" keeps the config's env.family / model.name_or_path.
    checkpoint: a policy directory (a gated_train output); it replaces the model, loaded as it is (no warm start
    of it, whatever warmstart.pretrained says). url: the env server to
    play on (launch_envs' endpoints["url"]; "" plays in-process environments). sizes: {dotted key: int},
    each set when nonzero (0 keeps the config's value: steps, group_size, tasks_per_step, eval.tasks).
    extra: more dotted keys, set as given (e.g. experiment, parent_run_id, replay.pairs_path).
    """
    from sdar.config import parse_overrides

    ov = parse_overrides(overrides) if isinstance(overrides, str) or overrides is None else dict(overrides)
    if arm:
        ov["arm"] = arm
    if seed is not None:
        ov["seed"] = int(seed)
    if tracking is not None:
        ov["tracking"] = bool(tracking)
    if output_dir:
        ov["output_dir"] = str(output_dir)
    ov.update({key: int(value) for key, value in (sizes or {}).items() if value})
    if family:
        ov["env.family"] = family
    if model or checkpoint:
        ov["model.name_or_path"] = checkpoint or model
    if checkpoint:  # a trained policy is loaded as it is: never warm-started again (warmstart.pretrained would)
        ov["warmstart.pretrained"] = False
    if url:
        ov["env.url"] = url
    ov.update(extra or {})
    return ov


class StepSetup(NamedTuple):
    """What `prepare_step` built: the config, the overrides it was loaded with, and the runtime."""

    cfg: Any  # sdar.config.TrainConfig
    overrides: dict[str, Any]
    runtime: Any  # sdar.train.runtime.Runtime (policy, backend, teacher, envs); None with runtime=False


def prepare_step(config_path: str, overrides: str | Mapping[str, Any] | None = "{}", *, runtime: bool = True,
                 **step: Any) -> StepSetup:
    """A step's config and runtime: `step_overrides(overrides, **step)` -> load_config -> ensure_warm_start
    (the tiny model's warm start: built once, by the baseline evaluation, and loaded by every later step)
    -> build_runtime (the policy, the rollout settings of the arm and the env factory; no optimizer).
    runtime=False stops after load_config (no warm start, no model)."""
    from sdar.config import load_config

    ov = step_overrides(overrides, **step)
    cfg = load_config(config_path, ov)
    if not runtime:
        return StepSetup(cfg, ov, None)
    from sdar.train.runtime import build_runtime
    from sdar.train.warmstart import ensure_warm_start

    ensure_warm_start(cfg)
    return StepSetup(cfg, ov, build_runtime(cfg, train=False))


def tracking_uri_of(tracking_uri: str, endpoints: Mapping[str, Any], output_root: str) -> str:
    """The MLflow store a step logs to: `tracking_uri`, else the pipeline's (endpoints), else
    MLFLOW_TRACKING_URI, else the SQLite store under `output_root`: every arm logs into one store."""
    return (tracking_uri or endpoints.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
            or default_tracking_uri(output_root))


# ---- run_matrix ----------------------------------------------------------------------------------
def expand_run_matrix(arms: list[str], seeds: list[int], config_path: str, overrides: str = "{}", family: str = "",
                      model: str = "") -> list[dict[str, Any]]:
    """[{"arm": a, "seed": s}] for every arm and seed, after checking that every arm exists, no arm or
    seed repeats, and the config loads with the overrides (fail here, not an hour later).

    family / model: "" keeps the config's env.family / model.name_or_path; a family other than the
    config's is refused when the config's env.kwargs belong to its own family.
    """
    from sdar.algos import get_arm
    from sdar.config import load_config

    if not arms:
        raise ValueError("arms is empty; pass at least one, e.g. ['grpo', 'grpo_opsd', 'sdar']")
    if not seeds:
        raise ValueError("seeds is empty; pass at least one seed, e.g. [0]")
    for name in (a for a in set(arms) if arms.count(a) > 1):
        raise ValueError(f"arm {name!r} is listed twice in {list(arms)}; list each arm once (seeds give repeats)")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {list(seeds)} repeat a value; each seed is one run")
    for a in arms:
        get_arm(a)  # an unknown arm names the valid ones
    ov = step_overrides(overrides)
    cfg = load_config(config_path, ov)
    if family and family != cfg.env.family and cfg.env.kwargs:
        raise ValueError(
            f"family {family!r} differs from env.family {cfg.env.family!r} of {config_path}, whose env.kwargs "
            f"{cfg.env.kwargs} belong to {cfg.env.family!r}; pass a config made for {family!r} or leave family empty"
        )
    if model:
        load_config(config_path, step_overrides(ov, model=model))
    runs = [{"arm": a, "seed": int(s)} for a in arms for s in seeds]
    print(f"run matrix of {len(runs)} runs: " + ", ".join(f"{r['arm']}/seed{r['seed']}" for r in runs))
    return runs


# ---- rollout -------------------------------------------------------------------------------------
@once_per_job("rollout", key=("arm", "seed", "replay_round"), outputs=("trajectories_path",))
def play_rollouts(config_path: str, overrides: str, trajectories_path: str, *, checkpoint: str = "",
                  endpoints: str = "", arm: str = "grpo", episodes: int = 16, split: str = "train",
                  temperature: float = 1.0, seed: int = 0, replay_round: int = 0, family: str = "", model: str = "",
                  output_root: str = "runs/kfp", job_id: str = "standalone") -> dict[str, Any]:
    """Play `episodes` episodes on tasks of `split` (shuffled by `seed`, and by the round from round 1 on,
    so later rounds play other tasks; cycled if the split is smaller) and write them to
    `trajectories_path` as JSONL trajectories (the shared trajectory format plus the token ids a teacher
    replay needs).

    checkpoint: the policy ("": the config's model, e.g. the warm-started tiny model).
    endpoints: launch_envs' JSON file for a running env server; "" plays in-process environments.
    temperature: 1.0 = the training distribution; arm decides the prompt (skill_grpo shows skills).
    Returns {episodes, success, metadata: the trajectories' artifact metadata}.
    """
    import random
    from dataclasses import replace

    from sdar.agent.rollout import rollout as play
    from sdar.eval.report import write_trajectories
    from sdar.train.runtime import seed_everything

    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    cfg, _, rt = prepare_step(config_path, overrides, arm=arm, seed=int(seed), tracking=False,
                              output_dir=str(Path(output_root) / job_id / f"rollout-{arm}-seed{int(seed)}"),
                              family=family, model=model, checkpoint=checkpoint,
                              url=read_json(endpoints).get("url", ""))
    probe = rt.env_factory()
    try:
        pool = list(probe.task_ids(split))
    finally:
        probe.close()
    if not pool:
        raise ValueError(f"split {split!r} of {cfg.env.family} has no tasks; use train, valid or test")
    random.Random(seed if not replay_round else f"{seed}:round{replay_round}").shuffle(pool)  # later rounds: other tasks
    ids = [pool[i % len(pool)] for i in range(episodes)]
    seed_everything(int(seed))
    rcfg = replace(rt.rollout_cfg, temperature=float(temperature))
    envs = [rt.env_factory() for _ in ids]
    try:
        trajs = play(rt.backend, rt.tokenizer, envs, ids, list(range(len(ids))), rcfg)
    finally:
        for e in envs:
            e.close()
    write_trajectories(trajectories_path, trajs, cfg.env.family,
                       backend=f"policy:{Path(checkpoint).name if checkpoint else cfg.model.name_or_path}")
    success = sum(t.won for t in trajs) / len(trajs)
    print(f"{len(trajs)} episodes, success {success:.3f}, {sum(t.length for t in trajs)} turns")
    return {"episodes": len(trajs), "success": success,
            "metadata": {"episodes": len(trajs), "success": success, "family": cfg.env.family}}


# ---- teacher_replay ------------------------------------------------------------------------------
@once_per_job("teacher-replay", key=("arm", "seed", "replay_round"), outputs=("scores_path", "pairs_path"))
def replay_teachers(trajectories_path: str, config_path: str, overrides: str, scores_path: str, pairs_path: str, *,
                    checkpoint: str = "", teacher_pool: str = "", arm: str = "sdar", seed: int = 0,
                    replay_round: int = 0, family: str = "", model: str = "", output_root: str = "runs/kfp",
                    job_id: str = "standalone") -> dict[str, Any]:
    """Replay every turn of the rollout step's trajectories. Always: the privileged self-teacher (the same
    policy with the task's skills in its prompt) scores every turn (gap, SDAR gate). For an arm with a
    replay weight (Composer channel 3): the N-teacher pool proposes an action at every turn, and the turns
    it overrules the student on become DPO pairs, the file gated_train consumes.

    checkpoint: the policy that is both student and teacher ("": the config's model); it should be
    the one that produced the trajectories, else the 'student' log-probs are another model's.
    arm: its gate_beta sets the reported gate; its replay_coef decides whether the pool is asked.
    seed, replay_round: the run and round the trajectories belong to (where the step's files go).
    teacher_pool: a YAML file with the pool (the `replay:` settings: teachers with base_url, model,
    api_key_env, prices...; min_agree, budget_usd); "" = the config's `replay` section, whose default
    is the local pool (`sdar teachers serve`: rule experts on 127.0.0.1). API keys come from the
    environment variables the endpoints name (a Kubernetes Secret on a cluster), never from here.
    scores_path: JSON {gap_mean, gate_mean, pos_gap_frac, turns, trajectories: [...]}.
    pairs_path: JSONL, one DPO pair per line (prompt, chosen and rejected token ids; empty for arms
    without replay).
    Returns {gap_mean, gate_mean, pairs, metrics: for the step's KFP Metrics, metadata: the pairs'
    artifact metadata, i.e. the pool's accounting (calls, tokens, cost, latency, agreement)}.
    """
    from sdar.config.replay import load_pool_file
    from sdar.eval.report import read_trajectories
    from sdar.eval.report import teacher_replay as score
    from sdar.train.replay import PairSet, replay_trajectories, write_pair_set

    pool = load_pool_file(teacher_pool) if teacher_pool else {}  # a wrong path fails before any work
    trajs = read_trajectories(trajectories_path)
    if not trajs:
        raise ValueError(f"{trajectories_path} holds no trajectories; run the rollout step first")
    cfg, _, rt = prepare_step(config_path, overrides, arm=arm, tracking=False,
                              output_dir=str(Path(output_root) / job_id / f"replay-{arm}-seed{int(seed)}-round{replay_round}"),
                              family=family,
                              model=model, checkpoint=checkpoint, extra={f"replay.{k}": v for k, v in pool.items()})
    out = score(rt.model, rt.teacher, trajs, gate_beta=rt.arm.gate_beta, mask_forced_tokens=cfg.rollout.mask_forced_tokens)
    write_json(scores_path, out)
    metrics = {k: float(out[k]) for k in ("gap_mean", "gate_mean", "pos_gap_frac", "forced_frac", "turns")}
    found, stats = PairSet(), {}
    if rt.arm.replay_coef != 0.0:
        found, stats = replay_trajectories(rt, trajs, out_dir=cfg.resolved_output_dir())
        metrics.update({k.replace("/", "_"): float(v) for k, v in stats.items()})
        print(f"teacher pool: {int(stats.get('replay/calls', 0))} calls, {len(found)} DPO pairs from {len(trajs)} "
              f"trajectories, ${stats.get('replay/cost_usd', 0.0):.4f} (${stats.get('replay/cost_per_trajectory_usd', 0.0):.5f}"
              " per trace)")
    write_pair_set(found, pairs_path)
    print(f"{len(trajs)} trajectories, {out['turns']} turns: gap {out['gap_mean']:+.4f}, gate {out['gate_mean']:.4f}, "
          f"teacher endorses {out['pos_gap_frac']:.1%} of tokens")
    return {"gap_mean": out["gap_mean"], "gate_mean": out["gate_mean"], "pairs": len(found), "metrics": metrics,
            "metadata": {"pairs": len(found), "trajectories": len(trajs), **stats}}


# ---- gated_train ---------------------------------------------------------------------------------
def round_steps(total: int, replay_round: int, replay_rounds: int) -> int:
    """The step replay round `replay_round` of `replay_rounds` trains up to: ceil(total * (r + 1) / R), so
    the rounds split the run's `total` steps and the last one ends at `total`."""
    check_round(replay_round, replay_rounds)
    return math.ceil(total * (replay_round + 1) / replay_rounds)


def check_round(replay_round: int, replay_rounds: int) -> None:
    """ValueError unless 0 <= replay_round < replay_rounds."""
    if replay_rounds < 1 or not 0 <= replay_round < replay_rounds:
        raise ValueError(f"replay_round={replay_round} of replay_rounds={replay_rounds}: need 0 <= round < rounds")


def log_pair_accounting(run_id: str, accounting: Mapping[str, Any], tracking_uri: str | None) -> dict[str, float]:
    """teacher_replay's accounting of the pairs it handed over (the pairs' artifact metadata: pairs, calls,
    tokens, cost, latency, agreement) as `dag_<key>` metrics of the arm's MLflow run; returns them."""
    acct = {f"dag_{k}": float(v) for k, v in accounting.items() if isinstance(v, (int, float))}
    if acct:
        from sdar.tracking.comparison import log_to_run

        log_to_run(run_id, acct, tracking_uri=tracking_uri)
    return acct


@once_per_job("train", key=("arm", "seed", "replay_round"), outputs=("checkpoint_dir", "history_path"))
def train_arm(arm: str, seed: int, config_path: str, overrides: str, job_id: str, checkpoint_dir: str,
              history_path: str, *, endpoints: str = "", pairs: str = "", pairs_accounting: Mapping[str, Any] | None = None,
              replay_round: int = 0, replay_rounds: int = 1, family: str = "", model: str = "", steps: int = 0,
              group_size: int = 0, tasks_per_step: int = 0, eval_tasks: int = 0, experiment: str = "sdar-comparison",
              tracking: bool = True, tracking_uri: str = "", output_root: str = "runs/kfp",
              checkpoint_root: str = "") -> dict[str, Any]:
    """Train `arm` with `seed` on the config plus `overrides`, a JSON object of dotted config keys
    (e.g. '{"rollout.max_turns": 8}'), with `sdar.train.train` (rollout -> teacher scoring -> update inside
    one process, no reloads), or, when the config's `launch` section asks for more than one GPU (or
    `launcher: trainjob` / `torchx`), as a job of torchrun workers that this call submits and waits for: a
    Kubeflow Trainer TrainJob (the default on Kubernetes) or a TorchX job.

    steps / group_size / tasks_per_step / eval_tasks: 0 keeps the config's value.
    family / model: "" keeps the config's env.family / model.name_or_path.
    endpoints: launch_envs' JSON file; its url is the env server to play on ("": in-process envs) and its
    parent_run_id makes this run an MLflow child of the pipeline's run.
    output_root: run directory root (<output_root>/<job_id>/<arm>-seed<seed>); a retried step resumes
    from its latest checkpoint there. checkpoint_root: put checkpoints under this URI instead
    (s3://bucket/prefix on a cluster), at <checkpoint_root>/<job_id>/<arm>-seed<seed>; a `checkpoint.uri` in
    `overrides` is taken as such a root too. checkpoint_dir: gets a copy of the final policy (LoRA adapter +
    tokenizer); history_path: JSON {arm, seed, run_id, steps, train_seconds, output_dir, history}.
    pairs: teacher_replay's DPO pairs file (Composer channel 3), added to the first step's loss of an arm
    with a replay weight; pairs_accounting (its metadata: the pool's accounting) is logged to this arm's
    MLflow run as dag_replay/* (log_pair_accounting).
    replay_round / replay_rounds: round r of R trains up to step ceil(steps * (r + 1) / R) (round_steps),
    resuming the previous round's run (same output directory, optimizer state, reference and MLflow run).
    A job (launch.* in the config or overrides, e.g. '{"launch.nodes": 2, "launch.gpus_per_node": 4}')
    gets the same config and overrides, and runs launch.image, else SDAR_IMAGE (the cluster pipeline
    sets it to its own image); on Kubernetes it needs checkpoint_root (s3://), through which its
    rank 0 hands the result back. This pod then only waits: compile with `sdar compile --gpus 0`.
    Returns {run_id, final_dir (checkpoint_dir), metadata: the checkpoint's artifact metadata}.
    """
    import shutil
    import time

    from sdar.config import load_config
    from sdar.env_service.manifests import JOB_LABEL, job_label

    info, name = read_json(endpoints), f"{arm}-seed{int(seed)}"
    # the parent run's experiment: KFP's, when its MLflow integration opened it (mlflow_runs.kfp_mlflow_run)
    extra: dict[str, Any] = {"experiment": info.get("experiment") or experiment}
    if info.get("parent_run_id"):
        extra["parent_run_id"] = info["parent_run_id"]
    if pairs:
        extra["replay.pairs_path"] = pairs
    # checkpoint_root, else a checkpoint.uri of the run's overrides, is a root: each job and arm gets its own prefix
    # under it (one uri for every arm, or for two runs, would have each resume from the others' checkpoints)
    root = checkpoint_root or str(step_overrides(overrides).get("checkpoint.uri") or "")
    if root:
        extra["checkpoint.uri"] = f"{root.rstrip('/')}/{job_id}/{name}"
    ov = step_overrides(overrides, arm=arm, seed=int(seed), tracking=tracking, output_dir=str(Path(output_root) / job_id / name),
                        family=family, model=model, url=info.get("url", ""), extra=extra,
                        sizes={"steps": steps, "group_size": group_size, "tasks_per_step": tasks_per_step,
                               "eval.tasks": eval_tasks})
    check_round(replay_round, replay_rounds)
    if replay_rounds > 1:
        ov["steps"] = round_steps(load_config(config_path, ov).steps, replay_round, replay_rounds)
    if tracking:  # every arm logs into one store: the pipeline's, else the one under output_root
        os.environ["MLFLOW_TRACKING_URI"] = tracking_uri_of(tracking_uri, info, output_root)
    t0 = time.perf_counter()
    summary = _train(config_path, ov, {JOB_LABEL: job_label(job_id)})  # the label teardown_envs deletes by
    seconds = time.perf_counter() - t0
    run_id = summary.get("run_id") or ""
    if tracking and pairs and run_id:
        log_pair_accounting(run_id, pairs_accounting or {}, os.environ.get("MLFLOW_TRACKING_URI"))
    dst = Path(checkpoint_dir)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(summary["final_dir"], dst)
    write_json(history_path, {"arm": arm, "seed": int(seed), "run_id": run_id, "steps": summary["steps"],
                              "train_seconds": seconds, "output_dir": summary["output_dir"],
                              "history": summary["history"]})
    last = summary["history"][-1] if summary["history"] else {}
    print(f"{arm}/seed{seed}: {summary['steps']} steps in {seconds:.0f} s; last step success "
          f"{last.get('success', float('nan')):.3f}, gap {last.get('sdar/gap_mean', float('nan')):+.3f}")
    return {"run_id": run_id, "final_dir": str(dst),
            "metadata": {"arm": arm, "seed": int(seed), "run_id": run_id, "steps": summary["steps"]}}


def _train(config_path: str, ov: dict[str, Any], job_labels: dict[str, str]) -> dict[str, Any]:
    """Train with the config and overrides here, or as the job the config's launch section asks for, labelled
    `job_labels`: a Kubeflow Trainer TrainJob (sdar.launch.trainjob) or a TorchX job (sdar.launch.torchx_job)."""
    from sdar.config import load_config

    cfg = load_config(config_path, ov)
    launcher = cfg.launch.resolved_launcher()
    if launcher == "trainjob":
        from sdar.launch.trainjob import launch_trainjob

        return launch_trainjob(cfg, config_path, ov, labels=job_labels)
    if launcher == "torchx":
        from sdar.launch.torchx_job import launch_training

        return launch_training(cfg, config_path, ov, labels=job_labels)
    from sdar.train import train
    from sdar.train.warmstart import ensure_warm_start

    ensure_warm_start(cfg)  # the tiny model's warm start (cached: the baseline evaluation built it)
    return train(cfg)


# ---- compare -------------------------------------------------------------------------------------
def compare_arms(evaluations: list[str], histories: list[str], table_path: str, plot_path: str, report_path: str, *,
                 baseline: str = "", endpoints: str = "", title: str = "", tracking: bool = True,
                 tracking_uri: str = "", output_root: str = "runs/kfp", report_dir: str = "") -> dict[str, Any]:
    """Pair every arm's evaluation JSON with its training history (by arm and seed) and write the
    comparison: `table_path` (markdown), `plot_path` (PNG of success rate and teacher-student gap over
    steps) and `report_path` (a directory: comparison.md/.png/.json).

    baseline: the warm-started policy's evaluation file, shown as the first row and a dashed line.
    endpoints: launch_envs' JSON file; the files and per-arm metrics go to its MLflow parent run.
    report_dir: also copy the report files there (local runs: a stable place to open them).
    Returns {best_arm, table_md, metrics: the per-arm numbers for the step's KFP Metrics}.
    """
    import shutil

    from sdar.eval.compare import ArmRun, view_rows, write_comparison

    hists = {}
    for path in histories:
        h = read_json(path)
        hists[(h["arm"], int(h["seed"]))] = h
    runs = []
    for ev in map(read_json, evaluations):
        key = (ev["arm"], int(ev["seed"]))
        if key not in hists:
            raise ValueError(f"no training history for {key[0]}/seed {key[1]}; have {sorted(hists)}")
        runs.append(ArmRun.from_dicts(ev, hists[key]))
    info = read_json(endpoints)
    result = write_comparison(runs, report_path, baseline=read_json(baseline) or None,
                              title=title or f"sdar comparison ({info.get('family', '')})".replace(" ()", ""))
    shutil.copyfile(result.table_path, table_path)
    shutil.copyfile(result.plot_path, plot_path)
    if report_dir:
        Path(report_dir).mkdir(parents=True, exist_ok=True)
        for p in result.files:
            shutil.copyfile(p, Path(report_dir) / p.name)
    parent = info.get("parent_run_id") or ""
    if tracking and parent:
        log_comparison(result.metrics(), result.files, parent_run_id=parent,
                       tracking_uri=tracking_uri_of(tracking_uri, info, output_root),
                       rows=view_rows(runs, read_json(baseline) or None))
    print(result.table)
    print(f"plot: {result.plot_path}")
    best = max(result.summaries, key=lambda s: s.success).arm
    return {"best_arm": best, "table_md": result.table, "metrics": {k: float(v) for k, v in result.metrics().items()}}
