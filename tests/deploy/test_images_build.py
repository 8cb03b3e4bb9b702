"""`make images DOCKER=podman` for real, and both images run as the cluster runs them.

* the env server as charts/sdar-envs runs its household pod: uid/gid 10001, read-only root filesystem,
  every capability dropped, no privilege escalation, /tmp an emptyDir (a tmpfs here), the chart's args and
  env (the operator token from its Secret); an expert episode is played against it over the wire with the
  sdar_envs client (WebSocket) and over the plain HTTP session routes, and must be the local episode exactly;
* the trainer (its CPU variant, `<tag>-cpu`) with the training pods' restricted context (sdar.launch.pods' user
  and writable directories) runs `sdar demo --selfcheck`;
* the CA bundle the builds get as the secret `ca` is in no layer of either image.

Slow and outside `make test` (CI is near its time limit): it runs only with SDAR_IMAGES_TEST=1, i.e.
`make images-test`, as root on a machine with podman, runc and debootstrap. A cold build (base image
included) took 20 min on 2 shared cores; with every layer cached the whole test takes about 2 min, after a
change under src/ about 6 (docs/cluster.md has the figures). SDAR_IMAGES_TEST_BUILT=1 checks the images as
they are, without `make images`.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import ca_bundles
from tests.deploy.conftest import REPO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("SDAR_IMAGES_TEST") != "1",
        reason="builds and runs the container images (tens of minutes cold): SDAR_IMAGES_TEST=1 or `make images-test`",
    ),
    # a cold `make images` alone runs far past pytest's default limit
    pytest.mark.timeout(int(os.environ.get("SDAR_IMAGES_TEST_TIMEOUT", "7200"))),
]

DOCKER = "podman"
FAMILY = "household"
START_TIMEOUT_S = 120.0


def _run(cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 600, check: bool = True,
         **kw: Any) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-6000:]}")
    return proc


# ---- the build --------------------------------------------------------------------------------------------


def _build_command() -> list[str]:
    """The commands `make images DOCKER=podman` would run (make -n), as one list of words per line."""
    out = _run(["make", "-n", "--no-print-directory", "images", f"DOCKER={DOCKER}"], cwd=REPO).stdout
    return [line for line in out.replace("\\\n", " ").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Any]:
    """Runs `make images DOCKER=podman`; returns the two image names, the CA bundle given as the build
    secret (None when none was) and the build's wall time."""
    missing = [tool for tool in (DOCKER, "make") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (Debian: apt-get install -y podman runc debootstrap)")
    if os.geteuid() != 0:
        pytest.skip("the local base image needs root (debootstrap; tools/base_image.sh)")
    lines = _build_command()
    tags = [t for line in lines for t in re.findall(r"(?:^|\s)-t\s+(\S+)", line)]
    env_server = [t for t in tags if "sdar-env-server" in t]
    trainer = [t for t in tags if "sdar-trainer" in t]
    assert len(env_server) == 1 and len(trainer) == 1, lines
    cas = {m for line in lines for m in re.findall(r"--secret\s+id=ca,src=(\S+)", line)}
    assert len(cas) <= 1, cas
    result = {"env_server": env_server[0], "trainer": trainer[0], "ca": next(iter(cas), None), "build_s": None}
    if os.environ.get("SDAR_IMAGES_TEST_BUILT") == "1":  # check the images as they are, without `make images`
        return result
    log = tmp_path_factory.mktemp("images") / "make-images.log"
    start = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.run(["make", "--no-print-directory", "images", f"DOCKER={DOCKER}"], cwd=REPO,
                              stdout=fh, stderr=subprocess.STDOUT, timeout=6600, check=False)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        pytest.fail(f"make images DOCKER={DOCKER} exited {proc.returncode} after {seconds:.0f} s:\n"
                    + log.read_text()[-8000:])
    return {**result, "build_s": seconds}


@pytest.fixture(scope="module")
def podman_env(built, tmp_path_factory) -> dict[str, str]:
    """The environment for `podman run`. Where root lacks CAP_SYS_RESOURCE (a sandboxed VM), runc cannot
    give a container podman's default rlimits (nofile and nproc 1048576, above the hard limits): "error
    setting rlimit type 7/6: operation not permitted". A containers.conf with `default_ulimits = []` then
    lets containers inherit this machine's limits (what a kubelet does too)."""
    env = dict(os.environ)
    probe = [DOCKER, "run", "--rm", "--network", "none", "--entrypoint", "python", built["env_server"], "-c", "pass"]
    first = _run(probe, env=env, check=False, timeout=120)
    if first.returncode != 0 and "rlimit" in first.stderr and "CONTAINERS_CONF" not in env:
        conf = tmp_path_factory.mktemp("containers") / "containers.conf"
        conf.write_text("[containers]\ndefault_ulimits = []\n")
        env["CONTAINERS_CONF"] = str(conf)
        first = _run(probe, env=env, check=False, timeout=120)
    if first.returncode != 0:
        pytest.fail(f"podman cannot run a container here:\n{first.stdout}{first.stderr}")
    return env


# ---- a pod spec as podman flags ---------------------------------------------------------------------------


def _bytes(quantity: str) -> int:
    """A Kubernetes quantity (512Mi, 1Gi, 100M) in bytes."""
    m = re.fullmatch(r"(\d+)([KMGT]i?)?", str(quantity))
    assert m, quantity
    unit = m.group(2) or ""
    power = {"K": 1, "M": 2, "G": 3, "T": 4}.get(unit[:1], 0)
    return int(m.group(1)) * (1024 if unit.endswith("i") else 1000) ** power


def pod_run_flags(pod: dict[str, Any], container: dict[str, Any], secret_data: dict[tuple[str, str], str]) -> list[str]:
    """`podman run` flags that give a container what this pod spec gives it: user and groups, read-only root,
    capabilities, no privilege escalation, the default seccomp profile, emptyDirs as tmpfs mounts and the env
    (secretKeyRef values from secret_data). Anything of the spec this cannot reproduce fails the test."""
    psc, csc = pod.get("securityContext") or {}, container.get("securityContext") or {}
    uid, gid = csc.get("runAsUser", psc.get("runAsUser")), csc.get("runAsGroup", psc.get("runAsGroup"))
    assert uid and gid is not None and (csc.get("runAsNonRoot") or psc.get("runAsNonRoot")), (psc, csc)
    flags = ["--user", f"{uid}:{gid}"]
    if psc.get("fsGroup") is not None:
        flags += ["--group-add", str(psc["fsGroup"])]
    if csc.get("readOnlyRootFilesystem"):
        # podman would mount its own tmpfs on /tmp, /var/tmp and /run: only the pod's volumes are writable
        flags += ["--read-only", "--read-only-tmpfs=false"]
    assert not csc.get("privileged")
    caps = csc.get("capabilities") or {}
    flags += [f"--cap-drop={c}" for c in caps.get("drop", [])] + [f"--cap-add={c}" for c in caps.get("add", [])]
    if csc.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    seccomp = (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type", "RuntimeDefault")
    assert seccomp == "RuntimeDefault", seccomp  # podman's default profile
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        assert "emptyDir" in volume, f"{mount['name']}: only emptyDir volumes are reproduced here"
        size = (volume["emptyDir"] or {}).get("sizeLimit")
        opts = "rw,mode=1777" + (f",size={_bytes(size)}" if size else "")
        flags += ["--tmpfs", f"{mount['mountPath']}:{opts}"]
    for var in container.get("env", []):
        if "value" in var:
            value = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            value = secret_data[(ref["name"], ref["key"])]
        flags += ["--env", f"{var['name']}={value}"]
    assert not container.get("envFrom"), "envFrom is not reproduced here"
    return flags


# ---- the env server, as the chart's household pod -------------------------------------------------------


@pytest.fixture(scope="module")
def chart_pod(helm, tmp_path_factory) -> dict[str, Any]:
    """The household Deployment of `helm template charts/sdar-envs` with the chart's defaults, and the data
    of the Secrets it renders (the operator token)."""
    import yaml

    from tests.deploy.conftest import run_helm

    out = run_helm(helm, "template", "sdar-envs", "--namespace", "rl")
    objects = [o for o in yaml.safe_load_all(out) if o]
    deployments = [o for o in objects if o["kind"] == "Deployment"
                   and o["spec"]["template"]["spec"]["containers"][0]["name"] == FAMILY]
    assert len(deployments) == 1, [o["metadata"]["name"] for o in objects]
    secret_data = {}
    for s in (o for o in objects if o["kind"] == "Secret"):
        for key, value in (s.get("data") or {}).items():
            secret_data[(s["metadata"]["name"], key)] = base64.b64decode(value).decode()
        for key, value in (s.get("stringData") or {}).items():
            secret_data[(s["metadata"]["name"], key)] = value
    return {"pod": deployments[0]["spec"]["template"]["spec"], "secret_data": secret_data,
            "grace_s": deployments[0]["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)}


def _port(name: str, container: dict[str, Any]) -> int:
    return next(p["containerPort"] for p in container["ports"] if p["name"] == name)


def _wait_health(url: str, cid: str, env: dict[str, str]) -> None:
    from sdar_envs.client import EnvServerError, http_json

    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            http_json("GET", f"{url}/health", timeout_s=3)
            return
        except EnvServerError:
            state = _run([DOCKER, "inspect", "--format", "{{.State.Status}}", cid], env=env, check=False)
            if state.stdout.strip() not in ("running", "created", "configured") or time.monotonic() > deadline:
                logs = _run([DOCKER, "logs", cid], env=env, check=False)
                pytest.fail(f"the env server did not answer {url}/health ({state.stdout.strip()}):\n"
                            f"{(logs.stdout + logs.stderr)[-4000:]}")
            time.sleep(0.5)


@pytest.fixture(scope="module")
def env_server(built, podman_env, chart_pod) -> Any:
    pod = chart_pod["pod"]
    (container,) = pod["containers"]
    http_port, probe_port = _port("http", container), _port("probe", container)
    # the chart's Secret holds a random token (helm's randAlphaNum): a fresh one here, like each install
    secret_data = {k: secrets.token_urlsafe(24) for k in chart_pod["secret_data"]}
    flags = pod_run_flags(pod, container, secret_data)
    # like the kubelet, the container's own args after the image's ENTRYPOINT (the chart sets no command)
    assert "command" not in container
    cmd = [DOCKER, "run", "--detach", "--name", f"sdar-images-test-{secrets.token_hex(4)}", *flags,
           "--publish", f"127.0.0.1::{http_port}", "--publish", f"127.0.0.1::{probe_port}",
           built["env_server"], *container["args"]]
    cid = _run(cmd, env=podman_env, timeout=120).stdout.strip()
    try:
        def host_port(port: int) -> int:
            out = _run([DOCKER, "port", cid, f"{port}/tcp"], env=podman_env).stdout
            return int(out.strip().splitlines()[0].rsplit(":", 1)[1])

        url = f"http://127.0.0.1:{host_port(http_port)}"
        probe_url = f"http://127.0.0.1:{host_port(probe_port)}"
        _wait_health(probe_url, cid, podman_env)  # the startup probe's endpoint
        _wait_health(url, cid, podman_env)
        refs = [v["valueFrom"]["secretKeyRef"] for v in container["env"]
                if v["name"] == "SDAR_ENV_OPERATOR_TOKEN" and "valueFrom" in v]
        yield {"cid": cid, "url": url, "probe_url": probe_url, "env": podman_env, "container": container,
               "operator_token": secret_data[(refs[0]["name"], refs[0]["key"])] if refs else None,
               "grace_s": chart_pod["grace_s"]}
    finally:
        _run([DOCKER, "rm", "--force", "--time", "0", cid], env=podman_env, check=False)


def _expert_local(task_id: str, max_steps: int = 60):
    from sdar_envs.base import make_env

    env = make_env(FAMILY)
    steps = [env.reset(task_id=task_id)]
    actions = []
    while not steps[-1].done and len(actions) < max_steps:
        actions.append(env.expert_action())
        steps.append(env.step(actions[-1]))
    env.close()
    return actions, steps


def _same(got, expected, where) -> None:
    from sdar_envs.base import METADATA_KEYS

    assert (got.observation, got.reward, got.done) == (expected.observation, expected.reward, expected.done), where
    for key in METADATA_KEYS:
        assert got.metadata[key] == expected.metadata[key], (where, key)


def test_env_server_runs_as_the_chart_pod(env_server):
    """The container is what the pod spec asks for: the chart's args, uid/gid 10001, no capabilities, nothing
    writable but /tmp."""
    cid, env, container = env_server["cid"], env_server["env"], env_server["container"]
    assert container["args"][:4] == ["envs", "serve", "--env", FAMILY]
    check = (
        "import os, pathlib\n"
        "print(os.getuid(), os.getgid())\n"
        "caps = dict(l.split(':\\t') for l in open('/proc/1/status').read().splitlines() if l.startswith('Cap'))\n"
        "print(caps['CapEff'].strip(), caps['CapBnd'].strip())\n"
        "for p in ('/opt/venv/x', '/x', '/var/tmp/x', '/tmp/x'):\n"
        "    try:\n"
        "        pathlib.Path(p).write_text('x'); print(p, 'writable')\n"
        "    except OSError:\n"
        "        print(p, 'read-only')\n"
        "print(open('/proc/1/cmdline').read().split(chr(0))[:-1])\n"
    )
    out = _run([DOCKER, "exec", cid, "python", "-c", check], env=env).stdout.splitlines()
    assert out[0] == "10001 10001"
    assert out[1] == "0000000000000000 0000000000000000"
    assert out[2:6] == ["/opt/venv/x read-only", "/x read-only", "/var/tmp/x read-only", "/tmp/x writable"]
    # PID 1 is the image's entry point (python running sdar-envs) with exactly the chart's args
    cmdline = ast.literal_eval(out[6])
    assert cmdline[1] == "/opt/venv/bin/sdar-envs" and cmdline[2:] == container["args"], cmdline


def test_expert_household_episodes_over_the_wire(env_server):
    """An expert episode over the sdar_envs client (WebSocket) and one over the plain HTTP session routes:
    each the local episode exactly, and won; the operator token from the chart's Secret lists the sessions."""
    from sdar_envs.base import make_env
    from sdar_envs.client import RemoteEnv, fetch_observation, http_json, step_from_payload

    url = env_server["url"]
    info = http_json("GET", f"{url}/info")
    assert info.get("family") == FAMILY, info
    with RemoteEnv(url, FAMILY) as remote:
        task_ids = remote.task_ids("test")
        assert task_ids == make_env(FAMILY).task_ids("test")
        actions, expected = _expert_local(task_ids[0])
        got = [remote.reset(task_id=task_ids[0])] + [remote.step(a) for a in actions]
        for t, (g, e) in enumerate(zip(got, expected, strict=True)):
            _same(g, e, ("websocket", t))
        assert got[-1].done and got[-1].metadata["won"] is True
        assert remote.observation_at(len(got) // 2) == got[len(got) // 2]

    task_id = task_ids[len(task_ids) // 2]
    actions, expected = _expert_local(task_id)
    created = http_json("POST", f"{url}/sessions")
    sid, token = created["session_id"], created["session_token"]
    got = [step_from_payload(http_json("POST", f"{url}/sessions/{sid}/reset", {"task_id": task_id}, token=token))]
    for a in actions:
        got.append(step_from_payload(http_json("POST", f"{url}/sessions/{sid}/step", {"action": {"message": a}},
                                               token=token)))
    for t, (g, e) in enumerate(zip(got, expected, strict=True)):
        _same(g, e, ("http", t))
    assert got[-1].done and got[-1].metadata["won"] is True
    assert fetch_observation(url, sid, 0, token=token) == got[0]
    if env_server["operator_token"]:
        listed = http_json("GET", f"{url}/sessions", token=env_server["operator_token"])
        assert sid in {s["session_id"] for s in listed["sessions"]}, listed
    assert http_json("DELETE", f"{url}/sessions/{sid}", token=token)["closed"] is True


def test_env_server_stops_within_the_grace_period(env_server):
    """SIGTERM (what the kubelet sends) ends the server before terminationGracePeriodSeconds runs out."""
    cid, env, grace = env_server["cid"], env_server["env"], env_server["grace_s"]
    start = time.monotonic()
    _run([DOCKER, "stop", "--time", str(grace), cid], env=env, timeout=grace + 60)
    took = time.monotonic() - start
    code = _run([DOCKER, "inspect", "--format", "{{.State.ExitCode}}", cid], env=env).stdout.strip()
    assert took < grace, f"still running {took:.0f} s after SIGTERM (grace {grace} s)"
    assert code in ("0", "143"), f"exit code {code} after SIGTERM"


# ---- the trainer, as the training pods run it ----------------------------------------------------------


def test_trainer_selfcheck_in_the_training_pods_context(built, podman_env):
    """`sdar demo --selfcheck` in the CPU trainer image with the restricted context that sdar.launch.pods gives the
    training pods (uid/gid 10001, read-only root, no capabilities, /tmp and /workspace/runs emptyDirs)."""
    from sdar.launch.pods import RUN_AS_GROUP, RUN_AS_USER, WRITABLE_DIRS

    container = {
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "privileged": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True},
        "volumeMounts": [{"name": name, "mountPath": path} for name, (path, _) in WRITABLE_DIRS.items()],
    }
    pod = {
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_GROUP,
                            "fsGroup": RUN_AS_GROUP, "seccompProfile": {"type": "RuntimeDefault"}},
        "volumes": [{"name": name, "emptyDir": {"sizeLimit": size}} for name, (_, size) in WRITABLE_DIRS.items()],
        "containers": [container],
    }
    flags = pod_run_flags(pod, container, {})
    out = _run([DOCKER, "run", "--rm", "--network", "none", *flags, built["trainer"], "demo", "--selfcheck",
                "--mode", "quick"], env=podman_env, timeout=900)
    assert "self-check passed" in out.stdout, out.stdout[-3000:]
    version = _run([DOCKER, "run", "--rm", "--network", "none", *flags, "--entrypoint", "python", built["trainer"],
                    "-c", "import torch, sdar; print(torch.__version__, torch.version.cuda, sdar.__version__)"],
                   env=podman_env, timeout=300).stdout.split()
    assert version[0].endswith("+cpu") and version[1] == "None", version


# ---- the build secret ------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["env_server", "trainer"])
def test_the_build_ca_bundle_is_in_no_layer(built, podman_env, which):
    """The CA bundle reached pip through the secret mount only: no /run/secrets, no pip configuration or PIP_*
    setting in the image, and no certificate private to the build machine (in none of the public bundles the
    image carries as their packages shipped them: Debian's, certifi's, botocore's...; tests/deploy/ca_bundles.py)
    in any layer, deleted files included (`podman image save`: every layer's tar), as PEM or DER."""
    if built["ca"] is None:
        pytest.skip("the build got no CA bundle (none configured on this machine)")
    image, env = built[which], podman_env
    out = _run([DOCKER, "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c",
                "ls -A /run/secrets 2>&1; echo --; pip config list; echo --; env | grep -i '^pip_' || true"],
               env=env).stdout
    secrets_dir, pip_config, pip_env = (part.strip() for part in out.split("--"))
    assert "No such file" in secrets_dir or not secrets_dir, secrets_dir
    assert not pip_config and not pip_env, out
    config = _run([DOCKER, "image", "inspect", "--format", "{{json .Config.Env}} {{json .History}}", image],
                  env=env).stdout
    assert "PIP_CERT" not in config and built["ca"] not in config

    # the image's public bundles, read inside it by its own python (stdlib only: the module's source on stdin)
    found = json.loads(_run([DOCKER, "run", "--rm", "-i", "--network", "none", "--entrypoint", "python", image,
                             "-", "/"], env=env, input=Path(ca_bundles.__file__).read_text()).stdout)
    assert found["public"], f"{image} carries no CA bundle its packages shipped: is dpkg's or pip's record gone?"
    private = ca_bundles.private_certificates(Path(built["ca"]).read_bytes(), found["public"].values())
    if not private:
        pytest.skip("every certificate of the build's bundle is in a public bundle of the image")
    needles = {n: der for der in private for n in ca_bundles.layer_needles(der)}
    with subprocess.Popen([DOCKER, "image", "save", "--format", "docker-archive", image], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as save:
        hit = ca_bundles.first_needle_in(save.stdout, list(needles))
        save.stdout.close()
    assert hit is None, (
        f"a certificate private to the build machine ({len(private)} of {built['ca']} are in no public bundle of "
        f"the image) is in a layer of {image}: find the file with `podman run --rm --entrypoint grep {image} -rl "
        f"{base64.b64encode(needles[hit]).decode()[64:128]} /`; bundles changed since their packages shipped "
        f"them: {found['modified'] or 'none'}")
    assert save.returncode == 0, f"podman image save {image} exited {save.returncode}"
