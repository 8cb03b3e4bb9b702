"""The comparison pipeline compiles to KFP IR with the expected DAG: launch, baseline eval,
per-arm train and eval in a ParallelFor, compare, teardown as the ExitHandler's exit task; the
cluster target adds GPUs (or none), scheduling, the env-server image and namespace, the image of
TorchX jobs and secrets, the local target none of them."""

from __future__ import annotations

import pytest
import yaml

from pipelines.sdar_comparison import build_pipeline
from sdar.pipeline.runner import compile_pipeline, submit
from sdar.pipeline.settings import ClusterSettings


def _compile(tmp_path, target: str, **kw) -> tuple[dict, dict]:
    path = compile_pipeline(tmp_path / f"{target}.yaml", target=target, **kw)
    docs = list(yaml.safe_load_all(path.read_text()))
    return docs[0], (docs[1] if len(docs) > 1 else {})


def _executor(spec: dict, platform: dict, name: str) -> tuple[dict, dict]:
    """(container, kubernetes platform config) of executor `name`."""
    k8s = platform.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}).get("executors", {})
    return spec["deploymentSpec"]["executors"][name]["container"], k8s.get(name, {})


def _launch_input(spec: dict, name: str):
    """The constant the launch-envs task passes as `name` (None: not passed)."""
    _, body = _body(spec)
    param = body["launch-envs"]["inputs"]["parameters"].get(name)
    return param["runtimeValue"]["constant"] if param else None


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

    assert set(body) == {"run-matrix", "launch-envs", "evaluate", "for-loop-2", "compare"}
    assert body["launch-envs"]["dependentTasks"] == ["run-matrix"]
    assert body["evaluate"]["dependentTasks"] == ["launch-envs"]  # the baseline eval of the warm start
    assert "checkpoint" not in body["evaluate"]["inputs"].get("artifacts", {})
    loop = body["for-loop-2"]
    assert loop["parameterIterator"]["items"] == {"inputParameter": "pipelinechannel--run-matrix-Output"}
    assert set(loop["dependentTasks"]) == {"evaluate", "launch-envs", "run-matrix"}  # arms start after the baseline
    arm = spec["components"][loop["componentRef"]["name"]]["dag"]["tasks"]
    # issue 13.4: rollout -> teacher replay -> gated training -> evaluate, per arm and seed
    assert set(arm) == {"rollout", "teacher-replay", "gated-train", "evaluate-2"}
    assert "dependentTasks" not in arm["rollout"]  # its wait for the baseline is the loop's (above)
    assert arm["teacher-replay"]["inputs"]["artifacts"]["trajectories"]["taskOutputArtifact"] == {
        "outputArtifactKey": "trajectories", "producerTask": "rollout"}
    assert arm["gated-train"]["inputs"]["artifacts"]["pairs"]["taskOutputArtifact"] == {
        "outputArtifactKey": "pairs", "producerTask": "teacher-replay"}
    assert arm["teacher-replay"]["inputs"]["parameters"]["teacher_pool"]["componentInputParameter"] == \
        "pipelinechannel--teacher_pool"
    ev = arm["evaluate-2"]["inputs"]
    assert ev["artifacts"]["checkpoint"]["taskOutputArtifact"] == {"outputArtifactKey": "checkpoint", "producerTask": "gated-train"}
    assert ev["parameters"]["run_id"]["taskOutputParameter"] == {"outputParameterKey": "run_id", "producerTask": "gated-train"}
    # compare collects every arm's evaluation and history from the loop
    cmp_art = body["compare"]["inputs"]["artifacts"]
    assert cmp_art["evaluations"]["taskOutputArtifact"]["producerTask"] == "for-loop-2"
    assert cmp_art["histories"]["taskOutputArtifact"]["producerTask"] == "for-loop-2"
    assert cmp_art["baseline"]["taskOutputArtifact"] == {"outputArtifactKey": "result", "producerTask": "evaluate"}
    params = spec["root"]["inputDefinitions"]["parameters"]
    for name in ("family", "model", "arms", "steps", "group_size", "tasks_per_step", "seeds", "eval_tasks", "config_path",
                 "teacher_pool", "replay_episodes"):
        assert name in params, name
    assert params["arms"]["defaultValue"] == ["grpo", "grpo_opsd", "sdar"]


