"""The Kubeflow Trainer launcher (src/sdar/launch/trainjob.py): the TrainJob it builds, exactly, checked against
the Trainer's published API models (kubeflow-trainer-api) and, as the pods it makes, against the Kubernetes
schemas under the restricted profile; then launch_trainjob against a fake API server (tests/deploy/
fake_kube_api.py: real HTTP, the real `kubernetes` client) the ways a run goes: it completes, it fails, the
step is stopped (SIGTERM) or interrupted (Ctrl-C), an earlier attempt's TrainJob is in the way, the cluster
has no Trainer; and `sdar compile --set launch.launcher=trainjob` gives a gated_train that creates one."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import REPO
from tests.deploy.fake_kube_api import FakeKubeApi, condition, jobs_status
from tests.deploy.trainer_runtime import node_pods

CONFIG = "configs/household-tiny.yaml"
NAMESPACE = "kubeflow"
GROUP_TJ = "trainer.kubeflow.org"
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "privileged": False,
                        "readOnlyRootFilesystem": True, "runAsNonRoot": True}
def _secret(var: str, secret: str) -> dict:
    return {"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": var}}}


def test_the_trainjob_is_exactly_this_and_fits_the_trainer_api():
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    from sdar.cli import build_parser
    from sdar.config import load_config
    from sdar.launch.trainjob import trainjob_for_config, trainjob_name
    from sdar.train.cli import _overrides

    overrides = {"launch.nodes": 2, "launch.gpus_per_node": 4, "checkpoint.uri": "s3://bucket/job/sdar-seed0",
                 "launch.image": "reg.example/sdar-trainer:9", "launch.kueue_queue": "team-a"}
    cfg = load_config(CONFIG, overrides)
    assert cfg.launch.resolved_launcher() == "trainjob"  # auto: more than one GPU on Kubernetes
    job = trainjob_for_config(cfg, CONFIG, overrides, NAMESPACE)
    name = trainjob_name(cfg)
    assert name.startswith("sdar-sdar-seed0-") and len(name) <= 40
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "runs", "mountPath": "/workspace/runs"},
              {"name": "dshm", "mountPath": "/dev/shm"},
              # the ServiceAccount admission mounts no API token where a mount is already
              {"name": "no-api-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True}]
    volumes = [{"name": "tmp", "emptyDir": {"sizeLimit": "100Gi"}}, {"name": "runs", "emptyDir": {"sizeLimit": "50Gi"}},
               {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32768M"}},
               {"name": "no-api-token", "emptyDir": {"sizeLimit": "1Mi"}}]
    amounts = {"cpu": "8", "memory": "32768M", "nvidia.com/gpu": "4"}
    pod_patch = {
        "metadata": {"labels": {"app.kubernetes.io/part-of": "sdar-pipeline"}},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "node", "securityContext": RESTRICTED_CONTAINER, "volumeMounts": mounts}],
            "volumes": volumes,
            "serviceAccountName": "pipeline-runner",
            "nodeSelector": {"eks.amazonaws.com/nodegroup": "gpu"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    assert job == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name, "namespace": NAMESPACE,
                     "labels": {"app.kubernetes.io/part-of": "sdar-pipeline", "kueue.x-k8s.io/queue-name": "team-a"}},
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                           "name": "torch-distributed"},
            "trainer": {
                "image": "reg.example/sdar-trainer:9",
                "command": job["spec"]["trainer"]["command"],  # below: it rebuilds the config
                "numNodes": 2, "numProcPerNode": 4,
                "resourcesPerNode": {"requests": amounts, "limits": amounts},
                # credentials as references to the pipeline's Secrets, key by key, never as values
                "env": [_secret("MLFLOW_TRACKING_URI", "sdar-mlflow"), _secret("AWS_ACCESS_KEY_ID", "sdar-s3"),
                        _secret("AWS_SECRET_ACCESS_KEY", "sdar-s3"), _secret("SDAR_S3_ENDPOINT_URL", "sdar-s3")],
            },
            "runtimePatches": [{"manager": "sdar/launcher", "trainingRuntimeSpec": {"template": {"spec": {
                "replicatedJobs": [{"name": "node", "template": {"spec": {"template": pod_patch}}}]}}}}],
        },
    }
    # the Trainer's models read it whole and write back the same object: no field the API lacks
    assert TrainerV1alpha1TrainJob.from_dict(job).to_dict() == job
    # the command is the TorchX job's: torchrun (rendezvous from the Trainer's PET_* variables) running
    # `sdar train` with the launching config, publishing the result to the checkpoint store
    command = job["spec"]["trainer"]["command"]
    assert command[:4] == ["torchrun", "-m", "sdar.cli", "train"] and command[-1] == "--publish"
    args = build_parser().parse_args(command[3:])
    assert load_config(args.config, _overrides(args)).to_dict() == cfg.to_dict()


def test_the_api_models_refuse_what_the_trainer_does_not_have():
    from sdar.config import load_config
    from sdar.launch.secrets import secret_env
    from sdar.launch.trainjob import trainjob_for_config, validate_trainjob

    overrides = {"launch.nodes": 2, "launch.gpus_per_node": 2, "checkpoint.uri": "s3://b/x"}
    job = trainjob_for_config(load_config(CONFIG, overrides), CONFIG, overrides)
    pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod["template"]["spec"]["template"]["spec"]["automountServiceAccountToken"] = False  # not patchable
    with pytest.raises(ValueError, match="fields Kubeflow Trainer's API does not: .*automountServiceAccountToken"):
        validate_trainjob(job)
    job = trainjob_for_config(load_config(CONFIG, overrides), CONFIG, overrides)
    job["spec"]["trainer"]["numNodes"] = "2"
    with pytest.raises(ValueError, match="does not fit Kubeflow Trainer's API"):
        validate_trainjob(job)
    # no envFrom in a TrainJob: only the pipeline's Secrets, whose keys are known; MLflow's only when tracking
    with pytest.raises(ValueError, match="'my-secret', whose keys a TrainJob cannot know"):
        secret_env(["sdar-s3", "my-secret"], tracking=True)
    assert {e["valueFrom"]["secretKeyRef"]["name"] for e in secret_env(["sdar-mlflow", "sdar-s3"], False)} == {"sdar-s3"}
    with pytest.raises(ValueError, match="one worker per GPU"):
        trainjob_for_config(load_config(CONFIG, {**overrides, "launch.procs_per_node": 4}), CONFIG, overrides)
    # the CRD's limit of 128 command items (2 per override), which the models do not carry
    many = {**overrides, **{f"arm_overrides.extra_coefs.c{i}": 0.0 for i in range(70)}}
    with pytest.raises(ValueError, match="73 overrides make a command of 153 items; a TrainJob takes 128"):
        trainjob_for_config(load_config(CONFIG, overrides), CONFIG, many)


def test_a_replaying_arms_workers_get_its_teachers_keys_and_no_other_arm_does():
    from sdar.config import load_config
    from sdar.launch.trainjob import trainjob_for_config, validate_trainjob

    teachers = [{"name": "api", "base_url": "https://api.example/v1", "model": "m", "api_key_env": "OPENAI_API_KEY"},
                {"name": "local", "base_url": "http://127.0.0.1:8300/v1", "model": "m"}]  # no key
    overrides = {"launch.gpus_per_node": 2, "checkpoint.uri": "s3://b/x", "tracking": False, "replay.teachers": teachers}

    def env(**more):
        ov = {**overrides, **more}
        job = validate_trainjob(trainjob_for_config(load_config(CONFIG, ov), CONFIG, ov))
        return {e["name"]: e["valueFrom"]["secretKeyRef"] for e in job["spec"]["trainer"]["env"]}

    s3 = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "SDAR_S3_ENDPOINT_URL"}
    # an arm that asks the pool (replay_coef != 0): the key its teacher names, from the pipeline's teacher
    # Secret, optional as in gated_train's own pod (a pool of local servers needs none)
    assert env(arm="grpo_replay") == {**{v: {"name": "sdar-s3", "key": v} for v in s3},
                                      "OPENAI_API_KEY": {"name": "sdar-teachers", "key": "OPENAI_API_KEY",
                                                         "optional": True}}
    assert set(env(arm="sdar")) == s3 == set(env(arm="grpo_replay", **{"arm_overrides": {"replay_coef": 0.0}}))
    bad = [dict(teachers[0], api_key_env="OTHER_KEY"), teachers[1]]
    with pytest.raises(ValueError, match="api_key_env OTHER_KEY is no key of the Secret sdar-teachers"):
        env(arm="grpo_replay", **{"replay.teachers": bad})


def test_the_trainjob_merges_into_trainer_2_3s_runtime_and_its_nodes_run_torchrun_with_the_pet_variables(
        monkeypatch):
    """On Kubeflow Trainer 2.3.0's own torch-distributed runtime, merged as its controller merges runtime patches
    (tests/deploy/trainer_runtime.py): every node pod gets the trainer's image, torchrun command and resources,
    all of the launcher's patch, the Secrets' keys, and the torch plugin's PET_* variables, which torchrun reads
    as its arguments."""
    from torch.distributed.run import parse_args

    from sdar.config import load_config
    from sdar.launch.trainjob import trainjob_for_config
    from tests.deploy.trainer_runtime import node_command, torch_distributed

    teachers = [{"name": "api", "base_url": "https://api.example/v1", "model": "m", "api_key_env": "OPENAI_API_KEY"},
                {"name": "local", "base_url": "http://127.0.0.1:8300/v1", "model": "m"}]
    overrides = {"launch.nodes": 3, "launch.gpus_per_node": 2, "checkpoint.uri": "s3://b/x", "tracking": False,
                 "arm": "grpo_replay", "replay.teachers": teachers}
    cfg = load_config(CONFIG, overrides)
    job = trainjob_for_config(cfg, CONFIG, overrides, NAMESPACE)
    runtime = torch_distributed()
    assert runtime["metadata"]["name"] == cfg.launch.runtime
    name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
    (patch,) = job["spec"]["runtimePatches"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    patched = rjob["template"]["spec"]["template"]
    (patched_node,) = patched["spec"]["containers"]
    pods = node_pods(job, runtime)
    assert len(pods) == 3
    for rank, pod in enumerate(pods):
        (c,) = pod["spec"]["containers"]
        assert c["name"] == "node" and c["image"] == trainer["image"]  # not the runtime's pytorch/pytorch
        assert c["command"] == trainer["command"] and c["command"][:4] == ["torchrun", "-m", "sdar.cli", "train"]
        assert c["resources"] == trainer["resourcesPerNode"]
        # the whole patch, nothing of it lost in the merge
        assert pod["metadata"]["labels"] == patched["metadata"]["labels"]
        assert {k: v for k, v in pod["spec"].items() if k != "containers"} == {
            k: v for k, v in patched["spec"].items() if k != "containers"}
        assert (c["securityContext"], c["volumeMounts"]) == (patched_node["securityContext"],
                                                             patched_node["volumeMounts"])
        # the Secrets' keys (the teacher's included), then the torch plugin's variables and port
        assert c["env"][:len(trainer["env"])] == trainer["env"]
        assert {e["name"] for e in trainer["env"]} >= {"OPENAI_API_KEY", "AWS_ACCESS_KEY_ID"}
        assert c["env"][len(trainer["env"]):] == [
            {"name": "PET_NNODES", "value": "3"}, {"name": "PET_NPROC_PER_NODE", "value": "2"},
            {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
            {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
            {"name": "PET_MASTER_PORT", "value": "29500"}]
        assert c["ports"] == [{"containerPort": 29500}]
        assert pod["metadata"]["annotations"] == {"batch.kubernetes.io/job-completion-index": str(rank)}
        # what the node's container runs: the command, with the PET_* values (the Secrets' are the cluster's)
        argv, env = node_command(job, rank)
        assert argv == trainer["command"]
        assert env == {"PET_NNODES": "3", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": str(rank),
                       "PET_MASTER_ADDR": f"{name}-node-0-0.{name}", "PET_MASTER_PORT": "29500"}
        # torchrun takes them as --nnodes, --nproc-per-node, --node-rank, --master-addr, --master-port (static
        # rendezvous: rank 0 hosts the store on the port the plugin opened)
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        args = parse_args(argv[1:])
        assert (args.nnodes, args.nproc_per_node, args.node_rank, args.master_addr, args.master_port) == (
            "3", "2", rank, f"{name}-node-0-0.{name}", 29500)
        assert args.rdzv_backend == "static" and args.module and args.training_script == "sdar.cli"
    # one machine: rank 0's address and a free port instead of the Service's
    assert node_command(job, 2, master_addr="127.0.0.1", master_port=40123)[1] == {
        "PET_NNODES": "3", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "40123"}


def test_one_trainer_version_installed_validated_and_tested():
    """The docs install the Kubeflow Trainer release whose API models validate the TrainJob and whose runtime the
    tests merge it into; the package range admits exactly that minor."""
    from importlib.metadata import version

    from packaging.requirements import Requirement

    from sdar.launch.trainjob import TRAINER_VERSION, check_api_models
    from tests.deploy import trainer_runtime

    assert trainer_runtime.TRAINER_VERSION == TRAINER_VERSION == "2.3.0"
    assert f"at tag v{TRAINER_VERSION}" in trainer_runtime.RUNTIME_FILE.read_text()
    doc = (REPO / "docs" / "cluster.md").read_text()
    assert re.findall(r"export TRAINER_VERSION=(\S+)", doc) == [TRAINER_VERSION]
    readme = re.sub(r"\\\n\s*", " ", (REPO / "README.md").read_text())
    installs = re.findall(r"helm install kubeflow-trainer [^\n]*", readme + "\n" + re.sub(r"\\\n\s*", " ", doc))
    assert installs and all(re.search(r"--version (\S+)", i).group(1) in (TRAINER_VERSION, '"$TRAINER_VERSION"')
                            for i in installs), installs
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in (*project["dependencies"], *(r for e in project["optional-dependencies"].values()
                                                                  for r in e))]
    ranges = [r.specifier for r in reqs if r.name == "kubeflow-trainer-api"]
    assert len(ranges) == 2, ranges  # the cluster extra and dev
    for spec in ranges:
        assert TRAINER_VERSION in spec and "2.3.9" in spec and "2.2.1" not in spec and "2.4.0" not in spec, spec
    assert check_api_models() == version("kubeflow-trainer-api")
    with pytest.raises(RuntimeError, match=r"kubeflow-trainer-api 2.2.1 is installed, but the TrainJob is built for "
                                           r"Kubeflow Trainer 2.3.0: pip install 'kubeflow-trainer-api==2.3.\*'"):
        check_api_models("2.2.1")


@pytest.mark.parametrize("version", ("1.30", "1.33"))
def test_the_pods_it_makes_run_restricted_with_the_pipelines_labels(version):
    import kubernetes_validate

    from sdar.config import load_config
    from sdar.launch.trainjob import trainjob_for_config
    from sdar.pipeline.settings import ClusterSettings

    overrides = {"launch.nodes": 2, "launch.gpus_per_node": 4, "checkpoint.uri": "s3://b/x", "tracking": False,
                 "output_dir": "/data/out/{arm}"}
    pods = node_pods(trainjob_for_config(load_config(CONFIG, overrides), CONFIG, overrides))
    assert len(pods) == 2
    for pod in pods:
        kubernetes_validate.validate(pod, version, strict=True)
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert (spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"]) == (10001, 10001)
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        (c,) = spec["containers"]
        assert c["securityContext"] == RESTRICTED_CONTAINER
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
        # the root filesystem is read-only: every writable path is a size-limited emptyDir, the output_dir too
        volumes = {v["name"]: v for v in spec["volumes"]}
        writable = {m["mountPath"]: volumes[m["name"]]["emptyDir"] for m in c["volumeMounts"] if not m.get("readOnly")}
        assert set(writable) == {"/tmp", "/workspace/runs", "/dev/shm", "/data/out/sdar"}
        assert all(v.get("sizeLimit") for v in writable.values()) and writable["/dev/shm"]["medium"] == "Memory"
        # no Kubernetes API token: an empty read-only directory where the ServiceAccount admission would mount it
        (token,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"]
        assert token["readOnly"] and volumes[token["name"]] == {"name": token["name"], "emptyDir": {"sizeLimit": "1Mi"}}
        # the NetworkPolicies of k8s/ admit the workers like the pipeline's pods
        assert ClusterSettings().pod_labels.items() <= pod["metadata"]["labels"].items()
        # a run without MLflow gets the S3 Secret's keys only
        assert {e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})
                } == {"sdar-s3"}


def test_which_launcher_a_config_gets():
    from sdar.config import LaunchConfig

    assert LaunchConfig().resolved_launcher() == "inprocess"  # the default: in the step's process, as before
    assert LaunchConfig(gpus_per_node=1).resolved_launcher() == "inprocess"
    # more than one GPU: a TrainJob on Kubernetes, a TorchX job on this machine (local_cwd)
    assert LaunchConfig(gpus_per_node=2).resolved_launcher() == "trainjob"
    assert LaunchConfig(nodes=2, gpus_per_node=1).wants_trainjob()
    assert LaunchConfig(gpus_per_node=2, scheduler="local_cwd").resolved_launcher() == "torchx"
    # either one by name
    assert LaunchConfig(launcher="torchx", nodes=2, gpus_per_node=8).wants_torchx()
    assert LaunchConfig(launcher="trainjob").wants_trainjob()
    assert LaunchConfig(launcher="inprocess", nodes=2, gpus_per_node=8).resolved_launcher() == "inprocess"
    with pytest.raises(ValueError, match="a TrainJob runs on Kubernetes"):
        LaunchConfig(launcher="trainjob", scheduler="local_cwd").resolved_launcher()
    with pytest.raises(ValueError, match="unknown launcher 'pytorchjob'; choose one of auto, inprocess, trainjob"):
        LaunchConfig(launcher="pytorchjob").resolved_launcher()


# ---- launch_trainjob against a fake API server -------------------------------------------------------
class _MlflowClient:
    """Records what the launcher tells MLflow."""

    records: list = []

    def __init__(self, tracking_uri=None):
        self.uri = tracking_uri

    def set_tag(self, run_id, key, value):
        self.records.append(("tag", run_id, key, value))

    def log_text(self, run_id, text, path):
        self.records.append(("text", run_id, path, text))


def _point_the_client_at(mp: pytest.MonkeyPatch, url: str) -> None:
    """The launcher loads the in-cluster config: here it becomes a client of the fake server."""
    import kubernetes

    mp.setattr(kubernetes.client.Configuration, "_default", kubernetes.client.Configuration(host=url))
    mp.setattr(kubernetes.config, "load_incluster_config", lambda **kw: None)


def _stop_with(signum: int):
    def hook(i: int) -> None:
        if i == 1:  # the pod is deleted (SIGTERM) or Ctrl-C'd while the job runs
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, "SIGTERM would kill the step as it is"
            os.kill(os.getpid(), signum)

    return hook


# a pipeline's training run: 2 GPUs (auto: a TrainJob), checkpoints in S3, logging under the pipeline's run
OVERRIDES = {"launch.gpus_per_node": 2, "checkpoint.uri": "s3://bucket/job/sdar-seed0", "tracking": True,
             "parent_run_id": "parent-run"}
RUNNING = {"jobsStatus": jobs_status(active=1)}
READY = {"jobsStatus": jobs_status(active=1, ready=1), "trainerStatus": {"progressPercentage": 40}}
LOG = "step 0 done\nTraceback (most recent call last):\nRuntimeError: boom\n"
WAYS = {
    "succeeded": ([RUNNING, READY, {"conditions": [condition("Complete", "JobsCompleted", "jobs done")],
                                    "jobsStatus": jobs_status(succeeded=1)}], {}),
    "failed": ([RUNNING, {"conditions": [condition("Failed", "JobsFailed", "jobset node failed: exit code 1")],
                          "jobsStatus": jobs_status(failed=1)}], {"log": LOG}),
    "stopped": ([RUNNING, READY], {"on_event": _stop_with(signal.SIGTERM)}),
    "interrupted": ([RUNNING, READY], {"on_event": _stop_with(signal.SIGINT)}),
    "retried": ([{"conditions": [condition("Complete")]}], {"existing": "the run's own name"}),
}


@contextlib.contextmanager
def _python_sigint():
    """Ctrl-C raises KeyboardInterrupt, as in a pipeline pod, whatever handler this process had (TorchX's local
    scheduler used to leave its own behind; sdar.lifecycle.handlers_kept and tests/conftest.py now put it back)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def launch_on_a_fake_trainer(tmp_path: Path, namespace: str = NAMESPACE) -> dict[str, dict]:
    """launch_trainjob from a pod in `namespace` against a fake API server, the WAYS a run goes. Returns, per
    way, the API calls (group, resource, verb, namespace), what it printed, its result or error, the bodies it
    created and deleted, and what it told MLflow."""
    import mlflow.tracking

    import sdar.kube
    import sdar.storage
    from sdar.config import load_config
    from sdar.launch.trainjob import launch_trainjob, trainjob_name
    from tests.deploy.test_torchx import _Store

    class ArmStore(_Store):  # rank 0 logged to the arm's own MLflow run
        def read_json(self, rel: str):
            return {**super().read_json(rel), "run_id": "arm-run"}

    sa_ns = tmp_path / "namespace"
    sa_ns.write_text(namespace + "\n")
    out = {}
    for way, (phases, kw) in WAYS.items():
        cfg = load_config(CONFIG, {**OVERRIDES, "output_dir": str(tmp_path / way)})
        kw = {**kw, "existing": [trainjob_name(cfg)]} if "existing" in kw else kw
        _MlflowClient.records = []
        printed = io.StringIO()
        with pytest.MonkeyPatch.context() as mp, FakeKubeApi(phases, **kw) as api, contextlib.redirect_stdout(printed), \
                _python_sigint():
            _point_the_client_at(mp, api.url)
            mp.setattr(sdar.kube, "SA_NAMESPACE_FILE", str(sa_ns))
            mp.setattr(sdar.storage, "open_store", lambda uri, **k: ArmStore())
            mp.setattr(mlflow.tracking, "MlflowClient", _MlflowClient)
            mp.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
            try:
                result = launch_trainjob(cfg, CONFIG, OVERRIDES, watch_timeout_s=5)
            except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt included
                result = exc
        assert not api.unknown, api.unknown
        out[way] = {"calls": api.calls, "printed": printed.getvalue(), "result": result, "created": api.created,
                    "deleted": api.deleted, "left": dict(api.objects), "mlflow": list(_MlflowClient.records),
                    "cfg": cfg}
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    handler_before = signal.getsignal(signal.SIGTERM)  # other libraries (torch elastic) may own it
    out = launch_on_a_fake_trainer(tmp_path_factory.mktemp("trainjob"))
    assert signal.getsignal(signal.SIGTERM) is handler_before  # the handler is put back
    return out


