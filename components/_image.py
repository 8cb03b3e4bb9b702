"""The container image every sdar component runs in, and how to rebuild a component for another.

SDAR_IMAGE (read when the component modules are imported) overrides the default image;
`with_image` rebinds an already built component, which is what `sdar compile --image` uses.
"""

import os

# the trainer image (images/): torch, sdar and kfp installed, so nothing is installed at run time
DEFAULT_IMAGE = "ghcr.io/sdar/trainer:0.1.0"
# the environment server image (images/env-server, the Helm chart's image)
DEFAULT_ENV_IMAGE = "ghcr.io/sdar/sdar-env-server:0.1.0"


def base_image() -> str:
    """SDAR_IMAGE when set, else DEFAULT_IMAGE."""
    return os.environ.get("SDAR_IMAGE") or DEFAULT_IMAGE


def env_image() -> str:
    """SDAR_ENV_IMAGE when set, else DEFAULT_ENV_IMAGE (the image launch_envs deploys on a cluster)."""
    return os.environ.get("SDAR_ENV_IMAGE") or DEFAULT_ENV_IMAGE


# every component: the image already holds sdar and kfp, so the runner installs nothing
COMPONENT_OPTIONS = {"install_kfp_package": False, "packages_to_install": []}


def with_image(component, image: str):
    """The same component (same python function) built for `image`."""
    from kfp import dsl

    return dsl.component(component.python_func, base_image=image, **COMPONENT_OPTIONS)
