"""sdar.kube: the one place the Kubernetes callers (the env service, the training launchers) find this pod's
namespace; each keeps its own default outside a pod."""

from __future__ import annotations

import pytest

import sdar.kube
from sdar.config import LaunchConfig
from sdar.env_service.cluster import namespace_of
from sdar.launch.job import job_namespace


@pytest.mark.parametrize("content, pod", [(None, None), ("", None), ("team-a\n", "team-a")],
                         ids=["outside-a-pod", "empty-file", "in-a-pod"])
def test_the_pods_namespace_is_where_both_callers_go_unless_named(tmp_path, monkeypatch, content, pod):
    path = tmp_path / "namespace"
    if content is not None:
        path.write_text(content)
    monkeypatch.setattr(sdar.kube, "SA_NAMESPACE_FILE", str(path))
    assert sdar.kube.pod_namespace() == pod
    assert namespace_of("") == (pod or "kubeflow")  # the env service: KFP's namespace outside a pod
    assert job_namespace(LaunchConfig()) == (pod or "default")  # a training job: the API's default
    assert namespace_of("envs") == "envs"
    assert job_namespace(LaunchConfig(namespace="jobs")) == "jobs"
