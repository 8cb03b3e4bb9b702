"""Compile, submit or run here a pipeline of sdar: `compile_pipeline` (KFP IR YAML for a cluster or the
local runner), `submit` (a run on Kubeflow Pipelines, as `kfp run create`) and `run_local` (the KFP local
runner on this machine, with a task table on the console and an MLflow parent run), behind `sdar compile`,
`sdar submit`, `sdar run --local` and `sdar demo`.

The DAGs are not part of the library: each is a builder registered as an entry point of group
`sdar.pipelines` (pyproject.toml: `sdar-comparison = "pipelines.sdar_comparison:build_pipeline"`), which
`load_pipeline` finds through importlib.metadata; the library never imports pipelines/ by name nor
edits sys.path. An entry point is there once the sdar distribution is installed (`pip install -e ./envs -e .`,
as the Makefile does).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sdar import openmp
from sdar.console import make_console
from sdar.env_service import local as local_envs
from sdar.lifecycle import Terminated, descendants, ending_on_signals, stop_processes
from sdar.pipeline.jobs import JOB_ENV, JobError, job_lock, new_job_id, read_job, write_job
from sdar.pipeline.settings import LOCAL_PARALLELISM, PIPELINE_NAME, ClusterSettings, RunSettings
from sdar.runlog import UNBUFFERED, TaskLog
from sdar.tags import PIPELINE_JOB_TAG
from sdar.tracking import Tracker, find_runs, mlflow_client, resolve_tracking_uri
from sdar.tracking.comparison import log_to_run
from sdar.tracking.view import how_to_open, published_view

ENTRY_POINT_GROUP = "sdar.pipelines"
# a checkout's root (src/sdar/pipeline/runner.py -> the repository): where run_local also looks for a
# relative config path (configs/household-tiny.yaml) when the working directory has none
REPO_ROOT = Path(__file__).resolve().parents[3]


class PipelineNotFound(LookupError):
    """No pipeline of that name is registered, or its package is not installed; the message says what to do."""


def pipelines() -> dict[str, Any]:
    """The registered pipelines: {name: entry point} of group sdar.pipelines."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_pipeline(name: str = PIPELINE_NAME) -> Callable[..., Any]:
    """The builder of pipeline `name` (for sdar-comparison: pipelines.sdar_comparison.build_pipeline), loaded
    through its entry point. PipelineNotFound, naming what to do, when it is not registered or not installed."""
    found = pipelines()
    if name not in found:
        raise PipelineNotFound(
            f"no pipeline {name!r} among the entry points of group {ENTRY_POINT_GROUP!r} (registered: "
            f"{', '.join(sorted(found)) or 'none'}); install sdar from a checkout of the repository "
            "(pip install -e ./envs -e .), which also installs its components/ and pipelines/ packages")
    try:
        return found[name].load()
    except ModuleNotFoundError as exc:  # an install of sdar without the checkout's components/ or pipelines/
        if (exc.name or "").split(".")[0] not in ("pipelines", "components"):
            raise
        raise PipelineNotFound(f"pipeline {name!r} ({found[name].value}) needs the package {exc.name!r}, which this "
                          "install of sdar lacks; install sdar from a checkout (pip install -e ./envs -e .)") from exc


def build_pipeline(target: str = "local", image: str | None = None, cluster: ClusterSettings | None = None,
                   parallelism: int = 0, replay_rounds: int = 1, name: str = PIPELINE_NAME):
    """The KFP pipeline function of pipeline `name` for `target` (its builder's arguments: for
    sdar-comparison see pipelines.sdar_comparison.build_pipeline)."""
    return load_pipeline(name)(target, image, cluster, parallelism=parallelism, replay_rounds=replay_rounds)


