"""The TorchX training job (src/sdar/launch/torchx_job.py): `torchx run --dryrun -s kubernetes` renders the
Volcano Job a cluster would get (no cluster, no Docker: --workspace "" skips the image build and
validate_spec=False the API server's dry run); the job rebuilds exactly the launching config; and
gated_train really launches it with the local_cwd scheduler (torchrun, 2 CPU workers)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import REPO
from tests.deploy.fake_kube_api import FakeKubeApi

CONFIG = "configs/household-tiny.yaml"


def _torchx_dryrun(*component_args: str) -> dict:
    torchx = Path(sys.executable).parent / "torchx"
    cmd = [str(torchx), "run", "--workspace", "", "--dryrun", "-s", "kubernetes",
           "-cfg", "queue=default,validate_spec=False", "src/sdar/launch/torchx_job.py:trainer", *component_args]
    proc = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    request = proc.stdout.split("=== SCHEDULER REQUEST ===", 1)[1]
    return yaml.safe_load(request)


def _container(task: dict) -> dict:
    (container,) = task["template"]["spec"]["containers"]
    return container


def _sdar_argv(container: dict) -> list[str]:
    """The `sdar` arguments inside the pod's `bash -c "torchrun ... -m sdar.cli ..."`."""
    assert container["command"][:2] == ["bash", "-c"]
    argv = shlex.split(container["command"][2])
    assert argv[0] == "torchrun"
    return argv[argv.index("-m") + 2 :] if argv[argv.index("-m") + 1] == "sdar.cli" else []


