"""Policy trajectories as JSONL (the shared expert format plus what a replay needs), the
privileged-teacher replay of such a file (per-trajectory teacher-student gap and SDAR gate), and
the env factory the pipeline's steps use to play on a shared env server.

Used by the pipeline's components, so rollout, replay, training and evaluation can run alone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sdar_envs.expert import validate_trajectory

from sdar.agent.prompts import TurnView
from sdar.agent.rollout import Trajectory, Turn, TurnBatch

TRAJECTORY_FORMAT = 1


def trajectory_record(traj: Trajectory, family: str, backend: str = "policy") -> dict[str, Any]:
    """One episode as a record of the shared trajectory format (family, backend, task_id, task_type,
    task, skills_key, won, reward, steps, final_observation), plus a `policy` section with what the
    model saw and produced per turn (token ids, response text, history, memory), so a replay can
    rebuild the exact prompts. final_observation is "" (the rollout loop does not keep it)."""
    steps, turns = [], []
    for k, t in enumerate(traj.turns):
        steps.append({"observation": t.view.observation, "admissible_actions": list(t.view.admissible_actions),
                      "action": t.action, "reward": float(t.reward),
                      # the env ended the episode on the last turn unless the turn budget cut it
                      "done": k == len(traj.turns) - 1 and (traj.won or len(traj.turns) < t.view.max_steps)})
        turns.append({
            "step": t.view.step, "max_steps": t.view.max_steps, "history": [list(h) for h in t.view.history],
            "memory": t.view.memory, "prompt_ids": list(t.prompt_ids), "response_ids": list(t.response_ids),
            "response": t.response_text, "valid": bool(t.valid), "env_valid": bool(t.env_valid),
            "error_kind": t.error_kind, "hint_template_key": t.hint_template_key, "error_args": t.error_args,
            "history_dropped": int(t.history_dropped), "format_valid": bool(t.format_valid),
            # constrained decoding: the allowed tokens per response position, so a replay scores the same
            # renormalised distribution and knows which tokens were forced (null when unconstrained)
            "allowed": t.allowed,
        })
    task = traj.turns[0].view.task if traj.turns else ""
    return {
        "family": family, "backend": backend, "task_id": traj.task_id, "task_type": traj.task_type, "task": task,
        "skills_key": traj.task_type, "won": bool(traj.won), "reward": float(traj.reward), "steps": steps,
        "final_observation": "",
        "policy": {"format": TRAJECTORY_FORMAT, "group": traj.group, "skills": traj.skills, "turns": turns},
    }


def write_trajectories(path: str | os.PathLike, trajs: list[Trajectory], family: str, backend: str = "policy") -> int:
    """Write one record per trajectory (atomically: a reader never sees half a file); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as fh:
        for t in trajs:
            fh.write(json.dumps(trajectory_record(t, family, backend)) + "\n")
    os.replace(tmp, path)
    return len(trajs)


def trajectory_from_record(rec: dict[str, Any], where: str = "record") -> Trajectory:
    """Rebuild a `Trajectory` (prompts, token ids and views included) from `trajectory_record`'s output."""
    pol = rec.get("policy")
    if not isinstance(pol, dict) or "turns" not in pol:
        raise ValueError(f"{where} has no 'policy' section: it is not a policy rollout (expert files carry no "
                         "token ids); write it with the rollout step or sdar.eval.report.write_trajectories")
    if pol.get("format") != TRAJECTORY_FORMAT:
        raise ValueError(f"{where} has trajectory format {pol.get('format')!r}; this sdar reads format {TRAJECTORY_FORMAT}")
    if len(pol["turns"]) != len(rec["steps"]):
        raise ValueError(f"{where}: {len(rec['steps'])} steps but {len(pol['turns'])} policy turns")
    traj = Trajectory(rec["task_id"], rec["task_type"], int(pol.get("group", 0)), skills=pol.get("skills", ""),
                      won=bool(rec["won"]), reward=float(rec["reward"]))
    for step, t in zip(rec["steps"], pol["turns"]):
        view = TurnView(task=rec.get("task") or "", step=int(t["step"]), max_steps=int(t["max_steps"]),
                        observation=step["observation"], admissible_actions=list(step["admissible_actions"]),
                        history=[tuple(h) for h in t["history"]], memory=t.get("memory", ""))
        traj.turns.append(Turn(view=view, prompt_ids=list(t["prompt_ids"]), response_ids=list(t["response_ids"]),
                               response_text=t["response"], action=step["action"], valid=bool(t["valid"]),
                               env_valid=bool(t["env_valid"]), reward=float(step["reward"]),
                               error_kind=t.get("error_kind"), hint_template_key=t.get("hint_template_key"),
                               error_args=t.get("error_args"), history_dropped=int(t.get("history_dropped", 0)),
                               allowed=t.get("allowed"), format_valid=bool(t.get("format_valid", True))))
    return traj


def read_trajectories(path: str | os.PathLike) -> list[Trajectory]:
    """The trajectories of a file written by `write_trajectories`, validated line by line."""
    out = []
    with Path(path).open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where} is not JSON ({exc}); expected one episode per line") from exc
            validate_trajectory(rec, where)
            out.append(trajectory_from_record(rec, where))
    return out


def teacher_replay(model, teacher, trajs: list[Trajectory], *, gate_beta: float = 5.0,
                   mask_forced_tokens: bool = True) -> dict[str, Any]:
    """Score every turn of `trajs` under the student (its recorded prompt) and under the privileged
    teacher (`teacher`, a `TeacherScorer`), both with the teacher's `Scorer` (at the rollout's temperature) and
    under the same constrained distribution the turn was sampled from: per-trajectory and overall token-mean gap
    (log p_teacher - log p_student), SDAR gate sigmoid(gate_beta * gap), and the share of tokens the
    teacher endorses (gap > 0), over the tokens that carried a choice (all tokens with
    mask_forced_tokens=False); `forced_frac` is the share left out. No gradient; the model is not changed."""
    import torch

    from sdar.algos.sdar import sdar_gate
    from sdar.models.scoring import free_token_mask

    batch = TurnBatch.of(trajs)
    allowed = batch.allowed
    if not len(batch):
        raise ValueError("no turns to replay: every trajectory is empty")
    student = teacher.scorer.score(model, batch.prompts, batch.responses, allowed)
    gate, gap = sdar_gate(student.logp, teacher.score(model, batch).logp, gate_beta)
    mask = free_token_mask(allowed, student.mask, forced_free=not mask_forced_tokens)
    forced_frac = 1.0 - float(free_token_mask(allowed, student.mask).sum()) / max(float(student.mask.sum()), 1.0)

    def stats(rows: slice) -> dict[str, float]:
        m = mask[rows]
        n = float(m.sum().clamp(min=1.0))
        return {"gap_mean": float((gap[rows] * m).sum()) / n, "gate_mean": float((gate[rows] * m).sum()) / n,
                "pos_gap_frac": float(((gap[rows] > 0).float() * m).sum()) / n, "tokens": float(m.sum())}

    per_traj = []
    for tr, span in zip(trajs, batch.trajectory_rows()):
        rows = slice(span.start, span.stop)
        per_traj.append({"task_id": tr.task_id, "task_type": tr.task_type, "won": tr.won, "turns": len(tr.turns),
                         **(stats(rows) if tr.turns else {})})
    with torch.no_grad():
        overall = stats(slice(0, len(batch)))
    return {"gate_beta": gate_beta, "turns": len(batch), "forced_frac": forced_frac, **overall,
            "trajectories": per_traj}