def compile_pipeline(out: str | os.PathLike = "pipeline.yaml", target: str = "cluster", image: str | None = None,
                     cluster: ClusterSettings | None = None, replay_rounds: int = 1, name: str = PIPELINE_NAME) -> Path:
    """Write the pipeline's IR YAML (what `kfp run create -f` and the Kubeflow UI take)."""
    from kfp import compiler

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(target, image, cluster, replay_rounds=replay_rounds, name=name),
                                package_path=str(out))
    return out


def submit(host: str, experiment: str, yaml_path: str | os.PathLike | None = None,
           arguments: dict[str, Any] | None = None, run_name: str | None = None, namespace: str | None = None,
           timeout_s: float = 10.0) -> str:
    """Create a run of the compiled pipeline on Kubeflow Pipelines at `host` (as `kfp run create
    -e EXPERIMENT -f pipeline.yaml` does); compiles for the cluster first when no YAML is given.
    Returns the run id. Raises ConnectionError with what to do when the host does not answer."""
    import tempfile
    import urllib.error
    import urllib.request

    base = host.rstrip("/")
    if "://" not in base:
        raise ValueError(f"--host needs a URL with a scheme, e.g. http://127.0.0.1:8080, got {host!r}")
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{base}/apis/v2beta1/healthz", timeout=timeout_s) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            pass  # an authenticating proxy answered: the host is there, kfp.Client handles auth
        else:
            raise ConnectionError(f"Kubeflow Pipelines at {base} answered HTTP {exc.code} on /apis/v2beta1/healthz; "
                                  "check that --host is the KFP API (or UI) address") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ConnectionError(
            f"cannot reach Kubeflow Pipelines at {base} ({getattr(exc, 'reason', exc)}); start a port-forward "
            "(kubectl -n kubeflow port-forward svc/ml-pipeline-ui 8080:80) and pass --host http://127.0.0.1:8080, "
            "or run it here with `sdar run --local`"
        ) from None
    import kfp

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(yaml_path) if yaml_path else compile_pipeline(Path(tmp) / "pipeline.yaml", "cluster")
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found; write it with `sdar compile --out {path}`")
        client = kfp.Client(host=base, namespace=namespace)
        run = client.create_run_from_pipeline_package(str(path), arguments=arguments or {}, run_name=run_name,
                                                      experiment_name=experiment, namespace=namespace)
    return run.run_id


