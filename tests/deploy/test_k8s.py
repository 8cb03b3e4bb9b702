"""k8s/ rendered with `kubectl kustomize` (base, local and eks overlays), and the eksctl config:
every object validated strictly against the Kubernetes schemas, then checked against what the
pipeline, its components, the TorchX jobs they launch and the sdar-envs chart really do (RBAC
verbs, labels, taints, secrets)."""

from __future__ import annotations

import base64
import functools
import ipaddress
import json
import re
import shutil
import subprocess
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.conftest import REPO
from tests.deploy.trainer_runtime import MASTER_PORT

K8S = REPO / "k8s"
TARGETS = ("base", "overlays/local", "overlays/eks")
OVERLAYS = ("overlays/local", "overlays/eks")
# the oldest Kubernetes EKS offers today and a newer one (as test_helm_chart.py)
K8S_VERSIONS = ("1.30", "1.33")
SERVICES_NS = "sdar"
# Kubeflow Pipelines standalone runs every pipeline pod in its own namespace, as this ServiceAccount
PIPELINE_NS = "kubeflow"
PIPELINE_SA = "pipeline-runner"
# the eks overlay's registry: an ECR host of the placeholder account and region, or of the real ones
# once docs/cluster.md's sed has run (the checks read them from the files, never assume them)
ECR_HOST = re.compile(r"(?P<account>[0-9]{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com")
WORKLOADS = ("Deployment", "StatefulSet", "Job", "DaemonSet")
ENV_ROLE = "sdar-env-manager"  # launch_envs / teardown_envs, in SERVICES_NS
TORCHX_ROLE = "sdar-torchx-launcher"  # gated_train launching TorchX jobs, in PIPELINE_NS
TRAINJOB_ROLE = "sdar-trainjob-launcher"  # gated_train launching Kubeflow Trainer TrainJobs, in PIPELINE_NS
CREDENTIAL_KEY = re.compile(r"PASSWORD|SECRET|ACCESS_KEY|TOKEN", re.IGNORECASE)


