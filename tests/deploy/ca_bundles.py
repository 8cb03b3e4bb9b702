"""What of the build machine's CA bundle is private to it: the certificates that no public bundle carried by an
image has (tests/deploy/test_images_build.py looks for exactly those in the image's layers).

A bundle counts as public only as its package shipped it: a Python distribution's file whose sha256 matches the
distribution's RECORD (certifi's cacert.pem, botocore's, pip's vendored certifi, grpc's roots.pem...), or a Debian
package's file whose md5 matches its /var/lib/dpkg/info/<package>.md5sums (ca-certificates' mozilla/*.crt). Debian's
generated /etc/ssl/certs/ca-certificates.crt is not one: it also holds /usr/local/share/ca-certificates, where a
leaked CA would go. Stdlib only: `python - ROOT < ca_bundles.py` runs `pristine_bundles(ROOT)` inside an image
and prints it as JSON.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import sys
from typing import Iterable

PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\s+([A-Za-z0-9+/=\s]+?)-----END CERTIFICATE-----")
# files a package ships its CA bundle in; only these are opened (an image holds GBs of other packaged files)
BUNDLE_SUFFIXES = (".pem", ".crt", ".cer", "cacerts.txt")
# pseudo and per-run filesystems of a container: no package files there
SKIP_DIRS = {"/proc", "/sys", "/dev", "/run", "/tmp", "/var/tmp"}


def certificates(pem: bytes | str) -> set[bytes]:
    """The DER bytes of each certificate of a PEM text, however it is wrapped."""
    data = pem.encode() if isinstance(pem, str) else pem
    out = set()
    for m in PEM.finditer(data):
        try:
            out.add(base64.b64decode(re.sub(rb"\s+", b"", m.group(1)), validate=True))
        except (binascii.Error, ValueError):
            continue  # not base64: not a certificate any tool would load
    return out


def private_certificates(build_bundle: bytes | str, public_bundles: Iterable[bytes | str]) -> set[bytes]:
    """The certificates (DER) of the build machine's bundle that none of `public_bundles` carries: what only the
    build machine has (its proxy's CA, a company root), which must be in no layer of an image."""
    public: set[bytes] = set()
    for bundle in public_bundles:
        public |= certificates(bundle)
    return certificates(build_bundle) - public


def layer_needles(der: bytes) -> list[bytes]:
    """Byte strings that a copy of the certificate `der` in a layer contains, whether as PEM (one 64-character
    line from its middle, the way every PEM writer wraps) or as DER (48 bytes from the middle, the bytes of that
    line). Each is long enough never to occur by chance."""
    b64 = base64.b64encode(der)
    start = (len(b64) // 2) // 64 * 64
    line = b64[start:start + 64]
    raw = der[start // 4 * 3:start // 4 * 3 + 48]
    return [line, raw]


def first_needle_in(stream, needles: list[bytes], chunk: int = 1 << 22) -> bytes | None:
    """The first of `needles` found in a byte stream (`podman image save` writes each layer as a plain tar),
    None when none is: read in chunks that overlap by the longest needle, so a needle across two is found."""
    overlap = max(len(n) for n in needles)
    tail = b""
    while True:
        data = stream.read(chunk)
        if not data:
            return None
        window = tail + data
        hit = next((n for n in needles if n in window), None)
        if hit is not None:
            return hit
        tail = window[-overlap:]


def _sha256_record(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _python_bundles(root: str, public: dict[str, str], modified: list[str]) -> None:
    """Each *.dist-info/RECORD under `root`: its bundle files, public when their sha256 is the RECORD's."""
    for top, dirs, _ in os.walk(root):
        if os.path.normpath(os.path.join("/", os.path.relpath(top, root))) in SKIP_DIRS:
            dirs[:] = []
            continue
        for d in [d for d in dirs if d.endswith(".dist-info")]:
            record = _read(os.path.join(top, d, "RECORD"))
            for line in (record or b"").decode(errors="replace").splitlines():
                parts = line.rsplit(",", 2)
                if len(parts) != 3 or not parts[0].endswith(BUNDLE_SUFFIXES) or not parts[1]:
                    continue
                path = os.path.normpath(os.path.join(top, parts[0]))
                data = _read(path)
                if data is None or b"-----BEGIN CERTIFICATE-----" not in data:
                    continue
                if _sha256_record(data) == parts[1]:
                    public[path] = data.decode(errors="replace")
                else:
                    modified.append(path)


def _debian_bundles(root: str, public: dict[str, str], modified: list[str]) -> None:
    """Each Debian package's bundle files (dpkg's md5sums), public when their md5 is the one dpkg recorded."""
    info = os.path.join(root, "var", "lib", "dpkg", "info")
    for name in sorted(os.listdir(info)) if os.path.isdir(info) else []:
        if not name.endswith(".md5sums"):
            continue
        for line in (_read(os.path.join(info, name)) or b"").decode(errors="replace").splitlines():
            md5, _, rel = line.partition("  ")
            if not rel.endswith(BUNDLE_SUFFIXES):
                continue
            path = os.path.join(root, rel)
            data = _read(path)
            if data is None or b"-----BEGIN CERTIFICATE-----" not in data:
                continue
            if hashlib.md5(data).hexdigest() == md5:
                public[path] = data.decode(errors="replace")
            else:
                modified.append(path)


def pristine_bundles(root: str = "/") -> dict[str, object]:
    """{"public": {path: PEM text} of every CA bundle file under `root` that is byte for byte what its Python
    distribution or Debian package shipped, "modified": [paths of bundle files that differ from it]}."""
    public: dict[str, str] = {}
    modified: list[str] = []
    _python_bundles(root, public, modified)
    _debian_bundles(root, public, modified)
    return {"public": public, "modified": sorted(modified)}


if __name__ == "__main__":
    json.dump(pristine_bundles(sys.argv[1] if len(sys.argv) > 1 else "/"), sys.stdout)