def run_local(settings: RunSettings | None = None, *, quick: bool = False, root: str | os.PathLike = "runs/kfp-local",
              tracking_uri: str | None = None, console=None, quiet: bool = False, verbose: bool = False,
              parallelism: int | None = None, resume: str | None = None) -> dict[str, Any]:
    """Run the comparison pipeline on this machine through the KFP local runner (SubprocessRunner,
    no venv: the components run with this Python, so nothing is installed).

    The run is a job with an id of its own, printed first (sdar.pipeline.jobs). resume: the id of a job this root ran
    before and did not finish (killed, stopped, or a task failed): continue it with the settings, MLflow parent run
    and store it began with (pass no settings); the tasks that had finished are taken from their records, not redone,
    and the arm that was training resumes from its newest checkpoint.

    settings: sizes and arms (default: `RunSettings.quick()` when quick, else the config's sizes).
    root: pipeline_root of the runner; run outputs, the MLflow store (mlflow.db, unless
    tracking_uri or MLFLOW_TRACKING_URI names another) and reports/<stamp>/ go under it (<stamp>: the time and
    the job's random part, so two runs at once on one root never share a folder).
    The console shows one line per pipeline task (a live table on a terminal: name, state, seconds, and
    the step and success of training tasks); the whole runner log goes to <root>/logs/<stamp>/pipeline.log
    and each task's to <root>/logs/<stamp>/<task>.log, and a failed task's log is printed with its path.
    quiet: no live table, a line per task start and end only (what a log file or CI wants).
    verbose: stream the runner's and components' full logs to the terminal instead.
    parallelism: arms trained at once (default LOCAL_PARALLELISM = 2, the runner's cap; 1 = one at a time).
    Returns {table, plot, report_dir, parent_run_id, child_runs, tracking_uri, seconds, status, summaries, job_id,
    ui_command, view_url}: `ui_command` serves the store on 127.0.0.1:5000, where `view_url` opens the comparison; with
    an http(s) tracking URI `ui_command` is empty and `view_url` is on that server, whose UI it is.
    """
    console = console or make_console()
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    asked_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if resume:
        s, quick, uri, parent_id = _resumed(root, resume, settings, asked_uri)
    else:
        s = settings or (RunSettings.quick() if quick else RunSettings())
        uri = resolve_tracking_uri(asked_uri or f"sqlite:///{root / 'mlflow.db'}")
    job = resume or new_job_id()
    cfg_path = config_file(s.config_path)
    # <stamp>-<the job's random part>: two runs started in one second on one root keep their logs and reports apart
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{job.rsplit('-', 1)[-1]}"
    report_dir, log_dir = root / "reports" / stamp, root / "logs" / stamp
    args = {**s.arguments(), "config_path": str(cfg_path), "tracking_uri": uri, "output_root": str(root / "outputs"),
            "report_dir": str(report_dir)}
    with job_lock(args["output_root"], job):  # a second runner of the job is refused while this one lives
        if resume:
            parent = Tracker(s.experiment, resume_run_id=parent_id, tracking_uri=uri).start()
        else:
            parent = Tracker(s.experiment, run_name=f"comparison-{stamp}", tracking_uri=uri,
                             tags={"sdar.kind": "pipeline", "sdar.runner": "kfp-local", "sdar.quick": str(quick),
                                   PIPELINE_JOB_TAG: job}).start()
            parent.log_params({k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in args.items()})
            write_job(args["output_root"], job, {"settings": asdict(s), "quick": quick, "tracking_uri": uri,
                                                 "parent_run_id": parent.run_id, "experiment": s.experiment})
        args["parent_run_id"] = parent.run_id
        console.print(f"[bold]sdar comparison[/bold] via the KFP local runner: arms {', '.join(s.arms)}, seeds "
                      f"{s.seeds}, steps {s.steps or 'config'}; outputs under {root}")
        console.print(f"job {job} ({'continued' if resume else 'new'}); should it stop, `{resume_command(root, job)}` "
                      "continues it without redoing finished tasks", soft_wrap=True, highlight=False)
        at_once = LOCAL_PARALLELISM if parallelism is None else parallelism
        pipeline = build_pipeline("local", parallelism=at_once, replay_rounds=s.replay_rounds)
        # arms trained at once share the cores: their OpenMP threads sleep at once (sdar.openmp.at_once)
        with _environ({JOB_ENV: job, **openmp.at_once(min(at_once, len(s.arms) * len(s.seeds)))}):
            error, view, seconds = _run_pipeline(pipeline, args, parent.run_id, uri, log_dir, console, root, job,
                                                 quiet=quiet, verbose=verbose)
    result = _local_result(s.experiment, parent.run_id, uri, error, seconds, view, log_dir, report_dir)
    result["resume_command"] = resume_command(root, job) if error else ""
    result["disk_full"] = view is not None and view.disk_full is not None
    # the exit handler ended the parent run; make sure it is not left RUNNING if the runner itself failed
    log_to_run(parent.run_id, {"pipeline/seconds": seconds}, tracking_uri=uri)
    if mlflow_client(uri).get_run(parent.run_id).info.status == "RUNNING":
        parent.end("FAILED" if error else "FINISHED")
    _print_summary(console, result, uri)
    return result