# ---- rendering ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip(
            "kubectl is not installed: the k8s/ tests render with `kubectl kustomize` "
            "(install kubectl >= 1.27, which has kustomize built in)"
        )
    probe = subprocess.run(
        [path, "kustomize", "--help"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip(
            f"this kubectl has no working `kustomize` subcommand: {probe.stderr.strip()[:200]}"
        )
    return path


@functools.cache
def _build(kubectl: str, target: str) -> tuple[str, ...]:
    proc = subprocess.run(
        [kubectl, "kustomize", str(K8S / target)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, f"kubectl kustomize k8s/{target} failed:\n{proc.stderr}"
    return tuple(json.dumps(d) for d in yaml.safe_load_all(proc.stdout) if d)


@dataclass
class Objects:
    """The objects one kustomization renders, with lookups."""

    items: list[dict[str, Any]]

    def kind(self, *kinds: str) -> list[dict[str, Any]]:
        return [o for o in self.items if o["kind"] in kinds]

    def get(self, kind: str, name: str, namespace: str = SERVICES_NS) -> dict[str, Any]:
        found = [
            o
            for o in self.kind(kind)
            if o["metadata"]["name"] == name and o["metadata"].get("namespace") == namespace
        ]
        assert len(found) == 1, f"expected one {kind} {namespace}/{name}, found {len(found)}"
        return found[0]

    def names(self, kind: str) -> set[str]:
        return {o["metadata"]["name"] for o in self.kind(kind)}


@pytest.fixture(scope="session")
def build(kubectl):
    def _objects(target: str) -> Objects:
        return Objects([json.loads(d) for d in _build(kubectl, target)])  # fresh copies each time

    return _objects


def eks_registry() -> re.Match:
    """The registry host of the eks overlay's `images:` (one for all), its account and region."""
    kustomization = yaml.safe_load((K8S / "overlays" / "eks" / "kustomization.yaml").read_text())
    hosts = {i["newName"].split("/", 1)[0] for i in kustomization["images"]}
    assert len(hosts) == 1, f"the eks overlay pulls from several registries: {hosts}"
    match = ECR_HOST.fullmatch(hosts.pop())
    assert match, (
        "the eks overlay's registry is not an ECR host <account>.dkr.ecr.<region>.amazonaws.com"
    )
    return match


def pod_templates(objs: Objects) -> list[tuple[dict, dict]]:
    """(workload, pod template) of every object that runs pods."""
    out = []
    for o in objs.kind(*WORKLOADS):
        out.append((o, o["spec"]["template"]))
    return out


def containers(pod_spec: dict) -> list[dict]:
    return pod_spec.get("initContainers", []) + pod_spec["containers"]


def secret_values(secret: dict) -> dict[str, str]:
    out = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    out.update(secret.get("stringData") or {})
    return out


# ---- label selectors and NetworkPolicy semantics ------------------------------------------------
def selects(selector: dict | None, labels: dict[str, str]) -> bool:
    """A Kubernetes LabelSelector (matchLabels and matchExpressions) applied to `labels`."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


@dataclass(frozen=True)
class Pod:
    """A pod as NetworkPolicies see it: its namespace, labels and named container ports."""

    namespace: str
    labels: tuple[tuple[str, str], ...]
    ports: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, namespace: str, template: dict) -> Pod:
        ports = {
            p["name"]: p["containerPort"]
            for c in template["spec"]["containers"]
            for p in c.get("ports", [])
            if "name" in p
        }
        return cls(
            namespace,
            tuple(sorted(template["metadata"]["labels"].items())),
            tuple(sorted(ports.items())),
        )

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    def port(self, port: str | int) -> int | None:
        return dict(self.ports).get(port) if isinstance(port, str) else port


def admits(policies: list[dict], dst: Pod, src: Pod, port: str | int) -> bool:
    """Whether a TCP connection from `src` to `dst`:`port` gets through, by the NetworkPolicy rules:
    a pod no Ingress policy selects takes everything; a selected pod takes what any rule admits."""
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == dst.namespace
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and selects(p["spec"]["podSelector"], dst.label_map)
    ]
    if not selecting:
        return True
    number = dst.port(port)
    for policy in selecting:
        ns = policy["metadata"]["namespace"]
        for rule in policy["spec"].get("ingress") or []:
            ports = rule.get("ports")
            if ports and not any(
                number is not None
                and dst.port(p["port"]) == number
                and p.get("protocol", "TCP") == "TCP"
                for p in ports
            ):
                continue
            peers = rule.get("from")
            if not peers:
                return True
            for peer in peers:
                if "ipBlock" in peer:
                    continue
                if "namespaceSelector" in peer:
                    ns_ok = selects(
                        peer["namespaceSelector"], {"kubernetes.io/metadata.name": src.namespace}
                    )
                else:
                    ns_ok = src.namespace == ns
                pod_ok = "podSelector" not in peer or selects(peer["podSelector"], src.label_map)
                if ns_ok and pod_ok:
                    return True
    return False


def test_the_policy_evaluator_itself():
    # the semantics the checks below rely on, on a hand-made policy
    policy = {
        "metadata": {"namespace": "a"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "db"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "b"}
                            },
                            "podSelector": {"matchLabels": {"role": "client"}},
                        }
                    ],
                    "ports": [{"port": "sql", "protocol": "TCP"}],
                }
            ],
        },
    }
    db = Pod("a", (("app", "db"),), (("sql", 5432),))
    other = Pod("a", (("app", "web"),), (("http", 80),))
    client_b = Pod("b", (("role", "client"),))
    assert admits([policy], db, client_b, "sql") and admits([policy], db, client_b, 5432)
    assert not admits([policy], db, client_b, 22)
    # the right labels in the wrong namespace
    assert not admits([policy], db, Pod("a", (("role", "client"),)), "sql")
    assert not admits([policy], db, Pod("b", ()), "sql")
    assert admits([policy], other, Pod("z", ()), "http")  # not selected: not isolated
    assert selects(
        {"matchExpressions": [{"key": "x", "operator": "In", "values": ["1", "2"]}]}, {"x": "2"}
    )
    assert not selects({"matchExpressions": [{"key": "x", "operator": "In", "values": ["1"]}]}, {})


# ---- every object is valid Kubernetes -----------------------------------------------------------
@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_every_object_validates_strictly(build, target, version):
    objs = build(target)
    assert objs.items
    for obj in objs.items:
        # strict: an unknown field fails; an unknown kind/apiVersion (SchemaNotFoundError) fails too
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_everything_is_namespaced_except_the_namespace_and_storage_class(build, target):
    objs = build(target)
    for obj in objs.items:
        ns = obj["metadata"].get("namespace")
        if obj["kind"] in ("Namespace", "StorageClass"):
            assert ns is None
        else:
            assert ns in (SERVICES_NS, PIPELINE_NS), (obj["kind"], obj["metadata"]["name"])
            # only the Secrets the pipeline's pods read, the TorchX launcher's Role (the jobs go
            # beside the launching pod) and the egress policies of the pipeline's own pods live in
            # KFP's namespace
            assert (
                ns == SERVICES_NS
                or obj["kind"] == "Secret"
                or (obj["kind"] in ("Role", "RoleBinding")
                    and obj["metadata"]["name"] in (TORCHX_ROLE, TRAINJOB_ROLE))
                or (obj["kind"] == "NetworkPolicy" and _selects_only_pipeline_pods(obj))
            ), (obj["kind"], obj["metadata"]["name"])
    assert objs.names("Namespace") == {SERVICES_NS}


def _selects_only_pipeline_pods(policy: dict) -> bool:
    from sdar.pipeline.settings import ClusterSettings

    return policy["spec"]["podSelector"] == {"matchLabels": ClusterSettings().pod_labels}


# ---- RBAC: exactly what launch_envs, teardown_envs and the TorchX launcher call -----------------
_API_GROUPS = {"AppsV1Api": "apps", "CoreV1Api": ""}
_VERBS = {
    "create": "create",
    "read": "get",
    "list": "list",
    "delete": "delete",
    "patch": "patch",
    "replace": "update",
    "delete_collection": "deletecollection",
}
_CALL = re.compile(
    r"(delete_collection|create|read|list|delete|patch|replace)_namespaced_([a-z_]+?)(_status|_scale)?"
)


def _fake_kubernetes(monkeypatch, replicas: int) -> list[tuple[str, str, str, str]]:
    """Replace the Kubernetes client with one that records each call as (group, resource, verb,
    namespace), the way the API server authorises it."""
    import kubernetes.client
    import kubernetes.config
    import sdar_envs.launcher

    calls: list[tuple[str, str, str, str]] = []

    class FakeApi:
        def __init__(self, cls_name: str):
            self.group = _API_GROUPS[cls_name]

        def __getattr__(self, method: str):
            m = _CALL.fullmatch(method)
            assert m, (
                f"the components call {method}, which this fake does not map to RBAC; extend _CALL"
            )
            verb, kind, sub = m.groups()

            def call(*args, **kwargs):
                # (namespace, body) for create and list; (name, namespace, ...) for the others
                ns = args[0] if verb in ("create", "list", "delete_collection") else args[1]
                calls.append(
                    (self.group, kind + "s" + (f"/{sub[1:]}" if sub else ""), _VERBS[verb], ns)
                )
                if verb == "read":
                    return SimpleNamespace(status=SimpleNamespace(ready_replicas=replicas))
                if verb == "list":
                    return SimpleNamespace(
                        items=[SimpleNamespace(metadata=SimpleNamespace(name="found"))]
                    )
                return None

            return call

    monkeypatch.setattr(kubernetes.client, "AppsV1Api", lambda api_client=None: FakeApi("AppsV1Api"))
    monkeypatch.setattr(kubernetes.client, "CoreV1Api", lambda api_client=None: FakeApi("CoreV1Api"))
    monkeypatch.setattr(kubernetes.config, "load_incluster_config", lambda: None)
    monkeypatch.setattr(sdar_envs.launcher, "wait_healthy", lambda *a, **k: None)
    return calls


@pytest.fixture(scope="module")
def env_component_calls(tmp_path_factory):
    """Every Kubernetes API call of one launch_envs + teardown_envs pair on a cluster, run from a pipeline pod
    in KFP's namespace: the env service's (recorded by stand-ins), and teardown's of the run's TrainJobs and
    TorchX Volcano Jobs (through a fake API server holding one of each of this run and one of each of another).
    Returns the env calls, launch_envs' endpoints, and the fake API server (its calls and the jobs left)."""
    import kubernetes
    from kfp import dsl
    from kfp.dsl import Artifact

    import sdar.kube
    from components.launch_envs import launch_envs
    from components.teardown_envs import teardown_envs
    from tests.deploy.fake_kube_api import FakeKubeApi

    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("calls")
    (tmp / "namespace").write_text(PIPELINE_NS + "\n")
    trainjobs = FakeKubeApi([])
    trainjobs.add_trainjob(PIPELINE_NS, "sdar-sdar-seed0-0a1b2c3d", {"sdar.io/pipeline-job": "job-1"})
    trainjobs.add_trainjob(PIPELINE_NS, "sdar-grpo-seed0-4e5f6a7b", {"sdar.io/pipeline-job": "job-2"})
    trainjobs.add_vcjob(PIPELINE_NS, "sdar-sdar-seed1-x1y2", {"sdar.io/pipeline-job": "job-1"})  # TorchX's
    trainjobs.add_vcjob(PIPELINE_NS, "sdar-grpo-seed1-z3w4", {"sdar.io/pipeline-job": "job-2"})
    try:
        trainjobs.__enter__()
        calls = _fake_kubernetes(mp, replicas=1)
        mp.setattr(kubernetes.client.Configuration, "_default", kubernetes.client.Configuration(host=trainjobs.url))
        mp.setattr(sdar.kube, "SA_NAMESPACE_FILE", str(tmp / "namespace"))
        endpoints = Artifact(name="endpoints", uri=str(tmp / "endpoints.json"))
        launch_envs.python_func(
            config_path=str(REPO / "configs" / "household-tiny.yaml"),
            overrides="{}",
            job_id="job-1",
            endpoints=endpoints,
            target="cluster",
            namespace=SERVICES_NS,
            tracking=False,
            startup_timeout_s=5,
        )
        status = dsl.PipelineTaskFinalStatus(
            state="SUCCEEDED",
            pipeline_job_resource_name="jobs/1",
            pipeline_task_name="comparison",
            error_code=None,
            error_message=None,
        )
        teardown_envs.python_func(
            job_id="job-1", status=status, target="cluster", namespace=SERVICES_NS, tracking=False
        )
    finally:
        mp.undo()
        trainjobs.__exit__(None, None, None)
    return calls, json.loads(Path(endpoints.path).read_text()), trainjobs


def _granted(rules: list[dict]) -> set[tuple[str, str, str]]:
    out = set()
    for r in rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in r[field], f"wildcard in {field}: {r}"
        assert "resourceNames" not in r and "nonResourceURLs" not in r, r
        out |= {(g, res, v) for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]}
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_rbac_grants_exactly_what_the_env_components_call_in_one_namespace(
    build, target, env_component_calls
):
    calls, _, _ = env_component_calls
    needed = {(g, res, verb) for g, res, verb, _ in calls}
    # the calls the code makes today: a new call shows up here and must be granted on purpose
    assert needed == {
        ("apps", "deployments", "create"),
        ("", "services", "create"),
        ("apps", "deployments/status", "get"),
        ("apps", "deployments", "list"),
        ("apps", "deployments", "delete"),
        ("", "services", "list"),
        ("", "services", "delete"),
    }
    assert {ns for *_, ns in calls} == {SERVICES_NS}

    objs = build(target)
    assert not objs.kind("ClusterRole", "ClusterRoleBinding")
    assert objs.names("Role") == objs.names("RoleBinding") == {ENV_ROLE, TORCHX_ROLE, TRAINJOB_ROLE}
    _check_role(objs, ENV_ROLE, SERVICES_NS, needed)


def _check_role(objs: Objects, name: str, namespace: str, needed: set[tuple[str, str, str]]) -> None:
    """Role `name` in `namespace` grants exactly `needed`, to the pipeline's pods and nobody else."""
    role = objs.get("Role", name, namespace)
    assert _granted(role["rules"]) == needed
    binding = objs.get("RoleBinding", name, namespace)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": name,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": PIPELINE_SA, "namespace": PIPELINE_NS}
    ]


@pytest.fixture(scope="module")
def torchx_launcher_runs(tmp_path_factory):
    """launch_training (what gated_train calls for a multi-GPU config) from a pipeline pod, against a
    fake API server that records every call TorchX's kubernetes scheduler makes: a job that
    succeeds, one that fails (its log tail is read), and a step stopped while waiting (it cancels)."""
    from tests.deploy.test_torchx import launch_on_a_fake_cluster

    return launch_on_a_fake_cluster(tmp_path_factory.mktemp("torchx"), namespace=PIPELINE_NS)


@pytest.mark.parametrize("target", TARGETS)
def test_rbac_grants_exactly_what_the_torchx_launcher_calls_where_its_jobs_go(
    build, target, torchx_launcher_runs, env_component_calls
):
    _, _, teardown = env_component_calls
    calls = [c for run in torchx_launcher_runs.values() for c in run["calls"]] + [
        c for c in teardown.calls if c[0] == "batch.volcano.sh"]
    needed = {(g, res, verb) for g, res, verb, _ in calls}
    # the calls TorchX makes today on the paths launch_training takes, and teardown's: a new one must be granted
    # on purpose
    assert needed == {
        ("batch.volcano.sh", "jobs", "create"),  # submit (and its server-side dry run)
        ("batch.volcano.sh", "jobs/status", "get"),  # wait
        ("", "pods", "get"),  # wait: each replica's address; the log tail
        ("", "pods/log", "get"),  # the log tail of a failed job
        ("batch.volcano.sh", "jobs", "get"),  # cancel
        ("batch.volcano.sh", "jobs/status", "update"),  # cancel: phase Aborted
        ("batch.volcano.sh", "jobs", "list"),  # teardown: the run's, by its label
        ("batch.volcano.sh", "jobs", "delete"),  # teardown: a job a lost gated_train pod left
    }
    # the jobs go to the launching pod's own namespace, where the pipeline's Secrets are
    assert {ns for *_, ns in calls} == {PIPELINE_NS}
    _check_role(build(target), TORCHX_ROLE, PIPELINE_NS, needed)


@pytest.fixture(scope="module")
def trainjob_launcher_runs(tmp_path_factory):
    """launch_trainjob (what gated_train calls for a multi-GPU config on Kubernetes) from a pipeline pod,
    against a fake API server that records every request: a TrainJob that completes, one that fails
    (its log tail is read), a step stopped or interrupted while waiting (it deletes the job), and an
    earlier attempt's TrainJob in the way (deleted, then created anew)."""
    from tests.deploy.test_trainjob import launch_on_a_fake_trainer

    return launch_on_a_fake_trainer(tmp_path_factory.mktemp("trainjob"), namespace=PIPELINE_NS)


@pytest.mark.parametrize("target", TARGETS)
def test_rbac_grants_exactly_what_the_trainjob_launcher_calls_where_its_jobs_go(
    build, target, trainjob_launcher_runs, env_component_calls
):
    _, _, teardown = env_component_calls
    calls = [c for run in trainjob_launcher_runs.values() for c in run["calls"]] + [
        c for c in teardown.calls if c[0] != "batch.volcano.sh"]
    needed = {(g, res, verb) for g, res, verb, _ in calls}
    # the calls launch_trainjob and teardown_envs make today: a new one must be granted on purpose
    assert needed == {
        ("trainer.kubeflow.org", "trainjobs", "create"),
        ("trainer.kubeflow.org", "trainjobs", "get"),  # before each watch; an earlier attempt's job going
        ("trainer.kubeflow.org", "trainjobs", "watch"),
        ("trainer.kubeflow.org", "trainjobs", "delete"),  # done, failed, stopped; an earlier attempt's; teardown
        ("trainer.kubeflow.org", "trainjobs", "list"),  # teardown: the run's, by its label
        ("", "pods", "list"),  # node 0's pod of a failed job
        ("", "pods/log", "get"),  # its log tail
    }
    assert {ns for *_, ns in calls} == {PIPELINE_NS}
    _check_role(build(target), TRAINJOB_ROLE, PIPELINE_NS, needed)


def test_teardown_deletes_the_runs_jobs_of_both_launchers_and_no_other(env_component_calls):
    _, _, teardown = env_component_calls
    assert not teardown.unknown, teardown.unknown
    # job-1's TrainJob and TorchX Volcano Job are gone, in the foreground (their pods with them); job-2's stay
    assert set(teardown.objects) == {(PIPELINE_NS, "sdar-grpo-seed0-4e5f6a7b")}
    assert set(teardown.vcjobs) == {(PIPELINE_NS, "sdar-grpo-seed1-z3w4")}
    assert [d.get("propagationPolicy") for d in teardown.deleted] == ["Foreground", "Foreground"]
    assert [c[2] for c in teardown.calls if c[1] == "trainjobs"] == ["list", "delete"]
    assert [c[2] for c in teardown.calls if c[0] == "batch.volcano.sh"] == ["list", "delete"]


def test_the_roles_do_not_let_the_pipeline_read_secrets_or_exec(build):
    objs = build("overlays/eks")
    for name, namespace in ((ENV_ROLE, SERVICES_NS), (TORCHX_ROLE, PIPELINE_NS), (TRAINJOB_ROLE, PIPELINE_NS)):
        granted = _granted(objs.get("Role", name, namespace)["rules"])
        for forbidden in [
            ("", "secrets", "get"),
            ("", "secrets", "list"),
            ("", "pods", "create"),
            ("", "pods/exec", "create"),
            ("rbac.authorization.k8s.io", "roles", "create"),
            ("apps", "deployments", "patch"),
            ("trainer.kubeflow.org", "trainjobs", "update"),
            ("trainer.kubeflow.org", "trainjobs", "patch"),
            ("trainer.kubeflow.org", "trainingruntimes", "create"),
            ("", "pods", "delete"),
        ]:
            assert forbidden not in granted, (name, forbidden)


# ---- secrets hold placeholders only -------------------------------------------------------------
def _placeholder_ok(key: str, value: str) -> bool:
    if CREDENTIAL_KEY.search(key):
        return value == "" or value.startswith("CHANGE_ME")
    if key.endswith(("_URI", "_URL")):
        if value == "":
            return True
        url = urllib.parse.urlsplit(value)
        # an in-cluster address, never one with credentials in it
        return (
            url.scheme == "http"
            and url.username is None
            and url.hostname.endswith(".svc.cluster.local")
        )
    return re.fullmatch(r"[a-z][a-z0-9_]{0,30}|CHANGE_ME[\w-]*", value) is not None


@pytest.mark.parametrize("target", TARGETS)
def test_no_secret_holds_anything_but_placeholders(build, target):
    objs = build(target)
    for secret in objs.kind("Secret"):
        assert secret.get("type", "Opaque") == "Opaque"
        for key, value in secret_values(secret).items():
            assert _placeholder_ok(key, value), f"{secret['metadata']['name']}.{key} = {value!r}"
    # credentials reach containers only through secretKeyRef, never as literal values
    for workload, template in pod_templates(objs):
        for c in containers(template["spec"]):
            for env in c.get("env", []):
                if CREDENTIAL_KEY.search(env["name"]):
                    assert "secretKeyRef" in env.get("valueFrom", {}), (
                        workload["metadata"]["name"],
                        env,
                    )
    text = json.dumps(objs.items)
    assert not re.search(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b", text), (
        "something shaped like an AWS access key id"
    )


def test_the_eks_overlay_generates_no_credential_at_all(build):
    objs = build("overlays/eks")
    assert "sdar-postgres" not in objs.names(
        "Secret"
    )  # created with kubectl, never overwritten by apply
    for secret in objs.kind("Secret"):
        for key, value in secret_values(secret).items():
            if CREDENTIAL_KEY.search(key):
                assert value == "", (secret["metadata"]["name"], key)


def test_the_example_files_are_placeholders():
    examples = sorted(K8S.rglob("*.example"))
    assert examples, "no *.env.example templates under k8s/"
    for path in examples:
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                key, _, value = line.partition("=")
                assert _placeholder_ok(key, value), f"{path}: {line}"


@pytest.mark.parametrize("target", OVERLAYS)
def test_the_secrets_the_pipeline_reads_exist_where_its_pods_run(build, target):
    from sdar.pipeline.settings import ClusterSettings

    cs = ClusterSettings()
    objs = build(target)
    for name, keys in ((cs.mlflow_secret, cs.mlflow_keys), (cs.s3_secret, cs.s3_keys)):
        secret = objs.get("Secret", name, PIPELINE_NS)
        assert set(secret_values(secret)) == set(keys.values()), name
    # the tracking URI names the MLflow Service this overlay renders
    uri = urllib.parse.urlsplit(
        secret_values(objs.get("Secret", cs.mlflow_secret, PIPELINE_NS))["MLFLOW_TRACKING_URI"]
    )
    svc_name, svc_ns = uri.hostname.split(".")[:2]
    svc = objs.get("Service", svc_name, svc_ns)
    assert uri.port in [p["port"] for p in svc["spec"]["ports"]]
    assert selects(
        {"matchLabels": svc["spec"]["selector"]},
        objs.get("Deployment", "sdar-mlflow")["spec"]["template"]["metadata"]["labels"],
    )


# ---- pods: non-root, read-only, bounded ---------------------------------------------------------
def _cpu(q: str) -> float:
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def _mem(q: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if q.endswith(suffix):
            return int(float(q[: -len(suffix)]) * factor)
    return int(q)


@pytest.mark.parametrize("target", TARGETS)
def test_every_container_runs_non_root_read_only_with_limits(build, target):
    objs = build(target)
    templates = pod_templates(objs)
    assert templates
    for workload, template in templates:
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        spec = template["spec"]
        assert spec["automountServiceAccountToken"] is False, where
        assert spec["enableServiceLinks"] is False, where
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0 and psc["runAsGroup"] > 0, where
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert (
            not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
        ), where
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
        for c in containers(spec):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["runAsNonRoot"] is True and sc.get("privileged", False) is False, where
            assert sc.get("runAsUser", psc["runAsUser"]) != 0, where
            res = c["resources"]
            for kind in ("cpu", "memory"):
                assert kind in res["requests"] and kind in res["limits"], (where, kind)
            assert _cpu(res["requests"]["cpu"]) <= _cpu(res["limits"]["cpu"]), where
            assert _mem(res["requests"]["memory"]) <= _mem(res["limits"]["memory"]), where
            assert not any("nvidia.com/gpu" in r for r in (res["requests"], res["limits"])), where
            # the writable places: emptyDirs with a size limit, or the workload's own claims
            for m in c.get("volumeMounts", []):
                if m["name"] in claims:
                    continue
                v = volumes[m["name"]]
                assert "emptyDir" in v and v["emptyDir"].get("sizeLimit"), (where, m)
            # $(VAR) in env values and args only expands variables defined before it
            defined: list[str] = []
            for env in c.get("env", []):
                for ref in re.findall(r"\$\((\w+)\)", env.get("value", "")):
                    assert ref in defined, (where, env["name"], ref)
                defined.append(env["name"])
            for arg in c.get("args", []) + c.get("command", []):
                for ref in re.findall(r"\$\((\w+)\)", arg):
                    assert ref in defined, (where, arg)


@pytest.mark.parametrize("target", TARGETS)
def test_images_are_pinned_and_carry_the_overlays_registry(build, target):
    images = {c["image"] for _, t in pod_templates(build(target)) for c in containers(t["spec"])}
    assert images
    for image in images:
        name, _, tag = image.rpartition(":")
        assert "@sha256:" in image or (name and tag and tag != "latest" and "/" not in tag), image
    if target == "overlays/eks":
        assert all(i.startswith(eks_registry().group(0) + "/") for i in images), images
    else:
        assert not any(".dkr.ecr." in i for i in images), images
    # the overlays change registries, never tags: one pin per image, in base and the minio component
    if target == "overlays/eks":
        base = {c["image"] for _, t in pod_templates(build("base")) for c in containers(t["spec"])}
        assert sorted(i.rpartition(":")[2] for i in images) == sorted(
            i.rpartition(":")[2] for i in base
        )


# ---- network policies match the pods that really exist ------------------------------------------
@pytest.fixture(scope="module")
def pipeline_pod_labels(tmp_path_factory) -> dict[str, dict[str, str]]:
    """Pod labels of every step of the compiled cluster pipeline, by executor."""
    from sdar.pipeline.runner import compile_pipeline

    path = compile_pipeline(tmp_path_factory.mktemp("ir") / "pipeline.yaml", "cluster")
    docs = list(yaml.safe_load_all(path.read_text()))
    executors = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(executors) == set(
        docs[0]["deploymentSpec"]["executors"]
    )  # every step has platform config
    return {ex: (cfg.get("podMetadata") or {}).get("labels", {}) for ex, cfg in executors.items()}


def test_every_pipeline_pod_carries_the_cluster_settings_labels(pipeline_pod_labels):
    from sdar.pipeline.settings import ClusterSettings

    want = ClusterSettings().pod_labels
    assert want == {"app.kubernetes.io/part-of": "sdar-pipeline"}  # what k8s/ and the chart admit
    for ex, labels in pipeline_pod_labels.items():
        assert labels == want, ex


def _launched_env_pod(env_component_calls) -> Pod:
    _, info, _ = env_component_calls
    deployment = info["manifests"][0]
    assert deployment["metadata"]["namespace"] == SERVICES_NS
    return Pod.of(SERVICES_NS, deployment["spec"]["template"])


def _check_policies(
    objs: Objects, env_pods: list[Pod], pipeline_labels: dict[str, dict[str, str]]
) -> None:
    policies = objs.kind("NetworkPolicy")
    sdar_pods = {o["metadata"]["name"]: Pod.of(SERVICES_NS, t) for o, t in pod_templates(objs)}
    mlflow, postgres = sdar_pods["sdar-mlflow"], sdar_pods["sdar-postgres"]
    minio = sdar_pods.get("sdar-minio")
    pipeline_pods = [
        Pod(PIPELINE_NS, tuple(sorted(lab.items()))) for lab in pipeline_labels.values()
    ]
    outsiders = [
        Pod(PIPELINE_NS, (("app", "other-pipeline"),)),  # another KFP pipeline
        Pod("default", tuple(sorted(pipeline_pods[0].labels))),  # the label, elsewhere
        mlflow,
    ]  # a pod of sdar itself
    for env in env_pods:
        assert env.port("http") is not None
        for p in pipeline_pods:
            assert admits(policies, env, p, "http"), (env, p)
            assert not admits(policies, env, p, 9999)
        for o in outsiders:
            assert not admits(policies, env, o, "http"), (env, o)
    for p in pipeline_pods:
        assert admits(policies, mlflow, p, "http")
        assert not admits(policies, postgres, p, "postgres")
    # MLflow: this namespace and the pipeline; Postgres: MLflow only
    for in_ns in env_pods:
        assert admits(policies, mlflow, in_ns, "http")
        assert not admits(policies, postgres, in_ns, "postgres")
    assert not admits(policies, mlflow, Pod(PIPELINE_NS, (("app", "other-pipeline"),)), "http")
    assert admits(policies, postgres, mlflow, "postgres")
    if minio is not None:
        assert admits(policies, minio, pipeline_pods[0], "api") and admits(
            policies, minio, mlflow, "api"
        )
        assert not admits(policies, minio, pipeline_pods[0], "console")
        assert not admits(policies, minio, Pod("default", ()), "api")
        assert not admits(policies, postgres, minio, "postgres")
    # default deny: a pod no other policy names is closed too
    stray = Pod(SERVICES_NS, (("app", "stray"),), (("http", 80),))
    assert not admits(policies, stray, pipeline_pods[0], "http")


@pytest.mark.parametrize("target", OVERLAYS)
def test_network_policies_admit_the_pipeline_to_env_pods_launch_envs_creates(
    build, target, env_component_calls, pipeline_pod_labels
):
    _check_policies(build(target), [_launched_env_pod(env_component_calls)], pipeline_pod_labels)


@pytest.mark.parametrize("target", OVERLAYS)
def test_network_policies_admit_the_torchx_workers_like_the_pipeline(
    build, target, env_component_calls
):
    # a TorchX job's workers play episodes on the run's env service, log to MLflow and publish to
    # S3 (MinIO locally): the job gated_train would submit, as its pods would be
    from sdar.config import load_config
    from sdar.launch.torchx_job import dryrun

    overrides = {"launch.nodes": 2, "launch.gpus_per_node": 4, "launch.namespace": PIPELINE_NS}
    config = str(REPO / "configs" / "household-tiny.yaml")
    job = dryrun(load_config(config, overrides), config, overrides, validate_spec=False).request.resource
    objs = build(target)
    policies = objs.kind("NetworkPolicy")
    sdar_pods = {o["metadata"]["name"]: Pod.of(SERVICES_NS, t) for o, t in pod_templates(objs)}
    env = _launched_env_pod(env_component_calls)
    for task in job["spec"]["tasks"]:
        worker = Pod(PIPELINE_NS, tuple(sorted(task["template"].metadata.labels.items())))
        assert admits(policies, env, worker, "http")
        assert admits(policies, sdar_pods["sdar-mlflow"], worker, "http")
        if "sdar-minio" in sdar_pods:
            assert admits(policies, sdar_pods["sdar-minio"], worker, "api")
        assert not admits(policies, sdar_pods["sdar-postgres"], worker, "postgres")


@pytest.mark.parametrize("target", OVERLAYS)
def test_network_policies_admit_the_trainjob_workers_like_the_pipeline(build, target, env_component_calls):
    # a TrainJob's workers (the pods Kubeflow Trainer makes in the launching pod's namespace), labelled by
    # its runtime patch: the services admit them like the pipeline's pods (their egress, DNS and the rest:
    # test_egress_allows_each_pod_exactly_what_it_calls)
    objs = build(target)
    policies = objs.kind("NetworkPolicy")
    sdar_pods = {o["metadata"]["name"]: Pod.of(SERVICES_NS, t) for o, t in pod_templates(objs)}
    env = _launched_env_pod(env_component_calls)
    for worker in _trainjob_worker_pods():
        assert connects(policies, worker, env, "http")
        assert connects(policies, worker, sdar_pods["sdar-mlflow"], "http")
        if "sdar-minio" in sdar_pods:
            assert connects(policies, worker, sdar_pods["sdar-minio"], "api")
        assert not admits(policies, sdar_pods["sdar-postgres"], worker, "postgres")
        assert not connects(policies, worker, sdar_pods["sdar-postgres"], "postgres")


@pytest.mark.parametrize("target", OVERLAYS)
def test_network_policies_admit_the_pipeline_to_env_pods_of_the_chart(
    build, render, target, pipeline_pod_labels
):
    chart = render(namespace=SERVICES_NS)
    env_pods = [Pod.of(SERVICES_NS, d["spec"]["template"]) for d in chart.kind("Deployment")]
    assert len(env_pods) == 3
    _check_policies(build(target), env_pods, pipeline_pod_labels)
    # the chart's own policy, when switched on, admits the same pipeline pods
    (own,) = render(
        {
            "networkPolicy": {
                "enabled": True,
                "allowedClients": [
                    {
                        "podLabels": dict(next(iter(pipeline_pod_labels.values()))),
                        "namespaceLabels": {"kubernetes.io/metadata.name": PIPELINE_NS},
                    }
                ],
            }
        },
        namespace=SERVICES_NS,
    ).kind("NetworkPolicy")
    for env in env_pods:
        for labels in pipeline_pod_labels.values():
            assert admits([own], env, Pod(PIPELINE_NS, tuple(sorted(labels.items()))), "http")


# ---- egress: what each pod may open ------------------------------------------------------------
KUBE_DNS = Pod("kube-system", (("k8s-app", "kube-dns"),), (("dns", 53), ("dns-tcp", 53)))
# KFP's API server (grpc, http) and a pod of another pipeline, both in KFP's namespace
KFP_API = Pod(PIPELINE_NS, (("app", "ml-pipeline"),), (("grpc", 8887), ("http", 8888)))
OTHER_PIPELINE = Pod(PIPELINE_NS, (("app", "other-pipeline"),))
# an address of s3.amazonaws.com (as STS and the Hub: HTTPS out of the cluster)
S3_ADDRESS = "52.217.0.10"
API_SERVER = "172.18.0.2"  # kind's control-plane node (6443); EKS's API endpoints answer on 443
IMDS = "169.254.169.254"  # the node's instance metadata: credentials no pod should reach
ELSEWHERE = "203.0.113.7"


def _policy_types(policy: dict) -> list[str]:
    spec = policy["spec"]
    return spec.get("policyTypes") or ["Ingress"] + (["Egress"] if spec.get("egress") else [])


def _egress_port_matches(entry: dict, dst: Pod | str, number: int | None, protocol: str) -> bool:
    if entry.get("protocol", "TCP") != protocol:
        return False
    if "port" not in entry:
        return True  # every port of the protocol
    want = entry["port"]
    if isinstance(want, str):  # a named port of the destination pod
        return isinstance(dst, Pod) and number is not None and dst.port(want) == number
    return number is not None and want <= number <= entry.get("endPort", want)


def _in_block(address: str, block: dict) -> bool:
    ip = ipaddress.ip_address(address)
    return ip in ipaddress.ip_network(block["cidr"]) and not any(
        ip in ipaddress.ip_network(e) for e in block.get("except", [])
    )


def sends(
    policies: list[dict], src: Pod, dst: Pod | str, port: str | int, protocol: str = "TCP"
) -> bool:
    """Whether `src` may open a connection to `dst` (a pod, or an address outside the cluster's
    pods) on `port`, by the NetworkPolicy egress rules: a pod no Egress policy selects sends
    anywhere; a selected pod only where a rule allows. ipBlocks are taken to match addresses
    outside the cluster only (what they match of pod addresses is up to the network plugin)."""
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == src.namespace
        and "Egress" in _policy_types(p)
        and selects(p["spec"]["podSelector"], src.label_map)
    ]
    if not selecting:
        return True
    number = dst.port(port) if isinstance(dst, Pod) else (port if isinstance(port, int) else None)
    for policy in selecting:
        ns = policy["metadata"]["namespace"]
        for rule in policy["spec"].get("egress") or []:
            ports = rule.get("ports")
            if ports and not any(_egress_port_matches(e, dst, number, protocol) for e in ports):
                continue
            peers = rule.get("to")
            if not peers:
                return True
            for peer in peers:
                if "ipBlock" in peer:
                    if isinstance(dst, str) and _in_block(dst, peer["ipBlock"]):
                        return True
                    continue
                if not isinstance(dst, Pod):
                    continue
                if "namespaceSelector" in peer:
                    ns_ok = selects(
                        peer["namespaceSelector"], {"kubernetes.io/metadata.name": dst.namespace}
                    )
                else:
                    ns_ok = dst.namespace == ns
                pod_ok = "podSelector" not in peer or selects(peer["podSelector"], dst.label_map)
                if ns_ok and pod_ok:
                    return True
    return False


def connects(policies: list[dict], src: Pod, dst: Pod, port: str | int) -> bool:
    """A TCP connection from `src` to `dst`:`port` gets through: src's egress and dst's ingress."""
    return sends(policies, src, dst, port) and admits(policies, dst, src, port)


def test_the_egress_evaluator_itself():
    policy = {
        "metadata": {"namespace": "a"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "web"}},
            "policyTypes": ["Egress"],
            "egress": [
                {
                    "to": [{"podSelector": {"matchLabels": {"app": "db"}}}],
                    "ports": [{"port": "sql", "protocol": "TCP"}],
                },
                {
                    "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}],
                    "ports": [{"port": 443, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}],
                },
            ],
        },
    }
    web, db = Pod("a", (("app", "web"),)), Pod("a", (("app", "db"),), (("sql", 5432),))
    assert sends([policy], web, db, "sql") and sends([policy], web, db, 5432)
    assert not sends([policy], web, db, 22)
    assert not sends([policy], web, Pod("b", (("app", "db"),), (("sql", 5432),)), "sql")  # other ns
    assert sends([policy], web, "1.2.3.4", 443) and not sends([policy], web, "10.1.2.3", 443)
    assert not sends([policy], web, "1.2.3.4", 443, "UDP")
    assert sends([policy], web, "1.2.3.4", 53, "UDP")
    assert not sends([policy], web, "1.2.3.4", 80)
    assert sends([policy], db, "1.2.3.4", 22)  # not selected: not isolated
    deny = {"metadata": {"namespace": "a"}, "spec": {"podSelector": {}, "policyTypes": ["Egress"]}}
    assert not sends([deny], db, "1.2.3.4", 443) and not sends([deny], db, web, 80)
    # a named port in a rule matches the destination pod's port of that name only
    assert not sends([policy], web, "1.2.3.4", "sql")


