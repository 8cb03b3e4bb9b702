"""KFP component run_matrix: the experiment's settings checked and arms x seeds expanded into the list of
training runs the pipeline fans out over (sdar.pipeline.steps.expand_run_matrix)."""

from typing import List

from kfp import dsl

from components._image import COMPONENT_OPTIONS, base_image


@dsl.component(base_image=base_image(), **COMPONENT_OPTIONS)
def run_matrix(arms: List[str], seeds: List[int], config_path: str, overrides: str, family: str = "",
               model: str = "") -> List[dict]:
    """[{"arm": a, "seed": s}] for every arm and seed, after checking that every arm exists, no
    arm or seed repeats, and the config loads with the overrides (fail here, not an hour later).

    family / model: "" keeps the config's env.family / model.name_or_path.
    """
    from sdar.pipeline.steps import expand_run_matrix

    return expand_run_matrix(list(arms), list(seeds), config_path, overrides, family=family, model=model)
