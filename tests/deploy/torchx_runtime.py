"""What TorchX's kubernetes scheduler and Volcano make of an AppDef (sdar.launch.torchx_job.trainer's): the Volcano
Job, and the exact command and environment each replica's container runs (`replica_command`, which tests run under
torchrun here).

* TorchX (torchx/schedulers/kubernetes_scheduler.py `app_to_resource`, the installed torchx): one Volcano task per
  replica, named <role>-<replica>, whose pod runs `bash -c "torchrun ..."` with the macros substituted for that
  replica: ${app_id} (the job's unique name), ${replica_id}, and ${rank0_env} (TORCHX_RANK0_HOST=localhost on replica
  0, else the Volcano variable VC_<ROLE>_0_HOSTS); dist.torchrun's rendezvous endpoint is ${rank0_env}:rdzv_port.
* Volcano (github.com/volcano-sh/volcano pkg/controllers/job/plugins): the job's `env` plugin gives every container
  VK_TASK_INDEX and VC_TASK_INDEX (the pod's index in its task: 0, one pod per task), its `svc` plugin
  VC_<TASK>_HOSTS (<job>-<task>-<i>.<job>, the pods' names under the job's headless Service) and VC_<TASK>_NUM for
  every task, the task's name upper-cased with '-' as '_'.
"""

from __future__ import annotations

import json
from typing import Any

TASK_INDEX_VARS = ("VK_TASK_INDEX", "VC_TASK_INDEX")  # Volcano's env plugin (plugins/env/const.go)


def volcano_job(app, *, queue: str = "default", service_account: str | None = None,
                app_id: str | None = None) -> dict[str, Any]:
    """The Volcano Job TorchX's kubernetes scheduler submits for `app` (its app_to_resource, overlays applied), as
    the API server gets it (JSON). `app_id` replaces the unique name TorchX draws (the --rdzv_id of every replica,
    the job's name), so that replicas built in separate calls agree; default: the app's name."""
    from kubernetes.client import ApiClient
    from torchx.schedulers.kubernetes_scheduler import app_to_resource
    from torchx.util.strings import normalize_str

    resource = ApiClient().sanitize_for_serialization(app_to_resource(app, queue, service_account))
    drawn = resource["metadata"]["name"]
    return json.loads(json.dumps(resource).replace(drawn, app_id or normalize_str(app.name)))


def _task_env_key(task: str) -> str:
    return task.replace("-", "_").upper()


def replica_command(app, replica_id: int, *, rank0_host: str | None = None, app_id: str | None = None,
                    ) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of replica `replica_id`'s container in the Volcano Job of `app`: its command (`bash -c "torchrun
    ..."`, the macros substituted) and every env entry with a value (TorchX's: TORCHX_RANK0_HOST on replica 0,
    TORCHX_IMAGE, LOGLEVEL...; the role's), plus what Volcano's env and svc plugins add. Secrets (envFrom,
    secretKeyRef) are left out: their values are the cluster's. `rank0_host` replaces replica 0's address in
    Volcano's VC_<TASK0>_HOSTS (its DNS name under the job's Service) to run the replicas on one machine."""
    job = volcano_job(app, app_id=app_id)
    tasks = job["spec"]["tasks"]
    if not 0 <= replica_id < len(tasks):
        raise ValueError(f"replica_id {replica_id} is not one of the app's {len(tasks)} replicas")
    name = job["metadata"]["name"]
    (container,) = tasks[replica_id]["template"]["spec"]["containers"]
    env = {e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e}
    unresolved = [e["name"] for e in container.get("env") or [] if "value" not in e
                  and "secretKeyRef" not in (e.get("valueFrom") or {})]
    if unresolved:
        raise ValueError(f"env {', '.join(unresolved)} come from the pod's fields, which are not resolved here")
    env.update({var: "0" for var in TASK_INDEX_VARS})
    for i, task in enumerate(tasks):
        hosts = f"{name}-{task['name']}-0.{name}"
        if i == 0 and rank0_host is not None:
            hosts = rank0_host
        env[f"VC_{_task_env_key(task['name'])}_HOSTS"] = hosts
        env[f"VC_{_task_env_key(task['name'])}_NUM"] = "1"
    return [*container["command"], *(container.get("args") or [])], env