def _trainjob_worker_pods() -> list[Pod]:
    """The pods of the TrainJob gated_train would create in KFP's namespace (2 nodes), as Kubeflow Trainer
    makes them from the torch-distributed runtime: the runtime patch's labels (the Trainer adds the unnamed
    container port 29500, torchrun's rendezvous, to the `node` container: tests/deploy/trainer_runtime.py)."""
    from sdar.config import load_config
    from sdar.launch.trainjob import trainjob_for_config

    overrides = {"launch.nodes": 2, "launch.gpus_per_node": 4, "checkpoint.uri": "s3://b/x"}
    config = str(REPO / "configs" / "household-tiny.yaml")
    job = trainjob_for_config(load_config(config, overrides), config, overrides, PIPELINE_NS)
    (rjob,) = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    labels = {"jobset.sigs.k8s.io/jobset-name": job["metadata"]["name"],
              "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
              **rjob["template"]["spec"]["template"]["metadata"]["labels"]}
    out = [Pod(PIPELINE_NS, tuple(sorted({**labels, "batch.kubernetes.io/job-completion-index": str(i)}.items())))
           for i in range(job["spec"]["trainer"]["numNodes"])]
    assert len(out) == 2
    return out


def _torchx_worker_pods() -> list[Pod]:
    """The pods of the TorchX job gated_train would launch from KFP's namespace (2 nodes)."""
    from sdar.config import load_config
    from sdar.launch.torchx_job import dryrun

    overrides = {"launch.nodes": 2, "launch.gpus_per_node": 4, "launch.namespace": PIPELINE_NS}
    config = str(REPO / "configs" / "household-tiny.yaml")
    cfg = load_config(config, overrides)
    job = dryrun(cfg, config, overrides, validate_spec=False).request.resource
    out = []
    for task in job["spec"]["tasks"]:
        pod = task["template"]
        ports = {p.name: p.container_port for c in pod.spec.containers for p in (c.ports or [])}
        labels = tuple(sorted(pod.metadata.labels.items()))
        out.append(Pod(PIPELINE_NS, labels, tuple(sorted(ports.items()))))
    assert len(out) == 2
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_every_pod_of_the_namespace_is_egress_isolated(build, target):
    objs = build(target)
    policies = objs.kind("NetworkPolicy")
    deny = objs.get("NetworkPolicy", "default-deny-egress")
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Egress"]}
    stray = Pod(SERVICES_NS, (("app", "stray"),), (("http", 80),))
    for src in [stray] + [Pod.of(SERVICES_NS, t) for _, t in pod_templates(objs)]:
        # names resolve through the cluster's DNS, and only there
        for protocol in ("UDP", "TCP"):
            assert sends(policies, src, KUBE_DNS, 53, protocol), (src, protocol)
            assert not sends(policies, src, "8.8.8.8", 53, protocol), (src, protocol)
            other = Pod("kube-system", (("k8s-app", "other"),))
            assert not sends(policies, src, other, 53, protocol)
        assert not sends(policies, src, IMDS, 80) and not sends(policies, src, IMDS, 443), src
        assert not sends(policies, src, ELSEWHERE, 22), src
    # the stray pod: nothing but DNS
    assert not sends(policies, stray, S3_ADDRESS, 443)
    mlflow = Pod.of(SERVICES_NS, objs.get("Deployment", "sdar-mlflow")["spec"]["template"])
    assert not sends(policies, stray, mlflow, "http")
    # the pipeline's egress policies in KFP's namespace select its pods and nobody else's
    in_kfp = [p for p in policies if p["metadata"]["namespace"] == PIPELINE_NS]
    assert in_kfp and all(_selects_only_pipeline_pods(p) for p in in_kfp)
    for other in (KFP_API, OTHER_PIPELINE):
        assert sends(policies, other, ELSEWHERE, 22), other


