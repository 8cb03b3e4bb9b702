"""KFP component run_matrix: checks the experiment's settings before anything starts and expands
arms x seeds into the run matrix, the list of training runs the pipeline fans out over."""

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
    from sdar.algos import get_arm
    from sdar.config import load_config, parse_overrides

    if not arms:
        raise ValueError("arms is empty; pass at least one, e.g. ['grpo', 'grpo_opsd', 'sdar']")
    if not seeds:
        raise ValueError("seeds is empty; pass at least one seed, e.g. [0]")
    for name in (a for a in set(arms) if arms.count(a) > 1):
        raise ValueError(f"arm {name!r} is listed twice in {list(arms)}; list each arm once (seeds give repeats)")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {list(seeds)} repeat a value; each seed is one run")
    for a in arms:
        get_arm(a)  # an unknown arm names the valid ones
    ov = parse_overrides(overrides)
    cfg = load_config(config_path, ov)
    if family and family != cfg.env.family and cfg.env.kwargs:
        raise ValueError(
            f"family {family!r} differs from env.family {cfg.env.family!r} of {config_path}, whose env.kwargs "
            f"{cfg.env.kwargs} belong to {cfg.env.family!r}; pass a config made for {family!r} or leave family empty"
        )
    if model:
        load_config(config_path, {**ov, "model.name_or_path": model})
    runs = [{"arm": a, "seed": int(s)} for a in arms for s in seeds]
    print(f"run matrix of {len(runs)} runs: " + ", ".join(f"{r['arm']}/seed{r['seed']}" for r in runs))
    return runs
