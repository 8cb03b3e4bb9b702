"""Reading runs back: the runs of an output directory, a finished run's metric history, crashed runs closed."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from sdar.tracking.store import PARENT_TAG, reader


def close_crashed_runs(experiment: str, tags: Mapping[str, str], *, tracking_uri: str | None = None,
                       output_dir: str | os.PathLike | None = None, status: str = "KILLED") -> list[str]:
    """Mark RUNNING runs of `experiment` carrying all of `tags` as `status`: runs whose process died before
    it could end them (a kill before the first checkpoint leaves nothing to resume them from). Call it only
    while holding what makes such a run yours (the trainer's output-directory lock). Returns their ids."""
    try:
        uri, client = reader(tracking_uri, output_dir)
    except LookupError:  # no store yet: nothing can have crashed in it
        return []
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    query = " and ".join(["attributes.status = 'RUNNING'"] + [f"tags.`{k}` = '{v}'" for k, v in tags.items()])
    runs = client.search_runs([exp.experiment_id], filter_string=query)
    for run in runs:
        client.set_terminated(run.info.run_id, status=status)
        client.set_tag(run.info.run_id, "sdar.closed_by", "next start in the same output directory")
    return [r.info.run_id for r in runs]



@dataclass
class RunRecord:
    """One run as `find_runs` returns it: ids, status and the latest value of each metric."""

    run_id: str
    run_name: str
    status: str
    parent_run_id: str | None = None
    start_time: int | None = None  # ms since epoch
    end_time: int | None = None
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def find_runs(
    experiment: str,
    filter_string: str = "",
    *,
    tracking_uri: str | None = None,
    output_dir: str | os.PathLike | None = None,
    order_by: list[str] | None = None,
    max_results: int = 10_000,
) -> list[RunRecord]:
    """Runs of `experiment` matching an MLflow filter (e.g. "tags.mlflow.parentRunId = 'abc'"
    or "params.arm = 'sdar'"), newest first unless `order_by` says otherwise."""
    uri, client = reader(tracking_uri, output_dir)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise LookupError(
            f"experiment {experiment!r} not found in {uri}; runs are created by Tracker(experiment={experiment!r}) "
            "(check MLFLOW_TRACKING_URI / output_dir)"
        )
    out: list[RunRecord] = []
    token = None
    while len(out) < max_results:
        page = client.search_runs(
            [exp.experiment_id], filter_string, max_results=min(1000, max_results - len(out)),
            order_by=order_by, page_token=token,
        )
        for run in page:
            out.append(RunRecord(
                run_id=run.info.run_id, run_name=run.info.run_name, status=run.info.status,
                parent_run_id=run.data.tags.get(PARENT_TAG), start_time=run.info.start_time,
                end_time=run.info.end_time, params=dict(run.data.params), metrics=dict(run.data.metrics),
                tags=dict(run.data.tags),
            ))
        token = page.token
        if not token:
            break
    return out


def metric_history(
    run_id: str, key: str, *, tracking_uri: str | None = None, output_dir: str | os.PathLike | None = None
) -> list[tuple[int, float]]:
    """(step, value) of every logged value of metric `key` in a run, by step (for curves in reports)."""
    _, client = reader(tracking_uri, output_dir)
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
