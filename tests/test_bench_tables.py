"""tools/bench_tables.py: a stamped table is marked stale exactly when a commit after its stamp touched its benchmark's
code (on synthetic docs and a throwaway git history), the runner writes a benchmark's printout stamped into its block,
and docs/ has no table whose stamp line is not current (no unmarked stale table)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
try:
    import bench_tables as bt
finally:
    sys.path.pop(0)

BENCHES = {"fast": bt.Bench("a fast one", "python fast.py", ("fast.py", "lib"), "#fast"),
           "slow": bt.Bench("a slow one", "python slow.py", ("slow.py",), "other.md#slow", long=True)}
DOC = """# Doc

<!-- bench-index -->
<!-- /bench-index -->

## Fast
<!-- bench fast: aaaaaaa | a 2-core CPU | python fast.py --big -->
> anything

| x | y |
|---|---|
| 1 | 2 |
<!-- /bench fast -->

<!-- bench slow: bbbbbbb+changes | one GPU | python slow.py -->
> anything

text figures
<!-- /bench slow -->
"""


def fake_history(stale: dict[str, list[str]]):
    """changes(commit, paths): the commits `stale` lists for that stamp (newest first); None for ccccccc."""
    def changes(commit: str, paths: tuple[str, ...]) -> list[str] | None:
        return None if commit == "ccccccc" else stale.get(commit, [])
    return changes


def test_a_table_is_marked_stale_when_its_code_changed_since_its_stamp():
    text = bt.marked(DOC, fake_history({"aaaaaaa": ["3333333", "2222222"]}), BENCHES)
    fast, slow = text.split("\n")[7], text.split("\n")[15]
    assert fast.startswith("> **stale**: its code changed after the measurement (first in 2222222)")
    assert "`make bench ONLY=fast`" in fast and "measured at aaaaaaa on a 2-core CPU with `python fast.py --big`" in fast
    assert slow == "> Measured at bbbbbbb with uncommitted changes to its code on one GPU with `python slow.py`"
    assert bt.marked(text, fake_history({"aaaaaaa": ["3333333", "2222222"]}), BENCHES) == text  # idempotent
    # nothing changed since: the mark goes again
    fresh = bt.marked(text, fake_history({}), BENCHES)
    assert fresh.split("\n")[7] == "> Measured at aaaaaaa on a 2-core CPU with `python fast.py --big`"
    unknown = bt.marked(DOC.replace("aaaaaaa", "ccccccc"), fake_history({}), BENCHES)
    assert unknown.split("\n")[7].startswith("> **stale?** ccccccc is not in this clone's history")


def test_check_finds_the_unmarked_stale_table_and_the_index(tmp_path):
    doc, elsewhere = tmp_path / "benchmarks.md", tmp_path / "index.md"
    history = fake_history({"aaaaaaa": ["2222222"]})
    doc.write_text(bt.marked(DOC, fake_history({}), BENCHES))  # marked when nothing had changed
    problems = _check(doc, history, index=elsewhere)
    assert len(problems) == 1 and problems[0].startswith(f"{doc}:8: ") and "**stale**" in problems[0]
    doc.write_text(bt.marked(DOC, history, BENCHES))
    assert _check(doc, history, index=elsewhere) == []
    # a later commit touching the slow benchmark's code: its table is stale and unmarked
    assert len(_check(doc, fake_history({"aaaaaaa": ["2222222"], "bbbbbbb": ["4444444"]}), index=elsewhere)) == 1
    # the index, written from the blocks
    out = bt.rendered([doc], history, BENCHES, index=doc)[doc]
    assert "| a fast one | `python fast.py --big` | [below](#fast) | aaaaaaa | **stale** since 2222222 (rerun by " \
           "`make bench`) |" in out
    assert "| a slow one | `python slow.py` | [other.md](other.md#slow) | bbbbbbb+changes | current |" in out
    assert _check(doc, history, index=doc)[0].startswith(f"{doc}:4: ")  # the index is not written yet
    doc.write_text(out)
    assert _check(doc, history, index=doc) == []


def _check(doc: Path, history, index: Path) -> list[str]:
    """bench_tables.check's comparison of `doc` against what mark would write, with a made-up history."""
    new = bt.rendered([doc], history, BENCHES, index=index)[doc].split("\n")
    return [f"{doc}:{n}: {a!r} -> {b!r}" for n, (a, b) in enumerate(zip(doc.read_text().split("\n"), new), 1) if a != b]