def test_cli_dryrun_renders_a_volcano_job_of_gpu_torchrun_workers():
    job = _torchx_dryrun("--nnodes", "2", "--nproc_per_node", "4", "--gpu", "4",
                         "--image", "reg.example/sdar-trainer:7",
                         "--node_selector", "eks.amazonaws.com/nodegroup=gpu",
                         "--tolerations", "nvidia.com/gpu:NoSchedule",
                         "--", "--config", CONFIG, "--arm", "sdar")
    assert (job["apiVersion"], job["kind"]) == ("batch.volcano.sh/v1alpha1", "Job")
    spec = job["spec"]
    assert spec["schedulerName"] == "volcano" and spec["queue"] == "default"
    tasks = spec["tasks"]
    assert len(tasks) == 2 and all(t["replicas"] == 1 and t["minAvailable"] == 1 for t in tasks)  # one gang of 2 nodes
    for t in tasks:
        c = _container(t)
        assert c["image"] == "reg.example/sdar-trainer:7"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
        torchrun = shlex.split(c["command"][2])
        assert torchrun[0] == "torchrun"
        assert torchrun[torchrun.index("--nnodes") + 1] == "2"
        assert torchrun[torchrun.index("--nproc_per_node") + 1] == "4"
        assert _sdar_argv(c) == ["train", "--config", CONFIG, "--arm", "sdar"]
        # credentials come from the Secrets, never as values in the job
        assert {e["secretRef"]["name"] for e in c["envFrom"]} == {"sdar-mlflow", "sdar-s3"}
        names = {e["name"] for e in c.get("env", [])}
        assert not names & {"MLFLOW_TRACKING_URI", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        pod = t["template"]["spec"]
        assert pod["nodeSelector"] == {"eks.amazonaws.com/nodegroup": "gpu"}
        assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        # the restricted profile through the CLI too (the details: test_the_jobs_pods_run_restricted...)
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["automountServiceAccountToken"] is False
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_job_rebuilds_the_launching_config_and_uses_the_pipelines_secrets():
    from sdar.pipeline.settings import ClusterSettings
    from sdar.cli import build_parser
    from sdar.config import load_config
    from sdar.launch.torchx_job import dryrun, scheduler_cfg
    from sdar.train.cli import _overrides

    overrides = {"arm": "grpo_opsd", "seed": 3, "steps": 40, "rollout.max_turns": 8, "env.url": "http://envs:8000",
                 "model.tiny_overrides": {"hidden_size": 64}, "checkpoint.uri": "s3://bucket/run/grpo_opsd-seed3",
                 "launch.nodes": 2, "launch.gpus_per_node": 8, "launch.namespace": "rl", "launch.queue": "gpu",
                 "launch.image": "reg.example/sdar-trainer:9", "launch.launcher": "torchx"}
    cfg = load_config(CONFIG, overrides)
    assert cfg.launch.wants_torchx()
    job = dryrun(cfg, CONFIG, overrides, validate_spec=False).request.resource
    assert job["spec"]["queue"] == "gpu" and len(job["spec"]["tasks"]) == 2
    # the workers run as the pipeline's service account (its IRSA role; the env chart admits only it)
    assert scheduler_cfg(cfg) == {"queue": "gpu", "namespace": "rl", "service_account": "pipeline-runner"}
    from kubernetes.client import ApiClient

    for task in job["spec"]["tasks"]:
        pod = ApiClient().sanitize_for_serialization(task["template"])
        c = pod["spec"]["containers"][0]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8" and c["image"] == "reg.example/sdar-trainer:9"
        argv = _sdar_argv(c)
        assert argv[-1] == "--publish"  # rank 0 hands the result back through the checkpoint store
        args = build_parser().parse_args(argv)
        assert load_config(args.config, _overrides(args)).to_dict() == cfg.to_dict()
        cs = ClusterSettings()
        assert {e["secretRef"]["name"] for e in c["envFrom"]} == {cs.mlflow_secret, cs.s3_secret}
        assert pod["spec"]["nodeSelector"] == cs.node_selector
        assert pod["spec"]["tolerations"] == cs.tolerations


def test_when_training_leaves_this_process():
    from sdar.config import LaunchConfig

    assert not LaunchConfig().wants_torchx()  # the default: in-process, as before
    assert not LaunchConfig(gpus_per_node=1).wants_torchx()
    # more than one GPU: on Kubernetes a TrainJob (tests/deploy/test_trainjob.py) unless TorchX is named;
    # on this machine (local_cwd) a TorchX job
    assert not LaunchConfig(gpus_per_node=2).wants_torchx() and LaunchConfig(gpus_per_node=2).wants_trainjob()
    assert LaunchConfig(nodes=2, gpus_per_node=1, launcher="torchx").wants_torchx()
    assert LaunchConfig(gpus_per_node=2, scheduler="local_cwd").wants_torchx()
    assert LaunchConfig(launcher="torchx").wants_torchx()
    assert not LaunchConfig(launcher="inprocess", nodes=2, gpus_per_node=8).wants_torchx()
    with pytest.raises(ValueError, match="unknown launcher 'torch'; choose one of auto, inprocess, trainjob, torchx"):
        LaunchConfig(launcher="torch").wants_torchx()


def test_credentials_are_not_parameters_and_cluster_jobs_need_s3():
    from sdar.config import load_config
    from sdar.launch.torchx_job import launch_training, trainer

    with pytest.raises(ValueError, match="MLFLOW_TRACKING_URI must not be parameters"):
        trainer("--config", CONFIG, env={"MLFLOW_TRACKING_URI": "http://mlflow:5000"})
    with pytest.raises(ValueError, match="one worker per GPU"):
        trainer("--config", CONFIG, nproc_per_node=4, gpu=2)
    cfg = load_config(CONFIG, {"launch.launcher": "torchx"})
    with pytest.raises(ValueError, match="checkpoint.uri to an s3:// URI"):
        launch_training(cfg, CONFIG, {})


def test_a_local_dry_run_leaves_the_callers_signal_handlers_as_it_found_them(monkeypatch):
    """TorchX's local scheduler sets SIGINT and SIGTERM to raise its own SignalException when it is created and never
    puts them back; the launcher does (sdar.lifecycle.handlers_kept), so the caller's Ctrl-C stays its own."""
    from sdar.config import load_config
    from sdar.launch.torchx_job import dryrun

    monkeypatch.chdir(REPO)
    cfg = load_config(CONFIG, {"launch.launcher": "torchx", "launch.scheduler": "local_cwd",
                               "launch.procs_per_node": 2})

    def _own(signum, frame):
        pass

    with contextlib.ExitStack() as stack:
        for s in (signal.SIGINT, signal.SIGTERM):  # a caller's own handlers, put back after the test
            stack.callback(signal.signal, s, signal.signal(s, _own))
        info = dryrun(cfg, CONFIG, {})
        assert "torchrun" in " ".join(info.request.role_params["trainer"][0].args), info.request
        assert signal.getsignal(signal.SIGINT) is _own and signal.getsignal(signal.SIGTERM) is _own


@pytest.mark.slow
def test_gated_train_launches_a_torchx_job_of_two_workers(tmp_path, monkeypatch):
    from kfp.dsl import Artifact, Model

    from components.gated_train import gated_train
    from sdar.train.warmstart import tiny_checkpoint
    from tests.train.conftest import SMALL, small_config

    tiny_checkpoint(small_config(tmp_path / "ws"))  # cached across the session; the workers reuse it
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("SDAR_DIST_BACKEND", "gloo")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    overrides = {**SMALL, "launch.launcher": "torchx", "launch.scheduler": "local_cwd", "launch.procs_per_node": 2}
    ckpt, hist = Model(name="checkpoint", uri=str(tmp_path / "ckpt")), Artifact(name="h", uri=str(tmp_path / "h.json"))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    out = gated_train.python_func(arm="sdar", seed=0, config_path=CONFIG, overrides=json.dumps(overrides),
                                  job_id="job1", checkpoint=ckpt, history=hist, steps=1, tracking=False,
                                  output_root=str(tmp_path / "runs"))
    assert {s: signal.getsignal(s) for s in handlers} == handlers  # TorchX's own handlers did not outlive the job
    assert (Path(ckpt.path) / "adapter_model.safetensors").is_file()
    history = json.loads(Path(hist.path).read_text())
    assert history["steps"] == 1 and [h["step"] for h in history["history"]] == [0]
    # the job really ran under torchrun with two workers: rank 0 printed the summary with world_size 2
    logs = list((tmp_path / "runs" / "job1" / "sdar-seed0" / "torchx-logs").rglob("stdout.log"))
    summaries = [json.loads(line.split(":", 1)[1] if line.startswith("[") else line)
                 for log in logs for line in log.read_text().splitlines() if '"world_size"' in line]
    assert summaries and {s["world_size"] for s in summaries} == {2}
    assert out.final_dir == ckpt.path


# ---- launch_training against a fake API server ------------------------------------------------
def point_the_client_at(mp: pytest.MonkeyPatch, url: str) -> None:
    """The in-cluster config a pipeline pod loads, as a client of the fake API server at `url`: TorchX's
    scheduler loads it into a Configuration of its own, sdar's launchers into the default one."""
    import kubernetes

    def load_incluster_config(client_configuration=None, **kw) -> None:
        (client_configuration or kubernetes.client.Configuration._default).host = url

    mp.setattr(kubernetes.client.Configuration, "_default", kubernetes.client.Configuration(host=url))
    mp.setattr(kubernetes.config, "load_incluster_config", load_incluster_config)


class _Store:
    """The checkpoint store rank 0 publishes to (s3:// on a cluster), with a finished run in it."""

    def get_dir(self, prefix: str, local_dir) -> list[Path]:
        Path(local_dir).mkdir(parents=True)
        (Path(local_dir) / "adapter_config.json").write_text("{}")
        return [Path(local_dir) / "adapter_config.json"]

    def read_json(self, rel: str):
        return {"steps": 1, "history": [{"step": 0}], "run_id": ""}


RUN_LABEL = {"sdar.io/pipeline-job": "job-1"}  # what gated_train labels its job with (teardown deletes by it)
LOG = "step 0 done\nTraceback (most recent call last):\nRuntimeError: boom\n"


def launch_on_a_fake_cluster(tmp_path: Path, namespace: str = "kubeflow") -> dict[str, dict]:
    """launch_training on Kubernetes, from a pod in `namespace`, against a fake API server (tests/deploy/
    fake_kube_api.py: real HTTP, the real `kubernetes` client inside TorchX's scheduler), three ways: the job
    succeeds; it fails; the step is stopped (SIGTERM) while it waits. Returns, per way, the API calls (group,
    resource, verb, namespace), what it printed, its result or error, and the Volcano Jobs it created and left."""
    import sdar.kube
    import sdar.launch.torchx_job
    import sdar.storage
    from sdar.config import load_config

    sa_ns = tmp_path / "namespace"
    sa_ns.write_text(namespace + "\n")
    overrides = {"launch.gpus_per_node": 2, "launch.launcher": "torchx", "checkpoint.uri": "s3://bucket/job/sdar-seed0"}

    sent = []

    def stop_the_step(i: int) -> None:
        if i == 1 and not sent:  # the pod is being deleted while the job runs
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, "SIGTERM would kill the step as it is"
            sent.append(i)
            os.kill(os.getpid(), signal.SIGTERM)

    out = {}
    for way, phases, hook in (("succeeded", ["Pending", "Running", "Completed"], None),
                              ("failed", ["Running", "Terminated"], None),
                              ("stopped", ["Running"], stop_the_step)):
        printed = io.StringIO()
        cfg = load_config(CONFIG, {**overrides, "output_dir": str(tmp_path / way)})
        fake = FakeKubeApi([], volcano_phases=phases, on_event=hook, log=LOG)
        with pytest.MonkeyPatch.context() as mp, fake as api, contextlib.redirect_stdout(printed):
            point_the_client_at(mp, api.url)
            mp.setattr(sdar.kube, "SA_NAMESPACE_FILE", str(sa_ns))
            mp.setattr(sdar.storage, "open_store", lambda uri, **kw: _Store())
            try:
                result = sdar.launch.torchx_job.launch_training(cfg, CONFIG, overrides, wait_interval=0,
                                                                labels=RUN_LABEL)
            except BaseException as exc:  # noqa: BLE001 - SystemExit included: it is what SIGTERM became
                result = exc
        assert not api.unknown, api.unknown
        out[way] = {"calls": api.calls, "printed": printed.getvalue(), "result": result, "created": api.created,
                    "left": api.vcjobs, "cfg": cfg, "overrides": overrides}
    return out


@pytest.fixture(scope="module")
def torchx_runs(tmp_path_factory):
    handler_before = signal.getsignal(signal.SIGTERM)  # other libraries (torch elastic) may own it
    out = launch_on_a_fake_cluster(tmp_path_factory.mktemp("torchx"))
    assert signal.getsignal(signal.SIGTERM) is handler_before  # the handler is put back
    return out


def test_launch_training_submits_the_volcano_job_it_dry_ran_in_the_launching_pods_namespace(torchx_runs):
    from kubernetes.client import ApiClient

    from sdar.launch.torchx_job import dryrun

    for way, run in torchx_runs.items():
        (job,) = run["created"]
        want = ApiClient().sanitize_for_serialization(
            dryrun(run["cfg"], CONFIG, run["overrides"], validate_spec=False, labels=RUN_LABEL).request.resource)
        # the run's label on the job itself, where teardown_envs finds a job a lost gated_train pod left
        assert job["metadata"]["labels"] == RUN_LABEL, way
        # the same job but for the unique name TorchX draws per submission
        assert json.loads(json.dumps(job).replace(job["metadata"]["name"], "X")) == json.loads(
            json.dumps(want).replace(want["metadata"]["name"], "X")), way
        # the server-side dry run, then the job, in the launching pod's namespace
        creates = [c for c in run["calls"] if c[2] == "create"]
        assert creates == [("batch.volcano.sh", "jobs", "create", "kubeflow")] * 2, way
        assert {ns for *_, ns in run["calls"]} == {"kubeflow"}, way


def test_launch_training_waits_shows_the_failure_and_cancels_when_stopped(torchx_runs):
    ok = torchx_runs["succeeded"]
    assert ok["result"]["steps"] == 1 and ok["result"]["app_handle"].startswith("kubernetes://")
    assert Path(ok["result"]["final_dir"], "adapter_config.json").is_file()
    statuses = [c for c in ok["calls"] if c[1] == "jobs/status"]
    assert len(statuses) == 3 and {c[2] for c in statuses} == {"get"}  # Pending, Running, Completed
    # a failed job: its rank 0 log tail (read through the pod) is in this step's log, then a clear error
    failed = torchx_runs["failed"]
    assert isinstance(failed["result"], RuntimeError) and "did not succeed (FAILED)" in str(failed["result"])
    assert "RuntimeError: boom" in failed["printed"] and "torchx log" in str(failed["result"])
    assert ("", "pods/log", "get", "kubeflow") in failed["calls"]
    assert ("batch.volcano.sh", "jobs/status", "update", "kubeflow") not in failed["calls"]  # it ended already
    # a stopped step (pipeline run terminated): the job is aborted, not left holding the GPU nodes
    stopped = torchx_runs["stopped"]
    assert isinstance(stopped["result"], SystemExit) and stopped["result"].code == 128 + signal.SIGTERM
    assert "cancelled TorchX job" in stopped["printed"]
    assert stopped["calls"][-2:] == [("batch.volcano.sh", "jobs", "get", "kubeflow"),
                                     ("batch.volcano.sh", "jobs/status", "update", "kubeflow")]
    (left,) = stopped["left"].values()
    assert left["status"]["state"]["phase"] == "Aborted"


def test_teardown_on_a_cluster_without_volcano_finds_no_volcano_jobs(monkeypatch):
    from sdar.launch.torchx_job import delete_labelled

    with FakeKubeApi([], serves_volcano=False) as api:
        point_the_client_at(monkeypatch, api.url)
        assert delete_labelled("kubeflow", "sdar.io/pipeline-job=job-7") == [
            "no Volcano Jobs in kubeflow: the cluster serves none (no Volcano)"]
    assert api.calls == [("batch.volcano.sh", "jobs", "list", "kubeflow")]


def test_a_replaying_arms_workers_get_the_teachers_secret_and_no_other_arm_does():
    from sdar.config import load_config
    from sdar.launch.torchx_job import dryrun

    teachers = [{"name": "api", "base_url": "https://api.example/v1", "model": "m", "api_key_env": "OPENAI_API_KEY"},
                {"name": "local", "base_url": "http://127.0.0.1:8300/v1", "model": "m"}]  # no key
    base = {"launch.launcher": "torchx", "launch.gpus_per_node": 2, "replay.teachers": teachers}

    def env_from(**more) -> list[dict]:
        ov = {**base, **more}
        job = dryrun(load_config(CONFIG, ov), CONFIG, ov, validate_spec=False).request.resource
        (task,) = job["spec"]["tasks"]
        (c,) = task["template"].spec.containers
        return [{"name": e.secret_ref.name, **({"optional": True} if e.secret_ref.optional else {})}
                for e in c.env_from]

    pipeline = [{"name": "sdar-mlflow"}, {"name": "sdar-s3"}]
    # an arm that asks the pool: the pipeline's teacher Secret, optional as in gated_train's own pod
    assert env_from(arm="grpo_replay") == pipeline + [{"name": "sdar-teachers", "optional": True}]
    assert env_from(arm="sdar") == pipeline == env_from(arm="grpo_replay", arm_overrides={"replay_coef": 0.0})
    with pytest.raises(ValueError, match="api_key_env OTHER_KEY is no key of the Secret sdar-teachers"):
        env_from(arm="grpo_replay", **{"replay.teachers": [dict(teachers[0], api_key_env="OTHER_KEY"), teachers[1]]})


def test_what_each_replica_runs_rendezvouses_at_replica_0():
    """tests/deploy/torchx_runtime.py: each replica's `bash -c "torchrun ..."` with TorchX's macros substituted and
    Volcano's variables, expanded by bash as in the pod, is a torchrun joining replica 0's c10d store."""
    from torch.distributed.run import parse_args

    from sdar.launch.torchx_job import trainer
    from tests.deploy.torchx_runtime import replica_command

    app = trainer("--config", CONFIG, "--arm", "sdar", nnodes=2, nproc_per_node=3, image="img", rdzv_port=29611,
                  env={"OMP_NUM_THREADS": "1"})
    seen = []
    for replica in range(2):
        argv, env = replica_command(app, replica, rank0_host="127.0.0.1")
        assert argv[:2] == ["bash", "-c"] and argv[2].startswith("torchrun ")
        assert env["OMP_NUM_THREADS"] == "1" and env["TORCHX_IMAGE"] == "img" and env["VC_TASK_INDEX"] == "0"
        assert ("TORCHX_RANK0_HOST" in env) == (replica == 0)  # replica 0 hosts the store at localhost
        # the words torchrun gets, as bash expands them in the pod
        words = subprocess.run(["bash", "-c", argv[2].replace("torchrun ", "printf '%s\\n' ", 1)],
                               env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True,
                               check=True).stdout.splitlines()
        args = parse_args(words)
        assert (args.nnodes, args.nproc_per_node, args.rdzv_backend, args.module, args.training_script) == (
            "2", "3", "c10d", True, "sdar.cli")
        assert args.training_script_args == ["train", "--config", CONFIG, "--arm", "sdar"]
        seen.append((args.rdzv_endpoint, args.rdzv_id))
    assert seen[0][0] == "localhost:29611" and seen[1][0] == "127.0.0.1:29611"
    assert seen[0][1] == seen[1][1] == "sdar-train"  # one rendezvous
    # on the cluster replica 1 reaches replica 0 by its name under the job's headless Service
    assert replica_command(app, 1)[1]["VC_TRAINER_0_HOSTS"] == "sdar-train-trainer-0-0.sdar-train"
    with pytest.raises(ValueError, match="replica_id 2 is not one of the app's 2 replicas"):
        replica_command(app, 2)


def test_the_jobs_pods_carry_the_pipelines_labels():
    # the workers play episodes and log to MLflow: k8s/ NetworkPolicies admit only pods with these labels
    from sdar.pipeline.settings import ClusterSettings
    from sdar.config import load_config
    from sdar.launch.torchx_job import dryrun

    overrides = {"launch.nodes": 2, "launch.gpus_per_node": 4}
    job = dryrun(load_config(CONFIG, overrides), CONFIG, overrides, validate_spec=False).request.resource
    for task in job["spec"]["tasks"]:
        labels = task["template"].metadata.labels
        assert ClusterSettings().pod_labels.items() <= labels.items()
        assert labels["app.kubernetes.io/managed-by"] == "torchx.pytorch.org"  # TorchX's own are kept


def _job_pods(**overrides) -> list[dict]:
    """The pod templates (as the API server gets them) of the job `launch_training` would submit."""
    from kubernetes.client import ApiClient

    from sdar.config import load_config
    from sdar.launch.torchx_job import dryrun

    overrides = {"launch.nodes": 2, "launch.gpus_per_node": 4, **overrides}
    job = dryrun(load_config(CONFIG, overrides), CONFIG, overrides, validate_spec=False).request.resource
    return [{"apiVersion": "v1", "kind": "Pod", **ApiClient().sanitize_for_serialization(t["template"])}
            for t in job["spec"]["tasks"]]


def _writable(pod: dict) -> dict[str, dict]:
    """mountPath -> volume of each mount of the (only) container."""
    (c,) = pod["spec"]["containers"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    return {m["mountPath"]: volumes[m["name"]] for m in c.get("volumeMounts", [])}


def _under(path: str, dirs) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


@pytest.mark.parametrize("version", ("1.30", "1.33"))
def test_the_jobs_pods_run_restricted_with_a_read_only_root(version):
    import kubernetes_validate

    from sdar.config import load_config
    from tests.deploy.test_env_server_image import parse_dockerfile

    _, stages = parse_dockerfile((REPO / "images" / "trainer" / "Dockerfile").read_text())
    runtime = stages[-1]
    uid, gid = (int(x) for x in runtime.all("USER")[-1].split(":"))
    workdir = runtime.all("WORKDIR")[-1]
    pods = _job_pods()
    assert len(pods) == 2
    for i, pod in enumerate(pods):
        pod["metadata"]["name"] = f"trainer-{i}"  # the Volcano job names them
        kubernetes_validate.validate(pod, version, strict=True)
        spec = pod["spec"]
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True
        assert (psc["runAsUser"], psc["runAsGroup"]) == (uid, gid) == (10001, 10001)
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
        # the workers call no Kubernetes API and need no service variables
        assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
        (c,) = spec["containers"]
        assert c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                        "privileged": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True}
        for kind in ("cpu", "memory"):
            assert kind in c["resources"]["requests"] and kind in c["resources"]["limits"], kind
        # every writable path is an emptyDir with a size limit: TorchX's /dev/shm (memory), /tmp and
        # runs/ under the image's working directory
        writable = _writable(pod)
        assert {"/dev/shm", "/tmp", f"{workdir}/runs"} <= set(writable)
        for path, volume in writable.items():
            assert volume["emptyDir"].get("sizeLimit"), path
        assert writable["/dev/shm"]["emptyDir"]["medium"] == "Memory"
        # what the trainer writes lies there: HOME and the caches (the image's ENV), and the run's output_dir
        for var, value in runtime.env().items():
            if var in ("HOME", "XDG_CACHE_HOME", "SDAR_CACHE_DIR", "HF_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR",
                       "MPLCONFIGDIR"):
                assert _under(value, writable), (var, value)
        output_dir = str(load_config(CONFIG).resolved_output_dir())
        assert not output_dir.startswith("/") and _under(f"{workdir}/{output_dir}", writable)


def test_an_output_dir_elsewhere_gets_its_own_empty_dir():
    for output_dir, mounted in (("/data/out/{arm}", "/data/out/sdar"), ("out/x", "/workspace/out/x"),
                                ("/tmp/x", None), ("runs/kfp/job", None)):
        writable = _writable(_job_pods(output_dir=output_dir)[0])
        extra = set(writable) - {"/dev/shm", "/tmp", "/workspace/runs"}
        assert extra == ({mounted} if mounted else set()), output_dir
        for path in extra:
            assert writable[path]["emptyDir"]["sizeLimit"], path
    from sdar.launch.torchx_job import _pod_overlay

    with pytest.raises(ValueError, match="not an absolute path"):
        _pod_overlay("img", [], {}, [], {}, 1024, ["relative/dir"])
