"""KFP component teacher_replay: scores a rollout's trajectories with the privileged teacher (the
same policy with the task's skills in its prompt): teacher-student gap and SDAR gate per trajectory.
External N-teacher replay (Composer channel 3) plugs in through `teachers` when it lands."""

from typing import List, NamedTuple, Optional

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components._image import COMPONENT_OPTIONS, base_image


@dsl.component(base_image=base_image(), **COMPONENT_OPTIONS)
def teacher_replay(
    trajectories: Input[Dataset],
    config_path: str,
    overrides: str,
    scores: Output[Dataset],
    metrics: Output[Metrics],
    checkpoint: Optional[Input[Model]] = None,
    teachers: List[str] = [],
    arm: str = "sdar",
    family: str = "",
    model: str = "",
    output_root: str = "runs/kfp",
    job_id: str = "standalone",
) -> NamedTuple("ReplayOutputs", [("gap_mean", float), ("gate_mean", float)]):
    """Replay every turn of `trajectories` (written by the rollout step) under the privileged teacher.

    checkpoint: the policy that is both student and teacher (None: the config's model); it should be
    the one that produced the trajectories, else the 'student' log-probs are another model's.
    arm: its sdar_beta sets the gate sigmoid(beta * gap) that is reported.
    teachers: external teacher endpoints (OpenAI-compatible chat URLs) for N-teacher trace replay.
    Empty by default; that channel is not built yet: see the Composer-channels issue (ALGORITHM.md
    section 5, channel 3), which will fill this seam with DPO pairs where >= 2 teachers agree.
    scores: JSON {gap_mean, gate_mean, pos_gap_frac, turns, trajectories: [...]}.
    """
    import json
    from collections import namedtuple
    from pathlib import Path

    if teachers:
        raise NotImplementedError(
            f"external N-teacher replay ({len(teachers)} teacher endpoint(s) given) is not implemented yet; it "
            "arrives with the Composer-channels issue (ALGORITHM.md section 5, channel 3: N-teacher trace replay). "
            "Leave `teachers` empty to score with the privileged self-teacher."
        )
    from sdar.algos import get_arm
    from sdar.config import load_config, parse_overrides
    from sdar.eval.report import read_trajectories
    from sdar.eval.report import teacher_replay as replay
    from sdar.train.trainer import Trainer

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
    cfg = load_config(config_path, ov)
    trainer = Trainer(cfg)
    out = replay(trainer.model, trainer.tokenizer, trainer.teacher, trajs, pad_id=trainer.pad_id,
                 beta=get_arm(arm, **cfg.arm_overrides).sdar_beta, batch_size=cfg.score_batch_size,
                 temperature=cfg.rollout.temperature, mask_forced_tokens=cfg.rollout.mask_forced_tokens)
    Path(scores.path).parent.mkdir(parents=True, exist_ok=True)
    Path(scores.path).write_text(json.dumps(out, indent=1))
    for k in ("gap_mean", "gate_mean", "pos_gap_frac", "forced_frac"):
        metrics.log_metric(k, float(out[k]))
    metrics.log_metric("turns", float(out["turns"]))
    print(f"{len(trajs)} trajectories, {out['turns']} turns: gap {out['gap_mean']:+.4f}, gate {out['gate_mean']:.4f}, "
          f"teacher endorses {out['pos_gap_frac']:.1%} of tokens")
    return namedtuple("ReplayOutputs", ["gap_mean", "gate_mean"])(out["gap_mean"], out["gate_mean"])
