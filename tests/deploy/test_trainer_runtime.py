"""tests/deploy/trainer_runtime.py, Kubeflow Trainer 2.3.0's rules as the TrainJob tests apply them: the strategic
merge of runtime patches into the whole JobSet spec, what the admission webhook refuses, the torch plugin's PET_*
variables. The TrainJob the launcher builds, merged by these rules: tests/deploy/test_trainjob.py."""

from __future__ import annotations

import copy

import pytest

from tests.deploy.trainer_runtime import (merge_runtime_patches, node_command, node_pods, strategic_merge,
                                          torch_distributed)


def test_the_runtime_is_the_releases_torch_distributed():
    runtime = torch_distributed()
    assert (runtime["kind"], runtime["metadata"]["name"]) == ("ClusterTrainingRuntime", "torch-distributed")
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 1, "torch": {}}
    (rjob,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == "node"
    assert rjob["template"]["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    assert rjob["template"]["spec"]["template"]["spec"]["containers"] == [
        {"name": "node", "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"}]


def test_strategic_merge_merges_keyed_lists_and_replaces_the_others():
    pod = {"containers": [{"name": "node", "image": "a", "env": [{"name": "X", "value": "1"}],
                           "securityContext": {"capabilities": {"drop": ["NET_RAW"], "add": ["SYS_PTRACE"]}}},
                          {"name": "sidecar", "image": "b"}],
           "tolerations": [{"key": "a", "operator": "Exists"}], "nodeSelector": {"zone": "z1"},
           "volumes": [{"name": "data", "emptyDir": {}}]}
    patch = {"containers": [{"name": "node", "env": [{"name": "Y", "value": "2"}, {"name": "X", "value": "3"}],
                             "securityContext": {"capabilities": {"drop": ["ALL"]}}}],
             "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}], "nodeSelector": {"pool": "gpu"},
             "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}], "serviceAccountName": "sa"}
    merged = strategic_merge(pod, patch)
    node, sidecar = merged["containers"]
    # containers and env by name: kept in place, the new ones appended
    assert node["image"] == "a" and node["env"] == [{"name": "X", "value": "3"}, {"name": "Y", "value": "2"}]
    assert sidecar == {"name": "sidecar", "image": "b"}
    # structs merge field by field; a list of strings and tolerations (no merge key) are replaced whole
    assert node["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert merged["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert merged["nodeSelector"] == {"zone": "z1", "pool": "gpu"} and merged["serviceAccountName"] == "sa"
    assert [v["name"] for v in merged["volumes"]] == ["data", "tmp"]
    assert strategic_merge({"a": 1, "b": 2}, {"b": None}) == {"a": 1}  # null deletes
    assert pod["containers"][0]["env"] == [{"name": "X", "value": "1"}]  # the original is left alone
    with pytest.raises(NotImplementedError, match=r"\$patch"):
        strategic_merge(pod, {"containers": [{"name": "node", "$patch": "delete"}]})


def _job(**trainer) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "tj"},
            "spec": {"runtimeRef": {"name": "torch-distributed"},
                     "trainer": {"image": "img", "command": ["torchrun", "-m", "m"], **trainer}, "runtimePatches": []}}


def _patch(manager: str, pod_spec: dict, job: str = "node", metadata: dict | None = None) -> dict:
    template = {"spec": pod_spec, **({"metadata": metadata} if metadata else {})}
    return {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": job, "template": {"spec": {"template": template}}}]}}}}


def _two_job_runtime() -> dict:
    """torch-distributed with what 2.3's whole-spec merge must keep: a launcher job before the node job, and the
    node container's own resources, env and tolerations."""
    runtime = torch_distributed()
    spec = runtime["spec"]["template"]["spec"]
    node = spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    node["containers"][0].update({"resources": {"limits": {"cpu": "4", "example.com/efa": "1"}},
                                  "env": [{"name": "NCCL_DEBUG", "value": "INFO"}]})
    node["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    spec["replicatedJobs"].insert(0, {"name": "launcher", "template": {"spec": {"template": {"spec": {
        "containers": [{"name": "launcher", "image": "l"}]}}}}})
    return runtime


