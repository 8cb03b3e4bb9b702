"""Are the version ranges in pyproject.toml current? For each package the ecosystem moves fastest on (the
training stack, the pipeline stack, tracking, OpenEnv), print its range, the newest release on the package
index pip uses, the newest release the range allows, and what is installed.

    python tools/check_pins.py            # a table; exit 0 whatever it finds (a report)
    python tools/check_pins.py --json     # the same rows as JSON
    python tools/check_pins.py --strict   # exit 1 when a row needs action: behind, newer outside, index unreachable
    python tools/check_pins.py --gpu      # also resolve the GPU set (constraints/gpu.txt) with pip; exit 1 if not

`make test` on a fresh clone installs the newest allowed versions, so CI runs against them by construction;
what this adds is the view past the ranges: a release newer than a range's upper bound shows as `newer
outside` and is the cue to widen the range (and run the tests); `behind` means this environment is older than
its ranges allow (reinstall). A new upstream release changes what this prints, never whether a build passes:
only --strict turns such rows into a failure. Releases known not to install from this index are listed in HELD
with the reason. Needs pip and the index; nothing is installed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]
# torch is not watched: its build (CPU or CUDA) and version come from the Makefile's TORCH_SPEC, not the range
WATCHED = ("transformers", "peft", "trl", "mlflow", "kfp", "kfp-kubernetes", "openenv", "kubeflow-trainer-api")
# release -> why the range stops below it (checked on 2026-11-27)
HELD = {
    ("mlflow", "3.18.0"): "its mlflow-skinny 3.18.0 is not on this machine's index, so 3.18.0 does not install here",
}


@dataclass
class Row:
    package: str
    range: str
    newest: str
    newest_allowed: str
    installed: str
    status: str  # current | behind | newer outside | held | not installed | index unreachable

    @property
    def needs_action(self) -> bool:
        """What --strict fails on: this environment below its ranges, a release past a range, no answer from the index."""
        return self.status in ("behind", "newer outside", "index unreachable")


def ranges(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """The tightest range each watched package gets anywhere in pyproject.toml (dependencies and extras)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values() for r in extra]
    out: dict[str, str] = {}
    for text in reqs:
        req = Requirement(text)
        name = req.name.lower()
        if name in WATCHED and str(req.specifier):
            out[name] = ",".join(sorted({*filter(None, out.get(name, "").split(",")), *str(req.specifier).split(",")}))
    return out


def index_versions(package: str) -> list[Version]:
    """The releases pip's index offers (`pip index versions`), newest first; no pre-releases."""
    done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package, "--disable-pip-version-check"],
                          capture_output=True, text=True, timeout=120)
    found = re.search(r"Available versions: (.*)", done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"pip index versions {package} failed: {done.stderr.strip()[-300:]}")
    out = []
    for v in found.group(1).split(","):
        try:
            version = Version(v.strip())
        except InvalidVersion:
            continue
        if not version.is_prerelease:
            out.append(version)
    return sorted(out, reverse=True)


def _installed(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def check(package: str, spec: str) -> Row:
    from packaging.specifiers import SpecifierSet

    try:
        versions = index_versions(package)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"{package}: {exc}", file=sys.stderr)
        return Row(package, spec, "-", "-", _installed(package), "index unreachable")
    allowed = [v for v in versions if v in SpecifierSet(spec)]
    installed = _installed(package)
    newest, best = versions[0], (allowed[0] if allowed else None)
    local = Version(installed).release if installed else None  # 2.13.0+cpu counts as 2.13.0
    if not installed:
        status = "not installed"
    elif best is not None and local is not None and Version(".".join(map(str, local))) < best:
        status = "behind"
    elif best is not None and newest > best:
        status = "held" if (package, str(newest)) in HELD else "newer outside"
    else:
        status = "current"
    return Row(package, spec, str(newest), str(best or "-"), installed, status)


GPU_SET = ROOT / "constraints" / "gpu.txt"
GPU_EXTRAS = "gpu,cluster,trl"  # what a GPU machine and the trainer image install


def gpu_pins(path: Path = GPU_SET) -> dict[str, Version]:
    """The exact pins (`name==version`) of the GPU set; its bounds (`<`, `!=`) are hints for the resolver."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec, *more) = list(req.specifier) or [None]
        if spec is not None and spec.operator == "==" and not more:
            out[req.name.lower()] = Version(spec.version)
    return out


def resolve_gpu_set(timeout_s: float = 900.0) -> dict[str, str]:
    """pip's resolver on the GPU set: `pip install --dry-run --ignore-installed --report` of envs/ and the package with
    GPU_EXTRAS under constraints/gpu.txt, against the index pip uses (metadata only, no wheel installed); returns
    {package: resolved version}. RuntimeError with pip's last lines when it does not resolve."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                               "--disable-pip-version-check", "--report", str(report), "-c", str(GPU_SET),
                               "-e", str(ROOT / "envs"), "-e", f"{ROOT}[{GPU_EXTRAS}]"],
                              capture_output=True, text=True, timeout=timeout_s, check=False)
        if done.returncode != 0 or not report.is_file():
            lines = [ln for ln in done.stderr.splitlines() if not ln.startswith("WARNING: Location")]
            raise RuntimeError("the GPU set (constraints/gpu.txt) does not resolve:\n" + "\n".join(lines[-15:]))
        return {i["metadata"]["name"].lower(): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}


def check_gpu_set() -> list[str]:
    """What is wrong with the GPU set: each pin that resolved to another version (a local build tag such as +cpu or
    +cu130 is the same release)."""
    got = resolve_gpu_set()
    wrong = []
    for name, pin in gpu_pins().items():
        have = got.get(name)
        if have is None or Version(have).public.split("+")[0] != str(pin):
            wrong.append(f"{name}: pinned {pin}, resolved {have}")
    return wrong


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a row needs action (behind, newer outside, index unreachable); default: exit 0")
    ap.add_argument("--gpu", action="store_true",
                    help="also resolve the GPU set (constraints/gpu.txt) with pip against the index; exit 1 if it fails")
    ap.add_argument("packages", nargs="*", help=f"a subset of {', '.join(WATCHED)}")
    args = ap.parse_args(argv)
    if args.gpu:
        try:
            wrong = check_gpu_set()
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 1
        pins = ", ".join(f"{n} {v}" for n, v in gpu_pins().items())
        print(f"GPU set: {'resolves' if not wrong else 'resolves to other versions: ' + '; '.join(wrong)} ({pins})")
        if wrong:
            return 1
    wanted = ranges()
    rows = [check(p, wanted[p]) for p in (args.packages or WATCHED) if p in wanted]
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        print(f"{'package':22} {'range':14} {'newest':10} {'allowed':10} {'installed':14} status")
        for r in rows:
            why = f"  ({HELD[(r.package, r.newest)]})" if r.status == "held" else ""
            print(f"{r.package:22} {r.range:14} {r.newest:10} {r.newest_allowed:10} {r.installed:14} {r.status}{why}")
    return 1 if args.strict and any(r.needs_action for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
