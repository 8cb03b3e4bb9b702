"""The benchmark tables of docs/, each stamped with the commit, machine and command that measured it, and marked
stale once its benchmark's code has changed since that commit.

A table lives in a block of a docs/*.md file:

    <!-- bench train-step-cpu: 52d6de2 | 2-core CPU, torch 2.13 CPU | python benchmarks/bench_train_step.py ... -->
    > Measured at 52d6de2 on 2-core CPU, torch 2.13 CPU with `python benchmarks/bench_train_step.py ...`

    ...the table...
    <!-- /bench train-step-cpu -->

The line under the opening comment is written by this tool from the comment and `git log`: when a commit after the
stamped one touched the benchmark's code (BENCHES below: the benchmark and what it times), it says **stale** and
names the first such commit. docs/benchmarks.md's index (between <!-- bench-index --> and <!-- /bench-index -->) is
written from the same blocks.

    python tools/bench_tables.py run [--only ID,...] [--at REV]   # rerun (make bench), stamp, write the blocks
    python tools/bench_tables.py mark                              # rewrite every stamp line and the index
    python tools/bench_tables.py check                             # exit 1 when a line or the index is not current
    python tools/bench_tables.py list                              # the benchmarks, their commands and stamps

`run` measures the working tree (a stamp says "+changes" when the benchmark's code has uncommitted changes), or with
--at a clean export of that revision. Benchmarks that need what this machine lacks (a GPU, the ALFWorld games) are
skipped with the reason; the long ones run only when named in --only.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
INDEX = DOCS / "benchmarks.md"

# what the training step's benchmarks time: the trainer and everything a step runs
STEP_CODE = ("benchmarks/bench_train_step.py", "benchmarks/_shared.py", "src/sdar/train", "src/sdar/models",
             "src/sdar/agent", "src/sdar/teacher", "src/sdar/algos", "src/sdar/config", "envs/src/sdar_envs/household",
             "configs/household-tiny.yaml")
WARMSTART_CODE = ("benchmarks/bench_warmstart.py", "src/sdar/train/warmstart.py", "src/sdar/models", "src/sdar/agent",
                  "src/sdar/eval", "envs/src/sdar_envs")


@dataclass(frozen=True)
class Bench:
    """One benchmark table. command: what `run` executes from the repository root (its stdout is the table; a
    command printing markdown tables is written as markdown, anything else as a text block); code: the paths whose
    change makes the table stale; needs: gpu | alfworld | "" (what `run` checks first); long: runs only when named
    in --only; where: the table's section, for the index."""

    title: str
    command: str
    code: tuple[str, ...]
    where: str
    needs: str = ""
    long: bool = False
    table_from: str = ""  # a command that prints its progress to stdout: its table starts at the first line with this