@pytest.mark.parametrize("target", OVERLAYS)
def test_egress_allows_each_pod_exactly_what_it_calls(
    build, target, env_component_calls, pipeline_pod_labels
):
    objs = build(target)
    policies = objs.kind("NetworkPolicy")
    sdar_pods = {o["metadata"]["name"]: Pod.of(SERVICES_NS, t) for o, t in pod_templates(objs)}
    mlflow, postgres = sdar_pods["sdar-mlflow"], sdar_pods["sdar-postgres"]
    minio, bucket = sdar_pods.get("sdar-minio"), sdar_pods.get("sdar-minio-bucket")
    local = minio is not None
    assert local == (target == "overlays/local")
    env = _launched_env_pod(env_component_calls)
    pipeline = [Pod(PIPELINE_NS, tuple(sorted(la.items()))) for la in pipeline_pod_labels.values()]
    workers = _torchx_worker_pods()
    trainjob_workers = _trainjob_worker_pods()

    # env servers, Postgres and MinIO call nobody: DNS only
    for quiet in [env, postgres] + ([minio] if local else []):
        assert not sends(policies, quiet, S3_ADDRESS, 443), quiet
        assert not sends(policies, quiet, mlflow, "http"), quiet
        assert not sends(policies, quiet, KFP_API, "grpc"), quiet
        assert not sends(policies, quiet, workers[0], "c10d"), quiet
        assert not sends(policies, quiet, trainjob_workers[0], MASTER_PORT), quiet
        assert sends(policies, quiet, KUBE_DNS, 53, "UDP"), quiet
    # MLflow: its Postgres, and the artifact store: S3 over HTTPS (IRSA) on EKS, MinIO locally
    assert connects(policies, mlflow, postgres, "postgres")
    assert not sends(policies, mlflow, env, "http")
    assert not sends(policies, mlflow, S3_ADDRESS, 80)
    if local:
        assert connects(policies, mlflow, minio, "api")
        assert not sends(policies, mlflow, minio, "console")
        assert not sends(policies, mlflow, S3_ADDRESS, 443)
        assert connects(policies, bucket, minio, "api")
        assert not sends(policies, bucket, S3_ADDRESS, 443)
        assert not sends(policies, bucket, mlflow, "http")
    else:
        assert sends(policies, mlflow, S3_ADDRESS, 443)
    # the pipeline's pods and the TorchX and TrainJob workers: env servers, MLflow, KFP, HTTPS out; not Postgres
    for src in pipeline + workers + trainjob_workers:
        assert connects(policies, src, env, "http"), src
        assert not sends(policies, src, env, 9999), src
        assert connects(policies, src, mlflow, "http"), src
        assert not connects(policies, src, postgres, "postgres"), src
        assert not sends(policies, src, postgres, "postgres"), src
        assert sends(policies, src, KFP_API, "grpc") and sends(policies, src, KFP_API, "http"), src
        assert sends(policies, src, S3_ADDRESS, 443), src  # S3 and STS (IRSA), the Hugging Face Hub
        assert sends(policies, src, API_SERVER, 6443) and sends(policies, src, API_SERVER, 443), src
        assert not sends(policies, src, S3_ADDRESS, 80), src
        assert not sends(policies, src, ELSEWHERE, 22), src
        assert not sends(policies, src, IMDS, 443) and not sends(policies, src, IMDS, 80), src
        if local:
            assert connects(policies, src, minio, "api"), src
            assert not sends(policies, src, minio, "console"), src
    # a job's workers reach one another: rank 0's rendezvous store and the collectives' own ports
    for a in workers:
        for b in workers:
            assert sends(policies, a, b, "c10d") and sends(policies, a, b, 41234)
    # a TrainJob's: node 0's torchrun rendezvous on 29500 (the Trainer's PET_MASTER_PORT), the collectives
    for a in trainjob_workers:
        for b in trainjob_workers:
            assert connects(policies, a, b, MASTER_PORT) and connects(policies, a, b, 41234)


