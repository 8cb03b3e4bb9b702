"""The comparison pipeline as a Kubeflow Pipelines DAG, and the helpers that compile it for a
cluster, submit it to one, or run it on this machine through the KFP local runner.

DAG: run_matrix -> launch_envs -> baseline evaluate (warm-started policy) -> ParallelFor over
(arm, seed): [rollout -> teacher_replay -> gated_train] x replay_rounds -> evaluate -> compare;
teardown_envs is the ExitHandler's exit task, so it runs even when a branch fails. Each round's
rollout plays the newest policy, teacher_replay scores it with the self-teacher and (arms with a
replay weight) turns the N-teacher pool's verdicts into DPO pairs, and gated_train continues the
arm's run with those pairs in its first step while on-policy RL goes on in-process. `target="cluster"` adds GPUs, node selector, tolerations, the
env-server image and namespace, and secrets; `target="local"` leaves them out, because the local
runner ignores or rejects them.
"""

import json
import os
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, List

from kfp import dsl

PIPELINE_NAME = "sdar-comparison"
DEFAULT_ARMS = ["grpo", "grpo_opsd", "sdar"]
DEFAULT_CONFIG = "configs/household-tiny.yaml"
DEFAULT_EXPERIMENT = "sdar-comparison"
REPO_ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("local", "cluster")


@dataclass
class ClusterSettings:
    """What `target="cluster"` adds to the tasks (kfp-kubernetes); the secrets must exist in the
    pipeline's namespace (k8s/ creates them).

    gpu_type / gpus: accelerator of each gated_train pod (set_accelerator_type / _limit). gpus=0: no
    GPU request, node selector or toleration, for clusters without GPUs (kind, minikube) or when
    gated_train only launches a TorchX job (launch.gpus_per_node in `overrides`) and waits for it.
    train_cpu / train_memory: requests (and limits) of each gated_train pod.
    node_selector: labels a GPU node carries (EKS managed node group named "gpu" by default).
    tolerations: taints of the GPU nodes the training pods tolerate.
    env_image: the env-server image launch_envs deploys; "" = SDAR_ENV_IMAGE, else sdar-env-server
    beside the pipeline's image (same registry and tag), else sdar.images' default.
    env_namespace: default of the pipeline's `namespace` parameter, where launch_envs puts the env
    services: `sdar`, where k8s/ grants the Role and NetworkPolicies; "" = the pipeline pods' own.
    mlflow_secret / mlflow_keys: Secret name and {env var: secret key} for MLflow (tracking URI etc.),
    given only to the steps that log (MLFLOW_STEPS; MLflow proxies artifacts, so none needs S3 for it).
    s3_secret / s3_keys: Secret name and {env var: secret key} for S3/MinIO, given only to the step
    that reads and writes checkpoints there (S3_STEPS: gated_train and the TorchX jobs it launches).
    eval_on_gpu: give the evaluation pods the same GPU settings (real models decode faster there).
    pod_labels: labels on every task's pod; k8s/ NetworkPolicies admit only pods carrying these to
    the env services, MLflow and MinIO (the chart's networkPolicy.allowedClients default too).
    run_as_user / run_as_group: the user every step's container runs as (non-root; the images' USER
    10001:10001). KFP's backend (>= 2.16) adds the rest of the restricted profile to every executor
    container (allowPrivilegeEscalation false, capabilities drop ALL, seccomp RuntimeDefault).
    security_context: False leaves the user out of the IR, for KFP backends before 2.16, whose
    compiler rejects the field (2.6 to 2.15) or then drops the pod labels (2.5).
    step_cpu / step_memory: requests (and limits) of the light steps (run matrix, launch, compare, teardown).
    eval_cpu / eval_memory: requests (and limits) of the evaluation pods without eval_on_gpu.
    """

    gpu_type: str = "nvidia.com/gpu"
    gpus: int = 1
    train_cpu: str = "8"
    train_memory: str = "32G"
    node_selector: dict[str, str] = field(default_factory=lambda: {"eks.amazonaws.com/nodegroup": "gpu"})
    tolerations: list[dict[str, str]] = field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    env_image: str = ""
    env_namespace: str = "sdar"
    mlflow_secret: str = "sdar-mlflow"
    mlflow_keys: dict[str, str] = field(default_factory=lambda: {"MLFLOW_TRACKING_URI": "MLFLOW_TRACKING_URI"})
    s3_secret: str = "sdar-s3"
    s3_keys: dict[str, str] = field(default_factory=lambda: {
        "AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
        "SDAR_S3_ENDPOINT_URL": "SDAR_S3_ENDPOINT_URL"})
    eval_on_gpu: bool = False
    pod_labels: dict[str, str] = field(default_factory=lambda: {"app.kubernetes.io/part-of": "sdar-pipeline"})
    run_as_user: int = 10001
    run_as_group: int = 10001
    security_context: bool = True
    step_cpu: str = "1"
    step_memory: str = "2G"
    eval_cpu: str = "4"
    eval_memory: str = "16G"
    # the teacher pool's API keys: {env var an endpoint's api_key_env names: key in the Secret}, mounted
    # (optional: a pool of local models needs none) in the steps that call the pool (TEACHER_STEPS)
    teacher_secret: str = "sdar-teachers"
    teacher_keys: dict[str, str] = field(default_factory=lambda: {"OPENAI_API_KEY": "OPENAI_API_KEY"})


