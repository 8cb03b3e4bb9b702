"""KFP component teacher_replay: replays a rollout's frozen trajectories. Always: the privileged
self-teacher (the same policy with the task's skills in its prompt) scores every turn (gap, SDAR gate).
For an arm with a replay weight (Composer channel 3): the N-teacher pool proposes an action at every
turn and the turns it overrules the student on become DPO pairs, the Dataset gated_train consumes."""

from typing import NamedTuple, Optional

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components._image import COMPONENT_OPTIONS, base_image


@dsl.component(base_image=base_image(), **COMPONENT_OPTIONS)
def teacher_replay(
    trajectories: Input[Dataset],
    config_path: str,
    overrides: str,
    scores: Output[Dataset],
    pairs: Output[Dataset],
    metrics: Output[Metrics],
    checkpoint: Optional[Input[Model]] = None,
    teacher_pool: str = "",
    arm: str = "sdar",
    family: str = "",
    model: str = "",
    output_root: str = "runs/kfp",
    job_id: str = "standalone",
) -> NamedTuple("ReplayOutputs", [("gap_mean", float), ("gate_mean", float), ("pairs", int)]):
    """Replay every turn of `trajectories` (written by the rollout step).

    checkpoint: the policy that is both student and teacher (None: the config's model); it should be
    the one that produced the trajectories, else the 'student' log-probs are another model's.
    arm: its gate_beta sets the reported gate; its replay_coef decides whether the pool is asked.
    teacher_pool: a YAML file with the pool (the `replay:` settings: teachers with base_url, model,
    api_key_env, prices...; min_agree, budget_usd); "" = the config's `replay` section, whose default
    is the local pool (`sdar teachers serve`: rule experts on 127.0.0.1). API keys come from the
    environment variables the endpoints name (a Kubernetes Secret on a cluster), never from here.
    scores: JSON {gap_mean, gate_mean, pos_gap_frac, turns, trajectories: [...]}.
    pairs: JSONL, one DPO pair per line (prompt, chosen and rejected token ids; empty for arms without
    replay); its metadata carries the pool's accounting (calls, tokens, cost, latency, agreement).
    """
    import json
    from collections import namedtuple
    from pathlib import Path

    from sdar.config import load_config, parse_overrides
    from sdar.eval.report import read_trajectories
    from sdar.eval.report import teacher_replay as replay
    from sdar.replay.config import load_pool_file
    from sdar.train.replay import PairSet, replay_trajectories, write_pair_set
    from sdar.train.runtime import build_runtime
    from sdar.train.warmstart import ensure_warm_start

    pool = load_pool_file(teacher_pool) if teacher_pool else {}  # a wrong path fails before any work
    trajs = read_trajectories(trajectories.path)
    if not trajs:
        raise ValueError(f"{trajectories.path} holds no trajectories; run the rollout step first")
    ov = parse_overrides(overrides)
    ov.update({"arm": arm, "tracking": False, "output_dir": str(Path(output_root) / job_id / f"replay-{arm}")})
    if family:
        ov["env.family"] = family
    if model:
        ov["model.name_or_path"] = model
    if checkpoint is not None:
        ov["model.name_or_path"] = checkpoint.path
    ov.update({f"replay.{k}": v for k, v in pool.items()})
    cfg = load_config(config_path, ov)
    ensure_warm_start(cfg)
    rt = build_runtime(cfg, train=False)
    out = replay(rt.model, rt.teacher, trajs, gate_beta=rt.arm.gate_beta, mask_forced_tokens=cfg.rollout.mask_forced_tokens)
    Path(scores.path).parent.mkdir(parents=True, exist_ok=True)
    Path(scores.path).write_text(json.dumps(out, indent=1))
    for k in ("gap_mean", "gate_mean", "pos_gap_frac", "forced_frac"):
        metrics.log_metric(k, float(out[k]))
    metrics.log_metric("turns", float(out["turns"]))
    found, stats = PairSet(), {}
    if rt.arm.replay_coef != 0.0:
        found, stats = replay_trajectories(rt, trajs, out_dir=cfg.resolved_output_dir())
        for k, v in stats.items():
            metrics.log_metric(k.replace("/", "_"), float(v))
        print(f"teacher pool: {int(stats.get('replay/calls', 0))} calls, {len(found)} DPO pairs from {len(trajs)} "
              f"trajectories, ${stats.get('replay/cost_usd', 0.0):.4f} (${stats.get('replay/cost_per_trajectory_usd', 0.0):.5f}"
              " per trace)")
    write_pair_set(found, pairs.path)
    pairs.metadata.update({"pairs": len(found), "trajectories": len(trajs), **stats})
    print(f"{len(trajs)} trajectories, {out['turns']} turns: gap {out['gap_mean']:+.4f}, gate {out['gate_mean']:.4f}, "
          f"teacher endorses {out['pos_gap_frac']:.1%} of tokens")
    return namedtuple("ReplayOutputs", ["gap_mean", "gate_mean", "pairs"])(out["gap_mean"], out["gate_mean"], len(found))
