"""The container image every sdar component runs in, and how to rebuild a component for another.

Images are named like `make images` names them: <registry>/sdar-trainer:<tag> (images/trainer) and
<registry>/sdar-env-server:<tag> (images/env-server). SDAR_REGISTRY and SDAR_IMAGE_TAG change the
registry and tag (as REGISTRY and TAG do for make); SDAR_IMAGE / SDAR_ENV_IMAGE name an image
outright. They are read when the component modules are imported; `with_image` rebinds an already
built component, which is what `sdar compile --image` uses.
"""

from sdar.images import ENV_SERVER_REPOSITORY, TRAINER_REPOSITORY, env_server_image, image_ref, trainer_image

# the trainer image (images/trainer): torch, vLLM, sdar, kfp and TorchX installed, so nothing is
# installed at run time
DEFAULT_IMAGE = image_ref(TRAINER_REPOSITORY)
# the environment server image (images/env-server, the Helm chart's image)
DEFAULT_ENV_IMAGE = image_ref(ENV_SERVER_REPOSITORY)
# the one definition of each name is sdar.images; these are the components' names for them
base_image = trainer_image  # SDAR_IMAGE when set, else <registry>/sdar-trainer:<tag>
env_image = env_server_image  # SDAR_ENV_IMAGE when set, else the env-server image (beside a given trainer image)


# every component: the image already holds sdar and kfp, so the runner installs nothing
COMPONENT_OPTIONS = {"install_kfp_package": False, "packages_to_install": []}


def with_image(component, image: str):
    """The same component (same python function) built for `image`."""
    from kfp import dsl

    return dsl.component(component.python_func, base_image=image, **COMPONENT_OPTIONS)