@pytest.mark.parametrize("target", OVERLAYS)
def test_egress_of_the_charts_env_servers_is_dns_only(build, render, target, pipeline_pod_labels):
    policies = build(target).kind("NetworkPolicy")
    chart = render(namespace=SERVICES_NS)
    env_pods = [Pod.of(SERVICES_NS, d["spec"]["template"]) for d in chart.kind("Deployment")]
    assert env_pods
    pipeline = Pod(PIPELINE_NS, tuple(sorted(next(iter(pipeline_pod_labels.values())).items())))
    for env in env_pods:
        assert sends(policies, env, KUBE_DNS, 53, "UDP")
        assert not sends(policies, env, S3_ADDRESS, 443) and not sends(policies, env, ELSEWHERE, 80)
        assert not sends(policies, env, pipeline, 8080)
        assert connects(policies, pipeline, env, "http")


# ---- what each overlay holds --------------------------------------------------------------------
def _mlflow_env(objs: Objects) -> dict[str, dict]:
    c = objs.get("Deployment", "sdar-mlflow")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in c["env"]}


def _artifacts_destination(objs: Objects) -> str:
    (cm,) = [
        o for o in objs.kind("ConfigMap") if o["metadata"]["name"].startswith("sdar-mlflow-config")
    ]
    ref = _mlflow_env(objs)["MLFLOW_ARTIFACTS_DESTINATION"]["valueFrom"]["configMapKeyRef"]
    assert ref["name"] == cm["metadata"]["name"]
    return cm["data"][ref["key"]]


