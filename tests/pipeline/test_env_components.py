"""launch_envs / teardown_envs / run_matrix called directly: a real env server on loopback started
and stopped, the MLflow parent run opened and closed, and the cluster manifests (no API server here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kfp import dsl
from kfp.dsl import Artifact

from components.launch_envs import launch_envs
from components.run_matrix import run_matrix
from components.teardown_envs import teardown_envs
from sdar_envs.client import RemoteEnv, http_json

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "household-tiny.yaml")


def _status(state: str) -> dsl.PipelineTaskFinalStatus:
    return dsl.PipelineTaskFinalStatus(state=state, pipeline_job_resource_name="jobs/test", pipeline_task_name="comparison",
                                       error_code=None if state == "SUCCEEDED" else 1,
                                       error_message=None if state == "SUCCEEDED" else "Task comparison failed.")


def _alive(pid: int) -> bool:
    try:
        return b"sdar_envs.server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.parametrize("final_state, mlflow_status", [("SUCCEEDED", "FINISHED"), ("FAILED", "FAILED")])
def test_launch_serves_on_loopback_and_teardown_stops_it(tmp_path, mlflow_uri, final_state, mlflow_status):
    from mlflow.tracking import MlflowClient

    job = f"job-{final_state.lower()}"
    endpoints = Artifact(name="endpoints", uri=str(tmp_path / "endpoints.json"))
    out = launch_envs.python_func(config_path=CONFIG, overrides="{}", job_id=job, endpoints=endpoints,
                                  output_root=str(tmp_path), experiment="envs-test", tracking_uri=mlflow_uri,
                                  run_name="pipeline-run", startup_timeout_s=120)
    info = json.loads(Path(endpoints.path).read_text())
    pid = info["pids"][0]
    try:
        assert out.url == info["url"] and out.url.startswith("http://127.0.0.1:")
        assert info["family"] == "household" and info["target"] == "local"
        assert http_json("GET", f"{out.url}/health")["status"] == "healthy"
        # a real episode through the server, with the config's env kwargs (the sim backend)
        with RemoteEnv(out.url, family="household") as env:
            first = env.reset(task_id=env.task_ids("test")[0])
            assert first.metadata["task_type"] and first.metadata["admissible_actions"]
        assert _alive(pid)
        registry = tmp_path / "envs" / f"{job}.json"
        assert json.loads(registry.read_text())["pids"] == [pid]
        client = MlflowClient(tracking_uri=mlflow_uri)
        parent = client.get_run(out.parent_run_id)
        assert parent.info.status == "RUNNING" and parent.info.run_name == "pipeline-run"
        assert parent.data.tags["sdar.pipeline_job_id"] == job

        summary = teardown_envs.python_func(job_id=job, status=_status(final_state), output_root=str(tmp_path),
                                            experiment="envs-test", tracking_uri=mlflow_uri)
        assert f"stopped household server pid {pid}" in summary
        assert not _alive(pid)
        assert not registry.exists() and registry.with_suffix(".stopped.json").exists()
        parent = client.get_run(out.parent_run_id)
        assert parent.info.status == mlflow_status
        assert parent.data.tags["sdar.pipeline_state"] == final_state
        # a second teardown (a retried exit task) finds nothing to do and does not fail
        again = teardown_envs.python_func(job_id=job, status=_status(final_state), output_root=str(tmp_path),
                                          tracking=False)
        assert again == f"no local env servers registered for job {job}"
    finally:
        if _alive(pid):
            os.kill(pid, 9)


def test_teardown_never_signals_a_recycled_pid(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "envs").mkdir()
        (tmp_path / "envs" / "j.json").write_text(json.dumps({"family": "household", "pids": [other.pid], "url": "x"}))
        summary = teardown_envs.python_func(job_id="j", status=_status("SUCCEEDED"), output_root=str(tmp_path),
                                            tracking=False)
        assert summary == f"pid {other.pid} is no longer an env server; left alone"
        time.sleep(0.2)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_launch_for_a_cluster_builds_a_deployment_and_service(tmp_path):
    endpoints = Artifact(name="endpoints", uri=str(tmp_path / "endpoints.json"))
    job = "5f1c2a9e-0b7d-4e1a-9c3f-AB12cd34ef56"
    out = launch_envs.python_func(config_path=CONFIG, overrides="{}", job_id=job, endpoints=endpoints, target="cluster",
                                  namespace="team-a", env_image="registry.example/sdar-env-server:9", replicas=2,
                                  tracking=False, dry_run=True)
    info = json.loads(Path(endpoints.path).read_text())
    deployment, service = info["manifests"]
    name = deployment["metadata"]["name"]
    assert name == "sdar-env-household-5f1c2a9e-0b7d-4e1a-9c3f-ab12cd34ef56"
    assert len(name) <= 63 and name == name.lower()
    assert out.url == f"http://{name}.team-a.svc.cluster.local:8000"
    assert deployment["metadata"]["namespace"] == service["metadata"]["namespace"] == "team-a"
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    pod_labels = spec["template"]["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in spec["selector"]["matchLabels"].items())
    assert all(pod_labels[k] == v for k, v in service["spec"]["selector"].items())
    assert pod_labels["sdar.io/pipeline-job"] == job  # teardown deletes by this label
    container = spec["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/sdar-env-server:9"
    args = container["args"]
    assert args[:4] == ["envs", "serve", "--env", "household"]
    assert json.loads(args[args.index("--env-kwargs") + 1])["backend"] == "sim"  # the config's env kwargs
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert service["spec"]["ports"][0]["port"] == 8000 and service["spec"]["ports"][0]["targetPort"] == "http"
    summary = teardown_envs.python_func(job_id=job, status=_status("FAILED"), target="cluster", namespace="team-a",
                                        tracking=False, dry_run=True, trainjob_namespace="kubeflow")
    assert summary == (f"would delete deployments and services with sdar.io/pipeline-job={job} in team-a; "
                       f"would delete TrainJobs and Volcano Jobs with sdar.io/pipeline-job={job} in kubeflow")


def test_run_matrix_expands_arms_by_seeds_and_rejects_bad_settings():
    runs = run_matrix.python_func(arms=["grpo", "sdar"], seeds=[0, 3], config_path=CONFIG, overrides="{}")
    assert runs == [{"arm": "grpo", "seed": 0}, {"arm": "grpo", "seed": 3}, {"arm": "sdar", "seed": 0},
                    {"arm": "sdar", "seed": 3}]
    with pytest.raises(ValueError, match="unknown arm 'sdarr'; choose one of"):
        run_matrix.python_func(arms=["sdarr"], seeds=[0], config_path=CONFIG, overrides="{}")
    with pytest.raises(ValueError, match="arm 'sdar' is listed twice"):
        run_matrix.python_func(arms=["sdar", "sdar"], seeds=[0], config_path=CONFIG, overrides="{}")
    with pytest.raises(ValueError, match="family 'shop' differs from env.family 'household'"):
        run_matrix.python_func(arms=["sdar"], seeds=[0], config_path=CONFIG, overrides="{}", family="shop")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['stepz'\]"):
        run_matrix.python_func(arms=["sdar"], seeds=[0], config_path=CONFIG, overrides='{"stepz": 3}')
    with pytest.raises(ValueError, match="overrides must be a JSON object of dotted config keys"):
        run_matrix.python_func(arms=["sdar"], seeds=[0], config_path=CONFIG, overrides='["steps", 3]')


def test_teacher_replay_names_a_missing_pool_file(tmp_path):
    from kfp.dsl import Dataset, Metrics

    from components.teacher_replay import teacher_replay

    with pytest.raises(FileNotFoundError, match="teacher pool file .*nope.yaml not found"):
        teacher_replay.python_func(trajectories=Dataset(uri=str(tmp_path / "t.jsonl")), config_path=CONFIG,
                                   overrides="{}", scores=Dataset(uri=str(tmp_path / "s.json")),
                                   pairs=Dataset(uri=str(tmp_path / "p.jsonl")), metrics=Metrics(uri=str(tmp_path / "m")),
                                   teacher_pool=str(tmp_path / "nope.yaml"))

def test_kfp_mlflow_integration_owns_the_pipeline_run(tmp_path, mlflow_uri, monkeypatch):
    """With KFP's MLflow integration on (KFP 2.16+ sets MLFLOW_RUN_ID, the task's nested run under the pipeline run,
    and MLFLOW_TRACKING_URI on each task), launch_envs opens no second parent run: the arm runs nest under KFP's
    pipeline run in KFP's experiment, and teardown tags that run but leaves ending it to KFP. SDAR_KFP_MLFLOW=off
    brings back sdar's own parent run."""
    from mlflow.tracking import MlflowClient

    from sdar.pipeline.mlflow_runs import OWNER_TAG, close_pipeline_runs
    from sdar.tracking import PARENT_TAG, Tracker

    client = MlflowClient(tracking_uri=mlflow_uri)
    kfp_exp = client.create_experiment("kfp-pipeline-runs")
    root = client.create_run(kfp_exp, run_name="comparison-run").info.run_id  # what KFP's integration opens
    task = client.create_run(kfp_exp, run_name="launch-envs", tags={PARENT_TAG: root}).info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", task)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)

    def launch(job: str):
        endpoints = Artifact(name="endpoints", uri=str(tmp_path / f"{job}.json"))
        out = launch_envs.python_func(config_path=CONFIG, overrides="{}", job_id=job, endpoints=endpoints, target="cluster",
                                      namespace="team-a", experiment="envs-test", tracking_uri=mlflow_uri, dry_run=True)
        return out, json.loads(Path(endpoints.path).read_text())

    out, info = launch("job-kfp")
    assert out.parent_run_id == info["parent_run_id"] == root
    assert info["experiment"] == "kfp-pipeline-runs"
    assert client.get_experiment_by_name("envs-test") is None  # no parent run of our own
    tags = client.get_run(root).data.tags
    assert tags["sdar.pipeline_job_id"] == "job-kfp" and tags[OWNER_TAG] == "kfp"
    assert client.get_run(root).data.params["sdar.config_path"] == CONFIG
    # an arm run, as train_arm opens it (the parent's experiment, nested under it)
    with Tracker(info["experiment"], run_name="sdar-seed0", parent_run_id=info["parent_run_id"], tracking_uri=mlflow_uri) as arm:
        arm.log_metrics({"reward": 1.0}, step=0)
    assert client.get_run(arm.run_id).data.tags[PARENT_TAG] == root
    summary = close_pipeline_runs("envs-test", "job-kfp", "FAILED", tracking_uri=mlflow_uri)  # teardown_envs' call
    assert summary == [f"MLflow pipeline run {root} (KFP's) tagged FAILED"]
    run = client.get_run(root)
    assert run.info.status == "RUNNING" and run.data.tags["sdar.pipeline_state"] == "FAILED"  # KFP ends it

    monkeypatch.setenv("SDAR_KFP_MLFLOW", "off")
    out, info = launch("job-own")
    assert out.parent_run_id != root and info["experiment"] == "envs-test"
    assert client.get_run(out.parent_run_id).data.tags["sdar.pipeline_job_id"] == "job-own"
    monkeypatch.setenv("SDAR_KFP_MLFLOW", "on")
    monkeypatch.delenv("MLFLOW_RUN_ID")
    with pytest.raises(RuntimeError, match="SDAR_KFP_MLFLOW=on, but MLFLOW_RUN_ID"):
        launch("job-missing")