def test_it_creates_the_trainjob_it_built_in_the_launching_pods_namespace(runs):
    from sdar.launch.trainjob import trainjob_for_config, validate_trainjob

    for way, run in runs.items():
        want = trainjob_for_config(run["cfg"], CONFIG, OVERRIDES, NAMESPACE)
        assert run["created"][-1] == want, way
        validate_trainjob(run["created"][-1])
        assert ("trainer.kubeflow.org", "trainjobs", "create", NAMESPACE) in run["calls"]
        assert {ns for *_, ns in run["calls"]} == {NAMESPACE}, way
        # whatever happened, the TrainJob is gone afterwards (its pods with it: foreground deletion)
        assert run["left"] == {}, way
        assert run["deleted"] and all(d.get("propagationPolicy") == "Foreground" for d in run["deleted"]), way


def test_it_watches_to_completion_streaming_the_status(runs):
    ok = runs["succeeded"]
    assert ok["result"]["steps"] == 1 and ok["result"]["trainjob"].startswith(f"{NAMESPACE}/sdar-sdar-seed0-")
    assert Path(ok["result"]["final_dir"], "adapter_config.json").is_file()
    lines = [line for line in ok["printed"].splitlines() if line.startswith("TrainJob sdar-")]
    assert [line.split(": ", 1)[1] for line in lines] == [
        "created, waiting for its pods", "node: 1 active", "node: 1 active, 1 ready; 40% done",
        "Complete (JobsCompleted: jobs done); node: 1 succeeded"]
    assert "deleted TrainJob" in ok["printed"]
    # one watch, no polling: created, watched, then deleted once it completed
    verbs = [verb for _, res, verb, _ in ok["calls"] if res == "trainjobs"]
    assert verbs == ["create", "get", "watch", "delete"]
    # MLflow: each change tags the pipeline's run while the job runs; the arm's run gets the history
    name = ok["result"]["trainjob"].split("/")[1]
    tags = [r for r in ok["mlflow"] if r[0] == "tag" and r[1] == "parent-run"]
    assert [t[3] for t in tags] == [line.split(": ", 1)[1] for line in lines]
    assert all(t[2] == f"trainjob.{name}" for t in tags)
    assert ("tag", "arm-run", "trainjob.name", name) in ok["mlflow"]
    (text,) = [r for r in ok["mlflow"] if r[0] == "text"]
    assert text[1:3] == ("arm-run", f"trainjob/{name}.log") and "Complete" in text[3]