BENCHES: dict[str, Bench] = {
    "loss": Bench("the composed loss alone", "python benchmarks/bench_loss.py",
                  ("benchmarks/bench_loss.py", "src/sdar/algos"), "algorithms.md#loss-benchmark"),
    "train-step-cpu": Bench(
        "one RL step per arm, tiny model, speed-ups on and off",
        "python benchmarks/bench_train_step.py --steps 3 --compare-off --limits --set warmstart.episodes=300 "
        "--set warmstart.epochs=2", STEP_CODE, "#one-rl-step-on-2-cpu-cores"),
    "train-step-qwen-cpu": Bench(
        "one RL step per arm, Qwen2.5-0.5B shape (2 of 24 layers)",
        "python benchmarks/bench_train_step.py --model qwen2.5-0.5b --layers 2 --steps 1", STEP_CODE,
        "#one-rl-step-of-the-qwen25-05b-shape-2-layers-on-2-cpu-cores"),
    "train-step-qwen-packed": Bench(
        "issue 40's packed forwards and batched sampling against the defaults, Qwen2.5-0.5B shape (2 layers)",
        "python benchmarks/bench_train_step.py --model qwen2.5-0.5b --layers 2 --steps 1 --modes on,batched,packed",
        STEP_CODE, "#issue-40-packed-forwards-and-batched-sampling-qwen25-05b-shape-2-layers", long=True),
    "layouts-tiny": Bench(
        "the sampler's and the Scorer's layouts side by side, tiny model (the CPU rule)",
        "python benchmarks/bench_train_step.py --steps 2 --modes on,batched,packed --set warmstart.episodes=300 "
        "--set warmstart.epochs=2", STEP_CODE, "#the-samplers-and-the-scorers-layouts-on-2-cpu-cores", long=True),
    "layouts-smollm2": Bench(
        "the sampler's and the Scorer's layouts side by side, SmolLM2-135M (the CPU rule)",
        "bash benchmarks/bench_layouts_smollm2.sh",
        (*STEP_CODE, "benchmarks/bench_layouts_smollm2.sh", "configs/household-smollm2.yaml"),
        "#the-samplers-and-the-scorers-layouts-on-2-cpu-cores", long=True),
    "train-step-floor": Bench("SDAR/GRPO per step and its floor", "python benchmarks/bench_train_step.py --steps 3 "
                              "--compare-off --set warmstart.episodes=300 --set warmstart.epochs=2", STEP_CODE,
                              "#sdar-over-grpo-per-step-not-met", long=True),
    "scoring-head": Bench("the output head at free tokens only", "python benchmarks/bench_scoring_head.py",
                          ("benchmarks/bench_scoring_head.py", "src/sdar/models/scoring.py", "src/sdar/models/logprobs.py"),
                          "#the-output-head-at-free-tokens-only", long=True),
    "warmstart-sft": Bench("the warm start's SFT", "python benchmarks/bench_warmstart_sft.py",
                           ("benchmarks/bench_warmstart_sft.py", "src/sdar/train/warmstart.py", "src/sdar/models",
                            "configs/household-tiny.yaml"), "#the-warm-start-sft-not-met", long=True),
    "train-step-gpu": Bench("one RL step per arm on one GPU", "bash benchmarks/gpu_suite.sh runs/gpu-suite", STEP_CODE,
                            "#one-rl-step-on-one-gpu", needs="gpu", long=True),
    "env-load": Bench("environments over the wire, under load", "python benchmarks/bench_env_load.py",
                      ("benchmarks/bench_env_load.py", "envs/src"), "#environments"),
    "alfworld": Bench("ALFWorld gold path", "python benchmarks/bench_alfworld.py --workers 2",
                      ("benchmarks/bench_alfworld.py", "envs/src/sdar_envs/household"),
                      "environments.md#the-real-alfworld-engine-and-the-sims-fidelity", needs="alfworld", long=True),
    "reliability": Bench("env servers and training under abuse and outages", "python benchmarks/bench_reliability.py",
                         ("benchmarks/bench_reliability.py", "benchmarks/reliability_faults.py", "envs/src/sdar_envs", "src/sdar/train",
                          "src/sdar/storage", "src/sdar/pipeline",
                          "src/sdar/tracking"), "environments.md#reliability", long=True),
    "warmstart-household": Bench("the household warm start's quality", "python benchmarks/bench_warmstart.py",
                                 (*WARMSTART_CODE, "configs/household-tiny.yaml"), "training.md#the-warm-start",
                                 long=True),
    "warmstart-shop": Bench("the shop warm start", "python benchmarks/bench_warmstart.py --config configs/shop-tiny.yaml "
                            "--by-options 150", (*WARMSTART_CODE, "configs/shop-tiny.yaml"),
                            "environments.md#shop-at-laptop-scale", long=True),
    "warmstart-searchqa": Bench("the search-QA warm start", "python benchmarks/bench_warmstart.py --config "
                                "configs/searchqa-tiny.yaml", (*WARMSTART_CODE, "configs/searchqa-tiny.yaml"),
                                "environments.md#search-qa-at-laptop-scale", long=True),
    "composer": Bench("the Composer channels' cost", "sdar run --local --arms grpo,grpo_hint,grpo_replay,composer "
                      "--seeds 0,1 --steps 10 --eval-tasks 60 --replay-episodes 8 --set warmstart.episodes=300 "
                      "--set warmstart.epochs=2 --set eval.every=0 --set checkpoint.every=5 --root runs/composer-matrix "
                      "--quiet", ("src/sdar", "envs/src", "components", "pipelines"),
                      "algorithms.md#the-four-arm-composer-matrix-measured", long=True,
                      table_from="held-out success, same tasks for every arm"),
    "omp-wait": Bench("seconds per step under each OpenMP wait, beside issue 46's float32 step at a54e8fa",
                      "python benchmarks/bench_omp_wait.py",
                      (*STEP_CODE, "benchmarks/bench_omp_wait.py", "src/sdar/openmp.py", "src/sdar/__init__.py"),
                      "#how-pytorchs-openmp-threads-wait", long=True),
    "vs-trl": Bench("TRL's GRPOTrainer and sdar's grpo on the same work, SmolLM2",
                    "python benchmarks/bench_vs_trl.py --steps 3 --tasks-per-step 1 --group-size 4 --eval-tasks 24 "
                    "--set optim.lr=3e-5",
                    ("benchmarks/bench_vs_trl.py", "src/sdar/integrations", *STEP_CODE[2:],
                     "configs/household-smollm2.yaml"), "#trls-grpotrainer-and-sdar-on-the-same-work", long=True),
    "exit": Bench("how long an sdar command takes to end once done, the interpreter's final collections kept and skipped",
                  "python benchmarks/bench_exit.py",
                  ("benchmarks/bench_exit.py", "benchmarks/bench_train_step.py", "src/sdar/lifecycle.py", "src/sdar/cli.py"),
                  "#how-long-a-command-takes-to-end"),
}
NOT_MEASURED = {  # benchmarks with no table yet: listed in the index with why
    "vllm": ("vLLM against transformers (tokens/s, log-prob agreement)",
             "python benchmarks/bench_vllm.py --model smollm2 [--constrained]", "not measured yet: vLLM has not run on a GPU"),
}

