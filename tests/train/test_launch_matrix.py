"""The shapes the operators run, run here: the exact command and environment each launcher gives its pods (Kubeflow
Trainer 2.3's torch-distributed runtime: `torchrun -m sdar.cli train ...` with the torch plugin's PET_* variables;
TorchX's dist.ddp component: `bash -c "torchrun --rdzv_backend c10d ..."` with its macros substituted), executed
under torchrun with gloo at 1, 2 and 3 ranks, for ddp and fsdp, LoRA and full fine-tuning, and each arm family
(grpo; sdar; sdar_composer, which adds the hint and replay channels). Every cell trains step 0 at one rank count,
checkpoints, and resumes step 1 at another (to a local directory or through S3), so each cell is also a resume
across rank counts; its losses and final weights must equal a one-process run of both steps on the same global
batch: losses to 1e-4 relative (1e-6 absolute), the same counts, and weights to 1% of one optimizer step (optim.lr):
summation order differs between rank counts, and Adam's normalisation lifts a rounding difference in a near-zero
gradient element towards a whole step, so no tighter bound holds on every machine.

The cells cover the factors pairwise (every rank count with every strategy, with LoRA and full fine-tuning, with
each arm family and each launcher; every launcher with every strategy, tuning and arm), and the resumes
2 -> 1, 1 -> 3, 3 -> 2 under ddp and under fsdp, and ddp -> fsdp. What runs here differs from a cluster only in
where the ranks meet (127.0.0.1 and a free port instead of the rank-0 pod's DNS name and port 29500) and in the
credentials (this machine's environment, where the pods read Kubernetes Secrets).

Also: a bfloat16 model (float32 adapter) under fsdp at 2 ranks tracks its one-process run to bfloat16's rounding;
a rank killed mid-step (SIGKILL) ends the job non-zero naming it, and a restart resumes where the straight run
would be; a rendezvous that cannot complete ends within SDAR_DIST_TIMEOUT_S naming the rank, backend and address;
a global batch that cannot be split over the ranks is refused at start naming the numbers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from sdar.ports import free_port as _free_port

from .test_distributed import RUN

REPO = Path(__file__).resolve().parents[2]
CONFIG = "configs/household-tiny.yaml"
COMPARED = ("loss/total", "loss/pg", "loss/kl", "loss/entropy", "loss/sdar", "loss/hint_jsd", "loss/replay_dpo",
            "pg/clipfrac", "pg/ratio_mean", "sdar/gate_mean", "sdar/gap_mean", "grad_norm", "teacher/gap_all_tokens")
EXACT = ("reward", "success", "episode_length", "invalid_action_rate", "turn_samples", "updates", "hint/error_sites",
         "replay/pairs_in_loss")
TIMEOUT_S = 60  # SDAR_DIST_TIMEOUT_S of every launch: a rank that waits longer fails the test, never hangs it


@dataclass(frozen=True)
class Cell:
    arm: str
    lora: bool
    first: tuple[str, int]  # (strategy, ranks) of step 0
    then: tuple[str, int]  # of step 1, resumed from step 0's checkpoint
    launcher: str  # trainjob | torchx
    store: str  # local | s3

    @property
    def id(self) -> str:
        (s1, n1), (s2, n2) = self.first, self.then
        how = s1 if s1 == s2 else f"{s1}-to-{s2}"
        return f"{self.arm}-{'lora' if self.lora else 'full'}-{how}-{n1}to{n2}-{self.launcher}-{self.store}"


CELLS = [
    Cell("grpo", True, ("ddp", 2), ("ddp", 1), "trainjob", "local"),
    Cell("grpo", False, ("fsdp", 1), ("fsdp", 3), "torchx", "s3"),
    Cell("sdar", True, ("fsdp", 3), ("fsdp", 2), "trainjob", "s3"),
    Cell("sdar", False, ("ddp", 1), ("ddp", 3), "torchx", "local"),
    Cell("sdar_composer", True, ("ddp", 3), ("ddp", 2), "torchx", "s3"),
    Cell("sdar_composer", False, ("fsdp", 2), ("fsdp", 1), "trainjob", "local"),
    Cell("sdar", True, ("ddp", 2), ("fsdp", 3), "trainjob", "s3"),
]


def test_the_cells_cover_every_pair_of_factors():
    """The pairwise design holds: this test fails when a cell is taken out that a pair needs."""
    seen = set()
    for c in CELLS:
        for strategy, ranks in (c.first, c.then):
            level = {"ranks": ranks, "strategy": strategy, "tuning": c.lora, "arm": c.arm, "launcher": c.launcher}
            seen |= {(a, level[a], b, level[b]) for a in level for b in level if a < b}
    levels = {"ranks": [1, 2, 3], "strategy": ["ddp", "fsdp"], "tuning": [True, False],
              "arm": ["grpo", "sdar", "sdar_composer"], "launcher": ["trainjob", "torchx"]}
    missing = [(a, x, b, y) for a in levels for b in levels if a < b for x in levels[a] for y in levels[b]
               if (a, x, b, y) not in seen]
    assert not missing, missing
    resumes = {(c.first[0], c.first[1], c.then[0], c.then[1]) for c in CELLS}
    for strategy in ("ddp", "fsdp"):
        for n1, n2 in ((2, 1), (1, 3), (3, 2)):
            assert (strategy, n1, strategy, n2) in resumes
    assert any(c.first[0] == "ddp" and c.then[0] == "fsdp" for c in CELLS)
    assert {c.store for c in CELLS} == {"local", "s3"}


def _overrides(cell_arm: str, lora: bool, steps: int, out: Path, strategy: str, uri: str | None) -> dict:
    o = {**RUN, "arm": cell_arm, "model.lora": lora, "steps": steps, "tracking": False, "output_dir": str(out),
         "distributed.strategy": strategy}
    if uri:
        o["checkpoint.uri"] = uri
    return o


def pod_command(launcher: str, overrides: dict, ranks: int) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of the single node's container, as the launcher makes it for `ranks` workers, meeting on this
    machine: the TrainJob's node 0 (Kubeflow Trainer 2.3, tests/deploy/trainer_runtime.py) or TorchX's replica 0
    (tests/deploy/torchx_runtime.py)."""
    from sdar.config import load_config

    cfg = load_config(CONFIG, {**overrides, "launch.nodes": 1, "launch.procs_per_node": ranks,
                               "launch.gpus_per_node": 0, "launch.scheduler": "kubernetes"})
    port = _free_port()
    if launcher == "trainjob":
        from sdar.launch.trainjob import trainjob_for_config
        from tests.deploy.trainer_runtime import node_command

        return node_command(trainjob_for_config(cfg, CONFIG, overrides), 0, master_addr="127.0.0.1", master_port=port)
    from sdar.launch.torchx_job import app_for_config
    from tests.deploy.torchx_runtime import replica_command

    argv, env = replica_command(app_for_config(cfg, CONFIG, overrides), 0, rank0_host="127.0.0.1")
    # the rendezvous port: TorchX's default (29500) would collide with another job on this machine
    return [a.replace(":29500 ", f":{port} ") for a in argv], env