def test_a_failed_trainjob_shows_its_log_tail_and_message_and_is_deleted(runs):
    failed = runs["failed"]
    assert isinstance(failed["result"], RuntimeError)
    assert "failed: Failed (JobsFailed: jobset node failed: exit code 1)" in str(failed["result"])
    assert "RuntimeError: boom" in failed["printed"] and "log lines of node 0" in failed["printed"]
    assert ("", "pods", "list", NAMESPACE) in failed["calls"] and ("", "pods/log", "get", NAMESPACE) in failed["calls"]
    assert [v for _, res, v, _ in failed["calls"] if res == "trainjobs"][-1] == "delete"
    # the history goes to the pipeline's run (the arm's run id never came back)
    assert any(r[0] == "text" and r[1] == "parent-run" and "Failed" in r[3] for r in failed["mlflow"])


def test_a_stopped_or_interrupted_step_deletes_its_trainjob(runs):
    stopped = runs["stopped"]
    assert isinstance(stopped["result"], SystemExit) and stopped["result"].code == 128 + signal.SIGTERM
    interrupted = runs["interrupted"]
    assert isinstance(interrupted["result"], KeyboardInterrupt)
    for run in (stopped, interrupted):
        assert "deleted TrainJob" in run["printed"]
        assert run["calls"][-1][1:3] == ("trainjobs", "delete")
        assert ("", "pods/log", "get", NAMESPACE) not in run["calls"]  # not a failure: no log tail


