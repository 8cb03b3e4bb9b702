"""What Kubeflow Trainer v2.3.0 makes of a TrainJob on its `torch-distributed` runtime: the node pods, and the exact
command and environment each node's container runs (`node_command`, which tests run under torchrun here).

Each rule is the release's own, read at tag v2.3.0 of github.com/kubeflow/trainer; the file is named where it is used:
* runtime patches: pkg/runtime/core/trainingruntime.go `mergeRuntimePatches` strategic-merges each patch's
  `trainingRuntimeSpec.template.spec` into the whole JobSet spec (jobset v0.12.0's JobSetSpec: replicatedJobs by
  name), one patch after another, then restores the runtime's order of replicatedJobs. (v2.2 merged each replicated
  job's template alone, as a batch/v1 JobTemplateSpec, and skipped patches of jobs the runtime lacks.) The patch's
  JobSet metadata labels become the JobSet's (`newRuntimeInfo`).
* what a patch may say: pkg/runtime/framework/plugins/jobset/jobset.go `Validate` (the admission webhook): a domain-
  prefixed manager, replicated jobs and containers that the runtime has, no env for the node container; and
  pkg/runtime/framework/plugins/torch/torch.go `Validate`: no PET_* variable in trainer.env.
* the trainer: `newRuntimeInfo` sets the trainer job's count from the runtime's mlPolicy.numNodes and merges
  trainer.resourcesPerNode into the node container's resources (pkg/util/trainingruntime MergeResourceRequirements:
  limits and requests key by key); pkg/runtime/framework/plugins/jobset/builder.go `Trainer` sets the node
  container's image, command and args from trainer, and upserts trainer.env.
* torchrun's rendezvous: torch.go `EnforceMLPolicy` sets the count to trainer.numNodes and upserts PET_NNODES,
  PET_NPROC_PER_NODE (trainer.numProcPerNode, else "auto" with GPUs, else the CPUs), PET_NODE_RANK (the pod's
  batch.kubernetes.io/job-completion-index annotation), PET_MASTER_ADDR (<trainjob>-node-0-0.<trainjob>, the
  headless Service's name for rank 0) and PET_MASTER_PORT (constants.ContainerTrainerPort, 29500), and container
  port 29500 (pkg/constants/constants.go has the names).
The runtime is the release's manifest (tests/deploy/data/kubeflow-trainer-v2.3.0-torch-distributed.yaml).
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import yaml

TRAINER_VERSION = "2.3.0"
RUNTIME_FILE = Path(__file__).parent / "data" / f"kubeflow-trainer-v{TRAINER_VERSION}-torch-distributed.yaml"
NODE = "node"  # constants.Node: the trainer's replicated job and container
ANCESTOR_LABEL, ANCESTOR_TRAINER = "trainer.kubeflow.org/trainjob-ancestor-step", "trainer"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # the Job controller's annotation of each pod
COMPLETION_INDEX_FIELD = f"metadata.annotations['{COMPLETION_INDEX}']"  # constants.JobCompletionIndexFieldPath
MASTER_PORT = 29500  # constants.ContainerTrainerPort
PET_VARS = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
# The merge keys of the lists a runtime patch reaches (patchStrategy:"merge" patchMergeKey:... in jobset v0.12.0's
# api/jobset/v1alpha2/jobset_types.go and k8s.io/api/core/v1/types.go); every other list is replaced whole
# (e.g. tolerations, capabilities.drop), as the strategic merge patch does.
MERGE_KEYS = {"replicatedJobs": "name", "containers": "name", "initContainers": "name", "volumes": "name",
              "volumeMounts": "mountPath", "env": "name", "ports": "containerPort", "imagePullSecrets": "name",
              "schedulingGates": "name", "claims": "name"}
DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def torch_distributed() -> dict[str, Any]:
    """The release's ClusterTrainingRuntime torch-distributed."""
    return yaml.safe_load(RUNTIME_FILE.read_text())


