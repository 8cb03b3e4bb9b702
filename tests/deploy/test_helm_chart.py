"""charts/sdar-envs with a real helm: lint, render, validate every object against the Kubernetes
OpenAPI schemas (kubernetes-validate, strict), check what was rendered, and refuse bad values."""

from __future__ import annotations

import base64
import copy
import json
import shutil

import kubernetes_validate
import pytest
import yaml

from tests.deploy.conftest import CHART, FAMILIES, HelmFailed, run_helm

# the oldest Kubernetes the chart targets on EKS today, and a newer one
K8S_VERSIONS = ("1.30", "1.33")

ALFWORLD = {"household": {"backend": "alfworld", "alfworld": {"dataPVC": "alfworld-games"}}}

# every optional part switched on, with scheduling and extras: the widest render
FULL = {
    "global": {
        "image": {"registry": "123456789012.dkr.ecr.us-east-1.amazonaws.com"},
        "imagePullSecrets": [{"name": "ecr"}],
    },
    "imagePullSecrets": [{"name": "extra"}],
    "serviceAccount": {
        "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/envs"}
    },
    "networkPolicy": {
        "enabled": True,
        "allowedClients": [
            {
                "podLabels": {"app.kubernetes.io/part-of": "sdar-pipeline"},
                "namespaceLabels": {"kubernetes.io/metadata.name": "kubeflow"},
            },
            {"podLabels": {"role": "eval"}},
        ],
    },
    "podDisruptionBudget": {"enabled": True},
    "commonLabels": {"team": "rl"},
    "podAnnotations": {"prometheus.io/scrape": "false"},
    "service": {"annotations": {"a": "b"}},
    "household": {
        "backend": "alfworld",
        "replicas": 2,
        "maxSessions": 64,
        "alfworld": {"dataPVC": "alfworld-games", "dataSubPath": "games"},
        "nodeSelector": {"node.kubernetes.io/instance-type": "c7i.2xlarge"},
        "tolerations": [{"key": "envs", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {
                                "matchLabels": {"app.kubernetes.io/component": "household"}
                            },
                        },
                    }
                ]
            }
        },
        "extraArgs": ["--session-ttl", "600"],
        "extraEnv": [
            {"name": "SDAR_LOG", "value": "1"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "podLabels": {"tier": "envs"},
    },
    "shop": {"backend": "sim", "replicas": 3},
}


def chart_meta() -> dict:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def container(deploy: dict) -> dict:
    containers = deploy["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(c: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# ---- lint -------------------------------------------------------------------------------------
@pytest.mark.parametrize("values", [None, ALFWORLD, FULL], ids=["defaults", "alfworld", "full"])
def test_lint_passes_strict(helm, tmp_path, values):
    for flags in ((), ("--strict",)):
        out = run_helm(helm, "lint", *flags, values=values, tmp_dir=tmp_path)
        assert "0 chart(s) failed" in out
        assert "[ERROR]" not in out and "[WARNING]" not in out, out


def test_lint_fails_on_bad_values(helm, tmp_path):
    with pytest.raises(HelmFailed) as err:
        run_helm(helm, "lint", "--strict", values={"household": {"replicas": -1}}, tmp_dir=tmp_path)
    assert "household.replicas" in err.value.output


# ---- Kubernetes schema validation -----------------------------------------------------------------
def test_strict_validation_rejects_an_unknown_field():
    # the validator these tests rely on does fail on a bad object (so a pass below means something)
    bad = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 80}], "bogus": 1},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.30", strict=True)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(
    "values",
    [
        None,
        ALFWORLD,
        FULL,
        {
            "podDisruptionBudget": {"enabled": True, "minAvailable": "50%"},
            "shop": {"enabled": False},
        },
    ],
    ids=["defaults", "alfworld", "full", "pdb-min"],
)
def test_every_object_validates_strictly(render, values, version):
    rendered = render(values)
    assert rendered.objects
    for obj in rendered.objects:
        # SchemaNotFoundError (an unknown kind/apiVersion) fails the test as well
        kubernetes_validate.validate(obj, version, strict=True)