# the steps (component names) that read each Secret: MLflow for those that log runs (launch opens the
# parent run, teardown closes it); S3 for checkpoints, which only training reads and writes
MLFLOW_STEPS = ("launch_envs", "evaluate", "gated_train", "compare", "teardown_envs")
S3_STEPS = ("gated_train",)
# the steps that call the N-teacher pool (Composer channel 3): the replay step, and training, which goes on
# replaying its own on-policy trajectories
TEACHER_STEPS = ("teacher_replay", "gated_train")


def _components(image: str | None):
    import components as c

    if not image:
        return c
    from components._image import with_image

    class Rebuilt:  # the same python functions, built for `image`
        pass

    out = Rebuilt()
    for comp in c.ALL:
        setattr(out, comp.python_func.__name__, with_image(comp, image))
    return out


def _resources(task, cs: ClusterSettings) -> None:
    """CPU and memory of a training-sized pod, and with cs.gpus > 0 its GPUs and the GPU nodes'
    selector and tolerations (without GPUs the pod runs on any node)."""
    from kfp import kubernetes

    task.set_cpu_request(cs.train_cpu).set_cpu_limit(cs.train_cpu)
    task.set_memory_request(cs.train_memory).set_memory_limit(cs.train_memory)
    if not cs.gpus:
        return
    task.set_accelerator_type(cs.gpu_type).set_accelerator_limit(cs.gpus)
    for k, v in cs.node_selector.items():
        kubernetes.add_node_selector(task, label_key=k, label_value=v)
    for t in cs.tolerations:
        kubernetes.add_toleration(task, key=t.get("key"), operator=t.get("operator"), value=t.get("value"),
                                  effect=t.get("effect"))


def _secrets(task, cs: ClusterSettings, step: str) -> None:
    """The Secrets `step` (a component's name) reads, and no other."""
    from kfp import kubernetes

    if step in MLFLOW_STEPS:
        kubernetes.use_secret_as_env(task, secret_name=cs.mlflow_secret, secret_key_to_env=dict(cs.mlflow_keys))
    if step in S3_STEPS:
        kubernetes.use_secret_as_env(task, secret_name=cs.s3_secret, secret_key_to_env=dict(cs.s3_keys))
    if step in TEACHER_STEPS and cs.teacher_keys:
        kubernetes.use_secret_as_env(task, secret_name=cs.teacher_secret, secret_key_to_env=dict(cs.teacher_keys),
                                     optional=True)