def strategic_merge(original: Any, patch: Any) -> Any:
    """`patch` strategic-merged into `original` (k8s.io/apimachinery strategicpatch, for the directive-free patches
    a TrainJob carries): maps merge key by key (null deletes), lists of MERGE_KEYS merge item by item on their key
    (new items appended), other lists and values are replaced."""
    if not isinstance(original, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(original)
    for key, value in patch.items():
        if key.startswith("$"):
            raise NotImplementedError(f"patch directive {key!r}: a TrainJob's runtime patch here carries none")
        if value is None:
            out.pop(key, None)
        elif key in MERGE_KEYS and isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = _merge_list(out[key], value, MERGE_KEYS[key])
        else:
            out[key] = strategic_merge(out.get(key), value)
    return out


def _merge_list(original: list, patch: list, key: str) -> list:
    out = copy.deepcopy(original)
    for item in patch:
        at = next((i for i, o in enumerate(out) if isinstance(o, dict) and o.get(key) == item.get(key)), None)
        if at is None:
            out.append(copy.deepcopy(item))
        else:
            out[at] = strategic_merge(out[at], item)
    return out


def validate_runtime_patches(trainjob: dict[str, Any], runtime: dict[str, Any]) -> None:
    """Raise ValueError with the webhook's reason where v2.3.0's admission would refuse the TrainJob's runtime
    patches (jobset.go Validate) or its trainer env (torch.go Validate)."""
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    containers = {j["name"]: {c["name"] for c in j["template"]["spec"]["template"]["spec"].get("containers", [])}
                  | {c["name"] for c in j["template"]["spec"]["template"]["spec"].get("initContainers", [])}
                  for j in jobs}
    for patch in trainjob["spec"].get("runtimePatches") or []:
        host, _, path = (patch.get("manager") or "").partition("/")
        if not (DNS_1123_SUBDOMAIN.fullmatch(host) and len(host) <= 253 and path):
            raise ValueError(f"runtimePatches manager {patch.get('manager')!r} is not a domain-prefixed path")
        spec = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
        for rjob in spec.get("replicatedJobs") or []:
            if rjob["name"] not in containers:
                raise ValueError(f"runtimePatches: replicated job {rjob['name']!r} does not exist in the runtime job "
                                 f"template (it has {', '.join(sorted(containers))})")
            pod = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
                if c["name"] not in containers[rjob["name"]]:
                    raise ValueError(f"runtimePatches: container {c['name']!r} does not exist in the runtime job "
                                     f"{rjob['name']}")
                if c.get("env") and c["name"] in ("dataset-initializer", "model-initializer", NODE):
                    raise ValueError("runtimePatches must not have envs for the dataset-initializer, "
                                     "model-initializer, node containers: use trainer.env")
    reserved = sorted({e["name"] for e in (trainjob["spec"].get("trainer") or {}).get("env") or []} & set(PET_VARS))
    if reserved:
        raise ValueError(f"trainer.env must not have reserved envs, invalid envs configured: {reserved}")


def merge_runtime_patches(jobset_spec: dict[str, Any], trainjob: dict[str, Any]) -> dict[str, Any]:
    """The runtime's JobSet spec with the TrainJob's runtime patches merged in, as v2.3.0's mergeRuntimePatches
    does: the whole spec, patch by patch, replicatedJobs back in the runtime's order."""
    order = {j["name"]: i for i, j in enumerate(jobset_spec.get("replicatedJobs") or [])}
    spec = copy.deepcopy(jobset_spec)
    for patch in trainjob["spec"].get("runtimePatches") or []:
        patch_spec = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec")
        if patch_spec is not None:
            spec = strategic_merge(spec, patch_spec)
    # Go's sort.SliceStable over order[name]: a job the runtime lacks has order 0
    spec["replicatedJobs"] = sorted(spec.get("replicatedJobs") or [], key=lambda j: order.get(j["name"], 0))
    return spec


def _quantity(text: str) -> float:
    m = re.fullmatch(r"([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?", str(text))
    if not m:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    scale = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30,
             "Ti": 2 ** 40}.get(m.group(2) or "", 1)
    return float(m.group(1)) * scale


def _procs_per_node(trainer: dict[str, Any], resources: dict[str, Any]) -> str:
    """torch.go: trainer.numProcPerNode, else "auto" with GPUs, else the node's CPUs (requests, else limits)."""
    if trainer.get("numProcPerNode") is not None:
        return str(int(trainer["numProcPerNode"]))

    def gpus(amounts: dict) -> int:
        return next((math.ceil(_quantity(v)) for k, v in (amounts or {}).items() if "gpu" in k.lower()), 0)

    if gpus(resources.get("requests")) or gpus(resources.get("limits")):
        return "auto"
    cpu = (resources.get("requests") or {}).get("cpu") or (resources.get("limits") or {}).get("cpu") or "0"
    return str(max(1, math.ceil(_quantity(cpu))))


def _upsert(env: list[dict[str, Any]], *items: dict[str, Any]) -> None:
    """apply.UpsertEnvVars: replace the entry of the same name in place, else append."""
    for item in items:
        at = next((i for i, e in enumerate(env) if e["name"] == item["name"]), None)
        if at is None:
            env.append(copy.deepcopy(item))
        else:
            env[at] = copy.deepcopy(item)