def test_replay_rounds_unroll_rollout_replay_and_training(tmp_path):
    spec, _ = _compile(tmp_path, "local", replay_rounds=2)
    _, body = _body(spec)
    arm = spec["components"][body["for-loop-2"]["componentRef"]["name"]]["dag"]["tasks"]
    assert set(arm) == {"rollout", "teacher-replay", "gated-train", "rollout-2", "teacher-replay-2", "gated-train-2",
                        "evaluate-2"}
    art = lambda task, name: arm[task]["inputs"]["artifacts"][name]["taskOutputArtifact"]  # noqa: E731
    # round 2 plays, replays and trains from round 1's policy; the final evaluation takes round 2's
    for task in ("rollout-2", "teacher-replay-2"):
        assert art(task, "checkpoint") == {"outputArtifactKey": "checkpoint", "producerTask": "gated-train"}
    assert art("gated-train-2", "pairs")["producerTask"] == "teacher-replay-2"
    assert art("evaluate-2", "checkpoint")["producerTask"] == "gated-train-2"
    rounds = {t: arm[t]["inputs"]["parameters"]["replay_round"]["runtimeValue"]["constant"]
              for t in ("gated-train", "gated-train-2")}
    assert rounds == {"gated-train": 0, "gated-train-2": 1}
    with pytest.raises(ValueError, match="replay_rounds must be >= 1"):
        build_pipeline("local", replay_rounds=0)


def test_cluster_target_adds_gpu_scheduling_and_secrets(cluster):
    spec, platform = cluster
    res = spec["deploymentSpec"]["executors"]["exec-gated-train"]["container"]["resources"]
    assert res["accelerator"]["resourceType"] == "nvidia.com/gpu" and res["accelerator"]["resourceCount"] == "1"
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    train = k8s["exec-gated-train"]
    assert train["nodeSelector"]["labels"] == {"eks.amazonaws.com/nodegroup": "gpu"}
    assert train["tolerations"] == [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]
    # each step gets the Secrets it reads and no other: MLflow where it logs, S3 where checkpoints go
    mlflow, s3 = {"MLFLOW_TRACKING_URI"}, {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "SDAR_S3_ENDPOINT_URL"}
    # and the teacher pool's API keys where the pool is called (optional: a local pool needs none)
    teach = {"OPENAI_API_KEY"}
    want = {"exec-gated-train": {"sdar-mlflow": mlflow, "sdar-s3": s3, "sdar-teachers": teach}, "exec-run-matrix": {},
            "exec-rollout": {}, "exec-teacher-replay": {"sdar-teachers": teach}}
    for ex in k8s:
        secrets = {s["secretName"]: {e["envVar"] for e in s["keyToEnv"]} for s in k8s[ex].get("secretAsEnv", [])}
        assert secrets == want.get(ex, {"sdar-mlflow": mlflow}), ex
        for s in k8s[ex].get("secretAsEnv", []):
            assert s.get("optional", False) == (s["secretName"] == "sdar-teachers"), ex
    # no GPU on the other steps, and secrets never appear as pipeline parameters
    for ex, body in spec["deploymentSpec"]["executors"].items():
        if ex != "exec-gated-train":
            assert "accelerator" not in body["container"].get("resources", {}), ex
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert not [p for p in params if "secret" in p or "password" in p or "key" in p.lower()]