# ---- what the defaults render ------------------------------------------------------------------
def test_defaults_render_one_deployment_and_service_per_family(render):
    r = render()
    kinds = sorted(o["kind"] for o in r.objects)
    assert kinds == ["Deployment"] * 3 + ["NetworkPolicy", "Secret"] + ["Service"] * 3 + [
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    for family in FAMILIES:
        name = f"sdar-envs-{family}"
        deploy, svc = r.get("Deployment", name), r.get("Service", name)
        for obj in (deploy, svc):
            labels = obj["metadata"]["labels"]
            assert labels["app.kubernetes.io/name"] == "sdar-envs"
            assert labels["app.kubernetes.io/instance"] == "sdar-envs"
            assert labels["app.kubernetes.io/component"] == family
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["app.kubernetes.io/version"] == chart_meta()["appVersion"]
            assert labels["helm.sh/chart"] == f"sdar-envs-{chart_meta()['version']}"
            assert obj["metadata"]["namespace"] == "rl"
        assert deploy["spec"]["replicas"] == 1
        pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
        assert selects(deploy["spec"]["selector"]["matchLabels"], pod_labels)
        # the Service selects this family's pods and no other family's
        for other in FAMILIES:
            other_pods = r.get("Deployment", f"sdar-envs-{other}")["spec"]["template"]["metadata"][
                "labels"
            ]
            assert selects(svc["spec"]["selector"], other_pods) == (other == family)
        assert svc["spec"]["type"] == "ClusterIP"
        assert svc["spec"]["ports"] == [
            {
                "name": "http",
                "port": 8000,
                "targetPort": "http",
                "protocol": "TCP",
                "appProtocol": "http",
            }
        ]


def test_probes_point_at_health_on_a_port_no_client_reaches(render):
    r = render({"containerPort": 9100, "probePort": 9101})
    for deploy in r.kind("Deployment"):
        c = container(deploy)
        assert c["ports"] == [{"name": "http", "containerPort": 9100, "protocol": "TCP"},
                              {"name": "probe", "containerPort": 9101, "protocol": "TCP"}]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": "/health", "port": "probe"}, probe
        # the server listens where clients and probes knock
        assert c["args"][c["args"].index("--port") + 1] == "9100"
        assert c["args"][c["args"].index("--probe-port") + 1] == "9101"
        # the startup probe allows a slow first start; liveness only takes over after it
        assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 120
    # clients reach the HTTP port only: the Service does not carry the probe port, the NetworkPolicy does not admit it
    for svc in r.kind("Service"):
        assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["http"]
    (policy,) = r.kind("NetworkPolicy")
    assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == ["http"]


def test_the_probe_port_must_be_its_own(helm, tmp_path):
    with pytest.raises(HelmFailed) as err:
        run_helm(helm, "template", "sdar-envs", values={"containerPort": 9100, "probePort": 9100}, tmp_dir=tmp_path)
    assert "probePort and containerPort are both 9100" in err.value.output


def test_client_limits_reach_the_server_and_default_to_its_own(render):
    from sdar_envs.server.config import ServerOptions, options_from_args

    def served(values: dict) -> ServerOptions:
        c = container(render(values).get("Deployment", "sdar-envs-household"))
        return options_from_args(sdar_envs_parser().parse_args(c["args"]))

    default = served({})
    assert (default.max_sessions_per_client, default.max_connections_per_client) == (ServerOptions().max_sessions_per_client, None)
    assert default.probe_port == 8081
    behind_proxy = served({"clientLimits": {"maxSessionsPerClient": 0}})
    assert behind_proxy.max_sessions_per_client == 0 and behind_proxy.connections_per_client_limit == 0
    both = served({"clientLimits": {"maxSessionsPerClient": 512, "maxConnectionsPerClient": 600}})
    assert (both.max_sessions_per_client, both.connections_per_client_limit) == (512, 600)


def test_pods_run_non_root_read_only_without_privileges(render):
    r = render(FULL)
    sa = r.kind("ServiceAccount")
    assert len(sa) == 1 and sa[0]["automountServiceAccountToken"] is False
    assert sa[0]["metadata"]["annotations"] == FULL["serviceAccount"]["annotations"]
    for deploy in r.kind("Deployment"):
        pod = deploy["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == sa[0]["metadata"]["name"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["enableServiceLinks"] is False
        psc = pod["securityContext"]
        assert (
            psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001 and psc["runAsGroup"] == 10001
        )
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = container(deploy)["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
        # the only writable places are emptyDirs, and /tmp (HOME, caches) is one of them
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m for m in container(deploy)["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
        for m in mounts.values():
            v = volumes[m["name"]]
            assert "emptyDir" in v or m.get("readOnly") is True, m
            assert "hostPath" not in v


# ---- values reach the objects ------------------------------------------------------------------
def test_image_reference_is_built_from_values(render):
    app_version = chart_meta()["appVersion"]
    digest = "sha256:" + "ab" * 32
    cases = [
        ({}, f"sdar-env-server:{app_version}"),
        (
            {"image": {"registry": "reg.example:5000", "tag": "1.2.3"}},
            "reg.example:5000/sdar-env-server:1.2.3",
        ),
        (
            {
                "global": {"image": {"registry": "ecr.example"}},
                "image": {"registry": "ignored.example"},
            },
            f"ecr.example/sdar-env-server:{app_version}",
        ),
        (
            {"image": {"repository": "team/envs", "tag": "9.9", "digest": digest}},
            f"team/envs@{digest}",
        ),
    ]
    for values, expected in cases:
        for deploy in render(values).kind("Deployment"):
            assert container(deploy)["image"] == expected, values
    c = container(render({"image": {"pullPolicy": "Always"}}).kind("Deployment")[0])
    assert c["imagePullPolicy"] == "Always"


def test_default_image_tag_is_this_sdar_release():
    import sdar

    # the chart's appVersion is the default image tag, so it must name the package release
    assert chart_meta()["appVersion"] == sdar.__version__


def sdar_envs_parser():
    """The `sdar` parser with the `envs` commands only: how sdar.cli dispatches `sdar envs ...`,
    without importing every other area (training pulls in torch)."""
    import argparse

    from sdar_envs import cli

    parser = argparse.ArgumentParser(prog="sdar")
    cli.register(parser.add_subparsers(dest="command"))
    return parser


def test_args_build_a_serve_command_the_real_cli_accepts(render):
    from sdar_envs.server.config import options_from_args

    r = render(
        {
            "household": {"maxSessions": 32, "extraArgs": ["--session-ttl", "600"]},
            "shop": {"backend": "sim"},
            "logLevel": "info",
        }
    )
    seen = {}
    for deploy in r.kind("Deployment"):
        c = container(deploy)
        family = c["name"]
        args = sdar_envs_parser().parse_args(c["args"])  # the image's ENTRYPOINT is `sdar`
        assert (args.command, args.envs_command) == ("envs", "serve")
        opts = options_from_args(args)
        seen[family] = opts
        assert (
            opts.family == family
            and opts.host == "0.0.0.0"
            and opts.port == 8000
            and opts.log_level == "info"
        )
        assert env_of(c)["SDAR_ENV_PORT"] == "8000"  # what the image's HEALTHCHECK reads
    assert set(seen) == set(FAMILIES)
    assert seen["household"].env_kwargs == {"backend": "sim"}
    assert seen["household"].max_sessions == 32 and seen["household"].session_ttl_s == 600
    assert seen["shop"].env_kwargs == {"backend": "sim"}
    # no backend value: no --backend flag, the family's default
    assert (
        seen["searchqa"].env_kwargs == {}
        and "--backend" not in container(r.get("Deployment", "sdar-envs-searchqa"))["args"]
    )
    assert seen["searchqa"].max_sessions == 1024  # maxSessions 0 keeps the server's default


def test_disabling_a_family_removes_its_objects(render):
    r = render({"shop": {"enabled": False}, "podDisruptionBudget": {"enabled": True}})
    for kind in ("Deployment", "Service", "PodDisruptionBudget"):
        names = sorted(o["metadata"]["name"] for o in r.kind(kind))
        assert names == ["sdar-envs-household", "sdar-envs-searchqa"], kind
    assert not any("shop" in o["metadata"]["name"] for o in r.objects)


def test_replicas_resources_and_scheduling_are_per_family(render):
    r = render(FULL)
    hh, shop, sq = (r.get("Deployment", f"sdar-envs-{f}") for f in FAMILIES)
    assert (hh["spec"]["replicas"], shop["spec"]["replicas"], sq["spec"]["replicas"]) == (2, 3, 1)
    hh_pod, sq_pod = hh["spec"]["template"]["spec"], sq["spec"]["template"]["spec"]
    assert hh_pod["nodeSelector"] == FULL["household"]["nodeSelector"]
    assert hh_pod["tolerations"] == FULL["household"]["tolerations"]
    assert hh_pod["affinity"] == FULL["household"]["affinity"]
    assert not {"nodeSelector", "tolerations", "affinity"} & set(sq_pod)
    assert hh_pod["imagePullSecrets"] == [{"name": "ecr"}, {"name": "extra"}]
    assert hh["spec"]["template"]["metadata"]["labels"]["tier"] == "envs"
    assert hh["spec"]["template"]["metadata"]["annotations"] == {"prometheus.io/scrape": "false"}
    assert all(o["metadata"]["labels"]["team"] == "rl" for o in r.objects)
    for deploy in (hh, shop, sq):
        res = container(deploy)["resources"]
        assert set(res) == {"requests", "limits"} and {"cpu", "memory"} <= set(res["requests"])
    c = container(hh)
    assert c["args"][-2:] == ["--session-ttl", "600"]
    assert {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]
    # helm merges a map into the defaults; null drops a default key
    custom = render(
        {
            "searchqa": {
                "resources": {
                    "requests": {"cpu": "3", "memory": "5Gi"},
                    "limits": {"memory": "6Gi"},
                }
            }
        }
    )
    res = container(custom.get("Deployment", "sdar-envs-searchqa"))["resources"]
    assert res == {
        "requests": {"cpu": "3", "memory": "5Gi"},
        "limits": {"cpu": "1", "memory": "6Gi"},
    }
    custom = render({"searchqa": {"resources": {"limits": {"cpu": None}}}})
    assert (
        "cpu"
        not in container(custom.get("Deployment", "sdar-envs-searchqa"))["resources"]["limits"]
    )


def test_alfworld_backend_mounts_games_read_only_and_a_cache(render):
    sim = container(render().get("Deployment", "sdar-envs-household"))
    assert sim["args"][sim["args"].index("--backend") + 1] == "sim"
    assert [m["mountPath"] for m in sim["volumeMounts"]] == ["/tmp"]
    assert "SDAR_ALFWORLD_DATA" not in env_of(sim)

    r = render(FULL)
    deploy = r.get("Deployment", "sdar-envs-household")
    c, pod = container(deploy), deploy["spec"]["template"]["spec"]
    assert c["args"][c["args"].index("--backend") + 1] == "alfworld"
    env = env_of(c)
    assert env["SDAR_ALFWORLD_DATA"] == env["ALFWORLD_DATA"] == "/data/alfworld"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert env["SDAR_CACHE_DIR"] in mounts
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[env["SDAR_CACHE_DIR"]]["name"]]["emptyDir"] == {"sizeLimit": "1Gi"}
    data = mounts["/data/alfworld"]
    assert data["readOnly"] is True and data["subPath"] == "games"
    assert volumes[data["name"]]["persistentVolumeClaim"] == {
        "claimName": "alfworld-games",
        "readOnly": True,
    }
    # the other families never get the engine's volumes
    for family in ("shop", "searchqa"):
        other = container(r.get("Deployment", f"sdar-envs-{family}"))
        assert [m["mountPath"] for m in other["volumeMounts"]] == ["/tmp"]


def _by_name(namespaces: list[str]) -> dict:
    return {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}
        ]
    }


def _admits(r, namespace: str, ns_labels: dict, pod_labels: dict, service_account: str) -> bool:
    """Whether a pod could exist (the admission policies let it) and reach the servers (the
    NetworkPolicy admits it): the rendered objects evaluated as the API server and CNI would."""
    ns_labels = {**ns_labels, "kubernetes.io/metadata.name": namespace}

    def ns_match(selector: dict) -> bool:
        for expr in selector.get("matchExpressions", []):
            assert expr["operator"] == "In"
            if ns_labels.get(expr["key"]) not in expr["values"]:
                return False
        return selects(selector.get("matchLabels", {}), ns_labels)

    for binding in r.kind("ValidatingAdmissionPolicyBinding"):
        match = binding["spec"]["matchResources"]
        if ns_match(match["namespaceSelector"]) and selects(
            match["objectSelector"]["matchLabels"], pod_labels
        ):
            (policy,) = [
                p
                for p in r.kind("ValidatingAdmissionPolicy")
                if p["metadata"]["name"] == binding["spec"]["policyName"]
            ]
            (rule,) = policy["spec"]["validations"]
            prefix = "has(object.spec.serviceAccountName) && object.spec.serviceAccountName in "
            assert rule["expression"].startswith(prefix)
            if service_account not in json.loads(rule["expression"][len(prefix) :]):
                return False  # refused at admission: such a pod cannot exist
    (np,) = r.kind("NetworkPolicy")
    return any(
        ns_match(peer["namespaceSelector"]) and selects(peer["podSelector"]["matchLabels"], pod_labels)
        for rule in np["spec"]["ingress"]
        for peer in rule["from"]
    )


def test_network_policy_is_on_and_admits_the_pipeline_by_namespace_and_service_account(render):
    r = render()
    (np,) = r.kind("NetworkPolicy")
    spec = np["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    for deploy in r.kind("Deployment"):
        assert selects(
            spec["podSelector"]["matchLabels"], deploy["spec"]["template"]["metadata"]["labels"]
        )
    (rule,) = spec["ingress"]
    pipeline = {"app.kubernetes.io/part-of": "sdar-pipeline"}
    # the default client: KFP standalone's pods, in kubeflow (by its immutable name label)
    assert rule["from"] == [{"namespaceSelector": _by_name(["kubeflow"]), "podSelector": {"matchLabels": pipeline}}]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    # ... and the labels are tied to kubeflow's pipeline-runner: no other pod there may wear them
    (policy,) = r.kind("ValidatingAdmissionPolicy")
    (binding,) = r.kind("ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert policy["metadata"]["name"].startswith("sdar-envs-client-0-")  # + a hash of namespace/release
    assert render(namespace="other").kind("ValidatingAdmissionPolicy")[0]["metadata"]["name"] != policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"] == {
        "namespaceSelector": _by_name(["kubeflow"]),
        "objectSelector": {"matchLabels": pipeline},
    }
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert "pipeline-runner" in policy["spec"]["validations"][0]["message"]
    # who gets through, as the API server and the CNI would decide
    assert _admits(r, "kubeflow", {}, pipeline, "pipeline-runner")
    assert not _admits(r, "kubeflow", {}, pipeline, "default")  # a pod that set the label itself
    assert not _admits(r, "kubeflow", {}, {"app": "x"}, "pipeline-runner")  # the SA without the label
    assert not _admits(r, "rl", {}, pipeline, "pipeline-runner")  # the label in another namespace
    assert not _admits(r, "team-b", {}, pipeline, "default")

    # FULL: namespaceLabels alone select namespaces by label; an entry with neither, this release's
    r = render(FULL)
    (rule,) = r.kind("NetworkPolicy")[0]["spec"]["ingress"]
    assert rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kubeflow"}},
            "podSelector": {"matchLabels": pipeline},
        },
        {"namespaceSelector": _by_name(["rl"]), "podSelector": {"matchLabels": {"role": "eval"}}},
    ]
    assert r.kind("ValidatingAdmissionPolicy") == []  # no serviceAccounts given: nothing pinned
    # namespaces and namespaceLabels together: those names, if they carry the labels
    client = {"namespaces": ["a", "b"], "namespaceLabels": {"env": "prod"}, "podLabels": {"role": "x"}}
    r = render({"networkPolicy": {"allowedClients": [{**client, "serviceAccounts": ["x"]}]}})
    (peer,) = r.kind("NetworkPolicy")[0]["spec"]["ingress"][0]["from"]
    assert peer["namespaceSelector"] == {**_by_name(["a", "b"]), "matchLabels": {"env": "prod"}}
    assert _admits(r, "a", {"env": "prod"}, {"role": "x"}, "x")
    assert not _admits(r, "a", {}, {"role": "x"}, "x") and not _admits(r, "c", {"env": "prod"}, {"role": "x"}, "x")
    (binding,) = r.kind("ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["matchResources"]["namespaceSelector"] == peer["namespaceSelector"]

    # several namespaces and service accounts; pinning off; the whole policy off
    clients = [
        {"namespaces": ["kubeflow", "team-a"], "podLabels": {"role": "eval"}, "serviceAccounts": ["eval", "ci"]},
        {"podLabels": {"role": "probe"}},
    ]
    r = render({"networkPolicy": {"allowedClients": clients}})
    assert [p["metadata"]["name"][:19] for p in r.kind("ValidatingAdmissionPolicy")] == ["sdar-envs-client-0-"]
    assert _admits(r, "team-a", {}, {"role": "eval"}, "ci")
    assert not _admits(r, "team-a", {}, {"role": "eval"}, "default")
    assert _admits(r, "rl", {}, {"role": "probe"}, "default")  # unpinned: labels and namespace only
    assert not _admits(r, "kubeflow", {}, {"role": "probe"}, "default")
    r = render({"networkPolicy": {"pinServiceAccounts": False}})
    assert len(r.kind("NetworkPolicy")) == 1 and r.kind("ValidatingAdmissionPolicy") == []
    assert _admits(r, "kubeflow", {}, pipeline, "default")  # what pinning prevents
    r = render({"networkPolicy": {"enabled": False}})
    assert r.kind("NetworkPolicy") == [] and r.kind("ValidatingAdmissionPolicyBinding") == []


def test_service_account_pinning_needs_kubernetes_1_30(helm, tmp_path):
    with pytest.raises(HelmFailed) as err:
        run_helm(helm, "template", "sdar-envs", "--kube-version", "1.29.0", tmp_dir=tmp_path)
    assert "pinServiceAccounts needs Kubernetes >= 1.30" in err.value.output
    values = {"networkPolicy": {"pinServiceAccounts": False}}
    out = run_helm(helm, "template", "sdar-envs", "--kube-version", "1.29.0", values=values, tmp_dir=tmp_path)
    assert "kind: NetworkPolicy" in out and "ValidatingAdmissionPolicy" not in out


def test_operator_token_comes_from_a_secret(render):
    r = render()
    (secret,) = r.kind("Secret")
    assert secret["metadata"]["name"] == "sdar-envs-operator"
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) == 48 and token.isalnum()
    for deploy in r.kind("Deployment"):
        (var,) = [e for e in container(deploy)["env"] if e["name"] == "SDAR_ENV_OPERATOR_TOKEN"]
        assert var == {
            "name": "SDAR_ENV_OPERATOR_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "sdar-envs-operator", "key": "token"}},
        }
        assert "value" not in var  # never in the pod spec itself
    assert render().kind("Secret")[0]["data"]["token"] != secret["data"]["token"]  # random per install
    r = render({"operatorToken": {"existingSecret": "ops-token", "secretKey": "t"}})
    assert r.kind("Secret") == []
    for deploy in r.kind("Deployment"):
        (var,) = [e for e in container(deploy)["env"] if e["name"] == "SDAR_ENV_OPERATOR_TOKEN"]
        assert var["valueFrom"]["secretKeyRef"] == {"name": "ops-token", "key": "t"}
    r = render({"operatorToken": {"create": False}})
    assert r.kind("Secret") == []
    assert all("SDAR_ENV_OPERATOR_TOKEN" not in env_of(container(d)) for d in r.kind("Deployment"))