def _env(pod_env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    env.update(pod_env)
    # the image's torchrun is the interpreter's; gloo on these CPUs, one thread per rank
    env.update({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", "SDAR_DIST_BACKEND": "gloo",
                "OMP_NUM_THREADS": "1", "SDAR_DIST_TIMEOUT_S": str(TIMEOUT_S), "PYTHONPATH": str(REPO)})
    return env


PORT_TRIES = 3


def port_taken(log: str) -> bool:
    """torchrun's rendezvous store could not listen on the port: another process took it between `_free_port`'s
    check and torchrun's bind (CI once saw a parallel test's gloo socket take a port drawn from the kernel's
    ephemeral range; `free_port` now draws below it, where only a process asking for that number can). The agent
    fails before any rank starts, so nothing was written and the same command on a fresh port is the same launch
    (a cluster's pod owns its port 29500)."""
    return "EADDRINUSE" in log and "failed to listen" in log


def run_pod(launcher: str, overrides: dict, ranks: int, timeout: float = 600, env: dict | None = None
            ) -> tuple[list[str], subprocess.CompletedProcess]:
    """The pod's command run to its end, on a fresh port when the port was taken before torchrun bound it."""
    for _ in range(PORT_TRIES):
        argv, pod_env = pod_command(launcher, overrides, ranks)
        proc = subprocess.run(argv, cwd=REPO, env={**_env(pod_env), **(env or {})}, capture_output=True, text=True,
                              timeout=timeout)
        if not (proc.returncode and port_taken(proc.stderr + proc.stdout)):
            break
    return argv, proc


def launch(launcher: str, overrides: dict, ranks: int, timeout: float = 600, env: dict | None = None
           ) -> subprocess.CompletedProcess:
    argv, proc = run_pod(launcher, overrides, ranks, timeout, env)
    assert proc.returncode == 0, f"{' '.join(argv)[:400]}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


@pytest.fixture(scope="module")
def references(tiny_ckpt, tmp_path_factory):
    """One process, two steps, per (arm, LoRA): built when a cell first asks."""
    from sdar.config import load_config
    from sdar.train import Trainer

    root, done = tmp_path_factory.mktemp("one-process"), {}

    def get(arm: str, lora: bool) -> Path:
        if (arm, lora) not in done:
            out = root / f"{arm}-{lora}"
            Trainer(load_config(CONFIG, _overrides(arm, lora, 2, out, "ddp", None))).run()
            done[arm, lora] = out
        return done[arm, lora]

    return get


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted((out / "final").glob("*.safetensors"))
    assert files, f"no final weights in {out / 'final'}"
    return {k: v for f in files for k, v in load_file(f).items()}


def assert_same_run(one: Path, many: Path, label: str, later: tuple[float, float] = (1e-4, 1e-6),
                    steps: float = 0.01) -> list[str]:
    """The run in `many` made the same updates as the one-process run in `one`; returns the compared figures.
    Step 0's losses agree to 1e-4 relative (1e-6 absolute), step 1's to `later` (relative, absolute), the final
    weights to `steps` optimizer steps (optim.lr)."""
    h1, h2 = (json.loads((d / "history.json").read_text()) for d in (one, many))
    assert [h["step"] for h in h1] == [h["step"] for h in h2] == [0, 1], label
    report = []
    for a, b in zip(h1, h2):
        assert a["updates"] >= 2 and abs(a["loss/pg"]) > 1e-4 and a["grad_norm"] > 0, (label, a)
        for key in EXACT:
            if key in a:
                assert b.get(key) == a[key], (label, a["step"], key, a[key], b.get(key))
        for key in COMPARED:
            if key in a:
                report.append(f"{label} step {a['step']} {key}: {a[key]:.8f} vs {b[key]:.8f}")
                rel, abs_ = (1e-4, 1e-6) if a["step"] == 0 else later
                assert b[key] == pytest.approx(a[key], rel=rel, abs=abs_), (label, a["step"], key)
    wa, wb = _weights(one), _weights(many)
    assert wa.keys() == wb.keys() and wa
    diff = max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)
    report.append(f"{label}: largest weight difference {diff:.3e} (bound: {steps:g} of a step, "
                  f"{steps * RUN['optim.lr']:.0e})")
    assert diff <= steps * RUN["optim.lr"], (label, diff)
    return report