@pytest.mark.slow
def test_cluster_target_deploys_the_env_server_image_into_the_sdar_namespace(cluster, local, tmp_path, monkeypatch):
    spec, _ = cluster
    # the image `make images` tags beside the trainer, not a hard-coded one
    assert _launch_input(spec, "env_image") == "ghcr.io/sdar/sdar-env-server:0.1.0"
    # env services go where k8s/ grants the Role and NetworkPolicies; a run can still say "" (own namespace)
    assert spec["root"]["inputDefinitions"]["parameters"]["namespace"]["defaultValue"] == "sdar"
    _, body = _body(spec)
    for task in ("launch-envs", "teardown-envs"):
        inputs = (body.get(task) or spec["root"]["dag"]["tasks"][task])["inputs"]["parameters"]
        # the pipeline's parameter (inside the exit handler as its pipelinechannel)
        assert inputs["namespace"]["componentInputParameter"] in ("namespace", "pipelinechannel--namespace"), task
    # --image REGISTRY/sdar-trainer:TAG: the env server from the same registry and tag
    custom, _ = _compile(tmp_path, "cluster", image="123.dkr.ecr.example/team/sdar-trainer:7")
    assert _launch_input(custom, "env_image") == "123.dkr.ecr.example/team/sdar-env-server:7"
    monkeypatch.setenv("SDAR_ENV_IMAGE", "reg.example/envs:3")  # named outright, it wins
    assert _launch_input(_compile(tmp_path, "cluster")[0], "env_image") == "reg.example/envs:3"
    own, _ = _compile(tmp_path, "cluster", cluster=ClusterSettings(env_image="reg.example/e:1", env_namespace=""))
    assert _launch_input(own, "env_image") == "reg.example/e:1"
    assert own["root"]["inputDefinitions"]["parameters"]["namespace"]["defaultValue"] == ""
    # locally the env server is a process: no image, no namespace
    local_spec, _ = local
    assert _launch_input(local_spec, "env_image") is None
    assert local_spec["root"]["inputDefinitions"]["parameters"]["namespace"]["defaultValue"] == ""


def _quantity(q: str) -> float:
    """A Kubernetes quantity (CPU or memory) as a number."""
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix in sorted(units, key=len, reverse=True):
        if q.endswith(suffix):
            return float(q[: -len(suffix)]) * units[suffix]
    return float(q)


def _images_user() -> int:
    """The uid both images run as (their last USER)."""
    from tests.deploy.conftest import REPO
    from tests.deploy.test_env_server_image import parse_dockerfile

    uids = set()
    for image in ("trainer", "env-server"):
        _, stages = parse_dockerfile((REPO / "images" / image / "Dockerfile").read_text())
        uids.add(int(stages[-1].all("USER")[-1].split(":")[0]))
    (uid,) = uids
    return uid


@pytest.mark.parametrize("settings", [ClusterSettings(), ClusterSettings(gpus=0, train_cpu="2", train_memory="4G"),
                                      ClusterSettings(eval_on_gpu=True)], ids=["default", "no-gpu", "eval-on-gpu"])
def test_every_cluster_step_runs_as_the_images_user_with_requests_and_limits(tmp_path, settings):
    spec, platform = _compile(tmp_path, "cluster", cluster=settings)
    uid = _images_user()
    assert uid == settings.run_as_user == settings.run_as_group == 10001
    executors = spec["deploymentSpec"]["executors"]
    assert len(executors) == 9  # 7 steps + the rollout and teacher replay of each arm's round
    for ex in executors:
        container, k8s = _executor(spec, platform, ex)
        # kfp-kubernetes sets the user; KFP's backend adds allowPrivilegeEscalation false, drop ALL
        # and seccomp RuntimeDefault to every executor container (the IR has no field for them)
        sc = k8s["securityContext"]
        assert sc["runAsNonRoot"] is True, ex
        assert int(sc["runAsUser"]) == int(sc["runAsGroup"]) == uid, ex
        res = container["resources"]
        for kind in ("Cpu", "Memory"):
            request, limit = res[f"resource{kind}Request"], res[f"resource{kind}Limit"]
            assert 0 < _quantity(request) <= _quantity(limit), (ex, kind)
    res = lambda ex: _executor(spec, platform, ex)[0]["resources"]  # noqa: E731
    assert res("exec-gated-train")["resourceMemoryLimit"] == settings.train_memory
    evaluation = settings.train_cpu if settings.eval_on_gpu else settings.eval_cpu
    assert res("exec-evaluate")["resourceCpuLimit"] == res("exec-evaluate-2")["resourceCpuLimit"] == evaluation
    for sized in ("exec-rollout", "exec-teacher-replay"):  # a policy forward each: evaluation-sized pods
        assert res(sized)["resourceCpuLimit"] == settings.eval_cpu, sized
    for light in ("exec-run-matrix", "exec-launch-envs", "exec-compare", "exec-teardown-envs"):
        assert res(light)["resourceCpuLimit"] == settings.step_cpu, light
        assert res(light)["resourceMemoryLimit"] == settings.step_memory, light