def test_pod_disruption_budgets(render):
    assert render().kind("PodDisruptionBudget") == []
    r = render({"podDisruptionBudget": {"enabled": True}})
    pdbs = r.kind("PodDisruptionBudget")
    assert len(pdbs) == 3
    for pdb in pdbs:
        family = pdb["metadata"]["labels"]["app.kubernetes.io/component"]
        assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
        for other in FAMILIES:
            pods = r.get("Deployment", f"sdar-envs-{other}")["spec"]["template"]["metadata"][
                "labels"
            ]
            assert selects(pdb["spec"]["selector"]["matchLabels"], pods) == (other == family)
    r = render({"podDisruptionBudget": {"enabled": True, "minAvailable": "50%"}})
    assert all(
        p["spec"] == {"minAvailable": "50%", "selector": p["spec"]["selector"]}
        for p in r.kind("PodDisruptionBudget")
    )


def test_long_release_names_stay_valid_and_distinct(render):
    release = "a-release-name-at-the-53-character-limit-of-helm-wxyz"
    assert len(release) == 53
    r = render(release=release)
    for kind in ("Deployment", "Service"):
        # truncated, yet one distinct name per family
        assert len({o["metadata"]["name"] for o in r.kind(kind)}) == 3, kind
    for name in [o["metadata"]["name"] for o in r.objects]:
        assert len(name) <= 63 and not name.startswith("-") and not name.endswith("-"), name
    for version in K8S_VERSIONS:
        for obj in r.objects:
            kubernetes_validate.validate(obj, version, strict=True)


