"""Which held-out tasks an evaluation plays: stratified over task types by default.

`select_tasks` takes N task ids round-robin over the task types (in the order the types first
appear in the split's listing, each type's ids in listing order), so every type is represented
even where a split is sorted by type (ALFWorld's official games are: the first 12 valid_seen
games are only two of the six types). `order="first"` keeps the first N ids as listed, and a
config can name the task ids outright (`eval_task_ids`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

ORDERS = ("stratified", "first")


def task_type_of(family: str, task_id: str) -> str | None:
    """The task type a task id names, without playing it; None where the id does not say.

    household: sim ids ("sim/heat/000123") and ALFWorld game paths (the task directory's prefix);
    searchqa: the question type ("searchqa/two_hop/000042"); shop ids carry no type.
    """
    try:
        if family == "household":
            if task_id.startswith("sim/"):
                from sdar_envs.household.sim import parse_task_id

                return parse_task_id(task_id)[0]
            from sdar_envs.household.alfworld_data import task_type_of as game_type

            return game_type(task_id)
        if family == "searchqa":
            from sdar_envs.searchqa.questions import parse_task_id as qa_task

            return qa_task(task_id)[0]
    except ValueError:
        return None
    return None


def select_tasks(
    task_ids: Sequence[str],
    n: int | None,
    type_of: Callable[[str], str | None] | None = None,
    order: str = "stratified",
) -> list[str]:
    """`n` of `task_ids` (all when n is None or exceeds them), deterministically.

    order="stratified": round-robin over the task types (`type_of(id)`; ids whose type is
    unknown form one group), the types in the order they first appear in `task_ids` and each
    type's ids in listing order, so the counts per type differ by at most one while a type has
    ids left. order="first": the first n ids as listed.
    """
    if order not in ORDERS:
        raise ValueError(f"unknown eval task order {order!r}; choose one of {', '.join(ORDERS)}")
    ids = list(task_ids)
    n = len(ids) if n is None else max(0, min(int(n), len(ids)))
    if order == "first" or type_of is None:
        return ids[:n]
    groups: dict[Any, list[str]] = {}
    for tid in ids:
        groups.setdefault(type_of(tid), []).append(tid)
    queues = list(groups.values())
    out: list[str] = []
    depth = 0
    while len(out) < n:
        for queue in queues:
            if depth < len(queue):
                out.append(queue[depth])
                if len(out) == n:
                    break
        depth += 1
    return out


def eval_task_set(env: Any, cfg: Any) -> list[str]:
    """The evaluation tasks of a `TrainConfig` on `env` (a TextEnv or a RemoteEnv).

    `cfg.eval.task_ids` when given (as listed; the split is then not read), else `cfg.eval.tasks`
    ids of `cfg.env.eval_split` chosen by `cfg.eval.task_order` (see `select_tasks`).
    """
    given = list(cfg.eval.task_ids or [])
    if given:
        return given
    family = cfg.env.family
    return select_tasks(env.task_ids(cfg.env.eval_split), cfg.eval.tasks,
                        type_of=lambda tid: task_type_of(family, tid),
                        order=cfg.eval.task_order)


def read_task_list(spec: str) -> list[str]:
    """Task ids from the command line: a file with one id per line (blank lines and '#'
    comments skipped), else a comma-separated list."""
    from pathlib import Path

    path = Path(spec)
    if path.is_file():
        lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
        ids = [line for line in lines if line]
    else:
        ids = [part.strip() for part in spec.split(",") if part.strip()]
    if not ids:
        raise ValueError(f"no task ids in {spec!r}; give a file with one id per line or ids separated by commas")
    return ids