def test_the_security_context_can_be_left_out_for_older_kfp_backends(tmp_path):
    # KFP backends before 2.16 reject the platform spec's securityContext: the rest stays
    spec, platform = _compile(tmp_path, "cluster", cluster=ClusterSettings(security_context=False))
    for ex in spec["deploymentSpec"]["executors"]:
        container, k8s = _executor(spec, platform, ex)
        assert "securityContext" not in k8s, ex
        assert k8s["podMetadata"]["labels"] == {"app.kubernetes.io/part-of": "sdar-pipeline"}, ex
        assert container["resources"]["resourceMemoryLimit"], ex


def test_the_secret_lists_match_what_the_components_read():
    # MLflow: every component that logs (a `tracking` switch); S3: the one that puts checkpoints
    # there (checkpoint_root) and launches the TorchX jobs that do
    import inspect

    import components
    from sdar.pipeline.settings import MLFLOW_STEPS, S3_STEPS

    used = [comp.python_func.__name__ for comp in components.ALL]
    assert set(MLFLOW_STEPS) | set(S3_STEPS) <= set(used)
    for comp in components.ALL:
        name, params = comp.python_func.__name__, inspect.signature(comp.python_func).parameters
        if name in ("rollout", "teacher_replay"):
            continue  # they log nothing to MLflow (gated_train logs the replay's accounting) and read no S3
        assert ("tracking" in params) == (name in MLFLOW_STEPS), name
        assert ("checkpoint_root" in params) == (name in S3_STEPS), name


def test_a_gpu_free_cluster_build_asks_for_no_gpu_node(tmp_path):
    spec, platform = _compile(tmp_path, "cluster", cluster=ClusterSettings(gpus=0, train_cpu="2", train_memory="4G",
                                                                           eval_on_gpu=True))
    for ex in spec["deploymentSpec"]["executors"]:
        container, k8s = _executor(spec, platform, ex)
        assert "accelerator" not in container.get("resources", {}), ex
        assert "nodeSelector" not in k8s and "tolerations" not in k8s, ex
        # still a pipeline pod: labels for the NetworkPolicies, and the Secrets
        assert k8s["podMetadata"]["labels"] == {"app.kubernetes.io/part-of": "sdar-pipeline"}, ex
    container, k8s = _executor(spec, platform, "exec-gated-train")
    res = container["resources"]
    assert (res["resourceCpuRequest"], res["resourceCpuLimit"]) == ("2", "2")
    assert (res["resourceMemoryRequest"], res["resourceMemoryLimit"]) == ("4G", "4G")
    assert {s["secretName"] for s in k8s["secretAsEnv"]} == {"sdar-mlflow", "sdar-s3", "sdar-teachers"}
    with pytest.raises(ValueError, match="gpus must be >= 0"):
        build_pipeline("cluster", cluster=ClusterSettings(gpus=-1))


