"""KFP component teardown_envs: the pipeline's exit handler. Stops the environment service of this
pipeline run (local processes or the Deployment + Service) and ends the MLflow parent run with the
pipeline's final state; it runs whether the body succeeded or failed."""

from kfp import dsl

from components._image import COMPONENT_OPTIONS, base_image


@dsl.component(base_image=base_image(), **COMPONENT_OPTIONS)
def teardown_envs(
    job_id: str,
    status: dsl.PipelineTaskFinalStatus,
    target: str = "local",
    output_root: str = "runs/kfp",
    namespace: str = "",
    experiment: str = "sdar-comparison",
    tracking: bool = True,
    tracking_uri: str = "",
    stop_timeout_s: float = 20.0,
    dry_run: bool = False,
) -> str:
    """Find what launch_envs started for `job_id` and stop it; returns a one-line summary.

    local: the pids in <output_root>/envs/<job_id>.json, each checked to still be an sdar env
    server (a recycled pid is never signalled), SIGTERM then SIGKILL after stop_timeout_s.
    cluster: every Deployment and Service labelled sdar.io/pipeline-job=<job_id> in `namespace`
    (found by label, so a launch that died half-way is cleaned up too). dry_run: only report.
    MLflow: the parent run tagged with this job id ends FINISHED if the pipeline succeeded, else FAILED.
    Nothing found is not an error (launch_envs may have failed before starting anything).
    """
    import json
    import os
    import re
    import signal
    import time
    from pathlib import Path

    state = (status.state or "").upper() if status is not None else "UNKNOWN"
    print(f"pipeline job {job_id} ended {state or 'UNKNOWN'}"
          + (f": {status.error_message}" if status is not None and status.error_message else ""))
    done: list[str] = []

    if target == "local":
        registry = Path(output_root) / "envs" / f"{job_id}.json"
        if registry.is_file():
            info = json.loads(registry.read_text())
            for pid in info.get("pids", []):
                cmdline = Path(f"/proc/{pid}/cmdline")
                try:
                    argv = cmdline.read_bytes().split(b"\0")
                except OSError:
                    done.append(f"pid {pid} already gone")
                    continue
                if b"sdar_envs.server" not in argv:
                    done.append(f"pid {pid} is no longer an env server; left alone")
                    continue
                if dry_run:
                    done.append(f"would stop pid {pid}")
                    continue
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + stop_timeout_s
                while time.monotonic() < deadline:
                    try:
                        # reap it if it is our child (tests); otherwise poll until /proc forgets it
                        if os.waitpid(pid, os.WNOHANG)[0] == pid:
                            break
                    except ChildProcessError:
                        pass
                    if not cmdline.exists():
                        break
                    time.sleep(0.1)
                else:
                    os.kill(pid, signal.SIGKILL)
                done.append(f"stopped {info.get('family', 'env')} server pid {pid} ({info.get('url', '?')})")
            log = info.get("log")
            if log and not dry_run:
                Path(log).unlink(missing_ok=True)
            if not dry_run:
                registry.rename(registry.with_suffix(".stopped.json"))
        else:
            done.append(f"no local env servers registered for job {job_id}")
    elif target == "cluster":
        sa_ns = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        ns = namespace or (sa_ns.read_text().strip() if sa_ns.is_file() else "kubeflow")
        selector = f"sdar.io/pipeline-job={re.sub(r'[^A-Za-z0-9_.-]', '-', job_id)[:63]}"
        if dry_run:
            done.append(f"would delete deployments and services with {selector} in {ns}")
        else:
            from kubernetes import client as k8s
            from kubernetes import config as k8s_config

            try:
                k8s_config.load_incluster_config()
            except k8s_config.ConfigException:
                k8s_config.load_kube_config()
            apps, core = k8s.AppsV1Api(), k8s.CoreV1Api()
            for d in apps.list_namespaced_deployment(ns, label_selector=selector).items:
                apps.delete_namespaced_deployment(d.metadata.name, ns, propagation_policy="Foreground")
                done.append(f"deleted deployment {ns}/{d.metadata.name}")
            for s in core.list_namespaced_service(ns, label_selector=selector).items:
                core.delete_namespaced_service(s.metadata.name, ns)
                done.append(f"deleted service {ns}/{s.metadata.name}")
            if not done:
                done.append(f"nothing labelled {selector} in {ns}")
    else:
        raise ValueError(f"target must be 'local' or 'cluster', got {target!r}")

    if tracking and not dry_run:
        from mlflow.tracking import MlflowClient

        from sdar.tracking import default_tracking_uri, resolve_tracking_uri

        uri = resolve_tracking_uri(tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(output_root))
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        runs = [] if exp is None else client.search_runs(
            [exp.experiment_id], f"tags.`sdar.pipeline_job_id` = '{job_id}'")
        final = "FINISHED" if state == "SUCCEEDED" else "FAILED"
        for run in runs:
            if run.data.tags.get("mlflow.parentRunId"):
                continue  # arm runs end themselves
            client.set_tag(run.info.run_id, "sdar.pipeline_state", state or "UNKNOWN")
            client.set_terminated(run.info.run_id, status=final)
            done.append(f"MLflow parent run {run.info.run_id} {final}")
    summary = "; ".join(done)
    print(summary)
    return summary