@pytest.mark.slow
@pytest.mark.parametrize("cell", CELLS, ids=[c.id for c in CELLS])
def test_each_launcher_at_each_rank_count_trains_as_one_process(cell, references, tmp_path, request):
    uri = None
    if cell.store == "s3":
        bucket = request.getfixturevalue("s3_server").make_bucket()
        uri = f"s3://{bucket}/run"
    out = tmp_path / "run"
    (s1, n1), (s2, n2) = cell.first, cell.then
    tracked = cell == CELLS[0]  # one cell tracks: rank 0 alone writes MLflow, and the resume continues its run
    env, extra = {}, {}
    if tracked:
        from sdar.tracking import prepare_sqlite_store

        env["MLFLOW_TRACKING_URI"] = prepare_sqlite_store(tmp_path / "mlflow.db")
        extra["tracking"] = True
    launch(cell.launcher, {**_overrides(cell.arm, cell.lora, 1, out, s1, uri), **extra}, n1, env=env)
    from sdar.storage import open_store
    from sdar.train.checkpoint import latest_checkpoint

    store = open_store(uri or str(out))
    step, rel = latest_checkpoint(store)
    assert step == 1
    if s1 == "fsdp":  # every rank's shard of the checkpoint reached the store
        names = {k.rsplit("/", 1)[-1] for k in store.list(f"{rel}/shards")}
        assert {f"__{r}_0.distcp" for r in range(n1)} | {".metadata"} <= names, names
    launch(cell.launcher, {**_overrides(cell.arm, cell.lora, 2, out, s2, uri), **extra}, n2, env=env)
    one = references(cell.arm, cell.lora)
    if tracked:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(env["MLFLOW_TRACKING_URI"])
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        assert len(runs) == 1 and runs[0].data.tags["arm"] == cell.arm, [r.info.run_id for r in runs]
        assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "loss/total")] == [0, 1]
    report = assert_same_run(one, out, cell.id)
    if cell.arm == "sdar_composer":  # the hint and replay channels were in the loss, at both rank counts
        h = json.loads((one / "history.json").read_text())
        assert h[0]["loss/hint_jsd"] > 0 and h[1]["loss/hint_jsd"] > 0
        assert h[1]["replay/pairs_in_loss"] > 0 and h[1]["loss/replay_dpo"] > 0
    print("\n".join(report))


