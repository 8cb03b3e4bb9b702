"""The deprecation detector (issue 44): a deprecation warning whose caller, the first frame outside the package that
raised it, is in sdar's own source (src/ or envs/src/). A library warns from its own file (transformers' `warnings.warn`
points at modeling_utils.py), so the stack at the moment of the warning is read, not the warning's filename.
`deprecations_of_ours()` collects them in this process; `install(path)` (what `sitecustomize_dir` arranges for every
Python process a command starts) appends them to a file."""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = ((ROOT / "src").resolve(), (ROOT / "envs" / "src").resolve())
DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
STDLIB_WARNINGS = Path(warnings.__file__).resolve()
LOG_ENV = "SDAR_TEST_DEPRECATION_LOG"


def _package(filename: str) -> Path:
    """The top package directory a file belongs to (site-packages/<pkg>, or src/<pkg>), else its own folder."""
    p = Path(filename).resolve()
    for root in ("site-packages", "dist-packages", "src"):
        if root in p.parts[:-1]:
            i = len(p.parts) - 1 - p.parts[::-1].index(root)
            return Path(*p.parts[: i + 2]) if i + 2 < len(p.parts) else p.parent
    return p.parent


def caller_of_ours(message, category, filename: str, skip: tuple[Path, ...] = ()) -> str | None:
    """'caller: category: message' when the warning's first frame outside its own package is in our source."""
    if not issubclass(category, DEPRECATIONS):
        return None
    raiser = _package(filename)
    for frame in reversed(traceback.extract_stack()[:-2]):
        where = Path(frame.filename).resolve()
        if where.is_relative_to(raiser) or where == STDLIB_WARNINGS or where == Path(__file__).resolve():
            continue
        if where in skip:
            return None
        if any(where.is_relative_to(o) for o in OURS):
            return f"{where.relative_to(ROOT)}:{frame.lineno} -> {category.__name__}: {message}"
        return None
    return None


@contextmanager
def deprecations_of_ours(skip: tuple[Path, ...] = ()):
    """Yields a list that collects, for each deprecation warning raised inside the block, 'caller: message' when the
    first frame outside the warning's own package is in our source (a caller in `skip` does not count)."""
    found: list[str] = []
    real = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        hit = caller_of_ours(message, category, filename, skip)
        if hit:
            found.append(hit)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        try:
            yield found
        finally:
            warnings.showwarning = real


def install(log: str | os.PathLike) -> None:
    """In this process from now on: every deprecation warning of ours appended to `log`, a line each."""
    real = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        hit = caller_of_ours(message, category, filename)
        if hit:
            with open(log, "a") as f:
                f.write(f"pid {os.getpid()} {' '.join(sys.argv[:3])}: {hit}\n")
        if not issubclass(category, DEPRECATIONS):
            real(message, category, filename, lineno, file, line)

    for category in DEPRECATIONS:
        warnings.simplefilter("always", category)
    warnings.showwarning = show
    with open(watched(log), "a") as f:  # which processes were watched: a test can tell the hook was loaded
        f.write(f"{os.getpid()} {' '.join(sys.argv[:3])}\n")


def watched(log: str | os.PathLike) -> Path:
    """The file that lists, a line each, the processes `install(log)` watched."""
    return Path(f"{log}.watched")


def sitecustomize_dir(where: Path, log: Path) -> dict[str, str]:
    """A directory holding a sitecustomize.py that installs the detector in every Python process that has it on
    PYTHONPATH: the environment variables to set for a command whose subprocesses must be watched too."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "sitecustomize.py").write_text(  # loads this file by its path: nothing added to sys.path
        "import importlib.util, os\n"
        f"spec = importlib.util.spec_from_file_location('sdar_test_deprecations', {str(Path(__file__).resolve())!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        f"module.install(os.environ[{LOG_ENV!r}])\n")
    path = os.pathsep.join(p for p in (str(where), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, LOG_ENV: str(log)}