def test_patches_merge_into_the_whole_spec_one_after_another_in_the_runtimes_order():
    runtime = _two_job_runtime()
    job = _job(numNodes=2, numProcPerNode=1, resourcesPerNode={"limits": {"cpu": "8", "nvidia.com/gpu": "1"}})
    job["spec"]["runtimePatches"] = [
        _patch("sdar/launcher", {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                                 "nodeSelector": {"pool": "gpu"}}, metadata={"labels": {"team": "a"}}),
        _patch("kueue.x-k8s.io/manager", {"nodeSelector": {"flavor": "h100"}})]
    spec = merge_runtime_patches(runtime["spec"]["template"]["spec"], job)
    assert [j["name"] for j in spec["replicatedJobs"]] == ["launcher", "node"]
    assert spec["replicatedJobs"][0] == runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    pod = spec["replicatedJobs"][1]["template"]["spec"]["template"]
    assert pod["metadata"] == {"labels": {"team": "a"}}
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu", "flavor": "h100"}  # the second patch on the first
    assert pod["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    # the ancestor label of the runtime's node job survives, so the torch plugin finds the trainer
    assert spec["replicatedJobs"][1]["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    (p0, p1) = node_pods(job, runtime)
    (c,) = p0["spec"]["containers"]
    # 2.3 merges resourcesPerNode into the runtime's resources key by key (2.2 replaced them)
    assert c["resources"] == {"limits": {"cpu": "8", "example.com/efa": "1", "nvidia.com/gpu": "1"}}
    assert [e["name"] for e in c["env"]] == ["NCCL_DEBUG", "PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK",
                                             "PET_MASTER_ADDR", "PET_MASTER_PORT"]
    assert node_command(job, 1, runtime=runtime)[1] == {
        "NCCL_DEBUG": "INFO", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "tj-node-0-0.tj", "PET_MASTER_PORT": "29500"}


def test_procs_per_node_defaults_as_the_torch_plugin_does():
    def procs(**trainer) -> str:
        return node_command(_job(**trainer), 0)[1]["PET_NPROC_PER_NODE"]

    assert procs(numProcPerNode=3) == "3"
    assert procs(resourcesPerNode={"limits": {"nvidia.com/gpu": "8"}}) == "auto"  # torchrun counts the GPUs
    assert procs(resourcesPerNode={"requests": {"cpu": "2500m"}, "limits": {"cpu": "6"}}) == "3"
    assert procs() == "1"
    assert node_command(_job(), 0)[1]["PET_NNODES"] == "1"  # the runtime's mlPolicy.numNodes


@pytest.mark.parametrize("change, message", [
    (lambda j: j["spec"]["runtimePatches"].append(_patch("sdar/launcher", {}, job="trainer")),
     "replicated job 'trainer' does not exist in the runtime job template"),
    (lambda j: j["spec"]["runtimePatches"].append(_patch("sdar/launcher", {"containers": [{"name": "trainer"}]})),
     "container 'trainer' does not exist in the runtime job node"),
    (lambda j: j["spec"]["runtimePatches"].append(_patch("sdar/launcher", {"containers": [
        {"name": "node", "env": [{"name": "A", "value": "1"}]}]})), "must not have envs for the .* node containers"),
    (lambda j: j["spec"]["runtimePatches"].append(_patch("Not A Domain", {})), "not a domain-prefixed path"),
    (lambda j: j["spec"]["trainer"].update(env=[{"name": "PET_NODE_RANK", "value": "0"}]),
     r"must not have reserved envs, invalid envs configured: \['PET_NODE_RANK'\]"),
])
def test_what_the_webhook_refuses_is_refused(change, message):
    job = _job(numNodes=2)
    change(job)
    with pytest.raises(ValueError, match=message):
        node_pods(job)
    with pytest.raises(ValueError, match="node_rank 2 is not one of the TrainJob's 2 nodes"):
        node_command(_job(numNodes=2), 2)
    assert copy.deepcopy(job) == job