@pytest.mark.slow
def test_a_bfloat16_model_under_fsdp_at_two_ranks_trains_as_one_process(tiny_ckpt, tmp_path):
    """The precision GPU users train in: a bfloat16 base with its float32 LoRA adapter (two dtypes in each FSDP unit)
    sharded over 2 ranks, through the TrainJob's pod command, makes the one-process bfloat16 run's two steps (group
    seeding makes the trajectories independent of the rank count in bfloat16 too). Step 0 starts both from the same
    weights and agrees as float32 runs do; step 1 starts from weights that differ by float32 summation order, which
    the bfloat16 forward rounds to its 2^-8: losses and statistics to 4e-3 relative (1e-4 absolute), weights to half
    a step (measured with model.cpu_mixed_precision, the default: losses within 1.4e-3, the weights 0.25 of a step;
    plain bfloat16 needs 1e-2 / 1e-4: its losses within 3e-3, the gap's mean 5.5e-3). The absolute bound is for
    teacher/gap_all_tokens, a mean near zero (-2.6e-4) of gaps of order 0.05 that each carry that rounding: 3.6e-5
    apart since the update and the scoring passes group their rows by length and content (a process's rows group
    otherwise than one rank's half), where every other figure agrees within 1.4e-3 relative."""
    from sdar.config import load_config
    from sdar.train import Trainer

    bf16 = {"model.dtype": "bfloat16"}
    one = tmp_path / "one"
    Trainer(load_config(CONFIG, {**_overrides("sdar", True, 2, one, "ddp", None), **bf16})).run()
    many = tmp_path / "fsdp"
    launch("trainjob", {**_overrides("sdar", True, 2, many, "fsdp", None), **bf16}, 2)
    print("\n".join(assert_same_run(one, many, "sdar-lora-bf16-fsdp-2", later=(4e-3, 1e-4), steps=0.5)))
    for d in (one, many):  # both trained the bfloat16 base
        assert json.loads((d / "final" / "sdar_policy.json").read_text())["spec"]["dtype"] == "bfloat16", d