def test_unreadable_or_unknown_blocks_are_errors():
    with pytest.raises(ValueError, match="cannot read"):
        bt.blocks(["<!-- bench fast 1234567 | x | y -->"])
    with pytest.raises(ValueError, match="needs its stamp line"):
        bt.blocks(["<!-- bench fast: 1234567 | x | y -->", "> stamp", "<!-- /bench fast -->"])
    with pytest.raises(ValueError, match="no benchmark"):
        bt.marked(DOC.replace("bench slow", "bench gone"), fake_history({}), BENCHES)


def test_git_changes_reads_the_commits_that_touched_the_code(tmp_path):
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "a.py").write_text("1")
    (tmp_path / "doc.md").write_text("x")
    git("add", ".")
    git("commit", "-qm", "stamp")
    stamp = git("rev-parse", "--short", "HEAD")
    (tmp_path / "doc.md").write_text("y")
    git("commit", "-qam", "docs only")
    assert bt.git_changes(stamp, ("lib", "fast.py"), tmp_path) == []
    (tmp_path / "lib" / "a.py").write_text("2")
    git("commit", "-qam", "code")
    code = git("rev-parse", "--short", "HEAD")
    assert bt.git_changes(stamp, ("lib", "fast.py"), tmp_path) == [code]
    assert bt.git_changes("1234567", ("lib",), tmp_path) is None


