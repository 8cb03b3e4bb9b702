"""The README, CHANGELOG and docs/*.md stay true to the repository: every relative link resolves
(heading anchors included), every `sdar ...` command shown in a fenced code block parses with the
real CLI parser (one in inline code names a real subcommand and real options), and the README stays
a short front page that starts with `make demo` and `make test`."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 250
SHELL_LANGS = {"", "bash", "sh", "shell", "console", "shell-session", "zsh"}

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_LINK = re.compile(  # [text](target), ![alt](target), [text](<target> "title")
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^\s)>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _doc_lines(path: Path) -> list[tuple[int, str, str | None]]:
    """(line number, text, fence language or None outside a fenced block) for every line that is
    not a fence delimiter."""
    out: list[tuple[int, str, str | None]] = []
    fence: str | None = None
    lang = ""
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        m = FENCE.match(line)
        if fence is None and m:
            fence, lang = m.group(1), m.group(2).lower()
            continue
        if fence is not None and line.strip().startswith(fence[0] * len(fence)) and \
                set(line.strip()) == {fence[0]}:
            fence = None
            continue
        out.append((n, line, lang if fence is not None else None))
    return out


# ---- links ----------------------------------------------------------------------------------
def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text (no markup), lower-cased, punctuation dropped
    except `-` and `_`, spaces as `-`."""
    text = INLINE_CODE.sub(lambda m: m.group(0).strip("`"), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("**", "").replace("__", "")
    text = text.strip().lower()
    kept = []
    for ch in text:
        if ch in "-_ " or unicodedata.category(ch)[0] in "LN":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line, lang in _doc_lines(path):
        m = HEADING.match(line) if lang is None else None
        if not m:
            continue
        slug = github_slug(m.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    for m in re.finditer(r"<a\s+(?:name|id)=\"([^\"]+)\"", path.read_text(encoding="utf-8")):
        out.add(m.group(1))
    return out


@dataclass(frozen=True)
class Link:
    file: Path
    line: int
    target: str

    def __str__(self) -> str:
        return f"{_rel(self.file)}:{self.line}: ({self.target})"


def relative_links(path: Path) -> list[Link]:
    links = []
    for n, line, lang in _doc_lines(path):
        if lang is not None:
            continue
        text = INLINE_CODE.sub("", line)
        targets = [m.group(1) for m in INLINE_LINK.finditer(text)]
        ref = REF_DEF.match(text)
        if ref:
            targets.append(ref.group(1))
        for target in targets:
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:, ...
                continue
            links.append(Link(path, n, target))
    return links


ALL_LINKS = [link for path in DOC_FILES for link in relative_links(path)]


def test_docs_have_links_to_check():
    assert any(link.file.name == "README.md" for link in ALL_LINKS), "the README links to no doc"


@pytest.mark.parametrize("link", ALL_LINKS, ids=str)
def test_relative_link_resolves(link: Link):
    file_part, _, anchor = link.target.partition("#")
    target = (link.file.parent / file_part).resolve() if file_part else link.file
    if not target.exists():
        where = _rel(link.file.parent) or "."
        pytest.fail(f"{link}: {file_part} does not exist (relative to {where})", pytrace=False)
    if anchor and target.is_file() and target.suffix == ".md":
        known = anchors(target)
        if anchor not in known:
            pytest.fail(f"{link}: no heading in {_rel(target)} has the anchor #{anchor}; "
                        f"anchors there: {', '.join(sorted(known))}", pytrace=False)


def test_github_slug_matches_githubs_rules():
    assert github_slug("The paper's settings: `configs/paper/`") == \
        "the-papers-settings-configspaper"
    assert github_slug("On one GPU: household seed 0 again (`evidence-cuda`)") == \
        "on-one-gpu-household-seed-0-again-evidence-cuda"
    assert github_slug("Sizing a cluster run: `sdar size`") == "sizing-a-cluster-run-sdar-size"
    assert github_slug("What **make demo** prints") == "what-make-demo-prints"


# ---- commands ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Command:
    file: Path
    line: int
    text: str  # as shown, continuations joined
    argv: tuple[str, ...]  # after `sdar`
    usage: bool  # usage notation, placeholders or inline code: subcommand and options checked only
    error: str = ""  # why the line is not shell syntax

    def __str__(self) -> str:
        return f"{_rel(self.file)}:{self.line}: {self.text}"


def _cut_shell(line: str, operators: str = "|;&<>") -> str:
    """The line up to its first unquoted comment, pipe, list operator or redirection (or, with
    `operators=""`, up to its comment only)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
        elif ch in operators:
            return re.sub(r"\s\d+$", "", line[:i])  # and the fd of `2>&1`
    return line


def _expand_usage(line: str) -> tuple[str, bool]:
    """Usage notation as one concrete line: `[--opt X]` kept (first alternative of `a|b`),
    `NAME[:suffix]` without the suffix. Returns the line and whether notation was found."""
    found = False
    while True:
        new = re.sub(r"(?<=\S)\[[^\[\]\s]*\]", "", line)  # NAME=CKPT[:skills]
        new = re.sub(r"(?<!\S)\[([^\[\]]*)\]", lambda m: m.group(1).split("|")[0], new)
        if new == line:
            return line, found
        line, found = new, True


PLACEHOLDER = re.compile(
    r"^(\.\.\.|…|<[^>]*>|[A-Z][A-Z0-9_]*(?:[=:][A-Z][A-Z0-9_]*)?|[\w.-]*=[A-Z][A-Z0-9_]*)$")


def _command(path: Path, line_no: int, text: str, inline: bool = False) -> Command | None:
    line = text.strip()
    line = re.sub(r"^\$\s+", "", line)  # a prompt
    line = re.sub(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)+", "", line)  # VAR=value before the command
    if not re.match(r"^(?:\S*/bin/)?sdar(?:\s|$)", line):  # sdar, .venv/bin/sdar
        return None
    line, usage = _expand_usage(line)
    line = _cut_shell(line)
    if "$(" in line or "`" in line:
        usage = True
    line = re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", "x", line)  # $REGISTRY -> a dummy value
    try:
        words = shlex.split(line)
    except ValueError as exc:
        return Command(path, line_no, text.strip(), (), True, error=f"not shell syntax ({exc})")
    if inline and len(words) < 2:
        return None  # the word sdar alone names the project, not a command
    if inline or any(PLACEHOLDER.match(w) for w in words[1:]):
        usage = True
    return Command(path, line_no, text.strip(), tuple(words[1:]), usage)


def shown_commands(path: Path) -> list[Command]:
    """The `sdar` commands of the fenced shell blocks, and those written in inline code."""
    commands = []
    pending: tuple[int, str] | None = None
    for n, line, lang in _doc_lines(path):
        if lang is None:
            pending = None
            for m in INLINE_CODE.finditer(line):
                cmd = _command(path, n, m.group(0).strip("`"), inline=True)
                if cmd:
                    commands.append(cmd)
            continue
        if lang not in SHELL_LANGS:
            pending = None
            continue
        start, text = pending if pending else (n, "")
        text = f"{text} {line.strip()}" if text else line
        code = _cut_shell(text, operators="").rstrip()
        if code.endswith("\\"):  # continued on the next line
            pending = (start, code[:-1])
            continue
        pending = None
        cmd = _command(path, start, text)
        if cmd:
            commands.append(cmd)
    return commands


ALL_COMMANDS = [cmd for path in DOC_FILES for cmd in shown_commands(path)]


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    from sdar.cli import build_parser

    return build_parser()


def _subparsers(p: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _walk(parser: argparse.ArgumentParser, argv: tuple[str, ...], where: str):
    """The parser of the subcommand argv names, and the words after it."""
    path = ["sdar"]
    p = parser
    i = 0
    while i < len(argv):
        sub = _subparsers(p)
        word = argv[i]
        if sub is None or word.startswith("-") or PLACEHOLDER.match(word):
            break
        if word not in sub.choices:
            pytest.fail(f"{where}: `{' '.join(path)} {word}` is not a subcommand; "
                        f"`{' '.join(path)}` has: {', '.join(sub.choices)}", pytrace=False)
        p = sub.choices[word]
        path.append(word)
        i += 1
    return p, argv[i:], " ".join(path)


def test_docs_show_sdar_commands():
    assert any(c.file.name == "README.md" for c in ALL_COMMANDS)
    assert any(not c.usage for c in ALL_COMMANDS)


@pytest.mark.parametrize("cmd", ALL_COMMANDS, ids=lambda c: f"{_rel(c.file)}:{c.line}")
def test_shown_sdar_command_parses(cmd: Command, parser: argparse.ArgumentParser):
    if cmd.error:
        pytest.fail(f"{cmd}: {cmd.error}", pytrace=False)
    sub, rest, name = _walk(parser, cmd.argv, str(cmd))
    known = sub._option_string_actions
    for word in rest:
        if word.startswith("-") and not re.match(r"^-\d", word) and word != "--":
            flag = word.split("=", 1)[0]
            if flag not in known:
                options = ", ".join(sorted(o for o in known if o.startswith("--")))
                pytest.fail(f"{cmd}: `{name}` has no option {flag}; it has: {options}",
                            pytrace=False)
    if cmd.usage:
        return  # placeholders: the subcommand and its options exist, values are the reader's
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            parser.parse_args(list(cmd.argv))  # parsing only: main() is what runs a command
        except SystemExit as exc:
            if exc.code not in (0, None):
                pytest.fail(f"{cmd}: the parser refuses it: {err.getvalue().strip()}",
                            pytrace=False)


def test_command_extraction_handles_shell_notation(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "```bash\n"
        "$ SDAR_X=1 sdar run --local --root runs/x   # a comment\n"
        "sdar submit --host http://h --yaml p.yaml \\\n"
        "  --arg checkpoint_root=s3://$BUCKET/c 2>&1 | tee log\n"
        "sdar envs serve --env household [--backend sim|alfworld]\n"
        "kubectl get pods\n"
        "```\n"
        "```python\nsdar = 1\n```\n"
        "Run `sdar eval --checkpoint DIR` or `sdar.cli`.\n")
    got = [(c.line, c.argv, c.usage) for c in shown_commands(doc)]
    assert got == [
        (2, ("run", "--local", "--root", "runs/x"), False),
        (3, ("submit", "--host", "http://h", "--yaml", "p.yaml",
             "--arg", "checkpoint_root=s3://x/c"), False),
        (5, ("envs", "serve", "--env", "household", "--backend", "sim"), True),
        (11, ("eval", "--checkpoint", "DIR"), True),
    ]


# ---- the README as a front page -------------------------------------------------------------
def test_readme_is_short_and_starts_with_the_two_commands():
    readme = REPO / "README.md"
    lines = readme.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, \
        f"README.md has {len(lines)} lines; at most {README_MAX_LINES}"
    first_fence = next(i for i, line in enumerate(lines) if FENCE.match(line))
    assert first_fence < 20, "the first code block of README.md should be near the top"
    assert FENCE.match(lines[first_fence]).group(2) == "bash"
    block = []
    for line in lines[first_fence + 1:]:
        if FENCE.match(line):
            break
        if line.strip():
            block.append(line.strip())
    assert [b.split("#")[0].strip() for b in block[:2]] == ["make demo", "make test"], block


# ---- docs/status.md: what ran where, once ---------------------------------------------------
STATUS = REPO / "docs" / "status.md"
STATUS_KINDS = ("CI (CPU)", "GPU at", "stand-ins", "never run", "by hand", "podman on this machine", "full size on")


def _status_rows() -> list[list[str]]:
    rows = []
    for line in STATUS.read_text(encoding="utf-8").splitlines():
        if line.startswith("| ") and not line.startswith("| capability") and not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip("|").split(" | ")])
    return rows


def test_the_status_table_names_real_tests_and_commits():
    """Every row says where it last ran in one of the table's kinds; every test file and benchmark it names exists;
    every commit it names is this repository's (where git history is here)."""
    import subprocess

    rows = _status_rows()
    assert len(rows) >= 20, f"docs/status.md lists {len(rows)} capabilities"
    for capability, where, how in rows:
        assert any(k in where for k in STATUS_KINDS), f"{capability}: {where!r} says none of {STATUS_KINDS}"
        for path in re.findall(r"`((?:tests|benchmarks)/[\w/.-]+\.(?:py|sh))", how):
            assert (REPO / path).exists(), f"docs/status.md names {path}, which does not exist"
    commits = set(re.findall(r"\b([0-9a-f]{7})\b", STATUS.read_text(encoding="utf-8")))
    assert commits, "no commit named: a GPU run is stamped with its commit"
    if (REPO / ".git").exists():
        for c in sorted(commits):
            found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{c}^{{commit}}"], capture_output=True, check=False)
            assert found.returncode == 0, f"docs/status.md names commit {c}, which this repository does not have"


def test_the_pages_that_claim_where_things_ran_link_the_status_table():
    """README and the pages about GPUs and the cluster point at docs/status.md rather than restating it, and none
    claims a GPU list the table does not have."""
    for page in ("README.md", "docs/cluster.md", "docs/pipeline.md", "docs/training.md", "docs/benchmarks.md"):
        assert "status.md" in (REPO / page).read_text(encoding="utf-8"), f"{page} does not link docs/status.md"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "on one GPU (an H100 and an" not in readme
    cluster = (REPO / "docs" / "cluster.md").read_text(encoding="utf-8")
    assert "None of this page has run against a real cluster yet" in cluster


def test_the_gpu_commit_of_the_status_table_is_the_gpu_benchmarks_stamp():
    """The table's GPU runs are the commit that docs/benchmarks.md's GPU table is stamped with: one source."""
    stamp = re.search(r"<!-- bench train-step-gpu: ([0-9a-f]{7}) ", (REPO / "docs" / "benchmarks.md").read_text())
    assert stamp, "docs/benchmarks.md has no stamped GPU table"
    assert f"GPU at {stamp.group(1)}" in STATUS.read_text(encoding="utf-8"), (
        f"docs/status.md's GPU rows do not name the GPU table's commit {stamp.group(1)}: update them together")