OPEN = re.compile(r"^<!-- bench (?P<id>[\w.-]+): (?P<commit>[0-9a-f]{7,40})(?P<changes>\+changes)? \| "
                  r"(?P<machine>[^|]*?) \| (?P<command>.*?) -->$")
CLOSE = "<!-- /bench {id} -->"


@dataclass(frozen=True)
class Stamp:
    id: str
    commit: str
    machine: str
    command: str
    changes: bool = False  # measured with uncommitted changes to the benchmark's code

    def comment(self) -> str:
        return f"<!-- bench {self.id}: {self.commit}{'+changes' if self.changes else ''} | {self.machine} | {self.command} -->"


@dataclass
class Block:
    """A stamped table in a doc: the lines of its opening comment, its stamp line and its closing comment."""

    stamp: Stamp
    start: int  # index of the opening comment
    end: int  # index of the closing comment


def blocks(lines: list[str], where: str = "") -> list[Block]:
    out = []
    for i, line in enumerate(lines):
        m = OPEN.match(line.strip())
        if m is None:
            if line.strip().startswith("<!-- bench ") and not line.strip().startswith("<!-- bench-index"):
                raise ValueError(f"{where}:{i + 1}: a bench comment this tool cannot read: {line.strip()[:120]}")
            continue
        stamp = Stamp(m["id"], m["commit"], m["machine"], m["command"], bool(m["changes"]))
        close = CLOSE.format(id=stamp.id)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == close), None)
        if end is None or end < i + 3 or lines[i + 2].strip():
            raise ValueError(f"{where}:{i + 1}: block {stamp.id!r} needs its stamp line, an empty line, its table and "
                             f"then {close}")
        out.append(Block(stamp, i, end))
    return out