def test_write_block_puts_a_printout_under_its_stamp(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text(DOC)
    stamp = bt.Stamp("fast", "1234567", "this box", "python fast.py")
    bt.write_block(doc, stamp, bt.table_of("model x\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nfigures: runs/x.json\n"))
    lines = doc.read_text().split("\n")
    (b,) = [b for b in bt.blocks(lines) if b.stamp.id == "fast"]
    assert b.stamp == stamp and lines[b.start + 3:b.end] == ["model x", "", "| a | b |", "|---|---|", "| 1 | 2 |"]
    assert bt.table_of("plain text\n") == "```text\nplain text\n```"


def test_the_hosts_share_of_the_cpu_reads_proc_stat():
    # /proc/stat's first line: user nice system idle iowait irq softirq steal guest guest_nice, in clock ticks
    before = bt.cpu_jiffies("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    after = bt.cpu_jiffies("cpu  300 0 100 1000 10 0 5 435 99 0\n")
    assert before == (35, 1000) and after == (435, 1850)  # guest time is inside user's, not counted twice
    assert bt.stolen(before, after) == ", 47% of the CPU time stolen by the host during the run"  # 400 of 850
    assert bt.stolen(before, before) == bt.stolen(None, after) == bt.stolen(before, None) == ""
    assert bt.cpu_jiffies("intr 1 2 3\n") is None and bt.cpu_jiffies("cpu 1 2\n") is None
    if Path("/proc/stat").exists():  # this machine's own
        stolen, total = bt.cpu_jiffies()
        assert 0 <= stolen <= total


def test_the_matmul_probe_measures_both_precisions():
    import re

    import torch

    said = bt.matmul_rates(seconds=0.05)
    if torch.cuda.is_available():
        assert said == ""
        return
    m = re.fullmatch(r", matmul (\d+) / (\d+) GFLOP/s \(bfloat16 / float32\) at the start", said)
    assert m and int(m[1]) > 0 and int(m[2]) > 0, said


def test_a_rerun_is_stamped_with_the_machines_speed_and_the_hosts_share_of_its_run(tmp_path, monkeypatch):
    """`run` writes a benchmark's printout under a stamp that names the machine and, on Linux, the share of CPU time
    the host took while it ran (a figure measured on half a machine says so)."""
    doc = tmp_path / "d.md"
    doc.write_text(DOC)
    (tmp_path / "fast.py").write_text("print('| a | b |')\nprint('|---|---|')\nprint('| 1 | 2 |')\n")
    monkeypatch.setattr(bt, "BENCHES", {"fast": bt.Bench("a fast one", f"python {tmp_path / 'fast.py'}", ("fast.py",),
                                                         "#fast")})
    monkeypatch.setattr(bt, "doc_files", lambda: [doc])
    monkeypatch.setattr(bt, "mark", lambda files=None: [])  # the repository's docs stay as they are
    ticks = iter([(100, 1000), (400, 1600)])
    monkeypatch.setattr(bt, "cpu_jiffies", lambda stat=None: next(ticks))
    monkeypatch.setattr(bt, "matmul_rates", lambda: ", matmul 9 / 3 GFLOP/s (bfloat16 / float32) at the start")
    assert bt.run(["fast"], None, console=lambda *_: None) == 0
    lines = doc.read_text().split("\n")
    (b,) = [b for b in bt.blocks(lines) if b.stamp.id == "fast"]
    assert b.stamp.machine.startswith(bt.machine().split(", load")[0])
    assert b.stamp.machine.endswith(", matmul 9 / 3 GFLOP/s (bfloat16 / float32) at the start"
                                    ", 50% of the CPU time stolen by the host during the run")
    assert lines[b.start + 3:b.end] == ["| a | b |", "|---|---|", "| 1 | 2 |"]


def test_docs_have_no_unmarked_stale_table():
    """Each stamp line and docs/benchmarks.md's index is what `python tools/bench_tables.py mark` writes from the
    stamps and `git log`: a table whose benchmark's code changed since its stamp says so."""
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("not a git checkout with its whole history: nothing to compare the stamps with")
    stamps = [b.stamp for f in bt.doc_files() for b in bt.blocks(f.read_text().split("\n"), str(f))]
    assert {s.id for s in stamps} <= set(bt.BENCHES)
    assert [s.id for s in stamps if bt.git_changes(s.commit, ()) is None] == [], "stamped with a commit git does not know"
    problems = bt.check()
    assert not problems, "\n".join(problems) + "\nrun `python tools/bench_tables.py mark`"


def test_every_tables_command_runs_with_this_interpreter_and_no_path():
    """`make bench` runs .venv's python without an activated environment: a `sdar` command must not need PATH (the
    composer table's `sdar run` failed with FileNotFoundError), and a `python` one is this interpreter."""
    bench_argv = bt.bench_argv
    assert bench_argv("python benchmarks/bench_loss.py --x 1") == [sys.executable, "benchmarks/bench_loss.py", "--x", "1"]
    assert bench_argv("sdar run --local --quiet") == [sys.executable, "-m", "sdar.cli", "run", "--local", "--quiet"]
    assert bench_argv("bash benchmarks/gpu_suite.sh OUT") == ["bash", "benchmarks/gpu_suite.sh", "OUT"]
    for bench_id, b in bt.BENCHES.items():
        assert bench_argv(b.command)[0] in (sys.executable, "bash"), bench_id


def test_a_commands_progress_before_its_table_is_left_out():
    out = "job 1 (new)\n  gated-train: step 1/10\n       held-out success, same tasks\n| x |\nfigures: a.json\n"
    assert bt.table_of(out, "held-out success, same") == "```text\nheld-out success, same tasks\n| x |\n```"
    assert bt.table_of(out).startswith("```text\njob 1 (new)\n")  # without table_from: the whole printout
    with pytest.raises(ValueError, match="no line with 'the table'"):
        bt.table_of(out, "the table")
    # the composer table's marker is what `sdar run` prints above its table
    assert bt.BENCHES["composer"].table_from in (ROOT / "src/sdar/pipeline/runner.py").read_text()