def test_an_earlier_attempts_trainjob_is_replaced(runs):
    retried = runs["retried"]
    assert retried["result"]["steps"] == 1
    verbs = [v for _, res, v, _ in retried["calls"] if res == "trainjobs"]
    assert verbs[:4] == ["create", "delete", "get", "create"]  # 409, delete it, gone, create again
    assert "exists (an earlier attempt of this step): deleting it" in retried["printed"]


def test_a_cluster_without_kubeflow_trainer_says_what_to_do(tmp_path, monkeypatch):
    from sdar.config import load_config
    from sdar.launch.trainjob import launch_trainjob

    ov = {"launch.launcher": "trainjob", "checkpoint.uri": "s3://b/x", "launch.namespace": NAMESPACE,
          "output_dir": str(tmp_path)}
    with FakeKubeApi([], serves_trainjobs=False) as api:
        _point_the_client_at(monkeypatch, api.url)
        with pytest.raises(RuntimeError, match="install Kubeflow Trainer .* or set launch.launcher=torchx"):
            launch_trainjob(load_config(CONFIG, ov), CONFIG, ov)
    with pytest.raises(ValueError, match="checkpoint.uri to an s3:// URI"):
        launch_trainjob(load_config(CONFIG, {"launch.launcher": "trainjob"}), CONFIG, {})


