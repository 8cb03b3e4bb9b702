"""DPO pairs from N-teacher trace replay (Composer channel 3): where at least `min_agree` teachers
propose the same action X for a turn and the student took Y != X, (chosen X, rejected Y).

Pure voting (`vote`), the replay over trajectories (`build_pairs`), and the JSONL form a pipeline
passes between steps (`write_pairs` / `read_pairs`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # kept out of the import: the sdar.agent package pulls torch
    from sdar.agent.prompts import PromptBuilder
    from sdar.agent.rollout import Trajectory
    from sdar.replay.pool import TeacherPool


@dataclass
class ReplayPair:
    """One DPO pair at turn `turn` of trajectory `traj` (indices into the replayed list).

    chosen: the agreed teacher action X (the response to train on is `format_action(family, X)`).
    rejected: the student's action Y; its exact response tokens are `rejected_ids`.
    agree: how many teachers proposed X; teachers: how many were asked.
    task_id, prompt_ids (the student's prompt at that turn), rejected_ids: filled by `build_pairs`
        so a pair file is self-contained.
    """

    traj: int
    turn: int
    chosen: str
    rejected: str
    agree: int
    teachers: int
    task_id: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    rejected_ids: list[int] = field(default_factory=list)


def normalize_action(action: str) -> str:
    """The comparison form of an action: whitespace collapsed, lower case."""
    return " ".join(action.split()).lower()


def vote(actions: Sequence[str | None], min_agree: int = 2) -> tuple[str | None, int]:
    """The plurality action among teacher proposals (None = no vote) and its count.

    Returns (X, n) when X has the most votes, alone, and n >= min_agree; else (None, n) with n the
    top count (0 with no votes). X is spelled as the first teacher that proposed it spelled it.
    """
    if min_agree < 1:
        raise ValueError(f"min_agree must be >= 1, got {min_agree}")
    spelled: dict[str, str] = {}
    counts: Counter[str] = Counter()
    for a in actions:
        if a is None or not a.strip():
            continue
        k = normalize_action(a)
        spelled.setdefault(k, " ".join(a.split()))
        counts[k] += 1
    if not counts:
        return None, 0
    (top, n), *rest = counts.most_common()
    if n < min_agree or (rest and rest[0][1] == n):
        return None, n
    return spelled[top], n


def teacher_action(text: str | None, family: str, admissible: list[str] | None) -> str | None:
    """A teacher reply as a vote: its action when it parsed and is admissible (where there is a list, matched
    up to whitespace and case and returned in the list's spelling), else None."""
    from sdar.agent.parsing import parse_response

    if text is None:
        return None
    p = parse_response(text, family, admissible or None)
    if p.valid:
        return p.action
    if p.valid_format and admissible:  # "Go to  Desk 1" is "go to desk 1": the admissible spelling votes
        want = normalize_action(p.action)
        return next((a for a in admissible if normalize_action(a) == want), None)
    return None


def build_pairs(trajs: list[Trajectory], pool: TeacherPool, builder: PromptBuilder, family: str,
                min_agree: int = 2) -> tuple[list[ReplayPair], dict[str, float]]:
    """Replay every turn of `trajs` to the pool's teachers and pair their agreed action with the student's.

    Each teacher sees exactly what the student saw: `builder.messages` of the turn's view with the
    history the student's prompt kept (`builder.history - turn.history_dropped`). Replies that do not
    parse, or name an action outside the turn's admissible list, cast no vote.
    Returns (pairs, stats): `replay/turns`, `replay/agreement_rate` (turns where an action reached
    min_agree), `replay/pairs`, `replay/pairs_per_trajectory`, `replay/student_agrees_rate` (of the
    agreed turns, those where the student already took X), `replay/teacher_valid_rate` (replies that
    were a valid action), merged with the pool's cumulative `pool.stats()`.
    """
    where = [(ti, k) for ti, t in enumerate(trajs) for k in range(len(t.turns))]
    messages = []
    for ti, k in where:
        turn = trajs[ti].turns[k]
        messages.append(builder.messages(turn.view, history=builder.history - turn.history_dropped))
    replies = pool.propose(messages) if messages else []
    n_teachers = len(pool.endpoints)
    pairs: list[ReplayPair] = []
    agreed = student_agrees = valid = 0
    for (ti, k), texts in zip(where, replies):
        turn = trajs[ti].turns[k]
        actions = [teacher_action(t, family, turn.view.admissible_actions) for t in texts]
        valid += sum(a is not None for a in actions)
        x, n = vote(actions, min_agree)
        if x is None:
            continue
        agreed += 1
        if normalize_action(turn.action) == normalize_action(x):
            student_agrees += 1
            continue
        pairs.append(ReplayPair(traj=ti, turn=k, chosen=x, rejected=turn.action, agree=n, teachers=n_teachers,
                                task_id=trajs[ti].task_id, prompt_ids=list(turn.prompt_ids),
                                rejected_ids=list(turn.response_ids)))
    turns = len(where)
    stats = {
        "replay/turns": float(turns),
        "replay/agreement_rate": agreed / turns if turns else 0.0,
        "replay/pairs": float(len(pairs)),
        "replay/pairs_per_trajectory": len(pairs) / len(trajs) if trajs else 0.0,
        "replay/student_agrees_rate": student_agrees / agreed if agreed else 0.0,
        "replay/teacher_valid_rate": valid / (turns * n_teachers) if turns and n_teachers else 0.0,
    }
    return pairs, {**pool.stats(), **stats}


def write_pairs(path: str | Path, pairs: Sequence[ReplayPair]) -> Path:
    """Write pairs as JSONL, one object per line with every `ReplayPair` field; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        for p in pairs:
            fh.write(json.dumps(asdict(p), ensure_ascii=False) + "\n")
    return out


def read_pairs(path: str | Path) -> list[ReplayPair]:
    """Pairs written by `write_pairs`; a malformed line is an error naming the file and line."""
    known = {f.name for f in fields(ReplayPair)}
    pairs = []
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row: dict[str, Any] = json.loads(line)
                unknown = sorted(set(row) - known)
                if unknown:
                    raise ValueError(f"unknown field(s) {unknown}; valid fields: {', '.join(sorted(known))}")
                pairs.append(ReplayPair(**row))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a replay pair ({exc})") from exc
    return pairs
