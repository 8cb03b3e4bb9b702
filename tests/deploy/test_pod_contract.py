"""The pod the chart describes, run for real without a cluster: the rendered args and environment,
uid 10001 with no capabilities, a read-only root filesystem and emptyDirs as the only writable paths."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

import sdar
from sdar.ports import free_port as _free_port
from sdar_envs.base import METADATA_KEYS
from tests.deploy.conftest import CHART, FAMILIES, REPO, Rendered, run_helm
from tests.deploy.test_env_server_image import DOCKERFILE, parse_dockerfile

UID = 10001

# Inside a private mount namespace: a fresh tmpfs for /tmp, built at a staging point on the real
# /tmp so that the paths uid 10001 must read which lie under /tmp (a checkout or venv there) are
# bound into it read-only before it hides the real /tmp; the paths to read elsewhere carried over
# any 0700 parent (e.g. /root holding pyenv); fresh tmpfs emptyDirs; every other mount remounted
# read-only; a check that the repository really is read-only; then the server as uid 10001 with
# no capabilities.
SANDBOX = r"""
set -eu
cwd=$(pwd)
stage=$(mktemp -d /tmp/.sdar-pod-XXXXXX)
trap 'cd /; umount -R "$stage" 2>/dev/null || true; rmdir "$stage" 2>/dev/null || true' EXIT
mount -t tmpfs -o mode=1777,size=512m tmpfs "$stage"
for path in $TMP_READ; do
  at=$stage${path#/tmp}
  if [ -e "$at" ]; then :  # inside a path bound already
  elif [ -d "$path" ]; then (umask 022; mkdir -p "$at")
  else (umask 022; mkdir -p "${at%/*}"); : > "$at"; fi
  mount --bind "$path" "$at"
  mount -o remount,bind,ro "$at"
done
cd /tmp
mount --move "$stage" /tmp
rmdir "${stage#/tmp/}"  # through the working directory, the real /tmp: leave nothing there
cd /
trap - EXIT
mkdir /tmp/.stage
i=0
for path in $CARRY; do mkdir /tmp/.stage/$i; mount --bind "$path" /tmp/.stage/$i; i=$((i+1)); done
for dir in $BLOCKERS; do mount -t tmpfs -o mode=755 tmpfs "$dir"; done
i=0
for path in $CARRY; do mkdir -p "$path"; mount --move /tmp/.stage/$i "$path"; i=$((i+1)); done
rm -rf /tmp/.stage
for dir in $EMPTYDIRS; do mkdir -p "$dir"; mount -t tmpfs -o mode=1777,size=512m tmpfs "$dir"; done
for mp in $(awk '{print $5}' /proc/self/mountinfo); do
  case "$mp" in /tmp|/tmp/*|/proc|/proc/*|/sys|/sys/*|/dev|/dev/*) continue;; esac
  mount -o remount,bind,ro "$mp" 2>/dev/null || true
done
if touch "$PROBE" 2>/dev/null; then rm -f "$PROBE"; echo "sandbox: the root filesystem is still writable" >&2; exit 97; fi
cd "$cwd" 2>/dev/null || cd /  # the working directory as seen inside the sandbox
exec setpriv --reuid $POD_UID --regid $POD_UID --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all -- "$@"
"""


def _sandbox_or_skip() -> None:
    if os.geteuid() != 0:
        pytest.skip(
            "emulating the pod needs root (mount namespaces, setpriv); run as root or in CI"
        )
    probe = subprocess.run(
        ["unshare", "--mount", "--fork", "--propagation", "private", "true"],
        check=False,
        capture_output=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"mount namespaces are not available here ({probe.stderr.decode().strip()})")


def _blocker(path: Path) -> Path | None:
    """The topmost parent of `path` that others cannot traverse (so uid 10001 could not reach it)."""
    for parent in reversed(path.parents):
        if parent != Path("/") and not os.stat(parent).st_mode & stat.S_IXOTH:
            return parent
    return None


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    start = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                assert resp.status == 200
                return
        except OSError:
            if proc.poll() is not None:
                pytest.fail(
                    f"the pod's server exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
                )
            if time.monotonic() - start > timeout_s:
                pytest.fail(f"no /health within {timeout_s} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.25)


def _server_pid(root: int) -> int:
    """The innermost descendant of `root` (unshare -> sh -> exec setpriv -> exec sdar)."""
    pid = root
    while True:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if not kids:
            return pid
        pid = int(kids[0])


def _status(pid: int) -> dict[str, str]:
    return dict(
        line.split(":\t", 1)
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if ":\t" in line
    )


def sandboxed(
    command: list[str], emptydirs: list[str] = (), extra_read: list[Path] = ()
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) that run `command` as the pod would: uid 10001, no capabilities, read-only root,
    a fresh /tmp and the given emptyDirs (which must lie under /tmp, to add nothing to this machine)."""
    assert all(d.startswith("/tmp/") for d in emptydirs), emptydirs
    needed = [
        Path(sys.base_prefix).resolve(),
        Path(sys.prefix).resolve(),
        Path(sdar.__file__).resolve().parents[1],
        REPO,  # what the read-only probe writes into
        *(Path(p).resolve() for p in extra_read),
    ]
    needed = sorted(set(needed), key=lambda p: (len(p.parts), str(p)))  # parents first
    tmp = Path("/tmp")
    # under /tmp (a checkout there): bound read-only into the fresh /tmp, whatever their parents
    under_tmp = [p for p in needed if tmp in p.parents]
    assert tmp not in needed, "/tmp itself cannot be carried into the pod's fresh /tmp"
    for d in map(Path, emptydirs):
        clash = [p for p in under_tmp if p == d or d in p.parents or p in d.parents]
        assert not clash, f"the emptyDir {d} overlaps paths the pod must read: {clash}"
    carry = [p for p in needed if tmp not in p.parents and _blocker(p)]
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "TMP_READ": " ".join(map(str, under_tmp)),
        "CARRY": " ".join(map(str, carry)),
        "BLOCKERS": " ".join(sorted({str(_blocker(p)) for p in carry})),
        "EMPTYDIRS": " ".join(emptydirs),
        "PROBE": str(REPO / ".ro-probe"),
        "POD_UID": str(UID),
    }
    argv = [
        "unshare",
        "--mount",
        "--fork",
        "--propagation",
        "private",
        "--kill-child=SIGTERM",
        "sh",
        "-c",
        SANDBOX,
        "sandbox",
        *command,
    ]
    return argv, env


def test_the_sandbox_is_read_only_and_unprivileged(tmp_path):
    # the emulation itself: what the pod may and may not do
    _sandbox_or_skip()
    script = (
        f"id -u; id -g; touch {REPO}/.sandbox-write && echo REPO_WRITABLE; touch /etc/x 2>/dev/null && echo ETC_WRITABLE; "
        f"touch /tmp/ok && echo TMP_OK; touch /tmp/cache-x/ok && echo CACHE_OK; ls {REPO}/src/sdar/__init__.py"
    )
    argv, env = sandboxed(["sh", "-c", script], emptydirs=["/tmp/cache-x"])
    proc = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split("\n")[:2] == [str(UID), str(UID)], proc.stdout + proc.stderr
    assert "Read-only file system" in proc.stderr
    assert "REPO_WRITABLE" not in proc.stdout and "ETC_WRITABLE" not in proc.stdout
    assert "TMP_OK" in proc.stdout and "CACHE_OK" in proc.stdout
    assert f"{REPO}/src/sdar/__init__.py" in proc.stdout  # the code stays readable for uid 10001
    assert not (REPO / ".sandbox-write").exists() and not Path("/tmp/cache-x").exists()


@contextlib.contextmanager
def run_pod(render, values: dict, family: str, tmp_path: Path, extra_read: list[Path] = ()):
    """Start the container of `family`'s Deployment as the chart renders it; yields (url, probe_url, proc, log):
    its clients' port and the port the kubelet's probes hit."""
    port, probe_port = _free_port(), _free_port()
    deploy = render({**values, "containerPort": port, "probePort": probe_port}).get("Deployment", f"sdar-envs-{family}")
    pod = deploy["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert (
        pod["securityContext"]["runAsUser"] == UID
        and c["securityContext"]["readOnlyRootFilesystem"] is True
    )

    # the image's environment, with its venv at this checkout's venv, then the container's env
    _, stages = parse_dockerfile(DOCKERFILE.read_text())
    env = stages[-1].env()
    venv_bin = Path(sys.executable).parent
    env["PATH"] = env["PATH"].replace("/opt/venv/bin", str(venv_bin))
    env.update({e["name"]: e["value"] for e in c.get("env", []) if "value" in e})
    args = [
        "127.0.0.1" if a == "0.0.0.0" else a for a in c["args"]
    ]  # loopback only on a test machine

    volumes = {v["name"]: v for v in pod["volumes"]}
    emptydirs = [
        m["mountPath"]
        for m in c["volumeMounts"]
        if "emptyDir" in volumes[m["name"]] and m["mountPath"] != "/tmp"
    ]
    command = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), str(venv_bin / "sdar"), *args]
    argv, sandbox_env = sandboxed(command, emptydirs, extra_read)
    log = tmp_path / f"{family}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            argv, env=sandbox_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{probe_port}", proc, log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def pods(helm, tmp_path_factory):
    """The three families' pods with default values, started together (their imports overlap)."""
    _sandbox_or_skip()
    tmp = tmp_path_factory.mktemp("pods")

    def render(values):
        return Rendered(
            [
                o
                for o in yaml.safe_load_all(
                    run_helm(helm, "template", "sdar-envs", values=values, tmp_dir=tmp, chart=CHART)
                )
                if o
            ]
        )

    with contextlib.ExitStack() as stack:
        t0 = time.monotonic()
        started = {f: stack.enter_context(run_pod(render, {}, f, tmp)) for f in FAMILIES}
        out = {}
        for family, (url, probe_url, proc, log) in started.items():
            _wait_healthy(probe_url, proc, log)  # as the kubelet sees it
            _wait_healthy(url, proc, log)
            out[family] = (url, _server_pid(proc.pid), time.monotonic() - t0)
        yield out


@pytest.mark.parametrize("family", FAMILIES)
def test_the_rendered_pod_serves_an_expert_episode(pods, family):
    from sdar_envs.base import make_env
    from sdar_envs.client import RemoteEnv

    url, pid, startup_s = pods[family]
    status = _status(pid)
    assert status["Uid"].split() == [str(UID)] * 4 and status["Gid"].split() == [str(UID)] * 4
    assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"
    # the expert's moves, computed on a local env, win the same task on the pod's server
    local = make_env(family)
    task_id = local.task_ids("test")[0]
    steps = [local.reset(task_id=task_id)]
    actions = []
    while not steps[-1].done and len(actions) < 60:
        actions.append(local.expert_action())
        steps.append(local.step(actions[-1]))
    with RemoteEnv(url, family) as remote:
        first = remote.reset(task_id=task_id)
        assert first.observation == steps[0].observation
        last = first
        for action in actions:
            last = remote.step(action)
        assert all(key in last.metadata for key in METADATA_KEYS)
        assert last.done and last.metadata["won"] is True
        assert last.reward == steps[-1].reward
    print(
        f"{family}: healthy within {startup_s:.1f} s of the start, as uid {UID} on a read-only root"
    )


def _alfworld_data() -> Path | None:
    for candidate in (
        os.environ.get("SDAR_ALFWORLD_DATA"),
        REPO.parent / "shared" / "data" / "alfworld",
    ):
        if candidate and Path(candidate).exists():
            return Path(candidate).resolve()
    return None


@pytest.mark.alfworld
@pytest.mark.slow
def test_the_alfworld_pod_unpacks_games_into_its_emptydir(render, tmp_path):
    _sandbox_or_skip()
    data = _alfworld_data()
    if data is None:
        pytest.skip(
            "no ALFWorld games: set SDAR_ALFWORLD_DATA or put them in ../shared/data/alfworld"
        )
    from sdar_envs.client import RemoteEnv

    values = {
        "household": {
            "backend": "alfworld",
            # the claim's mount is emulated by the games' real path (read-only like every path here);
            # the cache emptyDir is a fresh tmpfs
            "alfworld": {
                "dataPVC": "games",
                "dataMountPath": str(data),
                "cacheMountPath": "/tmp/alfworld-cache",
            },
        }
    }
    with run_pod(render, values, "household", tmp_path, extra_read=[data]) as (url, _probe_url, proc, log):
        _wait_healthy(url, proc, log)
        pid = _server_pid(proc.pid)
        with RemoteEnv(url, "household") as remote:
            out = remote.reset(seed=0)
            assert out.metadata["task"] and out.metadata["task_type"]
            actions = out.metadata["admissible_actions"]
            assert len(actions) > 3
            step = remote.step(actions[0])
            assert all(key in step.metadata for key in METADATA_KEYS)
            assert step.metadata["valid_action"] is True
        # the games went into the emptyDir: look inside the pod's mount namespace
        cache = Path(f"/proc/{pid}/root/tmp/alfworld-cache/alfworld")
        unpacked = [p for p in cache.rglob("game.tw-pddl")]
        assert len(unpacked) >= 100, f"{len(unpacked)} games in {cache}"