def node_pods(trainjob: dict[str, Any], runtime: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The pods of the TrainJob's node job, one per node rank, as v2.3.0 and JobSet make them on `runtime` (default:
    the release's torch-distributed): the runtime's template with the runtime patches merged in, the trainer's
    image, command, resources and env, the torch plugin's PET_* variables and port; each pod carries its rank as
    the Job controller's completion-index annotation."""
    runtime = runtime or torch_distributed()
    validate_runtime_patches(trainjob, runtime)
    name, trainer = trainjob["metadata"]["name"], trainjob["spec"].get("trainer") or {}
    spec = merge_runtime_patches(runtime["spec"]["template"]["spec"], trainjob)
    jobs = [j for j in spec["replicatedJobs"]
            if ((j["template"].get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL) == ANCESTOR_TRAINER]
    if len(jobs) != 1:
        raise ValueError(f"the runtime {runtime['metadata']['name']} has {len(jobs)} trainer jobs (label "
                         f"{ANCESTOR_LABEL}={ANCESTOR_TRAINER}); the torch plugin needs one")
    template = copy.deepcopy(jobs[0]["template"]["spec"]["template"])
    node = next((c for c in template["spec"]["containers"] if c["name"] == NODE), None)
    if node is None:
        raise ValueError(f"the trainer job of {runtime['metadata']['name']} has no container {NODE!r}")
    if trainer.get("resourcesPerNode"):  # MergeResourceRequirements: limits and requests key by key
        node["resources"] = strategic_merge(node.get("resources") or {}, trainer["resourcesPerNode"])
    for field in ("image", "command", "args"):  # builder.go Trainer
        if trainer.get(field) is not None:
            node[field] = copy.deepcopy(trainer[field])
    count = int(trainer.get("numNodes") or runtime["spec"].get("mlPolicy", {}).get("numNodes") or 1)
    env = node.setdefault("env", [])
    _upsert(env, *(trainer.get("env") or []))
    _upsert(env, {"name": "PET_NNODES", "value": str(count)},
            {"name": "PET_NPROC_PER_NODE", "value": _procs_per_node(trainer, node.get("resources") or {})},
            {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}},
            {"name": "PET_MASTER_ADDR", "value": f"{name}-{NODE}-0-0.{name}"},
            {"name": "PET_MASTER_PORT", "value": str(MASTER_PORT)})
    ports = node.setdefault("ports", [])
    if not any(p.get("containerPort") == MASTER_PORT for p in ports):
        ports.append({"containerPort": MASTER_PORT})
    pods = []
    for rank in range(count):
        meta = copy.deepcopy(template.get("metadata") or {})
        meta.update({"name": f"{name}-{NODE}-0-{rank}",
                     "annotations": {**(meta.get("annotations") or {}), COMPLETION_INDEX: str(rank)}})
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": copy.deepcopy(template["spec"])})
    return pods


def node_command(trainjob: dict[str, Any], node_rank: int, *, master_addr: str | None = None,
                 master_port: int | None = None, runtime: dict[str, Any] | None = None
                 ) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of node `node_rank`'s trainer container: its command and args, and every env entry with a
    value, the pod's own fields resolved (PET_NODE_RANK is the rank). Entries from Secrets (secretKeyRef) are left
    out: their values are the cluster's. `master_addr` / `master_port` replace PET_MASTER_ADDR / PET_MASTER_PORT
    (the rank-0 pod's DNS name and 29500) to run the nodes on one machine."""
    pods = node_pods(trainjob, runtime)
    if not 0 <= node_rank < len(pods):
        raise ValueError(f"node_rank {node_rank} is not one of the TrainJob's {len(pods)} nodes")
    pod = pods[node_rank]
    (node,) = [c for c in pod["spec"]["containers"] if c["name"] == NODE]
    env: dict[str, str] = {}
    for e in node.get("env") or []:
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif (e.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == COMPLETION_INDEX_FIELD:
            env[e["name"]] = pod["metadata"]["annotations"][COMPLETION_INDEX]
        elif "fieldRef" in (e.get("valueFrom") or {}):
            raise ValueError(f"{e['name']}: fieldRef {e['valueFrom']['fieldRef']['fieldPath']} is not resolved here")
    if master_addr is not None:
        env["PET_MASTER_ADDR"] = master_addr
    if master_port is not None:
        env["PET_MASTER_PORT"] = str(master_port)
    return [*node.get("command", []), *node.get("args", [])], env