def _kubeconfig(path: Path, url: str) -> Path:
    """A kubeconfig whose one context is the fake API server: what a developer's machine hands the client."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}], "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u", "namespace": NAMESPACE}}]}))
    return path


GATED_TRAIN = """
import json, sys
from kfp.dsl import Artifact, Model
from components.gated_train import gated_train
tmp = sys.argv[1]
gated_train.python_func(arm="sdar", seed=0, config_path="configs/household-tiny.yaml", job_id="job-7",
                        overrides=json.dumps({"launch.launcher": "trainjob", "launch.namespace": "kubeflow"}),
                        checkpoint=Model(name="c", uri=tmp + "/ckpt"), history=Artifact(name="h", uri=tmp + "/h.json"),
                        tracking=False, output_root=tmp + "/runs", checkpoint_root="s3://bucket/ckpt")
"""


TEARDOWN = """
from kfp import dsl
from components.teardown_envs import teardown_envs
status = dsl.PipelineTaskFinalStatus(state="FAILED", pipeline_job_resource_name="jobs/7",
                                     pipeline_task_name="comparison", error_code=None, error_message="node lost")
teardown_envs.python_func(job_id="job-7", status=status, target="cluster", namespace="sdar", tracking=False,
                          trainjob_namespace="kubeflow")