def test_torchx_jobs_of_the_training_step_run_the_pipelines_image(tmp_path, monkeypatch):
    # multi-GPU training as a TorchX job: the step only launches and waits (--gpus 0), the job asks
    # for the GPUs (launch.gpus_per_node in the run's overrides)
    from sdar.config import load_config
    from sdar.launch.torchx_job import dryrun

    image = "123.dkr.ecr.example/team/sdar-trainer:7"
    spec, platform = _compile(tmp_path, "cluster", image=image, cluster=ClusterSettings(gpus=0))
    container, k8s = _executor(spec, platform, "exec-gated-train")
    assert container["image"] == image
    assert {e["name"]: e["value"] for e in container["env"]}["SDAR_IMAGE"] == image
    assert "accelerator" not in container["resources"] and "nodeSelector" not in k8s
    # the step's environment is what sdar.launch.torchx_job reads: the job's pods get the same image and the GPUs
    for e in container["env"]:
        monkeypatch.setenv(e["name"], e["value"])
    overrides = {"launch.nodes": 2, "launch.gpus_per_node": 4, "checkpoint.uri": "s3://b/ckpt"}
    job = dryrun(load_config("configs/household-tiny.yaml", overrides), "configs/household-tiny.yaml", overrides,
                 validate_spec=False).request.resource
    for task in job["spec"]["tasks"]:
        pod = task["template"]
        assert pod.spec.containers[0].image == image
        assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "4"
        assert pod.spec.node_selector == ClusterSettings().node_selector
    # the default build passes its own image the same way
    default_container, _ = _executor(_compile(tmp_path, "cluster")[0], {}, "exec-gated-train")
    assert {"name": "SDAR_IMAGE", "value": "ghcr.io/sdar/sdar-trainer:0.1.0"} in default_container["env"]


def test_every_task_writes_its_output_unbuffered(cluster, local):
    # a pipe block-buffers Python's stdout: without this a task's progress reaches the KFP log when the task ends
    for spec, _ in (cluster, local):
        for ex, body in spec["deploymentSpec"]["executors"].items():
            assert {"name": "PYTHONUNBUFFERED", "value": "1"} in body["container"].get("env", []), ex


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


@pytest.mark.slow
def test_cli_compile_writes_the_yaml(tmp_path, capsys):
    from sdar.cli import main

    out = tmp_path / "p.yaml"
    assert main(["compile", "--out", str(out), "--target", "local"]) == 0
    spec = yaml.safe_load_all(out.read_text()).__next__()
    assert spec["pipelineInfo"]["name"] == "sdar-comparison"
    assert f"wrote {out}" in capsys.readouterr().out
    # kind/minikube: no GPU, small requests
    assert main(["compile", "--out", str(out), "--gpus", "0", "--train-cpu", "2", "--train-memory", "4G",
                 "--image", "localhost:5001/sdar-trainer:dev"]) == 0
    assert "0 GPU(s) per training pod" in capsys.readouterr().out
    spec, platform = list(yaml.safe_load_all(out.read_text()))
    container, k8s = _executor(spec, platform, "exec-gated-train")
    assert "accelerator" not in container["resources"] and container["resources"]["resourceCpuRequest"] == "2"
    assert "nodeSelector" not in k8s and "tolerations" not in k8s
    assert _launch_input(spec, "env_image") == "localhost:5001/sdar-env-server:dev"
    assert main(["compile", "--out", str(out), "--gpus", "8", "--env-image", "reg.example/e:2",
                 "--env-namespace", ""]) == 0
    spec, platform = list(yaml.safe_load_all(out.read_text()))
    container, k8s = _executor(spec, platform, "exec-gated-train")
    assert container["resources"]["accelerator"]["resourceCount"] == "8"
    assert k8s["nodeSelector"]["labels"] == {"eks.amazonaws.com/nodegroup": "gpu"}
    assert _launch_input(spec, "env_image") == "reg.example/e:2"
    assert spec["root"]["inputDefinitions"]["parameters"]["namespace"]["defaultValue"] == ""
    with pytest.raises(SystemExit, match="--gpus must be >= 0"):
        main(["compile", "--out", str(out), "--gpus", "-1"])
    with pytest.raises(SystemExit, match="needs --local"):
        main(["run", "--quick"])