# ---- bad values fail, with a message that names the value --------------------------------------
@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"household": {"replicas": -1}}, ["household.replicas", "greater than or equal to 0"]),
        ({"household": {"backend": "foo"}}, ["household.backend", '"sim", "alfworld"']),
        ({"shop": {"replicas": "two"}}, ["shop.replicas", "integer"]),
        ({"househld": {"replicas": 2}}, ["Additional property househld is not allowed"]),
        (
            {"searchqa": {"resources": {"limits": {"cpu": "lots"}}}},
            ["searchqa.resources.limits.cpu"],
        ),
        ({"image": {"digest": "latest"}}, ["image.digest"]),
        ({"containerPort": 80}, ["containerPort", "1024"]),
        ({"service": {"sessionAffinity": "Sticky"}}, ["service.sessionAffinity"]),
        (
            {"networkPolicy": {"enabled": True, "allowedClients": [{"podLabels": {}}]}},
            ["networkPolicy.allowedClients.0.podLabels", "1"],
        ),
        (
            {"networkPolicy": {"enabled": True, "allowedClients": []}},
            ["networkPolicy.allowedClients", "1"],
        ),
        (
            {"networkPolicy": {"allowedClients": [{"podLabels": {"a": "b"}, "namespaces": ["Kube_Flow"]}]}},
            ["networkPolicy.allowedClients.0.namespaces.0"],
        ),
        (
            {"networkPolicy": {"allowedClients": [{"podLabels": {"a": "b"}, "serviceAccounts": ["Runner!"]}]}},
            ["networkPolicy.allowedClients.0.serviceAccounts.0"],
        ),
        ({"operatorToken": {"secretKey": "a key"}}, ["operatorToken.secretKey"]),
        (
            {"household": {"backend": "alfworld"}},
            ["household.alfworld.dataPVC", "PersistentVolumeClaim"],
        ),
        (
            {f: {"enabled": False} for f in FAMILIES},
            ["every family is disabled", "enable at least one"],
        ),
    ],
    ids=[
        "replicas",
        "backend",
        "replicas-type",
        "typo",
        "quantity",
        "digest",
        "port",
        "affinity",
        "netpol-empty-labels",
        "netpol-no-clients",
        "netpol-namespace",
        "netpol-service-account",
        "operator-secret-key",
        "alfworld-no-data",
        "none-enabled",
    ],
)
def test_bad_values_fail_with_a_clear_message(render, values, expected):
    with pytest.raises(HelmFailed) as err:
        render(values)
    for text in expected:
        assert text in err.value.output, err.value.output