"""


def test_a_gated_train_pod_killed_without_sigterm_leaves_its_trainjob_and_teardown_deletes_it(tmp_path):
    """Node loss: gated_train (a real process, the real client, through a kubeconfig) has created its TrainJob and
    watches it when it is killed with SIGKILL, so nothing deletes the TrainJob; the pipeline's teardown_envs
    deletes the TrainJobs labelled with its run, and no other run's."""
    import subprocess
    import sys
    import time

    with FakeKubeApi([RUNNING]) as api:
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}  # not in a pod
        env["KUBECONFIG"] = str(_kubeconfig(tmp_path / "kubeconfig", api.url))
        log = tmp_path / "gated_train.log"
        with log.open("w") as out:
            step = subprocess.Popen([sys.executable, "-c", GATED_TRAIN, str(tmp_path)], cwd=REPO, env=env,
                                    stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180
            while (GROUP_TJ, "trainjobs", "watch", NAMESPACE) not in api.calls:
                assert step.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, f"no watch of its TrainJob:\n{log.read_text()[-3000:]}"
                time.sleep(0.2)
        finally:
            step.kill()  # SIGKILL: no handler runs
            step.wait(30)
        ((ns, name),) = api.objects
        assert ns == NAMESPACE and api.objects[(ns, name)]["metadata"]["labels"]["sdar.io/pipeline-job"] == "job-7"
        assert api.deleted == []  # left behind, holding its nodes
        api.add_trainjob(NAMESPACE, "sdar-grpo-seed0-0badc0de", {"sdar.io/pipeline-job": "job-8"})  # another run's

        # the exit handler's pod: teardown_envs with the run's job id (a process of its own, as on the cluster)
        teardown = subprocess.run([sys.executable, "-c", TEARDOWN], cwd=REPO, env=env, capture_output=True,
                                  text=True, timeout=180)
        assert teardown.returncode == 0, teardown.stdout[-3000:] + teardown.stderr[-3000:]
        summary = teardown.stdout
    assert f"deleted TrainJob {NAMESPACE}/{name}" in summary
    assert set(api.objects) == {(NAMESPACE, "sdar-grpo-seed0-0badc0de")}
    assert [d.get("propagationPolicy") for d in api.deleted] == ["Foreground"]  # its JobSet and pods with it
    assert [v for _, res, v, ns in api.calls if res == "trainjobs"][-2:] == ["list", "delete"]
    assert f"no Volcano Job labelled sdar.io/pipeline-job=job-7 in {NAMESPACE}" in summary  # TorchX's: none
    assert not api.unknown, api.unknown


def test_teardown_on_a_cluster_without_kubeflow_trainer_finds_no_trainjobs(tmp_path, monkeypatch):
    from sdar.launch.trainjob import delete_labelled

    with FakeKubeApi([], serves_trainjobs=False) as api:
        _point_the_client_at(monkeypatch, api.url)
        assert delete_labelled(NAMESPACE, "sdar.io/pipeline-job=job-7") == [
            f"no TrainJobs in {NAMESPACE}: the cluster serves none (no Kubeflow Trainer)"]
    assert api.calls == [(GROUP_TJ, "trainjobs", "list", NAMESPACE)]


# ---- the pipeline ------------------------------------------------------------------------------------
def test_compile_set_launcher_trainjob_gives_a_gated_train_that_creates_a_trainjob(tmp_path, monkeypatch):
    from kfp.dsl import Artifact, Model

    import sdar.kube
    import sdar.pipeline.runner
    import sdar.storage
    from components.gated_train import gated_train
    from sdar.cli import main
    from tests.deploy.test_torchx import _Store

    path = tmp_path / "pipeline.yaml"
    assert main(["compile", "--gpus", "0", "--set", "launch.launcher=trainjob", "--out", str(path)]) == 0
    spec = next(yaml.safe_load_all(path.read_text()))
    overrides = spec["root"]["inputDefinitions"]["parameters"]["overrides"]["defaultValue"]
    assert json.loads(overrides) == {"launch.launcher": "trainjob"}
    # the run's gated_train, with the compiled default overrides, from a pod in kubeflow
    (tmp_path / "ns").write_text(NAMESPACE)
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sdar.kube, "SA_NAMESPACE_FILE", str(tmp_path / "ns"))
    monkeypatch.setattr(sdar.storage, "open_store", lambda uri, **k: _Store())
    ckpt, hist = Model(name="checkpoint", uri=str(tmp_path / "ckpt")), Artifact(name="h", uri=str(tmp_path / "h.json"))
    with FakeKubeApi([{"conditions": [condition("Complete")]}]) as api:
        _point_the_client_at(monkeypatch, api.url)
        out = gated_train.python_func(arm="grpo_opsd", seed=1, config_path=CONFIG, overrides=overrides, job_id="job1",
                                      checkpoint=ckpt, history=hist, tracking=False,
                                      output_root=str(tmp_path / "runs"), checkpoint_root="s3://bucket/ckpt")
    (job,) = api.created
    assert job["kind"] == "TrainJob" and job["metadata"]["name"].startswith("sdar-grpo-opsd-seed1-")
    argv = job["spec"]["trainer"]["command"]
    assert 'checkpoint.uri="s3://bucket/ckpt/job1/grpo_opsd-seed1"' in argv and "launch.launcher=\"trainjob\"" in argv
    assert (Path(ckpt.path) / "adapter_config.json").is_file() and out.final_dir == ckpt.path
    assert json.loads(Path(hist.path).read_text())["steps"] == 1
    # `sdar submit --set` adds to the compiled default
    sent = {}
    monkeypatch.setattr(sdar.pipeline.runner, "submit", lambda host, experiment, **kw: sent.update(kw) or "run-1")
    assert main(["submit", "--host", "http://kfp.example", "--experiment", "e", "--yaml", str(path),
                 "--set", "launch.nodes=2", "--set", "launch.gpus_per_node=8"]) == 0
    assert json.loads(sent["arguments"]["overrides"]) == {"launch.launcher": "trainjob", "launch.nodes": 2,
                                                          "launch.gpus_per_node": 8}