def _restricted(task, cs: ClusterSettings, cpu: str, memory: str) -> None:
    """Non-root user and group (KFP adds no privilege escalation, drop ALL, seccomp RuntimeDefault), and
    CPU and memory requests equal to the limits (the training pods' _resources replaces them)."""
    from kfp import kubernetes

    if cs.security_context:
        kubernetes.set_security_context(task, run_as_user=cs.run_as_user, run_as_group=cs.run_as_group,
                                        run_as_non_root=True)
    task.set_cpu_request(cpu).set_cpu_limit(cpu)
    task.set_memory_request(memory).set_memory_limit(memory)


def build_pipeline(target: str = "local", image: str | None = None, cluster: ClusterSettings | None = None,
                   parallelism: int = 0, replay_rounds: int = 1):
    """The pipeline function for `target` ("local": the KFP local runner; "cluster": Kubeflow).

    image: the container image of every component (default: SDAR_IMAGE or the trainer image); on a
    cluster gated_train also gets it as SDAR_IMAGE, the image of the TorchX jobs it launches.
    cluster: GPU, scheduling, env-service and secret settings, applied only for target="cluster".
    parallelism: at most this many arms train at once (0: no limit; the local runner uses <= 2).
    replay_rounds: rollout -> teacher_replay -> gated_train rounds per arm, unrolled at compile time; round
        r trains to step ceil(steps * (r + 1) / R) from round r-1's run, so later rounds replay a newer policy.
    """
    if replay_rounds < 1:
        raise ValueError(f"replay_rounds must be >= 1, got {replay_rounds}")
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    from sdar.images import env_server_image

    c = _components(image)
    cs = cluster or ClusterSettings()
    if cs.gpus < 0:
        raise ValueError(f"ClusterSettings.gpus must be >= 0 (0 = no GPU), got {cs.gpus}")
    on_cluster = target == "cluster"
    # the image the components were built for (SDAR_IMAGE or the trainer image when `image` is None)
    pipeline_image = c.gated_train.component_spec.implementation.container.image
    # the env server's image and namespace matter on a cluster only; locally launch_envs starts a process
    env_kw = {"env_image": cs.env_image or env_server_image(pipeline_image)} if on_cluster else {}
    default_namespace = cs.env_namespace if on_cluster else ""

    @dsl.pipeline(name=PIPELINE_NAME, description=(
        "GRPO vs GRPO+OPSD vs SDAR (and the Composer arms) on the same budget: launch environment services, "
        "evaluate the warm-started policy, then per arm and seed in parallel: rollout -> teacher replay -> gated "
        "training (x replay rounds) -> evaluate; compare; teardown always runs."))
    def sdar_comparison(
        family: str = "",
        model: str = "",
        arms: List[str] = DEFAULT_ARMS,
        seeds: List[int] = [0],
        steps: int = 0,
        group_size: int = 0,
        tasks_per_step: int = 0,
        eval_tasks: int = 0,
        episodes_per_task: int = 1,
        eval_temperature: float = 0.4,
        greedy: bool = False,
        config_path: str = DEFAULT_CONFIG,
        overrides: str = "{}",
        experiment: str = DEFAULT_EXPERIMENT,
        tracking: bool = True,
        tracking_uri: str = "",
        parent_run_id: str = "",
        output_root: str = "runs/kfp",
        checkpoint_root: str = "",
        namespace: str = default_namespace,
        report_dir: str = "",
        teacher_pool: str = "",
        replay_episodes: int = 8,
    ):
        """Sizes left at 0 and family/model left empty keep the config's values; `overrides` is a JSON
        object of dotted config keys applied to every step (e.g. '{"rollout.max_turns": 8}');
        `namespace` is where the env services go on a cluster ("" = the pipeline pods' own).
        `teacher_pool`: a YAML of the N-teacher pool (replay settings; "" = the config's, by default the
        local pool); `replay_episodes`: episodes each round's rollout step plays for teacher replay."""
        job_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        common = {"config_path": config_path, "overrides": overrides, "family": family}
        track = {"experiment": experiment, "tracking": tracking, "tracking_uri": tracking_uri, "output_root": output_root}

        teardown = c.teardown_envs(job_id=job_id, target=target, namespace=namespace, **track)
        with dsl.ExitHandler(teardown, name="comparison"):
            matrix = c.run_matrix(arms=arms, seeds=seeds, model=model, **common)
            launch = c.launch_envs(job_id=job_id, target=target, namespace=namespace, parent_run_id=parent_run_id,
                                   run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER, **env_kw, **common, **track).after(matrix)
            endpoints = launch.outputs["endpoints"]
            evals = {"model": model, "eval_tasks": eval_tasks, "episodes_per_task": episodes_per_task,
                     "temperature": eval_temperature, "greedy": greedy, "job_id": job_id}
            baseline = c.evaluate(label="baseline", arm="grpo", seed=0, endpoints=endpoints,
                                  **common, **evals, **track)
            # arms and seeds arrive as one flat list of {arm, seed}: the local runner mis-binds an outer
            # loop's item inside a nested ParallelFor, so there is a single loop
            with dsl.ParallelFor(matrix.output, parallelism=parallelism or None) as run:
                newest: dict[str, Any] = {}  # the previous round's policy (round 0: the config's warm start)
                rounds = []
                for r in range(replay_rounds):
                    roll = c.rollout(arm=run.arm, seed=run.seed, replay_round=r, episodes=replay_episodes,
                                     endpoints=endpoints, job_id=job_id, model=model, output_root=output_root,
                                     **common, **newest)
                    if r == 0:
                        roll.after(baseline)  # the warm start is built once, by the baseline, before the arms share it
                    replay = c.teacher_replay(trajectories=roll.outputs["trajectories"], arm=run.arm,
                                              teacher_pool=teacher_pool, job_id=job_id, model=model,
                                              output_root=output_root, **common, **newest)
                    train = c.gated_train(
                        arm=run.arm, seed=run.seed, endpoints=endpoints, job_id=job_id, model=model, steps=steps,
                        group_size=group_size, tasks_per_step=tasks_per_step, eval_tasks=eval_tasks,
                        checkpoint_root=checkpoint_root, pairs=replay.outputs["pairs"], replay_round=r,
                        replay_rounds=replay_rounds, **common, **track,
                    )
                    newest = {"checkpoint": train.outputs["checkpoint"]}
                    rounds.append((roll, replay, train))
                final = c.evaluate(checkpoint=train.outputs["checkpoint"], run_id=train.outputs["run_id"],
                                   arm=run.arm, seed=run.seed, endpoints=endpoints, **common, **evals, **track)
            report = c.compare(
                evaluations=dsl.Collected(final.outputs["result"]), histories=dsl.Collected(train.outputs["history"]),
                baseline=baseline.outputs["result"], endpoints=endpoints, tracking=tracking,
                tracking_uri=tracking_uri, output_root=output_root, report_dir=report_dir,
            )

        if on_cluster:
            from kfp import kubernetes

            steps = {matrix: "run_matrix", launch: "launch_envs", baseline: "evaluate", final: "evaluate",
                     report: "compare", teardown: "teardown_envs"}
            for roll, replay, train_r in rounds:
                steps.update({roll: "rollout", replay: "teacher_replay", train_r: "gated_train"})
            for task in steps:
                for k, v in cs.pod_labels.items():
                    kubernetes.add_pod_label(task, label_key=k, label_value=v)
            sizes = {"gated_train": (cs.train_cpu, cs.train_memory), "evaluate": (cs.eval_cpu, cs.eval_memory),
                     "rollout": (cs.eval_cpu, cs.eval_memory), "teacher_replay": (cs.eval_cpu, cs.eval_memory)}
            for task, step in steps.items():
                _secrets(task, cs, step)  # run_matrix touches no store
                _restricted(task, cs, *sizes.get(step, (cs.step_cpu, cs.step_memory)))
            trains = [t for _, _, t in rounds]
            for task in (teardown, launch, final, baseline, *trains, *(rp for _, rp, _ in rounds)):
                # side effects (services, MLflow runs, paid teacher calls) must happen every run
                task.set_caching_options(False)
            for train_r in trains:
                _resources(train_r, cs)
                # a TorchX job gated_train launches runs this image too (unless launch.image names another)
                train_r.set_env_variable("SDAR_IMAGE", pipeline_image)
            if cs.eval_on_gpu:
                _resources(final, cs)
                _resources(baseline, cs)
            names = [(matrix, "run matrix"), (launch, "launch env services"), (baseline, "baseline eval"),
                     (final, "evaluate arm"), (report, "compare"), (teardown, "teardown env services")]
            for r, (roll, replay, train_r) in enumerate(rounds):
                tail = f" (round {r + 1})" if replay_rounds > 1 else ""
                names += [(roll, f"rollout{tail}"), (replay, f"teacher replay{tail}"), (train_r, f"train arm{tail}")]
            for task, name in names:
                task.set_display_name(name)

    return sdar_comparison


