"""The browser the MLflow view's test needs (issue 44.1): found where users have one ($CHROMIUM, PATH names,
Playwright's browsers), and `make browser` (what `make install` and `make test` run first) as a user without root or
sudo and without a browser stops in seconds with the commands that install one; with one it passes. The non-root
runs are real: `setpriv` drops to uid/gid 65534 (nobody) and the system Python runs src/sdar/browser.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


@pytest.fixture
def shared_tmp():
    """A temporary folder the other user can reach (pytest's tmp_path sits under a root-only folder)."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="sdar-nobody-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _fake(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o755)
    path.write_text("#!/bin/sh\necho fake chrome\n")
    path.chmod(0o755)
    return path


def test_the_search_takes_chromium_where_users_have_it(tmp_path, monkeypatch):
    from sdar.browser import find_browser, install_hint

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CHROMIUM", raising=False)
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(tmp_path / "pw"))
    assert find_browser() is None
    hint = install_hint()
    assert "python -m playwright install chromium" in hint and "CHROMIUM=" in hint
    # Playwright's per-user browsers (no root needed)
    pw = _fake(tmp_path / "pw" / "chromium-1187" / "chrome-linux" / "chrome")
    assert find_browser() == str(pw)
    # a PATH name comes before Playwright's
    chrome = _fake(tmp_path / "bin" / "google-chrome")
    monkeypatch.setenv("PATH", f"{empty}{os.pathsep}{chrome.parent}")
    assert find_browser() == str(chrome)
    # $CHROMIUM first, by path or by name; one that is not there is not replaced by another
    mine = _fake(tmp_path / "opt" / "my-chrome")
    monkeypatch.setenv("CHROMIUM", str(mine))
    assert find_browser() == str(mine)
    monkeypatch.setenv("CHROMIUM", str(tmp_path / "missing"))
    assert find_browser() is None


def _as_nobody(tmp_path: Path, path_dirs: list[Path], *extra_env: str) -> subprocess.CompletedProcess:
    setpriv, python = shutil.which("setpriv"), Path("/usr/bin/python3")
    if os.geteuid() != 0 or setpriv is None or not python.exists():
        pytest.skip("needs root, setpriv and /usr/bin/python3 to run make as another user")
    if not all(os.access(p, os.R_OK | os.X_OK) for p in (REPO, REPO / "src" / "sdar")) or \
            oct(REPO.stat().st_mode)[-1] not in "57":
        pytest.skip(f"{REPO} is not readable by other users")
    bin_dir = tmp_path / "bin"  # what the user has: make, a shell, the system python3; no sudo, no apt, no browser
    bin_dir.mkdir(exist_ok=True)
    for name, target in (("make", shutil.which("make")), ("sh", "/bin/sh"), ("python3", str(python))):
        (bin_dir / name).unlink(missing_ok=True)
        (bin_dir / name).symlink_to(target)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    os.chown(home, 65534, 65534)
    path = os.pathsep.join(str(p) for p in [bin_dir, *path_dirs])
    return subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "env", "-i", f"PATH={path}",
                           f"HOME={home}", *extra_env, "make", "--no-print-directory", "-C", str(REPO), "browser"],
                          capture_output=True, text=True, timeout=60, check=False)


def test_make_browser_as_a_user_without_root_stops_at_once_with_the_install_commands(shared_tmp):
    t0 = time.monotonic()
    proc = _as_nobody(shared_tmp, [])
    seconds = time.monotonic() - t0
    assert proc.returncode != 0 and seconds < 20, (proc.returncode, seconds, proc.stderr)
    assert "no headless Chrome or Chromium found" in proc.stderr
    assert "python -m playwright install chromium" in proc.stderr and "CHROMIUM=/path/to/chrome" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_make_browser_as_a_user_without_root_takes_the_browser_they_have(shared_tmp):
    chrome = _fake(shared_tmp / "apps" / "chromium")
    proc = _as_nobody(shared_tmp, [chrome.parent])
    assert proc.returncode == 0, proc.stderr
    mine = _fake(shared_tmp / "opt" / "chrome-for-testing")
    proc = _as_nobody(shared_tmp, [], f"CHROMIUM={mine}")
    assert proc.returncode == 0, proc.stderr
