"""The pipeline's evaluate step as a plain function (the component components/evaluate.py calls it): a policy's
held-out success on the fixed task set, per seed, paired episode by episode with its seed's warm start, and where
the numbers go in MLflow (the arm's run, or the parent run and a run per warm start)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sdar.pipeline.jobs import once_per_job
from sdar.pipeline.steps import prepare_step, read_json, tracking_uri_of, write_json
from sdar.tracking import Tracker
from sdar.tracking.loggers import log_once
from sdar.tracking.view import WARM_START

EVAL_SAMPLING_SEED = 10_007  # + the seed: the sampling seed of every evaluation of a seed (its warm start and arms)


@once_per_job("evaluate", key=("label", "arm", "seed"), outputs=("result_path",))
def evaluate_policy(config_path: str, overrides: str, job_id: str, result_path: str, *, checkpoint: str = "",
                    endpoints: str = "", label: str = "", arm: str = "grpo", seed: int = 0,
                    seeds: list[int] | None = None, run_id: str = "", family: str = "", model: str = "",
                    eval_tasks: int = 0, episodes_per_task: int = 1, temperature: float = 0.4, greedy: bool = False,
                    tracking: bool = True, tracking_uri: str = "", output_root: str = "runs/kfp") -> dict[str, Any]:
    """Play `eval_tasks` tasks of the config's eval split (stratified over task types unless the
    config's eval_task_order is "first"; see sdar.eval.tasks) `episodes_per_task` times each: the fixed
    held-out task set, the same task ids for every arm and seed; success per task type with a 95% Wilson
    interval. Every evaluation of seed s samples at EVAL_SAMPLING_SEED + s, each episode from its own generator
    (sdar.eval.evaluate), so an arm and its seed's warm start are paired episode by episode.

    checkpoint: the policy to evaluate (a gated_train output directory); "" evaluates the config's model
    as built (the warm-started tiny model by default), i.e. the baseline before RL.
    seeds: with no checkpoint, evaluate the warm start of each of these seeds (the warm start depends on the
    seed: each arm is compared with its own seed's); the result pools them and keeps each under `by_seed`.
    endpoints: launch_envs' JSON file (its url is the env server; its parent_run_id the pipeline's run).
    arm: decides the student's prompt (skill_grpo shows skills); grpo = the plain student prompt.
    temperature: the paper's 0.4; greedy=True decodes greedily instead (temperature 0).
    run_id: the arm's MLflow run; its metrics get a `final/` prefix there. Without one (the warm start), the
    numbers go to the pipeline's parent run under `<label>/` (e.g. baseline/success) and to a run per seed,
    warm-start-seed<s> (arm tag `warm-start`), nested under it: the reference of the comparison's view.
    result_path: written as JSON {label, arm, seed, run_id, task_ids, success, ci95, n, per_type, outcomes, ...}.
    Returns {success, ci_low, ci_high, metrics: {name: value} for the step's KFP Metrics}.
    """
    from sdar.eval.evaluate import wilson_interval

    if episodes_per_task < 1:
        raise ValueError(f"episodes_per_task must be >= 1, got {episodes_per_task}")
    info = read_json(endpoints)
    name = label or (f"{arm}-seed{int(seed)}" if checkpoint else "baseline")
    play = {"config_path": config_path, "overrides": overrides, "job_id": job_id, "checkpoint": checkpoint,
            "info": info, "arm": arm, "family": family, "model": model, "eval_tasks": eval_tasks,
            "episodes_per_task": episodes_per_task, "temperature": 0.0 if greedy else float(temperature),
            "output_root": output_root}
    runs = [_play_eval(name=name, seed=int(s), **play) for s in (seeds if seeds and not checkpoint else [seed])]
    result = dict(runs[0])
    if len(runs) > 1:  # the warm starts of several seeds: pooled, each kept
        wins, n = sum(r["wins"] for r in runs), sum(r["n"] for r in runs)
        result.update(seed=runs[0]["seed"], success=wins / n, ci95=list(wilson_interval(wins, n)), n=n, wins=wins,
                      per_type=_pooled_types(runs), outcomes=[o for r in runs for o in r["outcomes"]])
    result.update(label=name, run_id=run_id, by_seed={str(r["seed"]): r for r in runs})
    uri = tracking_uri_of(tracking_uri, info, output_root)
    if tracking and not checkpoint and info.get("parent_run_id"):
        for r in runs:  # the warm start of each seed as a run of the comparison
            r["run_id"] = log_warm_start(info, r, uri)
    write_json(result_path, result)
    numbers = {"success": result["success"], "success_ci_low": result["ci95"][0],
               "success_ci_high": result["ci95"][1], **{f"success/{t}": v["success"]
                                                        for t, v in result["per_type"].items()}}
    target_run = run_id or info.get("parent_run_id") or ""
    if tracking and target_run:
        from sdar.tracking.comparison import log_to_run

        prefix = "final" if run_id else name
        log_to_run(target_run, {f"{prefix}/{k}": v for k, v in {**runs[0]["metrics"], **numbers}.items()},
                   files={f"{prefix}_eval.json": Path(result_path)}, tracking_uri=uri)
    print(f"{name}: success {result['success']:.3f} [{result['ci95'][0]:.3f}, {result['ci95'][1]:.3f}] over "
          f"{result['n']} episodes ({len(result['task_ids'])} tasks x {episodes_per_task} x {len(runs)} seed(s), "
          f"temperature {play['temperature']:g})")
    return {"success": result["success"], "ci_low": result["ci95"][0], "ci_high": result["ci95"][1],
            "metrics": {**{k: float(v) for k, v in {**runs[0]["metrics"], **numbers}.items()},
                        "episodes": float(result["n"])}}


def _play_eval(*, config_path: str, overrides: str, job_id: str, name: str, checkpoint: str, info: Mapping[str, Any],
               arm: str, seed: int, family: str, model: str, eval_tasks: int, episodes_per_task: int,
               temperature: float, output_root: str) -> dict[str, Any]:
    """One evaluation of `evaluate_policy` (one policy, one seed): its JSON record, with every episode's outcome
    as [task id, repeat, won] (what the paired differences of sdar.eval.compare are made of)."""
    from sdar.eval import evaluate as run_eval

    cfg, _, rt = prepare_step(config_path, overrides, arm=arm, seed=seed, tracking=False,
                              output_dir=str(Path(output_root) / job_id / f"eval-{name}-seed{seed}"), family=family,
                              model=model, checkpoint=checkpoint, url=info.get("url", ""),
                              sizes={"eval.tasks": eval_tasks})
    tasks = list(rt.eval_tasks)
    if len(tasks) < cfg.eval.tasks:
        print(f"note: the {cfg.env.eval_split!r} split has {len(tasks)} tasks, fewer than eval_tasks={cfg.eval.tasks}")
    sampling_seed = EVAL_SAMPLING_SEED + seed  # the same draws for every policy of a seed
    res = run_eval(rt.backend, rt.tokenizer, rt.env_factory, tasks, rt.rollout_cfg, temperature=temperature,
                   episodes_per_task=episodes_per_task, sampling_seed=sampling_seed)
    outcomes = [[t.task_id, k % episodes_per_task, int(t.won)] for k, t in enumerate(res.trajectories)]
    log_once(cfg.report_to, cfg.output_dir, res.metrics(prefix="final" if checkpoint else name))  # jsonl, tensorboard
    return {"label": name, "arm": arm, "seed": seed, "baseline": not checkpoint, "temperature": temperature,
            "episodes_per_task": episodes_per_task, "sampling_seed": sampling_seed, "task_ids": tasks,
            "family": cfg.env.family, **res.to_dict(), "wins": sum(o[2] for o in outcomes), "outcomes": outcomes,
            "metrics": {k.split("/", 1)[1]: v for k, v in res.metrics(prefix="eval").items()}}


def _pooled_types(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task type success over several evaluations (episode-weighted), with Wilson intervals."""
    from sdar.eval.evaluate import wilson_interval

    out: dict[str, dict[str, Any]] = {}
    for t in sorted({t for r in runs for t in r["per_type"]}):
        parts = [r["per_type"][t] for r in runs if t in r["per_type"]]
        n = sum(p["n"] for p in parts)
        wins = round(sum(p["success"] * p["n"] for p in parts))
        out[t] = {"success": wins / n, "n": n, "ci95": list(wilson_interval(wins, n))}
    return out


def log_warm_start(info: Mapping[str, Any], result: Mapping[str, Any], tracking_uri: str) -> str:
    """The warm start of one seed as an MLflow run nested under the pipeline's parent run (`warm-start-seed<s>`,
    arm tag `warm-start`, the job's id inherited from the parent): its held-out numbers as `final/*`, the
    reference bar of the comparison's view. Returns its run id."""
    with Tracker(info.get("experiment") or "sdar-comparison", run_name=f"{WARM_START}-seed{result['seed']}",
                 parent_run_id=info["parent_run_id"], tracking_uri=tracking_uri,
                 tags={"arm": WARM_START, "seed": result["seed"], "sdar.kind": WARM_START}) as run:
        run.log_params({"arm": WARM_START, "seed": result["seed"], "sampling_seed": result["sampling_seed"]})
        run.log_metrics({f"final/{k}": v for k, v in result["metrics"].items()})
        run.log_dict({k: v for k, v in result.items() if k != "metrics"}, "final_eval.json")
    return run.run_id