def test_local_overlay_runs_minio_and_points_everything_at_it(build):
    objs = build("overlays/local")
    assert "sdar-minio" in objs.names("StatefulSet") and "sdar-minio" in objs.names("Service")
    assert "sdar-minio" in objs.names("NetworkPolicy") and "sdar-minio-bucket" in objs.names("Job")
    assert not any(t["spec"].get("nodeSelector") for _, t in pod_templates(objs))
    s3 = secret_values(objs.get("Secret", "sdar-s3", SERVICES_NS))
    assert secret_values(objs.get("Secret", "sdar-s3", PIPELINE_NS)) == s3  # one set of keys
    # MinIO's root credentials are the clients' keys
    minio = objs.get("StatefulSet", "sdar-minio")["spec"]["template"]["spec"]["containers"][0]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in minio["env"] if "valueFrom" in e}
    assert refs["MINIO_ROOT_USER"] == {"name": "sdar-s3", "key": "AWS_ACCESS_KEY_ID"}
    assert refs["MINIO_ROOT_PASSWORD"] == {"name": "sdar-s3", "key": "AWS_SECRET_ACCESS_KEY"}
    assert len(s3["AWS_SECRET_ACCESS_KEY"]) >= 8  # MinIO refuses shorter root passwords
    # the endpoint names the MinIO Service's API port
    endpoint = urllib.parse.urlsplit(s3["SDAR_S3_ENDPOINT_URL"])
    assert endpoint.hostname == "sdar-minio.sdar.svc.cluster.local"
    svc = objs.get("Service", "sdar-minio")
    assert endpoint.port == next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "api")
    # MLflow stores artifacts there, in the bucket the job creates
    env = _mlflow_env(objs)
    assert env["MLFLOW_S3_ENDPOINT_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "sdar-s3",
        "key": "SDAR_S3_ENDPOINT_URL",
    }
    bucket = urllib.parse.urlsplit(_artifacts_destination(objs)).netloc
    job = objs.get("Job", "sdar-minio-bucket")["spec"]["template"]["spec"]["containers"][0]
    assert job["args"][-1].split("/", 1)[1] == bucket
    assert "sdar-postgres" in objs.names("Secret")


