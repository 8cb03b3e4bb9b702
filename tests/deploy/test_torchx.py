"""The TorchX training job (src/sdar/launch.py): `torchx run --dryrun -s kubernetes` renders the
Volcano Job a cluster would get (no cluster, no Docker: --workspace "" skips the image build and
validate_spec=False the API server's dry run); the job rebuilds exactly the launching config; and
gated_train really launches it with the local_cwd scheduler (torchrun, 2 CPU workers)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import REPO

CONFIG = "configs/household-tiny.yaml"


def _torchx_dryrun(*component_args: str) -> dict:
    torchx = Path(sys.executable).parent / "torchx"
    cmd = [str(torchx), "run", "--workspace", "", "--dryrun", "-s", "kubernetes",
           "-cfg", "queue=default,validate_spec=False", "src/sdar/launch.py:trainer", *component_args]
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


def test_the_job_rebuilds_the_launching_config_and_uses_the_pipelines_secrets():
    from pipelines.sdar_comparison import ClusterSettings
    from sdar.cli import build_parser
    from sdar.config import load_config
    from sdar.launch import dryrun, scheduler_cfg
    from sdar.train.cli import _overrides

    overrides = {"arm": "grpo_opsd", "seed": 3, "steps": 40, "rollout.max_turns": 8, "env.url": "http://envs:8000",
                 "model.tiny_overrides": {"hidden_size": 64}, "checkpoint_uri": "s3://bucket/run/grpo_opsd-seed3",
                 "launch.nodes": 2, "launch.gpus_per_node": 8, "launch.namespace": "rl", "launch.queue": "gpu",
                 "launch.image": "reg.example/sdar-trainer:9"}
    cfg = load_config(CONFIG, overrides)
    assert cfg.launch.wants_torchx()
    job = dryrun(cfg, CONFIG, overrides, validate_spec=False).request.resource
    assert job["spec"]["queue"] == "gpu" and len(job["spec"]["tasks"]) == 2
    assert scheduler_cfg(cfg) == {"queue": "gpu", "namespace": "rl"}
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
    assert LaunchConfig(gpus_per_node=2).wants_torchx() and LaunchConfig(nodes=2, gpus_per_node=1).wants_torchx()
    assert LaunchConfig(launcher="torchx").wants_torchx()
    assert not LaunchConfig(launcher="inprocess", nodes=2, gpus_per_node=8).wants_torchx()
    with pytest.raises(ValueError, match="unknown launcher 'torch'; choose one of auto, inprocess, torchx"):
        LaunchConfig(launcher="torch").wants_torchx()


def test_credentials_are_not_parameters_and_cluster_jobs_need_s3():
    from sdar.config import load_config
    from sdar.launch import launch_training, trainer

    with pytest.raises(ValueError, match="MLFLOW_TRACKING_URI must not be parameters"):
        trainer("--config", CONFIG, env={"MLFLOW_TRACKING_URI": "http://mlflow:5000"})
    with pytest.raises(ValueError, match="one worker per GPU"):
        trainer("--config", CONFIG, nproc_per_node=4, gpu=2)
    cfg = load_config(CONFIG, {"launch.launcher": "torchx"})
    with pytest.raises(ValueError, match="checkpoint_uri to an s3:// URI"):
        launch_training(cfg, CONFIG, {})


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
    out = gated_train.python_func(arm="sdar", seed=0, config_path=CONFIG, overrides=json.dumps(overrides),
                                  job_id="job1", checkpoint=ckpt, history=hist, steps=1, tracking=False,
                                  output_root=str(tmp_path / "runs"))
    assert (Path(ckpt.path) / "adapter_model.safetensors").is_file()
    history = json.loads(Path(hist.path).read_text())
    assert history["steps"] == 1 and [h["step"] for h in history["history"]] == [0]
    # the job really ran under torchrun with two workers: rank 0 printed the summary with world_size 2
    logs = list((tmp_path / "runs" / "job1" / "sdar-seed0" / "torchx-logs").rglob("stdout.log"))
    summaries = [json.loads(line.split(":", 1)[1] if line.startswith("[") else line)
                 for log in logs for line in log.read_text().splitlines() if '"world_size"' in line]
    assert summaries and {s["world_size"] for s in summaries} == {2}
    assert out.final_dir == ckpt.path
