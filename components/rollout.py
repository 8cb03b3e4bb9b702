"""KFP component rollout: plays episodes with a policy checkpoint and writes them as JSONL
trajectories (the shared trajectory format plus the token ids a teacher replay needs)."""

from typing import NamedTuple, Optional

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components._image import COMPONENT_OPTIONS, base_image


@dsl.component(base_image=base_image(), **COMPONENT_OPTIONS)
def rollout(
    config_path: str,
    overrides: str,
    trajectories: Output[Dataset],
    checkpoint: Optional[Input[Model]] = None,
    endpoints: Optional[Input[Artifact]] = None,
    arm: str = "grpo",
    episodes: int = 16,
    split: str = "train",
    temperature: float = 1.0,
    seed: int = 0,
    replay_round: int = 0,
    family: str = "",
    model: str = "",
    output_root: str = "runs/kfp",
    job_id: str = "standalone",
) -> NamedTuple("RolloutOutputs", [("episodes", int), ("success", float)]):
    """`episodes` episodes on tasks of `split` (shuffled by `seed`, cycled if the split is smaller).

    checkpoint: the policy (None: the config's model, e.g. the warm-started tiny model).
    endpoints: launch_envs' JSON for a running env server; None plays in-process environments.
    temperature: 1.0 = the training distribution; arm decides the prompt (skill_grpo shows skills).
    """
    import json
    import random
    from collections import namedtuple
    from dataclasses import replace
    from pathlib import Path

    from sdar.agent.rollout import rollout as play
    from sdar.config import load_config, parse_overrides
    from sdar.eval.report import write_trajectories
    from sdar.train.runtime import build_runtime, seed_everything
    from sdar.train.warmstart import ensure_warm_start

    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    info = json.loads(Path(endpoints.path).read_text()) if endpoints is not None else {}
    ov = parse_overrides(overrides)
    ov.update({"arm": arm, "seed": int(seed), "tracking": False,
               "output_dir": str(Path(output_root) / job_id / f"rollout-{arm}-seed{int(seed)}")})
    if family:
        ov["env.family"] = family
    if model:
        ov["model.name_or_path"] = model
    if checkpoint is not None:
        ov["model.name_or_path"] = checkpoint.path
    if info.get("url"):
        ov["env.url"] = info["url"]
    cfg = load_config(config_path, ov)
    ensure_warm_start(cfg)
    rt = build_runtime(cfg, train=False)
    probe = rt.env_factory()
    try:
        pool = list(probe.task_ids(split))
    finally:
        probe.close()
    if not pool:
        raise ValueError(f"split {split!r} of {cfg.env.family} has no tasks; use train, valid or test")
    random.Random(seed if not replay_round else f"{seed}:round{replay_round}").shuffle(pool)  # later rounds: other tasks
    ids = [pool[i % len(pool)] for i in range(episodes)]
    seed_everything(int(seed))
    rcfg = replace(rt.rollout_cfg, temperature=float(temperature))
    envs = [rt.env_factory() for _ in ids]
    try:
        trajs = play(rt.backend, rt.tokenizer, envs, ids, list(range(len(ids))), rcfg)
    finally:
        for e in envs:
            e.close()
    write_trajectories(trajectories.path, trajs, cfg.env.family,
                       backend=f"policy:{Path(checkpoint.path).name if checkpoint is not None else cfg.model.name_or_path}")
    success = sum(t.won for t in trajs) / len(trajs)
    trajectories.metadata.update({"episodes": len(trajs), "success": success, "family": cfg.env.family})
    print(f"{len(trajs)} episodes, success {success:.3f}, {sum(t.length for t in trajs)} turns")
    return namedtuple("RolloutOutputs", ["episodes", "success"])(len(trajs), success)
