"""tests/deploy/ca_bundles.py, the decision of the image test `test_the_build_ca_bundle_is_in_no_layer`: which
certificates of the build machine's bundle are private to it. Synthetic bundles of real certificates (made here
with `cryptography`), a synthetic image root with real RECORD and dpkg md5sums files, and this venv's own packages."""

from __future__ import annotations

import base64
import datetime
import hashlib
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.deploy import ca_bundles
from tests.deploy.ca_bundles import (certificates, first_needle_in, layer_needles, pristine_bundles,
                                     private_certificates)


def _ca(name: str) -> bytes:
    """A self-signed CA certificate (PEM) named `name`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def cas() -> dict[str, bytes]:
    # debian: a root Debian ships; dropped: one newer Debian releases dropped and botocore still ships (TrustCor);
    # proxy: the build machine's own
    return {name: _ca(name) for name in ("debian-root", "dropped-root", "proxy-ca")}


def _der(pem: bytes) -> bytes:
    (der,) = certificates(pem)
    return der


def test_only_what_no_public_bundle_in_the_image_carries_is_private(cas):
    build = cas["debian-root"] + cas["dropped-root"] + cas["proxy-ca"]  # the machine's bundle
    debian, botocore = cas["debian-root"], cas["debian-root"] + cas["dropped-root"]
    # compared with Debian's bundle alone (the old test), botocore's public root looked private: the false failure
    # on a fresh machine
    assert private_certificates(build, [debian]) == {_der(cas["dropped-root"]), _der(cas["proxy-ca"])}
    # compared with every public bundle the image carries, only the proxy's CA is private
    assert private_certificates(build, [debian, botocore]) == {_der(cas["proxy-ca"])}
    assert private_certificates(cas["debian-root"], [debian, botocore]) == set()
    # the same certificate however it is wrapped or spaced (64 columns, 76, one line, CRLF)
    body = b"".join(cas["proxy-ca"].splitlines()[1:-1])
    for wrap in (64, 76, len(body)):
        lines = textwrap.wrap(body.decode(), wrap)
        pem = ("-----BEGIN CERTIFICATE-----\r\n" + "\r\n".join(lines) + "\r\n-----END CERTIFICATE-----\r\n").encode()
        assert private_certificates(build, [pem, botocore]) == set(), wrap


def test_a_private_certificate_in_a_layer_is_found_as_pem_or_der_and_a_public_one_is_not(cas):
    (proxy,) = private_certificates(b"".join(cas.values()), [cas["debian-root"] + cas["dropped-root"]])
    needles = layer_needles(proxy)
    assert len(needles[0]) == 64 and len(needles[1]) == 48
    # a layer (a tar in `podman image save`'s stream) holding only the public bundles: nothing found
    clean = b"\0" * 5000 + cas["debian-root"] + cas["dropped-root"] + b"\0" * 5000
    assert first_needle_in(io.BytesIO(clean), needles, chunk=1000) is None
    # the private CA in a layer as PEM (a file in /usr/local/share/ca-certificates, an appended bundle) or as
    # DER (a .cer file), across the reads' chunk boundaries
    for leaked in (cas["proxy-ca"], proxy):
        for offset in range(0, 1100, 97):
            stream = io.BytesIO(clean[:offset] + leaked + clean[offset:])
            assert first_needle_in(stream, needles, chunk=256) is not None, offset


def _write_dist(site: Path, dist: str, files: dict[str, bytes], tamper: dict[str, bytes] | None = None) -> None:
    """A pip-installed distribution: its files and a RECORD with their sha256 (then `tamper`'s files rewritten)."""
    lines = []
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{rel},sha256={digest},{len(data)}")
    info = site / f"{dist}.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("\n".join(lines + [f"{dist}.dist-info/RECORD,,"]) + "\n")
    for rel, data in (tamper or {}).items():
        (site / rel).write_bytes(data)


def _image_root(tmp_path: Path, cas: dict[str, bytes], leak: str = "") -> Path:
    """An image's filesystem: certifi and botocore in a venv, Debian's ca-certificates through dpkg, and its
    generated /etc/ssl/certs bundle; `leak` puts the proxy's CA into it one way."""
    root = tmp_path / "root"
    site = root / "opt/venv/lib/python3.11/site-packages"
    site.mkdir(parents=True)
    _write_dist(site, "certifi-2026.1.1", {"certifi/cacert.pem": cas["debian-root"], "certifi/core.py": b"x = 1\n"})
    boto = {"botocore/cacert.pem": cas["debian-root"] + cas["dropped-root"]}
    _write_dist(site, "botocore-1.40.0", boto,
                tamper={k: v + cas["proxy-ca"] for k, v in boto.items()} if leak == "appended" else None)
    mozilla = root / "usr/share/ca-certificates/mozilla/Debian_Root.crt"
    mozilla.parent.mkdir(parents=True)
    mozilla.write_bytes(cas["debian-root"])
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    (info / "ca-certificates.md5sums").write_text(
        f"{hashlib.md5(cas['debian-root']).hexdigest()}  usr/share/ca-certificates/mozilla/Debian_Root.crt\n"
        "d41d8cd98f00b204e9800998ecf8427e  usr/sbin/update-ca-certificates\n")
    generated = cas["debian-root"]
    if leak == "local":  # update-ca-certificates adds /usr/local/share/ca-certificates to the generated bundle
        local = root / "usr/local/share/ca-certificates/proxy.crt"
        local.parent.mkdir(parents=True)
        local.write_bytes(cas["proxy-ca"])
        generated += cas["proxy-ca"]
    (root / "etc/ssl/certs").mkdir(parents=True)
    (root / "etc/ssl/certs/ca-certificates.crt").write_bytes(generated)
    for skipped in ("proc/1", "tmp"):  # never walked
        (root / skipped).mkdir(parents=True)
    return root


@pytest.mark.parametrize("leak", ["", "local", "appended"])
def test_public_bundles_are_the_files_their_packages_shipped(tmp_path, cas, leak):
    root = _image_root(tmp_path, cas, leak)
    # run as the image test runs it: the module's source on stdin of the image's python
    proc = subprocess.run([sys.executable, "-", str(root)], input=Path(ca_bundles.__file__).read_text(),
                          capture_output=True, text=True, timeout=60, check=True)
    found = json.loads(proc.stdout)
    assert found == json.loads(json.dumps(pristine_bundles(str(root))))
    site = root / "opt/venv/lib/python3.11/site-packages"
    shipped = {str(site / "certifi/cacert.pem"), str(root / "usr/share/ca-certificates/mozilla/Debian_Root.crt")}
    boto = str(site / "botocore/cacert.pem")
    # Debian's generated bundle is never public: /usr/local/share/ca-certificates goes into it
    assert str(root / "etc/ssl/certs/ca-certificates.crt") not in found["public"]
    build = b"".join(cas.values())
    if leak == "appended":  # a bundle changed after pip installed it is no public bundle
        assert set(found["public"]) == shipped and found["modified"] == [boto]
    else:
        assert set(found["public"]) == shipped | {boto} and found["modified"] == []
    # either way the proxy's CA stays private, so the image test looks for it in the layers (and finds the leak);
    # with botocore's bundle changed, its dropped root has no public source left and is looked for too
    private = private_certificates(build, found["public"].values())
    assert private == {_der(cas["proxy-ca"])} | ({_der(cas["dropped-root"])} if leak == "appended" else set())


@pytest.mark.slow
def test_this_venvs_packaged_bundles_match_their_records():
    """Real pip installs: certifi's and botocore's bundles (what the trainer image carries) are public as shipped."""
    import botocore
    import certifi

    site = Path(certifi.__file__).parents[1]
    found = pristine_bundles(str(site))
    assert found["modified"] == []
    assert {certifi.where(), str(Path(botocore.__file__).parent / "cacert.pem")} <= set(found["public"])
    assert certificates(Path(certifi.where()).read_bytes()) and all(certificates(t) for t in found["public"].values())