@pytest.mark.slow
def test_dynamic_sampling_at_two_ranks_draws_on_each_rank_and_counts_every_group(tiny_ckpt, tmp_path):
    """rollout.filter_groups under torchrun (the TrainJob's pod command, 2 ranks, ddp): each rank draws until its own
    share of the groups moved, so the ranks may roll out different numbers of draws; nothing collective runs between
    draws (a rank left waiting would fail the launch at SDAR_DIST_TIMEOUT_S). Each step trains, and its group counts
    combine over the ranks: 3 groups a draw between them (rank 0 two, rank 1 one), at most 3 draws."""
    out = tmp_path / "run"
    launch("trainjob", {**_overrides("grpo", True, 2, out, "ddp", None), "rollout.filter_groups": True,
                        "rollout.filter_max_draws": 3}, 2)
    hist = json.loads((out / "history.json").read_text())
    assert [h["step"] for h in hist] == [0, 1]
    for h in hist:
        assert h["updates"] >= 1 and 3 <= h["groups/rolled_out"] <= 9, h
        flat = h["groups/zero_std_frac"] * h["groups/rolled_out"]
        assert flat == pytest.approx(round(flat)) and h["groups/zero_std_trained"] <= round(flat), h


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


@pytest.mark.slow
def test_a_rank_killed_mid_step_ends_the_job_and_a_restart_resumes(references, tmp_path):
    """Node loss: rank 1 of 2 gets SIGKILL during step 1 (after step 0's checkpoint). The job exits non-zero within
    the timeout, torchrun naming the dead rank; the same command again (the TrainJob's restart) resumes from the
    checkpoint and ends where the straight run does."""
    out = tmp_path / "run"
    overrides = _overrides("grpo", True, 2, out, "ddp", None)
    from sdar.train.checkpoint import LATEST_MARKER

    marker = out / LATEST_MARKER  # the default store, <output_dir> (its checkpoints/latest.json)
    killed, rank1, deadline = None, None, time.monotonic() + 300
    for _ in range(PORT_TRIES):
        argv, pod_env = pod_command("trainjob", overrides, 2)
        proc = subprocess.Popen(argv, cwd=REPO, env=_env(pod_env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        # find rank 1 first (`ps` takes a while on a loaded machine), then kill it the moment step 0's checkpoint is
        # there: a kill that waited for `ps` could land after step 1, when the job has nothing left to lose
        while rank1 is None and time.monotonic() < deadline and proc.poll() is None:
            rank1 = next((w for agent in _children(proc.pid) for w in [agent, *_children(agent)]
                          if _rank_of(w) == 1), None)
            time.sleep(0.05)
        if rank1 is not None or proc.poll() is None:
            break
        log = proc.communicate()[0]
        if not port_taken(log):
            raise AssertionError(f"rank 1 never started:\n{log[-3000:]}")
    try:
        assert rank1 is not None, "rank 1 never started"
        assert not marker.is_file(), "step 0's checkpoint came before rank 1 was found: nothing tests a kill mid-step"
        while killed is None and time.monotonic() < deadline and proc.poll() is None:
            if marker.is_file():
                os.kill(rank1, signal.SIGKILL)
                killed = time.monotonic()
            time.sleep(0.002)
        assert killed is not None, "step 0's checkpoint never came"
        assert json.loads(marker.read_text())["step"] == 1, marker.read_text()
        log, _ = proc.communicate(timeout=TIMEOUT_S + 30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    waited = time.monotonic() - killed
    assert proc.returncode != 0, log[-3000:]
    assert waited < TIMEOUT_S, waited
    assert "rank: 1" in log and "Signal 9 (SIGKILL)" in log, log[-3000:]
    assert not (out / "final").exists() or not any((out / "final").iterdir())
    restart = launch("trainjob", overrides, 2)  # the restart
    assert "resumed from" in restart.stderr and "at step 1" in restart.stderr, restart.stderr[-3000:]
    report = assert_same_run(references("grpo", True), out, "killed-and-restarted")
    print(f"the job ended {waited:.1f} s after rank 1 was killed\n" + "\n".join(report))


def test_a_rendezvous_that_cannot_complete_ends_naming_rank_backend_and_address(tiny_ckpt, tmp_path):
    """Rank 0 of a world of 2 whose rank 1 never comes: no silent wait, an error within SDAR_DIST_TIMEOUT_S."""
    args = [sys.executable, "-m", "sdar.cli", "train", "--config", CONFIG]
    for key, value in _overrides("grpo", True, 1, tmp_path / "run", "ddp", None).items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    for _ in range(PORT_TRIES):  # rank 0 listens on MASTER_PORT itself: a port taken meanwhile is tried afresh
        port = _free_port()
        env = _env({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port)})
        env["SDAR_DIST_TIMEOUT_S"] = "5"
        t0 = time.monotonic()
        proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        took = time.monotonic() - t0
        if not port_taken(proc.stderr):
            break
    assert proc.returncode != 0
    text = " ".join(proc.stderr.split())
    assert f"rank 0 of 2 (gloo) could not join the process group at 127.0.0.1:{port} within 5 s" in text, text[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert took < 60, took


@pytest.mark.slow
def test_a_batch_that_cannot_be_split_over_the_ranks_is_refused_at_start(tiny_ckpt, tmp_path, monkeypatch):
    """2 task groups over 3 ranks: refused before any rollout, naming both numbers. The first port offered is one
    another process holds (what a parallel test's socket can do to a port between `_free_port` and torchrun):
    torchrun's rendezvous fails to listen, `port_taken` reads that, and the launch goes again on a fresh port."""
    overrides = {**_overrides("grpo", True, 1, tmp_path / "run", "ddp", None), "tasks_per_step": 2}
    offered, fresh = [], _free_port
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()

        def offer() -> int:
            offered.append(fresh() if offered else held.getsockname()[1])
            return offered[-1]

        monkeypatch.setattr(sys.modules[__name__], "_free_port", offer)
        _, proc = run_pod("trainjob", overrides, 3, timeout=300)
    assert len(offered) == 2, offered  # the held port failed to listen, and the launch went again on a fresh one
    assert proc.returncode != 0
    text = " ".join((proc.stdout + proc.stderr).split())
    assert "tasks_per_step=2 task groups cannot be split over 3 ranks" in text, text[-3000:]
    assert "sdar/train/trainer.py" not in text, text[-3000:]  # a message, not our traceback (torchrun prints its own)
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_a_sharded_checkpoint_cut_off_half_uploaded_is_never_taken_and_a_restart_resumes_from_the_last_whole_one(
        references, s3_server, tmp_path):
    """Several ranks, one checkpoint (issue 43.6): fsdp at 2 ranks through S3 (moto), and step 2's upload cut off
    after rank 0's shard reached the bucket and before rank 1's (what a job stopped mid-upload leaves, in the order
    write_checkpoint uploads: the shards, then `_COMPLETE.json`, then `latest.json`). That checkpoint is never taken:
    the store's latest stays step 1, and a restart on a fresh pod (no local spool) at 1 rank resumes from step 1,
    clears the half upload, and ends where the straight one-process run does."""
    from sdar.storage import open_store
    from sdar.train.checkpoint import COMPLETE_FILE, checkpoint_path, latest_checkpoint

    uri = f"s3://{s3_server.make_bucket()}/run"
    launch("trainjob", _overrides("grpo", False, 1, tmp_path / "pod-a", "fsdp", uri), 2)
    store = open_store(uri)
    done, cut = checkpoint_path(1), checkpoint_path(2)
    assert {k.rsplit("/", 1)[-1] for k in store.list(f"{done}/shards")} >= {"__0_0.distcp", "__1_0.distcp"}
    # step 2's upload cut off: rank 0's shard and the metadata arrived, rank 1's shard did not, so neither did the
    # manifest nor the marker's move (its bytes: step 1's files, which a reader never opens without a manifest)
    for name in ("__0_0.distcp", ".metadata"):
        store.put_file(store.get_file(f"{done}/shards/{name}", tmp_path / name), f"{cut}/shards/{name}")
    assert not store.exists(f"{cut}/{COMPLETE_FILE}") and latest_checkpoint(store)[0] == 1

    restart = launch("trainjob", _overrides("grpo", False, 2, tmp_path / "pod-b", "fsdp", uri), 1)
    assert re.search(r"resumed from s3://\S+/step-000001 at step 1", restart.stderr), restart.stderr[-3000:]
    assert latest_checkpoint(store)[0] == 2
    assert {k.rsplit("/", 1)[-1] for k in store.list(f"{cut}/shards")} == {"__0_0.distcp", ".metadata"}
    print("\n".join(assert_same_run(references("grpo", False), tmp_path / "pod-b", "half-uploaded-then-1-rank")))