def git_changes(commit: str, paths: tuple[str, ...], root: Path = ROOT) -> list[str] | None:
    """The commits after `commit` that touched `paths`, newest first; None when `commit` is not in this history."""
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=root, capture_output=True)
    if known.returncode != 0:
        return None
    done = subprocess.run(["git", "log", "--format=%h", f"{commit}..HEAD", "--", *paths], cwd=root,
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def stamp_line(stamp: Stamp, changed: list[str] | None) -> str:
    """The line a reader sees under the opening comment: stale (and since which commit) or not, and the stamp."""
    measured = (f"measured at {stamp.commit}{' with uncommitted changes to its code' if stamp.changes else ''} on "
                f"{stamp.machine} with `{stamp.command}`")
    if changed is None:
        return f"> **stale?** {stamp.commit} is not in this clone's history; {measured}"
    if changed:
        return (f"> **stale**: its code changed after the measurement (first in {changed[-1]}); rerun it with "
                f"`make bench ONLY={stamp.id}`. It was {measured}")
    return f"> {measured[0].upper()}{measured[1:]}"


Changes = Callable[[str, tuple[str, ...]], "list[str] | None"]


def marked(text: str, changes: Changes, benches: dict[str, Bench] = BENCHES, where: str = "") -> str:
    """`text` with every block's stamp line rewritten from its stamp and `changes` (commit, code paths) -> the
    commits since (newest first; None: unknown commit)."""
    lines = text.split("\n")
    for b in blocks(lines, where):
        if b.stamp.id not in benches:
            raise ValueError(f"{where}: block {b.stamp.id!r} is no benchmark of tools/bench_tables.py's BENCHES")
        lines[b.start + 1] = stamp_line(b.stamp, changes(b.stamp.commit, benches[b.stamp.id].code))
    return "\n".join(lines)


def index_table(stamps: dict[str, Stamp], changes: Changes, benches: dict[str, Bench] = BENCHES) -> str:
    """docs/benchmarks.md's index: every benchmark, its command, where its table is, its stamp and state."""
    rows = ["| benchmark | command | table | measured at | state |", "|---|---|---|---|---|"]
    for bench_id, b in benches.items():
        link = f"[{'below' if b.where.startswith('#') else b.where.split('#')[0]}]({b.where})"
        s = stamps.get(bench_id)
        if s is None:
            rows.append(f"| {b.title} | `{b.command}` | {link} | - | no table yet |")
            continue
        changed = changes(s.commit, b.code)
        state = ("unknown commit" if changed is None else f"**stale** since {changed[-1]}" if changed else "current")
        rerun = "" if b.long or b.needs else " (rerun by `make bench`)"
        rows.append(f"| {b.title} | `{s.command}` | {link} | {s.commit}{'+changes' if s.changes else ''} | {state}{rerun} |")
    for title, command, why in NOT_MEASURED.values():
        rows.append(f"| {title} | `{command}` | - | - | {why} |")
    return "\n".join(rows)


def doc_files() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def rendered(files: list[Path], changes: Changes, benches: dict[str, Bench] = BENCHES, index: Path = INDEX
             ) -> dict[Path, str]:
    """Every doc's text with its stamp lines (and the index) as this tool writes them."""
    out, stamps = {}, {}
    for f in files:
        text = f.read_text()
        out[f] = marked(text, changes, benches, where=str(f))
        for b in blocks(text.split("\n"), str(f)):
            if b.stamp.id in stamps:
                raise ValueError(f"{f}: block {b.stamp.id!r} appears twice in docs/")
            stamps[b.stamp.id] = b.stamp
    if index in out:
        begin, end = "<!-- bench-index -->", "<!-- /bench-index -->"
        text = out[index]
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            _, tail = rest.split(end, 1)
            out[index] = f"{head}{begin}\n{index_table(stamps, changes, benches)}\n{end}{tail}"
    return out


def mark(files: list[Path] | None = None) -> list[Path]:
    """Rewrite the stamp lines and the index in place; the files changed."""
    changed = []
    for f, text in rendered(files or doc_files(), git_changes).items():
        if f.read_text() != text:
            f.write_text(text)
            changed.append(f)
    return changed


def check(files: list[Path] | None = None, changes: Changes = git_changes) -> list[str]:
    """What is not current: a stamp line (a stale table not marked, a fresh one marked stale) or the index."""
    problems = []
    for f, text in rendered(files or doc_files(), changes).items():
        old = f.read_text().split("\n")
        for n, (a, b) in enumerate(zip(old, text.split("\n")), 1):
            if a != b:
                problems.append(f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}:{n}: is {a[:100]!r}, "
                                f"should be {b[:100]!r}")
    return problems