def compile_pipeline(out: str | os.PathLike = "pipeline.yaml", target: str = "cluster", image: str | None = None,
                     cluster: ClusterSettings | None = None, replay_rounds: int = 1) -> Path:
    """Write the pipeline's IR YAML (what `kfp run create -f` and the Kubeflow UI take)."""
    from kfp import compiler

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(target, image, cluster, replay_rounds=replay_rounds),
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


# ---- local runs --------------------------------------------------------------------------------
@dataclass
class RunSettings:
    """Sizes of one comparison run; 0 keeps the config's value. `quick()` is the smoke-test size."""

    arms: list[str] = field(default_factory=lambda: list(DEFAULT_ARMS))
    seeds: list[int] = field(default_factory=lambda: [0])
    steps: int = 0
    group_size: int = 0
    tasks_per_step: int = 0
    eval_tasks: int = 0
    episodes_per_task: int = 1
    eval_temperature: float = 0.4
    greedy: bool = False
    family: str = ""
    model: str = ""
    config_path: str = DEFAULT_CONFIG
    overrides: dict[str, Any] = field(default_factory=dict)
    experiment: str = DEFAULT_EXPERIMENT
    teacher_pool: str = ""  # YAML of the N-teacher pool; "" = the config's replay section (the local pool)
    replay_episodes: int = 8  # episodes each round's rollout step plays for teacher replay
    replay_rounds: int = 1  # rollout -> teacher_replay -> gated_train rounds (compile time)

    @classmethod
    def quick(cls, **changes: Any) -> "RunSettings":
        """A few minutes on 2 CPU cores: 2 steps of 2 tasks x 2 rollouts, 10 eval tasks, 8-turn
        episodes, a small warm start, no periodic evaluation. A smoke test of the machinery: the
        policy barely learns at this size."""
        base = cls(steps=2, group_size=2, tasks_per_step=2, eval_tasks=10, replay_episodes=2, overrides={
            "rollout.max_turns": 8, "eval.every": 0, "checkpoint.every": 2,
            "warmstart.episodes": 24, "warmstart.epochs": 1,  # the tokenizer still sees 400 (cheap)
            # headroom: a barely trained policy wanders into long observations the config's budgets refuse
            "rollout.max_prompt_tokens": 768, "teacher.max_prompt_tokens": 1024,
        })
        overrides = {**base.overrides, **changes.pop("overrides", {})}
        return replace(base, overrides=overrides, **changes)

    def arguments(self) -> dict[str, Any]:
        """The pipeline's arguments (overrides as JSON: a KFP dict parameter would turn ints into floats)."""
        d = asdict(self)
        out = {k: d[k] for k in ("arms", "seeds", "steps", "group_size", "tasks_per_step", "eval_tasks",
                                 "episodes_per_task", "eval_temperature", "greedy", "family", "model",
                                 "config_path", "experiment", "teacher_pool", "replay_episodes")}
        out["overrides"] = json.dumps(self.overrides, sort_keys=True)
        return out


