"""Issue 44.4: plain output (a file, a pipe, a CI log) never wraps a line and never cuts a table cell. The comparison's
summary, with two seeds and a long arm name, printed by a real subprocess whose stdout is a file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    from sdar.console import make_console
    from sdar.pipeline.runner import _print_summary

    report = Path(sys.argv[1])
    report.mkdir(parents=True, exist_ok=True)
    (report / "comparison.json").write_text(json.dumps({"baseline": {"success": 0.146, "ci95": [0.07, 0.27]}}))
    arm = "sdar_composer_with_a_very_long_arm_name_for_this_test"
    summaries = [{"arm": a, "seeds": [0, 1], "success": 0.0833, "ci95": [0.031, 0.1989],
                  "vs_warm_start": [-0.0625, -0.1667, 0.0], "gap_last": -0.0612, "gate_last": 0.4567}
                 for a in ("grpo", "grpo_opsd", arm)]
    url = "http://127.0.0.1:5000/#/experiments/1/runs?workflowType=machine_learning&viewStateShareKey=sdar-" + "j" * 60
    result = {"summaries": summaries, "report_dir": str(report), "plot": str(report / "comparison.png"),
              "error": None, "seconds": 311.0, "parent_run_id": "f" * 32, "child_runs": ["a"] * 6,
              "experiment": "sdar-comparison", "ui_command": "sdar ui --root " + "/very/long/root" * 8,
              "view_url": url}
    _print_summary(make_console(), result, "sqlite:///x.db")
''')


def test_the_comparison_summary_in_a_file_keeps_every_line_and_cell_whole(tmp_path):
    out = tmp_path / "run.log"
    with open(out, "w") as fh:
        proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "report")], stdout=fh,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False,
                              env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "…" not in text and "..." not in text, text
    lines = text.splitlines()
    # each figure and name whole, on the line of its row
    row = next(line for line in lines if "sdar_composer_with_a_very_long_arm_name_for_this_test (2 seeds)" in line)
    for cell in ("0.083 [0.03, 0.20]", "-0.062 [-0.17, +0.00]", "-0.061", "0.457"):
        assert cell in row, row
    assert any("grpo_opsd (2 seeds)" in line and "0.083 [0.03, 0.20]" in line for line in lines)
    # the MLflow sentence and the URL each on one line
    assert any(line.startswith("MLflow: parent run") and line.rstrip().endswith("then open") for line in lines)
    assert any(line.strip().startswith("http://127.0.0.1:5000/#/experiments/1/runs?") and line.strip().endswith("j" * 60)
               for line in lines)


def test_a_terminal_keeps_its_width_and_columns_still_decides(monkeypatch):
    from sdar.console import PLAIN_WIDTH, make_console

    monkeypatch.delenv("COLUMNS", raising=False)
    import io

    assert make_console(file=io.StringIO()).width == PLAIN_WIDTH
    assert make_console(file=io.StringIO(), width=90).width == 90
    monkeypatch.setenv("COLUMNS", "123")
    assert make_console(file=io.StringIO()).width == 123
    assert make_console(file=io.StringIO(), force_terminal=True).width == 123


def test_a_narrow_terminal_gets_the_width_a_wide_table_asks_for(monkeypatch):
    import io

    from sdar.console import PLAIN_WIDTH, make_console

    monkeypatch.setenv("COLUMNS", "90")
    assert make_console(file=io.StringIO(), force_terminal=True, min_width=120).width == 120
    assert make_console(file=io.StringIO(), force_terminal=True, min_width=60).width == 90
    assert make_console(file=io.StringIO(), force_terminal=True, width=70, min_width=120).width == 70  # asked for
    monkeypatch.delenv("COLUMNS")
    assert make_console(file=io.StringIO(), min_width=120).width == PLAIN_WIDTH  # plain output: never narrower


# the two rich consoles still made by hand, each in a file whose every change marks the training step's stamped tables
# stale (tools/bench_tables.py STEP_CODE): neither prints to a file the docs take (bench_train_step's is its stderr
# progress; `sdar algos`'s table is 140 wide at least); they move to make_console with the next change there
HAND_MADE = {"benchmarks/bench_train_step.py", "src/sdar/algos/cli.py"}


def test_every_console_that_prints_a_table_or_figures_is_make_consoles():
    """A benchmark's stdout becomes a stamped table in docs/ (tools/bench_tables.py): a rich Console made by hand
    wraps it at 80 columns (bench_warmstart_sft's figures were split mid-sentence at ddb35e9)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = {str(p.relative_to(root)) for d in ("src", "envs/src", "benchmarks", "tools")
             for p in (root / d).rglob("*.py") if re.search(r"\bConsole\(", p.read_text())}
    assert found - {"src/sdar/console.py"} == HAND_MADE
