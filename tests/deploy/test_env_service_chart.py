"""The Deployment and Service launch_envs creates against charts/sdar-envs rendered by a real helm.
For every family, with the chart's default values and with changed ones, the two agree on the pod
(probes, resources, ports, security contexts, volumes, env, args, scheduling), the Service and the
label vocabulary; only what sdar.env_service.manifests lists as different on purpose may differ.
A changed template is caught, so the chart and launch_envs cannot drift apart."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from kfp.dsl import Artifact

from components.launch_envs import launch_envs
from sdar.env_service.manifests import CHART_ENV
from tests.deploy.conftest import CHART, FAMILIES, REPO

PAPER = REPO / "configs" / "paper"
CONFIGS = {
    "household": REPO / "configs" / "household-tiny.yaml",
    "shop": PAPER / "webshop-qwen2.5-1.5b.yaml",
    "searchqa": PAPER / "search-qwen2.5-1.5b.yaml",
}
NAMESPACE = "rl"
# labels that name the object (one Helm release, or one pipeline job) rather than say what it is
IDENTITY_LABELS = {
    "helm.sh/chart", "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by", "sdar.io/family", "sdar.io/pipeline-job",
}

# every value launch_envs takes from the chart, changed
CHANGED: dict[str, Any] = {
    "containerPort": 8080,
    "service": {"port": 8080, "sessionAffinity": "ClientIP", "annotations": {"team": "rl"}},
    "commonLabels": {"cost-center": "research"},
    "podAnnotations": {"prometheus.io/scrape": "false"},
    "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 20002, "runAsGroup": 20002, "fsGroup": 20002,
                           "seccompProfile": {"type": "RuntimeDefault"}},
    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                        "readOnlyRootFilesystem": True, "runAsNonRoot": True},
    "tmpSizeLimit": "2Gi",
    "probes": {"startup": {"periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 90},
               "readiness": {"periodSeconds": 7, "timeoutSeconds": 2, "failureThreshold": 4},
               "liveness": {"periodSeconds": 30, "timeoutSeconds": 9, "failureThreshold": 6}},
    "logLevel": "info",
    "terminationGracePeriodSeconds": 90,
    "image": {"pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "ecr"}],
    **{family: {
        "replicas": 2,
        "maxSessions": 64,
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "3", "memory": "3Gi"}},
        "nodeSelector": {"sdar.io/pool": "cpu"},
        "tolerations": [{"key": "envs", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {
                "matchLabels": {"app.kubernetes.io/component": family}}}}]}},
        "extraArgs": ["--session-ttl", "600"],
        "extraEnv": [{"name": "SDAR_LOG", "value": "1"}],
        "podLabels": {"tier": "envs"},
        "podAnnotations": {"sdar.io/family-note": family},
    } for family in FAMILIES},
}


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _chart_with(tmp_path: Path, values: dict[str, Any] | None = None,
                template_edit: tuple[str, str] | None = None) -> Path:
    """A copy of the chart with `values` merged into values.yaml and one template edit."""
    chart = tmp_path / "sdar-envs"
    shutil.copytree(CHART, chart)
    if values:
        path = chart / "values.yaml"
        path.write_text(yaml.safe_dump(_merged(yaml.safe_load(path.read_text()), values)))
    if template_edit:
        path = chart / "templates" / "deployment.yaml"
        text = path.read_text()
        assert text.count(template_edit[0]) == 1, template_edit[0]
        path.write_text(text.replace(*template_edit))
    return chart


def _both(render, monkeypatch, tmp_path: Path, chart: Path, family: str):
    """(the chart's Deployment and Service of `family`, launch_envs's), from the same chart."""
    monkeypatch.setenv(CHART_ENV, str(chart))
    values = yaml.safe_load((chart / "values.yaml").read_text())
    rendered = render(chart=chart, namespace=NAMESPACE)
    (deployment,), (service,) = ([o for o in rendered.kind(kind)
                                  if o["metadata"]["labels"]["app.kubernetes.io/component"] == family]
                                 for kind in ("Deployment", "Service"))
    assert values["containerPort"] == values["service"]["port"], "launch_envs serves one port"
    endpoints = Artifact(name="endpoints", uri=str(tmp_path / f"endpoints-{family}.json"))
    launch_envs.python_func(
        config_path=str(CONFIGS[family]), overrides="{}", job_id="job-1", endpoints=endpoints, target="cluster",
        namespace=NAMESPACE, env_image="registry.example/sdar-env-server:9", replicas=values[family]["replicas"],
        port=values["containerPort"], tracking=False, dry_run=True)
    launched = json.loads(Path(endpoints.path).read_text())["manifests"]
    assert launched[0]["spec"]["template"]["spec"]["containers"][0]["args"][3] == family
    return (deployment, service), tuple(launched)


def _without_flag(args: list[str], flag: str) -> list[str]:
    if flag not in args:
        return args
    i = args.index(flag)
    return args[:i] + args[i + 2:]


def _comparable(deployment: dict[str, Any], service: dict[str, Any], from_chart: bool) -> dict[str, Any]:
    """The two objects less what differs on purpose (sdar.env_service.manifests says why)."""
    d, s = copy.deepcopy(deployment), copy.deepcopy(service)
    template = d["spec"]["template"]
    for labelled in (d["metadata"], s["metadata"], template["metadata"]):
        labelled["labels"] = {k: v for k, v in labelled["labels"].items() if k not in IDENTITY_LABELS}
    for obj in (d, s):
        del obj["metadata"]["name"]
    del d["spec"]["selector"], s["spec"]["selector"]  # each selects its own pods (checked below)
    pod = template["spec"]
    if from_chart:
        # the chart's ServiceAccount; launch_envs's pods run as the namespace's default one (neither
        # mounts a token)
        del pod["serviceAccountName"]
    (container,) = pod["containers"]
    del container["image"]  # the pipeline's env-server image (sdar.images), not the chart's image values
    # the config's env kwargs in place of the chart's --backend
    container["args"] = _without_flag(container["args"], "--backend" if from_chart else "--env-kwargs")
    if from_chart:
        # the chart's operator-token Secret, which launch_envs does not create
        container["env"] = [e for e in container["env"] if e["name"] != "SDAR_ENV_OPERATOR_TOKEN"]
    return {"Deployment": d, "Service": s}


def _differences(chart: Any, launched: Any, path: str = "") -> list[str]:
    if isinstance(chart, dict) and isinstance(launched, dict):
        return [line for k in sorted(set(chart) | set(launched), key=str)
                for line in _differences(chart.get(k, "<absent>"), launched.get(k, "<absent>"), f"{path}.{k}")]
    if isinstance(chart, list) and isinstance(launched, list) and len(chart) == len(launched):
        return [line for i, (a, b) in enumerate(zip(chart, launched))
                for line in _differences(a, b, f"{path}[{i}]")]
    return [] if chart == launched else [f"{path}: chart {chart!r}, launch_envs {launched!r}"]


def _check_selectors(deployment: dict[str, Any], service: dict[str, Any]) -> None:
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for sel in (deployment["spec"]["selector"]["matchLabels"], service["spec"]["selector"]):
        assert sel.items() <= pod_labels.items(), (sel, pod_labels)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("changed", [False, True], ids=["chart-defaults", "changed-values"])
def test_launch_envs_creates_the_charts_deployment_and_service(render, monkeypatch, tmp_path, family,
                                                               changed):
    chart = _chart_with(tmp_path, CHANGED) if changed else CHART
    (chart_d, chart_s), (launched_d, launched_s) = _both(render, monkeypatch, tmp_path, chart, family)
    diffs = _differences(_comparable(chart_d, chart_s, True), _comparable(launched_d, launched_s, False))
    assert not diffs, "launch_envs and charts/sdar-envs differ:\n" + "\n".join(diffs)
    for d, s in ((chart_d, chart_s), (launched_d, launched_s)):
        _check_selectors(d, s)
    # what differs on purpose really is what the comparison left out, and no more
    container = launched_d["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/sdar-env-server:9"
    assert json.loads(container["args"][container["args"].index("--env-kwargs") + 1]) is not None
    assert "serviceAccountName" not in launched_d["spec"]["template"]["spec"]
    if changed:  # the changed values reached launch_envs's pod, not only the chart's
        assert container["livenessProbe"]["periodSeconds"] == 30
        assert container["resources"]["limits"]["memory"] == "3Gi"
        assert launched_s["spec"]["ports"][0]["port"] == 8080


@pytest.mark.parametrize("edit", [
    ("revisionHistoryLimit: 3", "revisionHistoryLimit: 5"),
    ("      enableServiceLinks: false", "      enableServiceLinks: true"),
    ("          livenessProbe:\n            httpGet:\n              path: /health",
     "          livenessProbe:\n            httpGet:\n              path: /livez"),
    ("            - name: tmp\n              mountPath: /tmp\n",
     "            - name: tmp\n              mountPath: /tmp\n              readOnly: false\n"),
], ids=["constant", "pod-field", "probe", "mount"])
def test_a_template_change_launch_envs_does_not_follow_is_caught(render, monkeypatch, tmp_path, edit):
    chart = _chart_with(tmp_path, template_edit=edit)
    (chart_d, chart_s), (launched_d, launched_s) = _both(render, monkeypatch, tmp_path, chart,
                                                         "household")
    assert _differences(_comparable(chart_d, chart_s, True), _comparable(launched_d, launched_s, False))
