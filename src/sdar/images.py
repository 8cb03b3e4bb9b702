"""The names of the project's container images, as `make images` tags them:
<registry>/sdar-trainer:<tag> (images/trainer) and <registry>/sdar-env-server:<tag> (images/env-server)."""

from __future__ import annotations

import os

from sdar import __version__

DEFAULT_REGISTRY = "ghcr.io/sdar"  # the Makefile's REGISTRY default; its TAG default is the package version
TRAINER_REPOSITORY = "sdar-trainer"
ENV_SERVER_REPOSITORY = "sdar-env-server"


def image_ref(repository: str, registry: str | None = None, tag: str | None = None) -> str:
    """<registry>/<repository>:<tag>; registry from SDAR_REGISTRY, tag from SDAR_IMAGE_TAG (what make's
    REGISTRY and TAG set), else ghcr.io/sdar and the package version."""
    registry = (registry or os.environ.get("SDAR_REGISTRY") or DEFAULT_REGISTRY).rstrip("/")
    return f"{registry}/{repository}:{tag or os.environ.get('SDAR_IMAGE_TAG') or __version__}"


def trainer_image() -> str:
    """SDAR_IMAGE when set, else <registry>/sdar-trainer:<tag>: the components' and the training jobs' image."""
    return os.environ.get("SDAR_IMAGE") or image_ref(TRAINER_REPOSITORY)


def env_server_image(trainer: str | None = None) -> str:
    """SDAR_ENV_IMAGE when set; else, when `trainer` is <registry>/sdar-trainer:<tag>, the env-server
    image beside it (same registry and tag: `make push-images` pushes both); else
    <registry>/sdar-env-server:<tag> from SDAR_REGISTRY and SDAR_IMAGE_TAG."""
    if os.environ.get("SDAR_ENV_IMAGE"):
        return os.environ["SDAR_ENV_IMAGE"]
    if trainer and "@" not in trainer:  # a digest names one image: nothing to derive from it
        name, _, tag = trainer.rpartition(":")
        registry, _, repository = name.rpartition("/")
        if repository == TRAINER_REPOSITORY and registry and tag and "/" not in tag:
            return image_ref(ENV_SERVER_REPOSITORY, registry=registry, tag=tag)
    return image_ref(ENV_SERVER_REPOSITORY)