def _run_pipeline(pipeline, args: dict[str, Any], parent_run_id: str, uri: str, log_dir: Path, console, root: Path,
                  job: str, *, quiet: bool, verbose: bool):
    """Run the pipeline through the KFP local runner: (the error of a failed task or None, the TaskLog, seconds). Ended
    by a signal or Ctrl-C, it stops what it started, says how to continue the job, and raises."""
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)
    for line in local_envs.stop_orphans(args["output_root"]):  # servers of a run that was killed outright
        console.print(f"stopped a leftover env server: {line}", soft_wrap=True, highlight=False)
    t0 = time.perf_counter()
    _STOPPED["tasks"] = 0
    try:
        # SIGTERM and SIGHUP end the run as Ctrl-C does: its task processes and env servers stop with it. The task
        # processes are stopped in the handler itself: KFP's ParallelFor waits for its worker threads (and so for
        # their tasks) in a `finally` before the exception gets out of it
        with ending_on_signals(on_signal=_stop_tasks):
            error, view = _run_logged(pipeline, args, log_dir, console, quiet=quiet, verbose=verbose)
    except (Terminated, KeyboardInterrupt) as exc:
        _stop_run(console, args["output_root"], parent_run_id, uri, exc)
        console.print(f"continue the job with `{resume_command(root, job)}`", soft_wrap=True, highlight=False)
        raise
    return error, view, time.perf_counter() - t0


_STOPPED = {"tasks": 0}  # task processes stopped since this run was ended by a signal


def resume_command(root: Path, job: str) -> str:
    """The command that continues job `job` of pipeline root `root`."""
    at = "" if Path("runs/kfp-local").resolve() == root else f" --root {root}"
    return f"sdar run --local{at} --resume {job}"


def _resumed(root: Path, job: str, settings: RunSettings | None, asked_uri: str | None):
    """(settings, quick, tracking URI, parent run id) of the unfinished job `job`; JobError when it cannot go on."""
    from mlflow.exceptions import MlflowException

    if settings is not None:
        raise JobError(f"job {job} continues with the settings it began with; pass no settings with resume")
    saved = read_job(root / "outputs", job)
    uri = saved["tracking_uri"]
    if asked_uri and resolve_tracking_uri(asked_uri) != uri:
        raise JobError(f"job {job} logs to {uri}, not {asked_uri} (MLFLOW_TRACKING_URI or --tracking-uri): "
                       "unset it, or set it to the job's store")
    try:
        parent = mlflow_client(uri).get_run(saved["parent_run_id"])
    except MlflowException as exc:
        raise JobError(f"job {job}'s MLflow parent run {saved['parent_run_id']} is not in {uri}: {exc}") from None
    if parent.info.status == "FINISHED":
        raise JobError(f"job {job} finished already (MLflow parent run {parent.info.run_id}); its comparison is under "
                       f"{root / 'reports'}. Start a new run without --resume")
    return RunSettings(**saved["settings"]), bool(saved["quick"]), uri, parent.info.run_id


def _stop_tasks() -> None:
    """Stop every process this runner started (the pipeline's task processes and what they started), counted."""
    tasks = descendants(os.getpid())
    stop_processes(tasks, grace_s=10.0)
    _STOPPED["tasks"] += len(tasks)


def _stop_run(console, output_root: str, parent_run_id: str, uri: str, why: BaseException) -> None:
    """The runner was ended by a signal (or Ctrl-C): stop its task processes and the env servers it started, mark its
    MLflow runs that are still open KILLED, and say so in one line."""
    from mlflow.exceptions import MlflowException

    _stop_tasks()  # any left: Ctrl-C has no handler of ours, and a task may have started since the signal
    tasks = _STOPPED["tasks"]
    servers = local_envs.stop_runner_servers(output_root, os.getpid())
    closed = 0
    try:
        client = mlflow_client(uri)
        parent = client.get_run(parent_run_id)
        runs = [parent, *client.search_runs([parent.info.experiment_id],
                                            f"tags.`mlflow.parentRunId` = '{parent_run_id}'")]
        for run in runs:
            if run.info.status == "RUNNING":
                client.set_terminated(run.info.run_id, "KILLED")
                closed += 1
    except (MlflowException, OSError) as exc:  # the store is unreachable: the runs stay open, the processes stopped
        console.print(f"[yellow]could not mark the MLflow runs KILLED: {str(exc)[:200]}[/yellow]")
    what = "Ctrl-C" if isinstance(why, KeyboardInterrupt) else str(why)
    console.print(f"sdar run: {what}; stopped {tasks} task process(es) and {len(servers)} env server(s), "
                  f"marked {closed} MLflow run(s) KILLED", soft_wrap=True, highlight=False)