# arms trained at once by the local runner (which caps it at 2). On 2 cores, 2 at once vs 1 at a
# time measured 147 s vs 157 s for the quick run: no loss from the overlap, so arms run in parallel
LOCAL_PARALLELISM = 2


def run_local(settings: RunSettings | None = None, *, quick: bool = False, root: str | os.PathLike = "runs/kfp-local",
              tracking_uri: str | None = None, console=None, quiet: bool = False, verbose: bool = False,
              parallelism: int | None = None) -> dict[str, Any]:
    """Run the comparison pipeline on this machine through the KFP local runner (SubprocessRunner,
    no venv: the components run with this Python, so nothing is installed).

    settings: sizes and arms (default: `RunSettings.quick()` when quick, else the config's sizes).
    root: pipeline_root of the runner; run outputs, the MLflow store (mlflow.db, unless
    tracking_uri or MLFLOW_TRACKING_URI names another) and reports/<stamp>/ go under it.
    The console shows one line per pipeline task (a live table on a terminal: name, state, seconds, and
    the step and success of training tasks); the whole runner log goes to <root>/logs/<stamp>/pipeline.log
    and each task's to <root>/logs/<stamp>/<task>.log, and a failed task's log is printed with its path.
    quiet: no live table, a line per task start and end only (what a log file or CI wants).
    verbose: stream the runner's and components' full logs to the terminal instead.
    parallelism: arms trained at once (default LOCAL_PARALLELISM = 2, the runner's cap; 1 = one at a time).
    Returns {table, plot, report_dir, parent_run_id, child_runs, tracking_uri, seconds, status, summaries}.
    """
    import contextlib

    from kfp import local
    from rich.console import Console

    from sdar.runlog import TaskLog
    from sdar.tracking import Tracker, find_runs, resolve_tracking_uri

    console = console or Console()
    s = settings or (RunSettings.quick() if quick else RunSettings())
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    cfg_path = Path(s.config_path)
    if not cfg_path.is_absolute():
        cfg_path = cfg_path if cfg_path.exists() else REPO_ROOT / cfg_path
    if not cfg_path.is_file():
        raise FileNotFoundError(f"config {s.config_path} not found (looked in . and {REPO_ROOT}); pass --config PATH")
    uri = resolve_tracking_uri(tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{root / 'mlflow.db'}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report_dir = root / "reports" / stamp
    args = {**s.arguments(), "config_path": str(cfg_path), "tracking_uri": uri, "output_root": str(root / "outputs"),
            "report_dir": str(report_dir)}
    parent = Tracker(s.experiment, run_name=f"comparison-{stamp}", tracking_uri=uri,
                     tags={"sdar.kind": "pipeline", "sdar.runner": "kfp-local", "sdar.quick": str(quick)}).start()
    parent.log_params({k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in args.items()})
    args["parent_run_id"] = parent.run_id

    console.print(f"[bold]sdar comparison[/bold] via the KFP local runner: arms {', '.join(s.arms)}, seeds "
                  f"{s.seeds}, steps {s.steps or 'config'}; outputs under {root}")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)
    pipeline = build_pipeline("local", parallelism=LOCAL_PARALLELISM if parallelism is None else parallelism,
                              replay_rounds=s.replay_rounds)
    t0 = time.perf_counter()
    error: str | None = None
    log_dir = root / "logs" / stamp
    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        # the runner warns that our image name has no "python" in it: the components run in this Python
        warnings.filterwarnings("ignore", message=".*non-Python base image.*", category=RuntimeWarning)
        view = None
        if not verbose:  # one line per task on the console; each task's full log in its own file
            view = stack.enter_context(TaskLog(log_dir, console, live=False if quiet else None))
            console.print(f"task logs: {log_dir}/", soft_wrap=True)
            # the runner logs to sys.stdout (its handler is made per run), so this takes it all
            stack.enter_context(contextlib.redirect_stdout(view))
        try:
            pipeline(**args)
        except RuntimeError as exc:  # a failed task; teardown already ran (exit handler)
            error = str(exc)
    if view is not None and error:
        view.report_failures()
    seconds = time.perf_counter() - t0

    children = [r for r in find_runs(s.experiment, f"tags.`mlflow.parentRunId` = '{parent.run_id}'", tracking_uri=uri)]
    result: dict[str, Any] = {"status": "FAILED" if error else "SUCCEEDED", "error": error, "seconds": seconds,
                              "log": None if verbose else str(log_dir / "pipeline.log"),
                              "task_logs": {} if view is None else {k: str(t.log_path) for k, t in view.tasks.items()},
                              "parent_run_id": parent.run_id, "tracking_uri": uri, "experiment": s.experiment,
                              "child_runs": {r.run_name: r.run_id for r in children}, "report_dir": str(report_dir),
                              "table": None, "plot": None, "summaries": []}
    if (report_dir / "comparison.md").is_file():
        result["table"] = (report_dir / "comparison.md").read_text()
        result["plot"] = str(report_dir / "comparison.png")
        result["summaries"] = json.loads((report_dir / "comparison.json").read_text())["arms"]
    # the exit handler ended the parent run; make sure it is not left RUNNING if the runner itself failed
    from mlflow.tracking import MlflowClient

    from sdar.eval.compare import log_to_run

    log_to_run(parent.run_id, {"pipeline/seconds": seconds}, tracking_uri=uri)
    if MlflowClient(tracking_uri=uri).get_run(parent.run_id).info.status == "RUNNING":
        parent.end("FAILED" if error else "FINISHED")
    _print_summary(console, result, uri)
    return result


