#!/usr/bin/env bash
# The local base image of `make images IMAGE_BASE=local` (the default with DOCKER=podman), for a machine that
# reaches no container registry: a Debian bookworm root filesystem made by debootstrap (minbase) with
# python3 (3.11, as python:3.11-slim-bookworm), python3-venv, python-is-python3 and Debian's own
# ca-certificates, trimmed like Debian's slim images (no docs, man pages or locales, no apt lists) and
# imported as IMAGE. Both Dockerfiles build FROM it: the env server's PYTHON_IMAGE and the trainer's
# CUDA_IMAGE (its CPU variant). Nothing of this machine is copied in: no CA bundle, no pip configuration.
#
#   tools/base_image.sh [IMAGE]      default localhost/sdar-base:bookworm; needs root, debootstrap, podman (or docker)
#
# It does nothing when IMAGE exists (FORCE=1 rebuilds). Settings: DOCKER (podman), DEBIAN_MIRROR
# (http://deb.debian.org/debian), DEBIAN_SECURITY (http://deb.debian.org/debian-security), DEBIAN_SUITE (bookworm).
set -euo pipefail

IMAGE=${1:-localhost/sdar-base:bookworm}
DOCKER=${DOCKER:-podman}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
SUITE=${DEBIAN_SUITE:-bookworm}
PACKAGES=python3,python3-venv,python-is-python3,ca-certificates

if [ "${FORCE:-0}" != 1 ] && "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "base image $IMAGE exists (FORCE=1 rebuilds it)"
    exit 0
fi

missing=()
command -v "$DOCKER" >/dev/null || missing+=("$DOCKER")
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ "$(basename "$DOCKER")" = podman ] && ! command -v runc >/dev/null && ! command -v crun >/dev/null; then
    missing+=(runc)
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "tools/base_image.sh: missing ${missing[*]}; on Debian/Ubuntu: apt-get install -y podman runc debootstrap" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "tools/base_image.sh: debootstrap needs root (run it as root, or import a base yourself and pass BASE_IMAGE=...)" >&2
    exit 1
fi

root=$(mktemp -d /var/tmp/sdar-base.XXXXXX)
trap 'umount "$root/proc" 2>/dev/null || true; rm -rf "$root"' EXIT
start=$(date +%s)
echo "debootstrap $SUITE (minbase + $PACKAGES) from $MIRROR into $root"
# Debian's slim images leave out docs, man pages and translations; the same dpkg filter keeps them out of
# the packages the Dockerfiles install on top
mkdir -p "$root/etc/dpkg/dpkg.cfg.d"
cat > "$root/etc/dpkg/dpkg.cfg.d/sdar-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
EOF
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 || {
    tail -20 "$root.log" >&2
    rm -f "$root.log"
    exit 1
}
rm -f "$root.log"
cat > "$root/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY $SUITE-security main
EOF
# apt as in Debian's own container images (debuerreotype): no package caches (pkgcache.bin and
# srcpkgcache.bin, ~80 MB in the layer of every `apt-get update` in a Dockerfile), no downloaded .debs,
# no translations, compressed indexes
printf '%s\n' \
    'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };' \
    'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };' \
    'Dir::Cache::pkgcache "";' 'Dir::Cache::srcpkgcache "";' > "$root/etc/apt/apt.conf.d/docker-clean"
echo 'Acquire::Languages "none";' > "$root/etc/apt/apt.conf.d/docker-no-languages"
echo 'Acquire::GzipIndexes "true";' > "$root/etc/apt/apt.conf.d/docker-gzip-indexes"
echo 'Apt::AutoRemove::SuggestsImportant "false";' > "$root/etc/apt/apt.conf.d/docker-autoremove-suggests"
# the suite's security and point-release updates, then nothing apt fetched stays in the image (there is no
# pty in the chroot: dpkg writes no terminal log)
mount -t proc proc "$root/proc"
chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c 'apt-get update -qq && apt-get upgrade -y -qq -o Dpkg::Use-Pty=0 >/dev/null && apt-get clean'
umount "$root/proc"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*.log "$root"/var/log/apt/* \
    "$root"/usr/share/doc/*/changelog* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/tmp/*
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
python=$(chroot "$root" python3 -c 'import platform; print(platform.python_version())')
tar -C "$root" --numeric-owner -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --change 'LABEL org.opencontainers.image.title=sdar-base' \
    --change "LABEL org.opencontainers.image.version=$SUITE-python$python" \
    - "$IMAGE" >/dev/null 2>"$root.import.log" || { cat "$root.import.log" >&2; rm -f "$root.import.log"; exit 1; }
rm -f "$root.import.log"
echo "base image $IMAGE: Debian $SUITE, python $python, $(( $(date +%s) - start )) s"