def config_file(config_path: str | os.PathLike) -> Path:
    """`config_path` as a file: absolute, else relative to the working directory, else to the checkout's root
    (REPO_ROOT). FileNotFoundError when neither holds it."""
    path = Path(config_path)
    if not path.is_absolute():
        path = path if path.exists() else REPO_ROOT / path
    if not path.is_file():
        raise FileNotFoundError(f"config {config_path} not found (looked in . and {REPO_ROOT}); pass --config PATH")
    return path


def _run_logged(pipeline, args: dict[str, Any], log_dir: Path, console, *, quiet: bool, verbose: bool):
    """Run `pipeline(**args)` with one line per task on the console and each task's log in `log_dir` (verbose:
    the full logs on the terminal instead). Returns (the error of a failed task or None, the TaskLog or None)."""
    error: str | None = None
    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        stack.enter_context(_print_kept())
        # the tasks' output line by line, as it is written; and whose run an env server belongs to
        from sdar.env_service.local import RUNNER_PID_ENV

        stack.enter_context(_environ({**UNBUFFERED, RUNNER_PID_ENV: str(os.getpid())}))
        # the runner warns that our image name has no "python" in it: the components run in this Python
        warnings.filterwarnings("ignore", message=".*non-Python base image.*", category=RuntimeWarning)
        view = None
        if not verbose:  # one line per task on the console; each task's full log in its own file
            # a full disk under the logs stops the run's tasks: it ends as a failed run that says why in one line
            view = stack.enter_context(TaskLog(log_dir, console, live=False if quiet else None, on_disk_full=_stop_tasks))
            console.print(f"task logs: {log_dir}/", soft_wrap=True)
            # the runner logs to sys.stdout (its handler is made per run), so this takes it all
            stack.enter_context(contextlib.redirect_stdout(view))
        try:
            pipeline(**args)
        except RuntimeError as exc:  # a failed task; teardown already ran (exit handler)
            error = str(exc)
    if view is not None and view.disk_full is not None:
        return str(view.disk_full), view
    if view is not None and error:
        view.report_failures()
    return error, view


@contextlib.contextmanager
def _print_kept():
    """builtins.print as it was before, whatever the runner did to it. KFP's local runner indents a task's output by
    replacing builtins.print for the task's duration (kfp.local.logging_utils.indented_print) and putting back the
    function it found; two tasks of a ParallelFor overlap, so the one that ends last can put back the other's
    indenting function, and every print of this process after the run (a test's, the caller's) began with four
    spaces."""
    kept = builtins.print
    try:
        yield
    finally:
        builtins.print = kept


@contextlib.contextmanager
def _environ(values: dict[str, str | None]):
    """os.environ with `values` set (None: removed; the runner's task subprocesses inherit it), restored afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _local_result(experiment: str, parent_run_id: str, uri: str, error: str | None, seconds: float, view,
                  log_dir: Path, report_dir: Path) -> dict[str, Any]:
    """run_local's result: the status, the logs, the MLflow runs and, when compare ran, the comparison."""
    children = list(find_runs(experiment, f"tags.`mlflow.parentRunId` = '{parent_run_id}'", tracking_uri=uri))
    result: dict[str, Any] = {"status": "FAILED" if error else "SUCCEEDED", "error": error, "seconds": seconds,
                              "log": None if view is None else str(log_dir / "pipeline.log"),
                              "task_logs": {} if view is None else {k: str(t.log_path) for k, t in view.tasks.items()},
                              "parent_run_id": parent_run_id, "tracking_uri": uri, "experiment": experiment,
                              "child_runs": {r.run_name: r.run_id for r in children}, "report_dir": str(report_dir),
                              "table": None, "plot": None, "summaries": []}
    result.update(_view(uri, parent_run_id, log_dir.parents[1]))
    if (report_dir / "comparison.md").is_file():
        result["table"] = (report_dir / "comparison.md").read_text()
        result["plot"] = str(report_dir / "comparison.png")
        result["summaries"] = json.loads((report_dir / "comparison.json").read_text())["arms"]
    return result


