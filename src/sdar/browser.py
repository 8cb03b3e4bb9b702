"""A headless Chrome or Chromium for the MLflow view's browser test and `sdar ui`'s rendering: found where users have
one, installed (Debian's `chromium`) only where this user can, otherwise one message with the command that installs
it on this system. Standard library only: `make install` and `make test` run this file with the system Python
(`python3 src/sdar/browser.py --ensure`) before or without the virtual environment.

Search order: $CHROMIUM (a path or a command name), then on PATH chromium, chromium-browser, google-chrome,
google-chrome-stable, chrome, headless_shell; then Playwright's browsers ($PLAYWRIGHT_BROWSERS_PATH, else its
per-user cache: `python -m playwright install chromium` puts them there, no root needed); then the macOS apps."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome", "headless_shell")
MAC_APPS = ("/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
            "/Applications/Chromium.app/Contents/MacOS/Chromium")
# inside one Playwright browser folder (chromium-<rev>, chromium_headless_shell-<rev>), by platform
PLAYWRIGHT_BINARIES = ("chrome-linux/chrome", "chrome-linux64/chrome", "chrome-linux/headless_shell",
                       "chrome-headless-shell-linux64/chrome-headless-shell",
                       "chrome-mac/Chromium.app/Contents/MacOS/Chromium",
                       "chrome-mac-arm64/Chromium.app/Contents/MacOS/Chromium")


def _executable(path: str | Path) -> str | None:
    p = Path(path).expanduser()
    return str(p) if p.is_file() and os.access(p, os.X_OK) else None


def _playwright_roots() -> list[Path]:
    if os.environ.get("PLAYWRIGHT_BROWSERS_PATH"):
        return [Path(os.environ["PLAYWRIGHT_BROWSERS_PATH"]).expanduser()]
    home = Path.home()
    return [home / ".cache" / "ms-playwright", home / "Library" / "Caches" / "ms-playwright"]


def find_browser() -> str | None:
    """The path of a Chrome or Chromium to run headless, or None."""
    wanted = os.environ.get("CHROMIUM", "").strip()
    if wanted:  # what the user named comes first; a name that is not there is not silently replaced
        return _executable(wanted) if os.sep in wanted else shutil.which(wanted)
    for name in NAMES:
        if found := shutil.which(name):
            return found
    for root in _playwright_roots():
        for folder in sorted(root.glob("chromium*"), reverse=True) if root.is_dir() else []:
            for rel in PLAYWRIGHT_BINARIES:
                if found := _executable(folder / rel):
                    return found
    for app in MAC_APPS if platform.system() == "Darwin" else ():
        if found := _executable(app):
            return found
    return None


def install_hint() -> str:
    """How to get a browser on this system, as commands (the Playwright one needs no root)."""
    playwright = f"{Path(sys.executable).name} -m pip install playwright && python -m playwright install chromium"
    if platform.system() == "Darwin":
        system = "brew install --cask chromium"
    elif _ubuntu():
        system = "sudo snap install chromium   (Ubuntu ships chromium as a snap)"
    elif shutil.which("apt-get"):
        system = "sudo apt-get install -y chromium"
    elif shutil.which("dnf"):
        system = "sudo dnf install -y chromium"
    else:
        system = "install Chrome or Chromium with your system's package manager"
    return (f"no headless Chrome or Chromium found (looked for $CHROMIUM, {', '.join(NAMES)} on PATH, Playwright's "
            f"browsers and the macOS apps); install one:\n  {system}\nor, without root:\n  {playwright}\n"
            "or point CHROMIUM at one you have: make test CHROMIUM=/path/to/chrome")


def _ubuntu() -> bool:
    try:
        return "ubuntu" in Path("/etc/os-release").read_text().lower()
    except OSError:
        return False


def _can_install() -> list[str] | None:
    """The prefix that runs apt-get as root here ([] as root, [sudo] with passwordless sudo), or None: Debian's
    chromium is installed only where that works without asking (never on Ubuntu, whose chromium is a snap)."""
    if not shutil.which("apt-get") or _ubuntu() or platform.system() != "Linux":
        return None
    if os.geteuid() == 0:
        return []
    sudo = shutil.which("sudo")
    if sudo and subprocess.run([sudo, "-n", "true"], capture_output=True, timeout=10, check=False).returncode == 0:
        return [sudo, "-n"]
    return None


def ensure() -> int:
    """Print the browser's path (0); else install Debian's chromium where this user can, else print how (1)."""
    found = find_browser()
    if found is None and not os.environ.get("CHROMIUM", "").strip() and (prefix := _can_install()) is not None:
        print("no headless browser found: installing Debian's chromium (apt-get)", file=sys.stderr, flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run([*prefix, "apt-get", "update", "-qq"], env=env, check=False)
        subprocess.run([*prefix, "apt-get", "install", "-y", "-qq", "chromium"], env=env, check=False,
                       stdout=subprocess.DEVNULL)
        found = find_browser()
    if found is None:
        wanted = os.environ.get("CHROMIUM", "").strip()
        if wanted:
            print(f"CHROMIUM={wanted} is not an executable browser; unset it or point it at Chrome or Chromium",
                  file=sys.stderr)
        else:
            print(install_hint(), file=sys.stderr)
        return 1
    print(found)
    return 0


def main(argv: list[str]) -> int:
    """--ensure: `ensure()`; without it, only look: the path (0) or how to install one (1)."""
    if argv not in ([], ["--ensure"]):
        print("usage: python src/sdar/browser.py [--ensure]", file=sys.stderr)
        return 2
    if argv:
        return ensure()
    found = find_browser()
    print(found or install_hint(), file=sys.stdout if found else sys.stderr)
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
