"""`sdar compile`, `sdar run --local` and `sdar submit`: the comparison pipeline compiled for a cluster, run
here through the KFP local runner, or submitted (sdar.pipeline.runner does the work).

`run_comparison(...)` is the importable entry point `sdar demo` calls.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

from sdar.config import SET_HELP, parse_set
from sdar.pipeline import runner  # runner.submit read at call time (tests stand in for a KFP host)
from sdar.pipeline.jobs import JobError
from sdar.pipeline.runner import PipelineNotFound, compile_pipeline, run_local
from sdar.pipeline.settings import DEFAULT_CONFIG, DEFAULT_EXPERIMENT, ClusterSettings, RunSettings, arms_at_once
from sdar.tracking import mlflow_client
from sdar.tracking.store import get_or_create_experiment
from sdar.tracking.view import publish_view, view_url


def run_comparison(arms: list[str] | None = None, seeds: list[int] | None = None, steps: int | None = None, *,
                   quick: bool = False, root: str = "runs/kfp-local", console=None, quiet: bool = False,
                   verbose: bool = False, parallelism: int | None = None, resume: str | None = None,
                   **settings: Any) -> dict[str, Any]:
    """Run the comparison pipeline locally (KFP local runner) and print the table, the plot path and
    how to open `mlflow ui`. quick: the smoke-test sizes (a few minutes on 2 cores).
    The console shows a line per pipeline task, each task's log goes to <root>/logs/<stamp>/<task>.log
    (quiet: no live table; verbose: the full logs on the terminal instead).

    parallelism: arms trained at once (default 2, the local runner's cap; 1 = one at a time).
    resume: continue that unfinished job of `root` with its own settings (then pass none).
    settings: any `RunSettings` field (group_size, tasks_per_step, eval_tasks, episodes_per_task,
    greedy, family, model, config_path, overrides, experiment). Returns sdar.pipeline.runner.run_local's
    result dict (table, plot, report_dir, parent_run_id, child_runs, tracking_uri, seconds, status, summaries).
    """
    changes = {k: v for k, v in settings.items() if v is not None}
    if arms is not None:
        changes["arms"] = list(arms)
    if seeds is not None:
        changes["seeds"] = list(seeds)
    if steps is not None:
        changes["steps"] = steps
    if resume:
        if changes or quick:
            from sdar.pipeline.jobs import JobError

            given = ", ".join(sorted(changes) + (["quick"] if quick else []))
            raise JobError(f"--resume {resume} continues the job with the settings it began with; drop {given}")
        return run_local(None, root=root, console=console, quiet=quiet, verbose=verbose, parallelism=parallelism,
                         resume=resume)
    s = RunSettings.quick(**changes) if quick else RunSettings(**changes)
    return run_local(s, quick=quick, root=root, console=console, quiet=quiet, verbose=verbose,
                     parallelism=parallelism)


def _needs_the_dag(command):
    """`command` reaches the DAG through its entry point: a missing one is a one-line error, not a traceback."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except PipelineNotFound as exc:
            raise SystemExit(f"sdar {args.command}: {exc}") from None

    return run


def _csv(text: str, cast=str) -> list:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    try:
        return [cast(x) for x in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated {cast.__name__}s, got {text!r}") from None


def _checked_overrides(sets: list[tuple[str, Any]] | None, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """`base` updated with the --set pairs, checked against the default config (the keys exist, the values
    fit, the launcher is known) so a typo fails here rather than in the run's first step."""
    from sdar.config import load_config

    overrides = {**(base or {}), **dict(sets or [])}
    try:
        load_config(DEFAULT_CONFIG, overrides).launch.resolved_launcher()
    except ValueError as exc:
        raise SystemExit(f"--set: {exc}") from None
    return overrides


def _compiled_default(path, name: str) -> Any:
    """The default of pipeline parameter `name` in the pipeline IR at `path` (None where it has none)."""
    from pathlib import Path

    import yaml

    spec = next(yaml.safe_load_all(Path(path).read_text()))
    return spec["root"]["inputDefinitions"]["parameters"].get(name, {}).get("defaultValue")


def _compiled_overrides(path) -> dict[str, Any]:
    """The default of the `overrides` parameter in the pipeline IR at `path`."""
    import json

    return json.loads(_compiled_default(path, "overrides") or "{}")


def _bake_overrides(path, overrides: dict[str, Any]) -> None:
    """Make `overrides` (JSON) the default of the pipeline's `overrides` parameter in the IR at `path`."""
    import json
    from pathlib import Path

    import yaml

    docs = list(yaml.safe_load_all(Path(path).read_text()))
    docs[0]["root"]["inputDefinitions"]["parameters"]["overrides"]["defaultValue"] = json.dumps(overrides)
    Path(path).write_text(yaml.safe_dump_all(docs, sort_keys=False))


@_needs_the_dag
def _cmd_compile(args: argparse.Namespace) -> int:
    from dataclasses import replace

    if args.gpus is not None and args.gpus < 0:
        raise SystemExit(f"--gpus must be >= 0 (0 = no GPU request, node selector or toleration), got {args.gpus}")
    changes = {k: v for k, v in (("gpus", args.gpus), ("env_image", args.env_image),
                                 ("env_namespace", args.env_namespace), ("train_cpu", args.train_cpu),
                                 ("train_memory", args.train_memory)) if v is not None}
    cluster = replace(ClusterSettings(), **changes)
    overrides = _checked_overrides(args.set) if args.set else {}
    path = compile_pipeline(args.out, target=args.target, image=args.image, cluster=cluster,
                            replay_rounds=args.replay_rounds)
    if overrides:  # the default of the run's `overrides`; a run's own (--arg overrides=...) replaces it
        _bake_overrides(path, overrides)
    where = f", {cluster.gpus} GPU(s) per training pod" if args.target == "cluster" else ""
    if args.target == "cluster" and cluster.gpus and overrides.get("launch.launcher") in ("trainjob", "torchx"):
        print(f"note: with launch.launcher={overrides['launch.launcher']} the training step only launches the job and "
              "waits; compile with --gpus 0 so that its pod holds no GPU")
    print(f"wrote {path} (target {args.target}{where}); run it with: kfp run create -e EXPERIMENT -f {path}  "
          f"(or sdar submit --host URL --experiment EXPERIMENT --yaml {path})")
    return 0


@_needs_the_dag
def _cmd_run(args: argparse.Namespace) -> int:
    if not args.local:
        raise SystemExit("sdar run runs the pipeline on this machine and needs --local; "
                         "for a cluster use `sdar compile` then `sdar submit --host URL --experiment NAME`")
    settings: dict[str, Any] = {
        "group_size": args.group_size, "tasks_per_step": args.tasks_per_step, "eval_tasks": args.eval_tasks,
        "episodes_per_task": args.episodes_per_task, "family": args.family, "model": args.model,
        "config_path": args.config, "experiment": args.experiment, "teacher_pool": args.teacher_pool,
        "replay_episodes": args.replay_episodes, "replay_rounds": args.replay_rounds,
    }
    if args.greedy:
        settings["greedy"] = True
    overrides = dict(args.set or [])
    if overrides:
        if args.quick:
            from sdar.pipeline.settings import RunSettings

            overrides = {**RunSettings.quick().overrides, **overrides}
        settings["overrides"] = overrides

    try:
        result = run_comparison(args.arms, args.seeds, args.steps, quick=args.quick, root=args.root, quiet=args.quiet,
                                verbose=args.verbose, parallelism=args.parallel, resume=args.resume, **settings)
    except JobError as exc:
        raise SystemExit(f"sdar run: {exc}") from None
    return 0 if result["status"] == "SUCCEEDED" else 5 if result.get("disk_full") else 1


@_needs_the_dag
def _cmd_submit(args: argparse.Namespace) -> int:
    import json

    arguments = dict(args.arg or [])
    if args.set:  # on top of the run's --arg overrides, else of the compiled pipeline's default
        base = arguments.get("overrides")
        if isinstance(base, str):
            base = json.loads(base or "{}")
        if base is None and args.yaml:
            base = _compiled_overrides(args.yaml)
        arguments["overrides"] = _checked_overrides(args.set, base)
    if isinstance(arguments.get("overrides"), dict):  # the pipeline takes them as JSON text
        arguments["overrides"] = json.dumps(arguments["overrides"])
    try:
        run_id = runner.submit(args.host, args.experiment, yaml_path=args.yaml, arguments=arguments,
                        run_name=args.run_name, namespace=args.namespace)
    except ConnectionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"submitted run {run_id} to {args.host} (experiment {args.experiment!r})")
    # the experiment the run logs to: what this submit passes, else what the compiled pipeline defaults to (a
    # pipeline compiled with another `experiment` logs there), else the pipeline's own default
    experiment = (args.mlflow_experiment or arguments.get("experiment")
                  or (_compiled_default(args.yaml, "experiment") if args.yaml else None))
    _print_view(run_id, args.mlflow_url, experiment)
    return 0


def _print_view(job: str, mlflow_url: str | None, experiment: str | None) -> None:
    """The submitted run's comparison view in MLflow: saved on the MLflow server now (the run's launch step saves
    the same one), so the printed URL opens it as soon as the first arm logs; without a server URL, how to get it."""
    import os

    url = mlflow_url or (os.environ.get("MLFLOW_TRACKING_URI", "") if os.environ.get(
        "MLFLOW_TRACKING_URI", "").startswith(("http://", "https://")) else "")
    if not url:
        print(f"the comparison in MLflow: sdar ui --tracking-uri MLFLOW_URL --job {job}  (prints its URL; or pass "
              "--mlflow-url to sdar submit)")
        return

    name = experiment or DEFAULT_EXPERIMENT
    client = mlflow_client(url)
    try:
        exp_id = get_or_create_experiment(client, name, None)
        publish_view(url, exp_id, job)
    except Exception as exc:  # noqa: BLE001 - the run is submitted; only the URL is missing
        print(f"could not save the comparison's view on {url} ({type(exc).__name__}: {str(exc)[:200]}); once the "
              f"run has started: sdar ui --tracking-uri {url} --job {job}")
        return
    print(f"the comparison in MLflow (experiment {name!r}; with KFP's MLflow integration on, pass its experiment as "
          f"--mlflow-experiment):\n  {view_url(url, exp_id, job)}")


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("compile", help="write the comparison pipeline's KFP IR YAML")
    c.add_argument("--out", default="pipeline.yaml", help="output YAML (default pipeline.yaml)")
    c.add_argument("--replay-rounds", type=int, default=1,
                   help="rollout -> teacher replay -> training rounds per arm, unrolled in the DAG (default 1)")
    c.add_argument("--target", choices=("cluster", "local"), default="cluster",
                   help="cluster adds GPUs, node selector, tolerations, the env image and secrets (default cluster)")
    c.add_argument("--image", default=None, help="component image (default: $SDAR_IMAGE or ghcr.io/sdar/sdar-trainer:<version>, see make images)")
    c.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="GPUs per training pod (default 1); 0: no GPU request, node selector or toleration "
                        "(kind/minikube, or a pod that only launches a TorchX job)")
    c.add_argument("--train-cpu", default=None, help="CPU request and limit of each training pod (default 8)")
    c.add_argument("--train-memory", default=None, help="memory request and limit of each training pod (default 32G)")
    c.add_argument("--env-image", default=None,
                   help="env-server image launch_envs deploys (default: $SDAR_ENV_IMAGE, else sdar-env-server "
                        "with the registry and tag of --image)")
    c.add_argument("--env-namespace", default=None,
                   help="default namespace of the env services (default sdar, where k8s/ grants access; "
                        "'' = the pipeline pods' own)")
    c.add_argument("--set", action="append", type=parse_set, metavar="KEY=VALUE",
                   help="a config override every step gets (the default of the pipeline's `overrides`), e.g. "
                        "--set launch.launcher=trainjob; " + SET_HELP)
    c.set_defaults(func=_cmd_compile)

    r = sub.add_parser("run", help="run the comparison pipeline here through the KFP local runner (--local)")
    r.add_argument("--local", action="store_true", help="run on this machine (the only mode of `sdar run`)")
    r.add_argument("--quick", action="store_true", help="smoke-test sizes: a few minutes on 2 CPU cores")
    r.add_argument("--arms", type=_csv, default=None, help="comma-separated arms (default grpo,grpo_opsd,sdar)")
    r.add_argument("--seeds", type=lambda t: _csv(t, int), default=None, help="comma-separated seeds (default 0)")
    r.add_argument("--steps", type=int, default=None, help="RL steps per arm (default: the config's, or 2 with --quick)")
    r.add_argument("--group-size", type=int, default=None, help="rollouts per task (G)")
    r.add_argument("--tasks-per-step", type=int, default=None)
    r.add_argument("--eval-tasks", type=int, default=None, help="held-out tasks (the same for every arm and seed)")
    r.add_argument("--episodes-per-task", type=int, default=None, help="evaluation episodes per held-out task")
    r.add_argument("--greedy", action="store_true", help="evaluate greedily instead of at temperature 0.4")
    r.add_argument("--family", default=None, help="environment family (default: the config's)")
    r.add_argument("--model", default=None, help="policy model (default: the config's; e.g. tiny, smollm2, a path)")
    r.add_argument("--config", default=None, help="experiment YAML (default configs/household-tiny.yaml)")
    r.add_argument("--experiment", default=None, help="MLflow experiment (default sdar-comparison)")
    r.add_argument("--root", default="runs/kfp-local", help="pipeline root and MLflow store (default runs/kfp-local)")
    r.add_argument("--resume", default=None, metavar="JOB",
                   help="continue the job of that id (printed at its start) that was killed, stopped or failed, with "
                        "its own settings: tasks that finished are not redone, training resumes from its checkpoint")
    r.add_argument("--set", action="append", type=parse_set, metavar="KEY=VALUE", help=SET_HELP)
    r.add_argument("--teacher-pool", default=None, metavar="YAML",
                   help="N-teacher pool for the replay arms (default: the config's replay section, the local pool)")
    r.add_argument("--replay-episodes", type=int, default=None, help="episodes each round's rollout plays for replay")
    r.add_argument("--replay-rounds", type=int, default=None, help="rollout -> teacher replay -> training rounds (default 1)")
    r.add_argument("--parallel", type=arms_at_once, default=None, metavar="N",
                   help="arms trained at once (default 2, the most the KFP local runner allows; 1 = one at a time)")
    r.add_argument("--quiet", action="store_true",
                   help="no live table: a line per task start and end (task logs are always in <root>/logs/<stamp>/)")
    r.add_argument("--verbose", action="store_true", help="stream the runner's and components' full logs to the terminal")
    r.set_defaults(func=_cmd_run)

    s = sub.add_parser("submit", help="submit the pipeline to Kubeflow Pipelines (like `kfp run create`)")
    s.add_argument("--host", required=True, help="KFP API or UI URL, e.g. http://127.0.0.1:8080")
    s.add_argument("--experiment", required=True, help="KFP experiment name (created if missing)")
    s.add_argument("--yaml", default=None, help="compiled pipeline (default: compile for the cluster now)")
    s.add_argument("--run-name", default=None)
    s.add_argument("--namespace", default=None, help="Kubeflow profile namespace (multi-user installs)")
    s.add_argument("--arg", action="append", type=parse_set, metavar="KEY=VALUE",
                   help="pipeline argument, YAML value (e.g. --arg arms=[grpo,sdar] --arg steps=150)")
    s.add_argument("--set", action="append", type=parse_set, metavar="KEY=VALUE",
                   help="a config override of this run, added to --arg overrides (else to the compiled "
                        "default), e.g. --set launch.nodes=2; " + SET_HELP)
    s.add_argument("--mlflow-url", default=None,
                   help="the MLflow server the run logs to (default: MLFLOW_TRACKING_URI when it is http(s)): save the "
                        "comparison's view there and print its URL")
    s.add_argument("--mlflow-experiment", default=None,
                   help="the MLflow experiment the run's runs land in (default: the pipeline's `experiment` argument, "
                        "sdar-comparison; with KFP's MLflow integration, the experiment KFP chose, e.g. KFP-Default)")
    s.set_defaults(func=_cmd_submit)