# ---- rerunning ------------------------------------------------------------------------------------
def machine() -> str:
    """This machine as a stamp names it: its cores and CPU, or its GPU, and torch; on a CPU, how OpenMP waits."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
        lib = f"torch {torch.__version__}"
    except ImportError:
        gpu, lib = "", "no torch"
    where = f"one {gpu}" if gpu else f"{os.cpu_count()}-core CPU ({cpu})"
    load = f", load {os.getloadavg()[0]:.1f} at the start" if hasattr(os, "getloadavg") else ""
    return f"{where}, {lib}{load}{'' if gpu else openmp_wait()}".replace("|", "/")


def cpu_jiffies(stat: str | None = None) -> tuple[int, int] | None:
    """(stolen, total) clock ticks of every CPU since boot, from the first line of /proc/stat (or `stat`); None where
    there is none. Stolen: the ticks a hypervisor gave this virtual machine's CPUs to other guests."""
    try:
        fields = (Path("/proc/stat").read_text() if stat is None else stat).split("\n", 1)[0].split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal (guest is inside user)
    return ticks[7], sum(ticks)


def stolen(before: tuple[int, int] | None, after: tuple[int, int] | None) -> str:
    """The share of this machine's CPU time a hypervisor took for other guests between two `cpu_jiffies`, as a stamp
    says it ("" where either is unknown): a benchmark run while it took half ran on half the machine."""
    if before is None or after is None or after[1] <= before[1]:
        return ""
    return f", {(after[0] - before[0]) / (after[1] - before[1]):.0%} of the CPU time stolen by the host during the run"


def matmul_rates(seconds: float = 0.5) -> str:
    """How fast this machine multiplies matrices now, as a stamp says it: 2048 x 2048 matmuls in bfloat16 and float32
    on the CPU, each for about `seconds` ("" on a GPU or without torch). Two stamps of one machine on different days
    compare through it: the same 2 cores have multiplied at 947 and at 315 GFLOP/s in bfloat16, with no CPU time
    stolen that the guest could see."""
    try:
        import torch
    except ImportError:
        return ""
    if torch.cuda.is_available():
        return ""
    rates = []
    for dtype in (torch.bfloat16, torch.float32):
        a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
        a @ b  # the first call's one-time costs
        n, t0 = 0, time.perf_counter()
        while n < 2 or time.perf_counter() - t0 < seconds:
            a @ b
            n += 1
        rates.append(2 * 2048 ** 3 * n / (time.perf_counter() - t0) / 1e9)
    return f", matmul {rates[0]:.0f} / {rates[1]:.0f} GFLOP/s (bfloat16 / float32) at the start"


def openmp_wait() -> str:
    """How a benchmark's OpenMP threads wait between ops (sdar.openmp), as a stamp says it; stamps before 2026-11-30
    name none, and ran passive (sdar's setting then)."""
    try:
        from sdar.openmp import describe
    except ImportError:
        return ""
    return f", OpenMP wait {describe(os.environ)}"


def missing(b: Bench) -> str | None:
    """Why this machine cannot run `b` (None: it can)."""
    if b.needs == "gpu":
        try:
            import torch

            if not torch.cuda.is_available():
                return "needs a CUDA GPU"
        except ImportError:
            return "needs torch with CUDA"
    if b.needs == "alfworld" and not os.environ.get("SDAR_ALFWORLD_DATA"):
        return "needs the ALFWorld games (SDAR_ALFWORLD_DATA)"
    return None


def table_of(stdout: str, table_from: str = "") -> str:
    """A benchmark's printout as a doc shows it: markdown tables as they are, anything else in a text block; the
    line naming its JSON file left out, and, with `table_from`, the lines before the first that contains it (a
    command's progress: `sdar run` prints each task's)."""
    lines = [line for line in stdout.rstrip().split("\n") if not line.startswith("figures: ")]
    if table_from:
        start = next((i for i, line in enumerate(lines) if table_from in line), None)
        if start is None:
            raise ValueError(f"the printout has no line with {table_from!r}: the command's output changed; update "
                             "its Bench.table_from")
        lines = lines[start:]
    if any(line.startswith("|---") for line in lines):
        return "\n".join(lines).strip()
    return "```text\n" + "\n".join(lines).strip() + "\n```"


def write_block(path: Path, stamp: Stamp, body: str) -> None:
    """Put `body` under `stamp` in the block of stamp.id in `path` (appended at the end when it has none)."""
    lines = path.read_text().split("\n")
    found = [b for b in blocks(lines, str(path)) if b.stamp.id == stamp.id]
    new = [stamp.comment(), "", "", *body.split("\n"), CLOSE.format(id=stamp.id)]
    if found:
        lines[found[0].start:found[0].end + 1] = new
    else:
        lines += ["", *new, ""]
    path.write_text("\n".join(lines))


