"""Install the CPU build of torch into this interpreter's environment (what `make` does first).

`pip install torch==X` from the public index on Linux x86_64 is the CUDA build (several GB). PyTorch's CPU index
(https://download.pytorch.org/whl/cpu) serves the CPU build: when it answers, torch comes from there (without
its dependencies, which then come from the configured index as usual); when it does not (an offline mirror, a
proxy that only passes PyPI), torch comes from the configured index, and the line printed says so. An empty
--index skips the CPU index (a GPU machine: the CUDA build from the configured index).

    python tools/install_torch.py 'torch==2.13.0' [--index URL] [--dry-run]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import urllib.request

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def reachable(index: str, timeout_s: float = 5.0) -> bool:
    """Whether `index` answers for torch (a simple-index page)."""
    try:
        with urllib.request.urlopen(f"{index.rstrip('/')}/torch/", timeout=timeout_s) as resp:
            return resp.status == 200
    except (OSError, ValueError):
        return False


def commands(spec: str, index: str) -> tuple[list[list[str]], str]:
    """The pip commands that install `spec`, and a line saying where torch comes from."""
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    if index and reachable(index):
        return ([[*pip, "--no-deps", "--index-url", index, spec], [*pip, spec]],
                f"{spec}: the CPU build from {index}")
    if index:
        return [[*pip, spec]], (f"{spec}: {index} does not answer, so from the configured index (on Linux x86_64 the "
                                "public PyPI serves the CUDA build, several GB; a mirror may serve the CPU one)")
    return [[*pip, spec]], f"{spec}: from the configured index (no CPU index asked for)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", help="e.g. torch==2.13.0")
    ap.add_argument("--index", default=CPU_INDEX, help=f"the CPU index (default {CPU_INDEX}; '' = none)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
    args = ap.parse_args(argv)
    cmds, why = commands(args.spec, args.index)
    print(f"installing {why}", flush=True)
    for cmd in cmds:
        if args.dry_run:
            print(" ".join(cmd[1:]))
        else:
            subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