def _print_summary(console, result: dict[str, Any], uri: str) -> None:
    """The headline numbers as a narrow table (the markdown file also has every task type)."""
    from rich.table import Table

    if result["summaries"]:
        base = json.loads((Path(result["report_dir"]) / "comparison.json").read_text()).get("baseline") or {}
        table = Table(title="held-out success, same tasks for every arm (gap, gate: last training step)")
        for col in ("arm", "success [95% CI]", "vs warm start", "gap", "gate"):
            table.add_column(col, justify="left" if col == "arm" else "right", no_wrap=True)
        if base:
            table.add_row("warm start", f"{base['success']:.3f} [{base['ci95'][0]:.2f}, {base['ci95'][1]:.2f}]",
                          "-", "-", "-")
        for a in result["summaries"]:
            delta = f"{a['success'] - base['success']:+.3f}" if base else "-"
            seeds = f" ({len(a['seeds'])} seeds)" if len(a["seeds"]) > 1 else ""
            table.add_row(a["arm"] + seeds, f"{a['success']:.3f} [{a['ci95'][0]:.2f}, {a['ci95'][1]:.2f}]", delta,
                          f"{a['gap_last']:+.3f}", f"{a['gate_last']:.3f}")
        console.print(table)
        console.print(f"table (with every task type): {Path(result['report_dir']) / 'comparison.md'}")
        console.print(f"plot: {result['plot']}")
    if result["error"]:
        console.print(f"[red]pipeline failed[/red] after {result['seconds']:.0f} s: {result['error']}")
    else:
        console.print(f"[green]pipeline finished[/green] in {result['seconds']:.0f} s")
    console.print(f"MLflow: parent run {result['parent_run_id']} with {len(result['child_runs'])} arm run(s) in "
                  f"experiment {result['experiment']!r}; to see them side by side run")
    console.print(f"  mlflow ui --backend-store-uri {uri}", soft_wrap=True)
    console.print("and open http://127.0.0.1:5000 (select the arm runs, then Compare)")