def bench_argv(command: str) -> list[str]:
    """The argv that runs a table's command with this interpreter: `python x` as `<this python> x`, and `sdar ...` as
    `<this python> -m sdar.cli ...`, so that it runs the code on PYTHONPATH (the export `--at` names), not whatever
    `sdar` a PATH holds (none, where the virtual environment is not activated: `make bench` calls .venv's python)."""
    argv = shlex.split(command)
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    if argv[0] == "sdar":
        return [sys.executable, "-m", "sdar.cli", *argv[1:]]
    return argv


def run(ids: list[str], at: str | None, console=print) -> int:
    """Rerun `ids`, stamp and write each into its block; the number that failed."""
    failed = 0
    head = subprocess.run(["git", "rev-parse", "--short", at or "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        tree = ROOT
        if at:  # a clean export of the revision: what the stamp names, whatever the working tree holds
            tree = Path(tmp)
            archive = subprocess.run(["git", "archive", at], cwd=ROOT, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "src"), str(tree / "envs" / "src"),
                                                            os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               "PYTHON": os.environ.get("PYTHON", sys.executable)}  # the interpreter of a shell benchmark
        for bench_id in ids:
            b = BENCHES[bench_id]
            why = missing(b)
            if why:
                console(f"{bench_id}: skipped ({why})")
                continue
            dirty = not at and bool(subprocess.run(["git", "status", "--porcelain", "--", *b.code], cwd=ROOT,
                                                   capture_output=True, text=True).stdout.strip())
            where, before = machine() + matmul_rates(), cpu_jiffies()
            argv = bench_argv(b.command)
            console(f"{bench_id}: {b.command} (in {tree})")
            t0 = time.perf_counter()
            done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
            stamp = Stamp(bench_id, head, where + stolen(before, cpu_jiffies()), b.command, dirty)
            if done.returncode != 0:
                failed += 1
                console(f"{bench_id}: failed (rc {done.returncode}), nothing written:\n{done.stderr[-2000:]}")
                continue
            target = next((f for f in doc_files() if f"<!-- bench {bench_id}:" in f.read_text()), INDEX)
            write_block(target, stamp, table_of(done.stdout, b.table_from))
            shown = target.relative_to(ROOT) if target.is_relative_to(ROOT) else target
            console(f"{bench_id}: {time.perf_counter() - t0:.0f} s, written to {shown}")
    mark()
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="rerun benchmarks and write their stamped tables (make bench)")
    r.add_argument("--only", default="", help=f"comma-separated ids (default: those not long): {', '.join(BENCHES)}")
    r.add_argument("--at", default=None, help="measure a clean export of this revision instead of the working tree")
    sub.add_parser("mark", help="rewrite every stamp line and the index of docs/benchmarks.md")
    sub.add_parser("check", help="exit 1 when a stamp line or the index is not what `mark` would write")
    sub.add_parser("list", help="the benchmarks, their commands and their stamps")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        ids = [i for i in args.only.split(",") if i] or [i for i, b in BENCHES.items() if not b.long]
        unknown = [i for i in ids if i not in BENCHES]
        if unknown:
            ap.error(f"unknown benchmark {unknown[0]!r}; choose among {', '.join(BENCHES)}")
        return 1 if run(ids, args.at) else 0
    if args.cmd == "mark":
        for f in mark():
            print(f"marked {f.relative_to(ROOT)}")
        return 0
    if args.cmd == "check":
        problems = check()
        for p in problems:
            print(p)
        if problems:
            print("run `python tools/bench_tables.py mark` (or rerun the tables: `make bench ONLY=...`)")
        return 1 if problems else 0
    stamps = {b.stamp.id: b.stamp for f in doc_files() for b in blocks(f.read_text().split("\n"), str(f))}
    for bench_id, b in BENCHES.items():
        s = stamps.get(bench_id)
        print(f"{bench_id:22} {'long' if b.long else '':5} {b.needs:9} {s.commit if s else '-':9} {b.command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