# ---- NOTES.txt -------------------------------------------------------------------------------------
def test_notes_print_the_endpoints(render, tmp_path):
    # helm prints NOTES.txt only on install (which needs a cluster); render it as a template of a
    # copy of the chart instead, through the same engine and values
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_notes_probe.tpl").write_text(
        '{{- define "notes.probe" -}}\n' + notes + "{{- end -}}\n"
    )
    (chart / "templates" / "notes-probe.yaml").write_text(
        'notes: {{ include "notes.probe" . | toJson }}\n'
    )

    def notes_for(values):
        (doc,) = [
            o
            for o in render(values, release="envs", namespace="rl", chart=chart).objects
            if "notes" in o
        ]
        return doc["notes"]

    text = notes_for({"shop": {"enabled": False}})
    assert "http://envs-sdar-envs-household.rl.svc.cluster.local:8000" in text
    assert "http://envs-sdar-envs-searchqa.rl.svc.cluster.local:8000" in text
    assert "shop" not in text
    assert "port-forward svc/envs-sdar-envs-household" in text
    assert (
        "pods app.kubernetes.io/part-of=sdar-pipeline in namespace kubeflow, running as pipeline-runner"
        in text
    )
    assert "kubectl -n rl get secret envs-sdar-envs-operator -o jsonpath='{.data.token}'" in text
    text = notes_for({"networkPolicy": {"pinServiceAccounts": False}})
    assert "running as pipeline-runner (not enforced: pinServiceAccounts is off)" in text
    text = notes_for(
        {
            "household": {"enabled": False},
            "service": {"port": 9000},
            "networkPolicy": {"enabled": False},
            "operatorToken": {"create": False},
        }
    )
    assert "http://envs-sdar-envs-shop.rl.svc.cluster.local:9000" in text
    assert "port-forward svc/envs-sdar-envs-shop 8000:9000" in text
    assert "NetworkPolicy" not in text and "operator token" not in text


def test_values_file_documents_every_schema_key():
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(sch, val, path):
        props = sch.get("properties", {})
        if sch.get("additionalProperties") is False:
            # every key of values.yaml is in the schema, and every schema key has a default
            assert set(val) == set(props), (path, set(val) ^ set(props))
        for key, sub in props.items():
            if isinstance(val.get(key), dict) and sub.get("type") == "object":
                walk(sub, val[key], f"{path}.{key}")

    walk(schema, copy.deepcopy(values), "")
