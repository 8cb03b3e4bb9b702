"""A Kubernetes API server for the launchers' and teardown's tests: real HTTP/1.1 on 127.0.0.1, speaking as much
of the API as they use, so the `kubernetes` client itself builds and sends every request and reads every answer,
the watch's chunked event stream included:
* sdar.launch.trainjob: create, get, watch, delete of trainjobs.trainer.kubeflow.org; list pods; a pod's log;
* teardown (sdar.pipeline.services): TrainJobs and Volcano Jobs listed by label and deleted; the env service's
  Deployments and Services listed by label (this fake holds none of those);
* TorchX's kubernetes scheduler (sdar.launch.torchx_job): create of jobs.batch.volcano.sh (its server-side dry run
  too), get of a job and of its status, replace of its status (cancel), delete; read a pod and its log.

Every request is recorded as (group, resource, verb, namespace), the way the API server authorises it (a
GET of a collection with watch=true is the verb `watch`), for the RBAC tests. A created TrainJob then goes
through `phases`: the i-th event of the watch sets its status to phases[i] (`on_event(i)` runs just
before; e.g. it sends this process SIGTERM while the job runs); after the last one the watch stays open,
as a real one does, until its timeoutSeconds pass or the TrainJob is deleted. A Volcano Job goes through
`volcano_phases` (Pending, Running, Completed, Terminated...): the i-th read of its status sees phases[i] (the
last one repeats; `on_event(i)` runs before), until the client writes its status (TorchX's cancel).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

TRAINJOBS = re.compile(r"/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs(?:/([^/]+))?")
VCJOBS = re.compile(r"/apis/batch\.volcano\.sh/v1alpha1/namespaces/([^/]+)/jobs(?:/([^/]+)(/status)?)?")
PODS = re.compile(r"/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)(/log)?)?")
ENV_OBJECTS = re.compile(r"/apis?/(?:(apps)/v1|v1)/namespaces/([^/]+)/(deployments|services)")
GROUP = "trainer.kubeflow.org"
VOLCANO = "batch.volcano.sh"
# a Volcano job's phase -> the phase of its tasks' pods in taskStatusCount (what TorchX's describe reads)
TASK_PHASE = {"Pending": "Pending", "Running": "Running", "Completed": "Succeeded", "Terminated": "Failed",
              "Failed": "Failed", "Aborted": "Failed"}


def condition(kind: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason or kind, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}


def jobs_status(active: int = 0, ready: int = 0, succeeded: int = 0, failed: int = 0) -> list[dict[str, Any]]:
    return [{"name": "node", "active": active, "ready": ready, "succeeded": succeeded, "failed": failed,
             "suspended": 0}]


class FakeKubeApi:
    """Start with `with FakeKubeApi(phases) as api:`; `api.url` is its address."""

    def __init__(self, phases: list[dict[str, Any]], *, on_event: Callable[[int], None] | None = None,
                 serves_trainjobs: bool = True, existing: list[str] = (), log: str = "",
                 event_delay_s: float = 0.02, volcano_phases: list[str] = (), serves_volcano: bool = True):
        self.phases, self.on_event, self.serves, self.log = phases, on_event, serves_trainjobs, log
        self.serves_volcano = serves_volcano
        self.volcano_phases, self._status_reads = list(volcano_phases), 0
        self.vcjobs: dict[tuple[str, str], dict[str, Any]] = {}  # Volcano Jobs by (namespace, name)
        self.event_delay_s = event_delay_s
        self.calls: list[tuple[str, str, str, str]] = []
        self.created: list[dict[str, Any]] = []  # the bodies of the creates, as sent
        self.deleted: list[dict[str, Any]] = []  # the bodies of the deletes (DeleteOptions)
        self.unknown: list[str] = []  # requests this fake does not serve (a test fails on any)
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self._rv, self._delivered = 100, 0
        self._changed = threading.Condition()
        self._stopping = False
        for name in existing:
            self._store("kubeflow", {"apiVersion": f"{GROUP}/v1alpha1", "kind": "TrainJob",
                                     "metadata": {"name": name, "namespace": "kubeflow"}})
        handler = type("Handler", (_Handler,), {"api": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKubeApi:
        # a short poll: shutdown() waits for the loop's next turn
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # ---- the store ---------------------------------------------------------------------------------
    def _store(self, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        with self._changed:
            self._rv += 1
            meta = obj.setdefault("metadata", {})
            meta.update({"namespace": namespace, "resourceVersion": str(self._rv),
                         "uid": meta.get("uid") or f"uid-{self._rv}",
                         "creationTimestamp": meta.get("creationTimestamp") or "2026-01-01T00:00:00Z"})
            self.objects[(namespace, meta["name"])] = obj
            self._changed.notify_all()
            return json.loads(json.dumps(obj))

    def add_trainjob(self, namespace: str, name: str, labels: dict[str, str] | None = None) -> None:
        """A TrainJob that is there already (e.g. another pipeline run's)."""
        self._store(namespace, {"apiVersion": f"{GROUP}/v1alpha1", "kind": "TrainJob",
                                "metadata": {"name": name, "labels": dict(labels or {})}})

    def add_vcjob(self, namespace: str, name: str, labels: dict[str, str] | None = None) -> None:
        """A Volcano Job (TorchX's) that is there already (e.g. another pipeline run's)."""
        self.vcjobs[(namespace, name)] = {"apiVersion": f"{VOLCANO}/v1alpha1", "kind": "Job", "status": {}, "spec": {
            "tasks": []}, "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})}}

    def _remove(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._changed:
            obj = self.objects.pop((namespace, name), None)
            self._changed.notify_all()
            return obj


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    api: FakeKubeApi

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def do_PUT(self) -> None:
        self._route("PUT")

    def _route(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null") if length else None
        m = TRAINJOBS.fullmatch(url.path)
        if m:
            return self._trainjobs(method, m.group(1), m.group(2), query, body)
        m = VCJOBS.fullmatch(url.path)
        if m:
            return self._vcjobs(method, m.group(1), m.group(2), bool(m.group(3)), query, body)
        m = PODS.fullmatch(url.path)
        if m and method == "GET":
            return self._pods(m.group(1), m.group(2), bool(m.group(3)), query)
        m = ENV_OBJECTS.fullmatch(url.path)
        if m and method == "GET":  # none here: the env service's own tests cover its objects
            self.api.calls.append((m.group(1) or "", m.group(3), "list", m.group(2)))
            kind = {"deployments": "DeploymentList", "services": "ServiceList"}[m.group(3)]
            return self._send(200, {"kind": kind, "apiVersion": "apps/v1" if m.group(1) else "v1", "metadata": {},
                                    "items": []})
        self.api.unknown.append(f"{method} {self.path}")
        self._send(404, _status(404, "NotFound", f"{self.path} is not served by this fake"))

    # ---- trainjobs ---------------------------------------------------------------------------------
    def _trainjobs(self, method: str, ns: str, name: str | None, query: dict, body: Any) -> None:
        api = self.api
        verb = {"POST": "create", "DELETE": "delete"}.get(method) or (
            "get" if name else "watch" if query.get("watch", "").lower() in ("true", "1") else "list")
        api.calls.append((GROUP, "trainjobs", verb, ns))
        if verb == "list" and api.serves:
            items = _selected(api.objects, ns, query)
            return self._send(200, {"apiVersion": f"{GROUP}/v1alpha1", "kind": "TrainJobList",
                                    "metadata": {"resourceVersion": str(api._rv)}, "items": items})
        if not api.serves:  # no Kubeflow Trainer: the API server knows no such resource
            return self._send(404, _status(404, "NotFound", "the server could not find the requested resource"))
        if verb == "create":
            api.created.append(json.loads(json.dumps(body)))
            if (ns, body["metadata"]["name"]) in api.objects:
                return self._send(409, _status(409, "AlreadyExists",
                                               f'trainjobs.trainer.kubeflow.org "{body["metadata"]["name"]}" already exists'))
            return self._send(201, api._store(ns, body))
        if verb == "watch":
            return self._watch(ns, query)
        obj = api.objects.get((ns, name or ""))
        if verb == "delete":
            api.deleted.append(body or {})
            obj = api._remove(ns, name)
        if obj is None:
            return self._send(404, _status(404, "NotFound", f'trainjobs.trainer.kubeflow.org "{name}" not found'))
        self._send(200, obj)

    def _watch(self, ns: str, query: dict) -> None:
        api = self.api
        name = query.get("fieldSelector", "").removeprefix("metadata.name=")
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 30)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while api._delivered < len(api.phases) and (ns, name) in api.objects:
                time.sleep(api.event_delay_s)
                i = api._delivered
                api._delivered += 1
                if api.on_event:
                    api.on_event(i)
                obj = api.objects.get((ns, name))
                if obj is None:
                    break
                obj["status"] = api.phases[i]
                self._chunk({"type": "MODIFIED", "object": api._store(ns, obj)})
            with api._changed:  # then as a real watch: open until its time is up or the job goes
                while (ns, name) in api.objects and not api._stopping and time.monotonic() < deadline:
                    api._changed.wait(0.05)
            if (ns, name) not in api.objects and not api._stopping:
                self._chunk({"type": "DELETED", "object": {"metadata": {"name": name, "namespace": ns}}})
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client went away (a stopped step)
            self.close_connection = True

    def _chunk(self, event: dict[str, Any]) -> None:
        data = (json.dumps(event) + "\n").encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    # ---- Volcano jobs (TorchX) ---------------------------------------------------------------------
    def _vcjobs(self, method: str, ns: str, name: str | None, status: bool, query: dict, body: Any) -> None:
        api = self.api
        verb = {"POST": "create", "DELETE": "delete", "PUT": "update"}.get(method) or ("get" if name else "list")
        api.calls.append((VOLCANO, "jobs/status" if status else "jobs", verb, ns))
        if not api.serves_volcano:  # no Volcano: the API server knows no such resource
            return self._send(404, _status(404, "NotFound", "the server could not find the requested resource"))
        if verb == "create":
            name = body["metadata"]["name"]
            if query.get("dryRun") != "All":  # the server-side dry run stores nothing
                if (ns, name) in api.vcjobs:
                    return self._send(409, {**_status(409, "AlreadyExists", f'jobs.batch.volcano.sh "{name}" '
                                                      "already exists"), "details": {"name": name}})
                api.created.append(json.loads(json.dumps(body)))
                api.vcjobs[(ns, name)] = {**json.loads(json.dumps(body)), "status": {}}
            return self._send(201, {**body, "metadata": {**body["metadata"], "namespace": ns}})
        if verb == "list":
            items = [{k: v for k, v in j.items() if k != "status_written"} for j in _selected(api.vcjobs, ns, query)]
            return self._send(200, {"apiVersion": f"{VOLCANO}/v1alpha1", "kind": "JobList", "items": items,
                                    "metadata": {"resourceVersion": str(api._rv)}})
        job = api.vcjobs.get((ns, name or ""))
        if job is None:
            return self._send(404, _status(404, "NotFound", f'jobs.batch.volcano.sh "{name}" not found'))
        if verb == "update":  # TorchX's cancel writes phase Aborted
            job["status"] = body.get("status") or {}
            job["status_written"] = True
            return self._send(200, job)
        if verb == "delete":
            api.deleted.append(body or {})
            return self._send(200, api.vcjobs.pop((ns, name)))
        if status and not job.get("status_written") and api.volcano_phases:
            i = api._status_reads
            api._status_reads += 1
            if api.on_event:
                api.on_event(i)
            phase = api.volcano_phases[min(i, len(api.volcano_phases) - 1)]
            job["status"] = {"state": {"phase": phase}, "taskStatusCount": {
                t["name"]: {"phase": {TASK_PHASE[phase]: 1}} for t in job["spec"]["tasks"]}}
        self._send(200, {k: v for k, v in job.items() if k != "status_written"})

    # ---- pods --------------------------------------------------------------------------------------
    def _pods(self, ns: str, name: str | None, log: bool, query: dict) -> None:
        api = self.api
        api.calls.append(("", "pods/log" if log else "pods", "get" if name else "list", ns))
        if log:
            return self._send(200, api.log, content_type="text/plain")
        if name:  # a Volcano job's pod: <job>-<task>-0, as Volcano names them
            task = next((t for (n, job), j in api.vcjobs.items() if n == ns for t in j["spec"]["tasks"]
                         if name == f"{job}-{t['name']}-0"), None)
            if task is None:
                return self._send(404, _status(404, "NotFound", f'pods "{name}" not found'))
            return self._send(200, {"kind": "Pod", "apiVersion": "v1",
                                    "metadata": {"name": name, "namespace": ns},
                                    "spec": {"containers": [{"name": c["name"], "image": c.get("image", "")}
                                                            for c in task["template"]["spec"]["containers"]]},
                                    "status": {"podIP": "10.0.0.5"}})
        selector = dict(kv.split("=", 1) for kv in query.get("labelSelector", "").split(",") if "=" in kv)
        job = selector.get("jobset.sigs.k8s.io/jobset-name", "")
        # a TrainJob's JobSet has one pod per node of its replicated job `node`: rank 0's is the one asked for
        node0 = (job and selector.get("jobset.sigs.k8s.io/replicatedjob-name") == "node"
                 and selector.get("batch.kubernetes.io/job-completion-index") == "0")
        items = [{"metadata": {"name": f"{job}-node-0-0-x7k2p", "namespace": ns,
                               "creationTimestamp": "2026-01-01T00:00:10Z", "labels": selector}}] if node0 else []
        self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})

    def _send(self, code: int, payload: Any, content_type: str = "application/json") -> None:
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _selected(objects: dict[tuple[str, str], dict[str, Any]], ns: str, query: dict) -> list[dict[str, Any]]:
    """The objects in `ns` whose labels match the query's labelSelector (KEY=VALUE,...), by name."""
    wanted = dict(kv.split("=", 1) for kv in query.get("labelSelector", "").split(",") if "=" in kv)
    return [o for (n, _), o in sorted(objects.items()) if n == ns
            and wanted.items() <= ((o.get("metadata") or {}).get("labels") or {}).items()]


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
