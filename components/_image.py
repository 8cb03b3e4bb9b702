"""The container image every sdar component runs in, and how to rebuild a component for another.

Images are named like `make images` names them: <registry>/sdar-trainer:<tag> (images/trainer) and
<registry>/sdar-env-server:<tag> (images/env-server). SDAR_REGISTRY and SDAR_IMAGE_TAG change the
registry and tag (as REGISTRY and TAG do for make); SDAR_IMAGE / SDAR_ENV_IMAGE name an image
outright. They are read when the component modules are imported; `with_image` rebinds an already
built component, which is what `sdar compile --image` uses.
"""

import os

from sdar.images import ENV_SERVER_REPOSITORY, TRAINER_REPOSITORY, image_ref

# the trainer image (images/trainer): torch, vLLM, sdar, kfp and TorchX installed, so nothing is
# installed at run time
DEFAULT_IMAGE = image_ref(TRAINER_REPOSITORY)
# the environment server image (images/env-server, the Helm chart's image)
DEFAULT_ENV_IMAGE = image_ref(ENV_SERVER_REPOSITORY)


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
