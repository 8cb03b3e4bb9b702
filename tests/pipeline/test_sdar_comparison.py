"""The comparison pipeline compiles to KFP IR with the expected DAG: launch, baseline eval,
per-arm train and eval in a ParallelFor, compare, teardown as the ExitHandler's exit task; the
cluster target adds GPUs, scheduling and secrets, the local target none of them."""

from __future__ import annotations

import pytest
import yaml

from pipelines.sdar_comparison import ClusterSettings, build_pipeline, compile_pipeline, submit


def _compile(tmp_path, target: str, **kw) -> tuple[dict, dict]:
    path = compile_pipeline(tmp_path / f"{target}.yaml", target=target, **kw)
    docs = list(yaml.safe_load_all(path.read_text()))
    return docs[0], (docs[1] if len(docs) > 1 else {})


def _body(spec: dict) -> tuple[str, dict]:
    """(exit handler task name, tasks inside the exit handler)."""
    root = spec["root"]["dag"]["tasks"]
    handler = next(k for k in root if k.startswith("exit-handler"))
    return handler, spec["components"][root[handler]["componentRef"]["name"]]["dag"]["tasks"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    return _compile(tmp_path_factory.mktemp("c"), "cluster")


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return _compile(tmp_path_factory.mktemp("l"), "local")


def test_dag_has_launch_baseline_parallel_arms_compare_and_teardown(cluster):
    spec, _ = cluster
    assert spec["pipelineInfo"]["name"] == "sdar-comparison"
    root = spec["root"]["dag"]["tasks"]
    handler, body = _body(spec)
    assert set(root) == {handler, "teardown-envs"}
    # teardown is the exit task: it runs when the body completes, failed or not, and gets its status
    teardown = root["teardown-envs"]
    assert teardown["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert teardown["inputs"]["parameters"]["status"] == {"taskFinalStatus": {"producerTask": handler}}
    assert teardown["inputs"]["parameters"]["job_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"

    assert set(body) == {"plan-runs", "launch-envs", "evaluate", "for-loop-2", "compare"}
    assert body["launch-envs"]["dependentTasks"] == ["plan-runs"]
    assert body["evaluate"]["dependentTasks"] == ["launch-envs"]  # the baseline eval of the warm start
    assert "checkpoint" not in body["evaluate"]["inputs"].get("artifacts", {})
    loop = body["for-loop-2"]
    assert loop["parameterIterator"]["items"] == {"inputParameter": "pipelinechannel--plan-runs-Output"}
    assert set(loop["dependentTasks"]) == {"evaluate", "launch-envs", "plan-runs"}  # arms start after the baseline
    arm = spec["components"][loop["componentRef"]["name"]]["dag"]["tasks"]
    assert set(arm) == {"gated-train", "evaluate-2"}
    ev = arm["evaluate-2"]["inputs"]
    assert ev["artifacts"]["checkpoint"]["taskOutputArtifact"] == {"outputArtifactKey": "checkpoint", "producerTask": "gated-train"}
    assert ev["parameters"]["run_id"]["taskOutputParameter"] == {"outputParameterKey": "run_id", "producerTask": "gated-train"}
    # compare collects every arm's evaluation and history from the loop
    cmp_art = body["compare"]["inputs"]["artifacts"]
    assert cmp_art["evaluations"]["taskOutputArtifact"]["producerTask"] == "for-loop-2"
    assert cmp_art["histories"]["taskOutputArtifact"]["producerTask"] == "for-loop-2"
    assert cmp_art["baseline"]["taskOutputArtifact"] == {"outputArtifactKey": "result", "producerTask": "evaluate"}
    params = spec["root"]["inputDefinitions"]["parameters"]
    for name in ("family", "model", "arms", "steps", "group_size", "tasks_per_step", "seeds", "eval_tasks", "config_path"):
        assert name in params, name
    assert params["arms"]["defaultValue"] == ["grpo", "grpo_opsd", "sdar"]


def test_cluster_target_adds_gpu_scheduling_and_secrets(cluster):
    spec, platform = cluster
    res = spec["deploymentSpec"]["executors"]["exec-gated-train"]["container"]["resources"]
    assert res["accelerator"]["resourceType"] == "nvidia.com/gpu" and res["accelerator"]["resourceCount"] == "1"
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    train = k8s["exec-gated-train"]
    assert train["nodeSelector"]["labels"] == {"eks.amazonaws.com/nodegroup": "gpu"}
    assert train["tolerations"] == [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]
    for ex in ("exec-gated-train", "exec-evaluate", "exec-evaluate-2", "exec-launch-envs", "exec-compare",
               "exec-teardown-envs"):
        secrets = {s["secretName"]: {e["envVar"] for e in s["keyToEnv"]} for s in k8s[ex]["secretAsEnv"]}
        assert secrets["sdar-mlflow"] == {"MLFLOW_TRACKING_URI"}, ex
        assert secrets["sdar-s3"] == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "SDAR_S3_ENDPOINT_URL"}, ex
    # no GPU on the other steps, and secrets never appear as pipeline parameters
    for ex, body in spec["deploymentSpec"]["executors"].items():
        if ex != "exec-gated-train":
            assert "accelerator" not in body["container"].get("resources", {}), ex
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert not [p for p in params if "secret" in p or "password" in p or "key" in p.lower()]


def test_local_target_has_no_cluster_settings(local):
    spec, platform = local
    assert platform == {}
    for ex, body in spec["deploymentSpec"]["executors"].items():
        assert "resources" not in body["container"], ex


def test_components_run_in_the_image_and_install_nothing(cluster, tmp_path, monkeypatch):
    spec, _ = cluster
    for ex, body in spec["deploymentSpec"]["executors"].items():
        c = body["container"]
        assert c["image"] == "ghcr.io/sdar/sdar-trainer:0.1.0", ex  # what `make images` tags
        assert "pip install" not in " ".join(c["command"]), ex
    custom, _ = _compile(tmp_path, "cluster", image="registry.example/sdar-trainer:7")
    assert {b["container"]["image"] for b in custom["deploymentSpec"]["executors"].values()} == {"registry.example/sdar-trainer:7"}


def test_cluster_settings_are_configurable(tmp_path):
    cs = ClusterSettings(gpus=4, node_selector={"sdar.io/pool": "a100"}, tolerations=[], eval_on_gpu=True)
    spec, platform = _compile(tmp_path, "cluster", cluster=cs)
    execs = spec["deploymentSpec"]["executors"]
    assert execs["exec-gated-train"]["container"]["resources"]["accelerator"]["resourceCount"] == "4"
    assert execs["exec-evaluate"]["container"]["resources"]["accelerator"]["resourceCount"] == "4"
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert k8s["exec-gated-train"]["nodeSelector"]["labels"] == {"sdar.io/pool": "a100"}
    assert "tolerations" not in k8s["exec-gated-train"]


def test_bad_target_and_unreachable_host_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="target must be one of local, cluster, got 'gke'"):
        build_pipeline("gke")
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionError, match=rf"cannot reach Kubeflow Pipelines at http://127.0.0.1:{port} .*port-forward"):
        submit(f"http://127.0.0.1:{port}", "exp", yaml_path=tmp_path / "none.yaml", timeout_s=2)
    with pytest.raises(ValueError, match="needs a URL with a scheme"):
        submit("127.0.0.1:8080", "exp")


def test_cli_compile_writes_the_yaml(tmp_path, capsys):
    from sdar.cli import main

    out = tmp_path / "p.yaml"
    assert main(["compile", "--out", str(out), "--target", "local"]) == 0
    spec = yaml.safe_load_all(out.read_text()).__next__()
    assert spec["pipelineInfo"]["name"] == "sdar-comparison"
    assert f"wrote {out}" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="needs --local"):
        main(["run", "--quick"])