def test_eks_overlay_uses_s3_through_irsa_gp3_and_the_cpu_node_group(build):
    objs = build("overlays/eks")
    assert not [o for o in objs.items if "minio" in json.dumps(o).lower()]
    env = _mlflow_env(objs)
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_S3_ENDPOINT_URL"} & set(env)
    dest = urllib.parse.urlsplit(_artifacts_destination(objs))
    account = eks_registry().group("account")
    assert dest.scheme == "s3" and dest.netloc == f"sdar-artifacts-{account}"
    sa = objs.get("ServiceAccount", "sdar-mlflow")
    assert (
        objs.get("Deployment", "sdar-mlflow")["spec"]["template"]["spec"]["serviceAccountName"]
        == "sdar-mlflow"
    )
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith(
        f"arn:aws:iam::{account}:role/"
    )
    # the pipeline's S3 Secret is the IRSA form: no keys, AWS's endpoint
    assert set(secret_values(objs.get("Secret", "sdar-s3", PIPELINE_NS)).values()) == {""}
    (sc,) = objs.kind("StorageClass")
    assert sc["provisioner"] == "ebs.csi.aws.com" and sc["parameters"]["type"] == "gp3"
    for workload, template in pod_templates(objs):
        assert template["spec"]["nodeSelector"] == {"eks.amazonaws.com/nodegroup": "cpu"}, workload[
            "metadata"
        ]["name"]
        for claim in workload["spec"].get("volumeClaimTemplates", []):
            assert claim["spec"]["storageClassName"] == sc["metadata"]["name"]


def test_base_and_overlays_share_the_services(build):
    for target in TARGETS:
        objs = build(target)
        assert {"sdar-mlflow", "sdar-postgres"} <= objs.names("Service")
        assert objs.names("NetworkPolicy") >= {
            "default-deny-ingress",
            "sdar-env-services",
            "sdar-mlflow",
            "sdar-postgres",
        }
        # a Service selects its workload's pods
        for svc_name, kind in (("sdar-mlflow", "Deployment"), ("sdar-postgres", "StatefulSet")):
            svc = objs.get("Service", svc_name)
            pod = objs.get(kind, svc_name)["spec"]["template"]
            assert selects({"matchLabels": svc["spec"]["selector"]}, pod["metadata"]["labels"])
            names = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
            assert {p["targetPort"] for p in svc["spec"]["ports"]} <= names


# ---- the eksctl ClusterConfig -------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster_config() -> dict:
    return yaml.safe_load((K8S / "eksctl" / "cluster.yaml").read_text())