def _view(uri: str, parent_run_id: str, root: Path, port: int = 5000) -> dict[str, str]:
    """The comparison's MLflow view of this run: the `sdar ui` command that serves the store and the URL it opens."""
    parent = mlflow_client(uri).get_run(parent_run_id)
    job = parent.data.tags.get(PIPELINE_JOB_TAG) or parent_run_id  # no job tag: launch_envs never ran
    view = published_view(uri, parent.info.experiment_id, job, port)
    if uri.startswith("sqlite:///") and Path(uri[len("sqlite:///"):]).resolve() == root / "mlflow.db":
        default_root = Path("runs/kfp-local").resolve() == root  # the pipeline root's store: sdar ui finds it
        view["ui_command"] = "sdar ui" + ("" if default_root else f" --root {root}") + f" --job {job}"
    return view


def _print_summary(console, result: dict[str, Any], uri: str) -> None:
    """The headline numbers as a narrow table (the markdown file also has every task type)."""
    from rich.table import Table

    if result["summaries"]:
        base = json.loads((Path(result["report_dir"]) / "comparison.json").read_text()).get("baseline") or {}
        table = Table(title="held-out success, same tasks for every arm (gap, gate: last training step)")
        for col in ("arm", "success [95% CI]", "vs warm start (paired)", "gap", "gate"):
            table.add_column(col, justify="left" if col == "arm" else "right", no_wrap=True)
        if base:
            table.add_row("warm start", f"{base['success']:.3f} [{base['ci95'][0]:.2f}, {base['ci95'][1]:.2f}]",
                          "-", "-", "-")
        for a in result["summaries"]:
            diff, lo, hi = a.get("vs_warm_start") or (math.nan,) * 3
            delta = f"{diff:+.3f} [{lo:+.2f}, {hi:+.2f}]" if diff == diff else (
                f"{a['success'] - base['success']:+.3f}" if base else "-")
            seeds = f" ({len(a['seeds'])} seeds)" if len(a["seeds"]) > 1 else ""
            table.add_row(a["arm"] + seeds, f"{a['success']:.3f} [{a['ci95'][0]:.2f}, {a['ci95'][1]:.2f}]", delta,
                          f"{a['gap_last']:+.3f}", f"{a['gate_last']:.3f}")
        console.print(table)
        console.print(f"table (with every task type): {Path(result['report_dir']) / 'comparison.md'}")
        console.print(f"plot: {result['plot']}")
    if result["error"]:
        console.print(f"[red]pipeline failed[/red] after {result['seconds']:.0f} s: {result['error']}")
        console.print(f"once the cause is fixed, `{result['resume_command']}` continues the job without redoing the "
                      "tasks that finished", soft_wrap=True, highlight=False)
    else:
        console.print(f"[green]pipeline finished[/green] in {result['seconds']:.0f} s")
    console.print(f"MLflow: parent run {result['parent_run_id']} with {len(result['child_runs'])} run(s) in "
                  f"experiment {result['experiment']!r}. The arms side by side: {how_to_open(result)}", soft_wrap=True)
    console.print(f"  {result['view_url']}", soft_wrap=True, markup=False, highlight=False)