@pytest.fixture(scope="module")
def eksctl_schema() -> dict:
    schema = json.loads((K8S / "eksctl" / "cluster.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def _node_labels(group: dict) -> dict[str, str]:
    # EKS puts eks.amazonaws.com/nodegroup=<name> on every node of a managed node group
    return {**group.get("labels", {}), "eks.amazonaws.com/nodegroup": group["name"]}


def _tolerates(tol: dict, taint: dict) -> bool:
    """Kubernetes toleration matching (an empty effect matches every effect)."""
    if tol.get("effect") and tol["effect"] != taint["effect"]:
        return False
    op = tol.get("operator") or "Equal"
    if not tol.get("key"):
        return op == "Exists"
    if tol["key"] != taint["key"]:
        return False
    return op == "Exists" or (tol.get("value") or "") == (taint.get("value") or "")


def test_cluster_config_matches_the_schema(cluster_config, eksctl_schema):
    jsonschema.Draft202012Validator(eksctl_schema).validate(cluster_config)


@pytest.mark.parametrize(
    "breakage",
    [
        lambda c: c["managedNodeGroups"][1].update(instancetype="p5.48xlarge"),  # a typo
        lambda c: c["managedNodeGroups"][1]["taints"][0].update(effect="NoScheduled"),
        lambda c: c.update(apiVersion="eksctl.io/v1alpha4"),
        lambda c: c["iam"]["serviceAccounts"][0].pop("attachPolicy"),  # a role with no policy
        lambda c: c["managedNodeGroups"][0].update(minSize="2"),
    ],
    ids=["typo", "effect", "apiVersion", "no-policy", "type"],
)
def test_the_schema_rejects_a_broken_config(cluster_config, eksctl_schema, breakage):
    broken = json.loads(json.dumps(cluster_config))
    breakage(broken)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, eksctl_schema)


def test_gpu_node_group_matches_the_pipelines_selector_and_tolerations(cluster_config):
    from sdar.pipeline.settings import ClusterSettings

    cs = ClusterSettings()
    groups = cluster_config["managedNodeGroups"]
    gpu = [g for g in groups if selects({"matchLabels": cs.node_selector}, _node_labels(g))]
    assert [g["name"] for g in gpu] == ["gpu"], "exactly one node group must take the training pods"
    (gpu,) = gpu
    assert gpu["instanceType"] in ("p4d.24xlarge", "p5.48xlarge")
    taints = gpu["taints"]
    assert taints, "an untainted GPU group would take every other pod"
    # the taints and the pipeline's tolerations are the same set: each taint tolerated, each
    # toleration naming a taint of the group
    assert all(any(_tolerates(t, taint) for t in cs.tolerations) for taint in taints)
    assert all(any(_tolerates(t, taint) for taint in taints) for t in cs.tolerations)
    assert {(t["key"], t["effect"]) for t in taints} == {
        (t["key"], t["effect"]) for t in cs.tolerations
    }
    assert cs.gpu_type == "nvidia.com/gpu"  # the resource the NVIDIA device plugin advertises
    # the other groups: no GPUs and no taint, so the services and KFP land there
    for g in groups:
        if g is not gpu:
            assert not g.get("taints") and not g["instanceType"].startswith(("p", "g")), g["name"]


def test_the_eks_overlay_lands_on_a_cpu_node_group(build, cluster_config):
    from sdar.pipeline.settings import ClusterSettings

    objs = build("overlays/eks")
    selectors = {
        json.dumps(t["spec"]["nodeSelector"], sort_keys=True) for _, t in pod_templates(objs)
    }
    (selector,) = [json.loads(s) for s in selectors]
    (group,) = [
        g
        for g in cluster_config["managedNodeGroups"]
        if selects({"matchLabels": selector}, _node_labels(g))
    ]
    assert not group.get("taints")
    assert not selects({"matchLabels": ClusterSettings().node_selector}, _node_labels(group))


def test_irsa_roles_match_the_service_accounts_and_the_bucket(build, cluster_config):
    assert cluster_config["iam"]["withOIDC"] is True
    objs = build("overlays/eks")
    accounts = {
        (a["metadata"]["namespace"], a["metadata"]["name"]): a
        for a in cluster_config["iam"]["serviceAccounts"]
    }
    bucket = urllib.parse.urlsplit(_artifacts_destination(objs)).netloc

    def s3_resources(account: dict) -> set[str]:
        return {
            r
            for s in account["attachPolicy"]["Statement"]
            if s["Effect"] == "Allow"
            for r in s["Resource"]
        }

    # MLflow's ServiceAccount is annotated with the role eksctl makes for it
    arn = objs.get("ServiceAccount", "sdar-mlflow")["metadata"]["annotations"][
        "eks.amazonaws.com/role-arn"
    ]
    mlflow = accounts[(SERVICES_NS, "sdar-mlflow")]
    assert mlflow["roleOnly"] is True and arn.endswith(f":role/{mlflow['roleName']}")
    # the pipeline's ServiceAccount (the RoleBindings' subject) gets one too
    (subject,) = objs.get("RoleBinding", ENV_ROLE)["subjects"]
    pipeline = accounts[(subject["namespace"], subject["name"])]
    assert (
        pipeline["roleOnly"] is True
    )  # KFP owns that ServiceAccount; docs/cluster.md annotates it
    for account in (mlflow, pipeline):
        assert s3_resources(account) == {f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"}
    # one account and region everywhere: the ECR registry, the role ARNs, the cluster
    registry = eks_registry()
    assert cluster_config["metadata"]["region"] == registry.group("region")
    assert arn.startswith(f"arn:aws:iam::{registry.group('account')}:role/")


def test_addons_enforce_network_policies_and_provide_gp3(build, cluster_config):
    addons = {a["name"]: a for a in cluster_config["addons"]}
    # without this the VPC CNI accepts NetworkPolicies and enforces none of them
    assert json.loads(addons["vpc-cni"]["configurationValues"])["enableNetworkPolicy"] == "true"
    (sc,) = build("overlays/eks").kind("StorageClass")
    assert sc["provisioner"] == "ebs.csi.aws.com" and "aws-ebs-csi-driver" in addons
    assert addons["aws-ebs-csi-driver"]["wellKnownPolicies"]["ebsCSIController"] is True


# ---- the walkthrough agrees with the manifests --------------------------------------------------
def test_the_walkthrough_names_real_paths_and_the_pipelines_secrets():
    from sdar.pipeline.settings import ClusterSettings

    doc = (REPO / "docs" / "cluster.md").read_text()
    # (a path of this repository, not the end of a URL such as oci://ghcr.io/kubeflow/charts/kubeflow-trainer)
    for path in set(re.findall(r"(?<![\w./-])((?:k8s|charts|docs)/[\w./-]*\w)", doc)):
        assert (REPO / path).exists(), path
    for target in OVERLAYS:
        assert f"kubectl apply -k k8s/{target}" in doc
    # what the docs tell users to create by hand has the keys the manifests read: every command
    # (continuation lines joined) that creates a Secret, by name
    commands = re.sub(r"\\\n\s*", " ", doc).splitlines()
    keys: dict[str, list[set[str]]] = {}
    for cmd in commands:
        m = re.search(r"create secret generic (\S+)", cmd)
        if m:
            keys.setdefault(m.group(1), []).append(set(re.findall(r"--from-literal=(\w+)=", cmd)))
    cs = ClusterSettings()
    assert keys["sdar-postgres"] and all(
        k == {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"} for k in keys["sdar-postgres"]
    )
    assert keys[cs.s3_secret] and all(k == set(cs.s3_keys.values()) for k in keys[cs.s3_secret])
    assert (
        f"--as=system:serviceaccount:{PIPELINE_NS}:{PIPELINE_SA}" in doc
        or f"SA=system:serviceaccount:{PIPELINE_NS}:{PIPELINE_SA}" in doc
    )
    for step in (
        "eksctl create cluster",
        "kubectl auth can-i",
        "helm install sdar-envs charts/sdar-envs",
        "make push-images REGISTRY=",
        "sdar compile --target cluster",
        "--gpus 0",  # the launcher pod of a TorchX job, and kind/minikube
        "helm install kubeflow-trainer oci://ghcr.io/kubeflow/charts/kubeflow-trainer",
        "--set runtimes.torchDistributed.enabled=true",  # the runtime launch.runtime names
        "kubectl get clustertrainingruntime torch-distributed",
        "kubectl auth can-i create trainjobs.trainer.kubeflow.org -n kubeflow",
        "--set launch.launcher=trainjob",
        "helm install volcano",
        "kubectl get crd jobs.batch.volcano.sh",
        "kubectl auth can-i create jobs.batch.volcano.sh -n kubeflow",
        "kfp --endpoint",
        "sdar submit --host",
        "port-forward svc/sdar-mlflow",
        "sdar plan",
    ):
        assert step in doc, step


def test_the_deployed_mlflow_server_is_the_release_the_view_is_tested_on():
    """The tracking server k8s/ deploys runs a release inside pyproject's mlflow range, the one the MLflow view's
    browser test runs (tests/integration/test_mlflow_ui.py): the comparison URL opens on a UI we have seen."""
    from importlib.metadata import version

    import tomllib
    from packaging.requirements import Requirement

    kustomization = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    tag = next(i["newTag"] for i in kustomization["images"] if i["name"] == "ghcr.io/mlflow/mlflow")
    deployed = re.fullmatch(r"v(\d+\.\d+\.\d+)-full", tag)
    assert deployed, f"the MLflow image tag {tag!r} is not v<release>-full"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (spec,) = [Requirement(r).specifier for r in project["dependencies"] if Requirement(r).name == "mlflow"]
    assert deployed.group(1) in spec, f"k8s/ deploys MLflow {deployed.group(1)}, outside pyproject's {spec}"
    assert version("mlflow") in spec  # the installed client, which the browser test serves, is in the range too
    docs = (REPO / "docs" / "cluster.md").read_text()
    assert f"ghcr.io/mlflow/mlflow:{tag}" in docs, "docs/cluster.md mirrors another MLflow image than k8s/ deploys"
