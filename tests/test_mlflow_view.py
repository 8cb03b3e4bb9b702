"""The comparison's MLflow view (issue 38, points 2 and 3): saved on the tracking server, it shows the warm start
and every arm and seed of one pipeline job flat, in fixed colours, locally and with KFP's MLflow integration, whose
run layout is built here as KFP's backend builds it."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from kfp.dsl import Artifact

from tests.comparison_store import build_comparison_store, check_view

CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "household-tiny.yaml")


def test_the_view_is_saved_on_the_server_and_named_by_the_url(mlflow_uri):
    from mlflow.tracking import MlflowClient

    from sdar.tracking.view import VIEW_TAG_PREFIX, arm_color, view_key, view_state, view_url

    build_comparison_store(mlflow_uri, "job-1", ["grpo", "grpo_opsd", "sdar"], [0, 1])
    shown = check_view(mlflow_uri, "job-1", ["grpo", "grpo_opsd", "sdar"], [0, 1])
    exp_id = shown[0].info.experiment_id
    saved = json.loads(MlflowClient(mlflow_uri).get_experiment(exp_id).tags[VIEW_TAG_PREFIX + view_key("job-1")])
    assert saved == view_state("job-1") and saved["runsHiddenMode"] == "SHOW_ALL"
    assert [c["metricKey"] for c in saved["compareRunCharts"]][:2] == ["held-out success",
                                                                       "held-out success - own warm start"]
    query = parse_qs(urlsplit(view_url("http://127.0.0.1:5000", exp_id, "job-1")).fragment.split("?", 1)[1])
    assert query == {"workflowType": ["machine_learning"], "viewStateShareKey": [view_key("job-1")],
                     "compareRunsMode": ["CHART"]}
    # an arm's colour is the report plot's colour; distinct for the main arms and the warm start
    assert len({arm_color(a) for a in ("grpo", "grpo_opsd", "sdar", "warm-start")}) == 4
    # the paired difference of sdar (wins 4 of 6) from its warm start (2 of 6), logged into its run
    sdar = next(r for r in shown if r.info.run_name == "sdar-seed0")
    assert abs(sdar.data.metrics["held-out success - own warm start"] - 2 / 6) < 1e-9


def test_with_kfps_mlflow_integration_the_arms_sit_side_by_side_in_kfps_experiment(tmp_path, mlflow_uri, monkeypatch):
    """KFP's layout, from its backend (kubeflow/pipelines): the API server opens the pipeline run, tagged
    kfp.pipeline_run_id and mlflow.kfp.idempotencyKey (backend/src/apiserver/plugins/mlflow/handler.go
    OnBeforeRunCreation, util.go BuildKFPTags); each driver nests a run under its parent DAG's run, one per sub-DAG
    (the exit handler, a ParallelFor; backend/src/v2/driver/dag.go) and one per task (container.go), and the task's
    container gets MLFLOW_RUN_ID = its own run (backend/src/v2/common/plugins/mlflow/handler.go
    RetrieveUserContainerEnvVars). launch_envs runs three levels down, the arms' training inside the loop."""
    from mlflow.tracking import MlflowClient

    from components.launch_envs import launch_envs
    from sdar.tracking import PARENT_TAG

    client = MlflowClient(tracking_uri=mlflow_uri)
    kfp_run = "7b1c6a0e-5f0d-4a55-9d7e-2f4f3c1d9a11"  # the KFP run id: the pipeline's job id
    exp = client.create_experiment("KFP-Default")
    root = client.create_run(exp, run_name="sdar comparison", tags={
        "kfp.pipeline_run_id": kfp_run, "kfp.pipeline_run_url": f"http://kfp/#/runs/details/{kfp_run}",
        "mlflow.kfp.idempotencyKey": kfp_run}).info.run_id

    def nested(name: str, parent: str) -> str:
        return client.create_run(exp, run_name=name, tags={PARENT_TAG: parent}).info.run_id

    exit_dag = nested("exit-handler-1", root)
    launch_task, loop_dag = nested("launch-envs", exit_dag), nested("for-loop-2", exit_dag)
    train_task, teardown_task = nested("gated-train", loop_dag), nested("teardown-envs", root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", exp)
    monkeypatch.setenv("MLFLOW_RUN_ID", launch_task)
    endpoints = Artifact(name="endpoints", uri=str(tmp_path / "endpoints.json"))
    launch_envs.python_func(config_path=CONFIG, overrides="{}", job_id=kfp_run, endpoints=endpoints, target="cluster",
                            namespace="team-a", experiment="sdar-comparison", tracking_uri=mlflow_uri, dry_run=True)
    info = json.loads(Path(endpoints.path).read_text())
    assert info["parent_run_id"] == root and info["experiment"] == "KFP-Default"
    monkeypatch.setenv("MLFLOW_RUN_ID", train_task)  # the training step's own task run, two levels below the root
    build_comparison_store(mlflow_uri, kfp_run, ["grpo", "sdar"], [0], info=info)
    shown = check_view(mlflow_uri, kfp_run, ["grpo", "sdar"], [0])
    assert {r.info.experiment_id for r in shown} == {exp}
    assert {r.data.tags[PARENT_TAG] for r in shown} == {root}
    assert teardown_task not in {r.info.run_id for r in shown}  # KFP's own task runs stay out of the view
    assert client.get_experiment_by_name("sdar-comparison") is None


def test_sdar_ui_prints_the_url_of_the_newest_comparison_in_a_root(tmp_path, capsys):
    from sdar.cli import main
    from sdar.tracking import prepare_sqlite_store

    uri = prepare_sqlite_store(tmp_path / "mlflow.db")
    build_comparison_store(uri, "job-old", ["grpo"], [0])
    build_comparison_store(uri, "job-new", ["sdar"], [0])
    assert main(["ui", "--root", str(tmp_path), "--no-serve", "--port", "5123"]) == 0
    url = capsys.readouterr().out.strip()
    assert url.startswith("http://127.0.0.1:5123/#/experiments/") and "viewStateShareKey=sdar-job-new" in url
    assert main(["ui", "--root", str(tmp_path), "--no-serve", "--job", "job-old"]) == 0
    assert "viewStateShareKey=sdar-job-old" in capsys.readouterr().out
    import pytest

    with pytest.raises(SystemExit, match="no MLflow store at .*run `sdar run --local --quick` first"):
        main(["ui", "--root", str(tmp_path / "nothing"), "--no-serve"])


def test_sdar_submit_saves_the_runs_view_before_the_run_logs_and_prints_its_url(mlflow_uri, capsys, monkeypatch):
    from mlflow.tracking import MlflowClient

    from sdar.tracking.view import VIEW_TAG_PREFIX, view_key
    from sdar.pipeline.cli import _print_view

    _print_view("kfp-run-1", mlflow_uri, None)  # what `sdar submit --mlflow-url` does after submitting run kfp-run-1
    exp = MlflowClient(mlflow_uri).get_experiment_by_name("sdar-comparison")
    assert VIEW_TAG_PREFIX + view_key("kfp-run-1") in exp.tags
    assert f"/#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning" in capsys.readouterr().out
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    _print_view("kfp-run-2", None, None)  # no server known: how to get the URL once the run logs
    assert "sdar ui --tracking-uri MLFLOW_URL --job kfp-run-2" in capsys.readouterr().out


def test_sdar_submit_prints_the_view_in_the_experiment_the_compiled_pipeline_logs_to(mlflow_uri, capsys, monkeypatch,
                                                                                     tmp_path):
    """A pipeline compiled with another `experiment` default logs there: the printed URL is that experiment's, not
    sdar-comparison's (the KFP API server cannot run here, so `submit` returns a run id without one)."""
    import yaml
    from mlflow.tracking import MlflowClient

    from sdar.cli import main
    from sdar.tracking.view import VIEW_TAG_PREFIX, view_key
    from sdar.pipeline import runner

    ir = tmp_path / "pipeline.yaml"
    ir.write_text(yaml.safe_dump({"root": {"inputDefinitions": {"parameters": {
        "experiment": {"defaultValue": "team-a-household", "parameterType": "STRING"},
        "overrides": {"defaultValue": "{}", "parameterType": "STRING"}}}}}))
    monkeypatch.setattr(runner, "submit", lambda *a, **k: "kfp-run-3")
    assert main(["submit", "--host", "http://kfp.invalid", "--experiment", "kfp-exp", "--yaml", str(ir),
                 "--mlflow-url", mlflow_uri]) == 0
    out = capsys.readouterr().out
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("team-a-household")
    assert exp is not None and VIEW_TAG_PREFIX + view_key("kfp-run-3") in exp.tags
    assert f"/#/experiments/{exp.experiment_id}/runs" in out and "'team-a-household'" in out
    assert client.get_experiment_by_name("sdar-comparison") is None
    # --mlflow-experiment (KFP's MLflow integration chose it) wins over the compiled default
    assert main(["submit", "--host", "http://kfp.invalid", "--experiment", "kfp-exp", "--yaml", str(ir),
                 "--mlflow-url", mlflow_uri, "--mlflow-experiment", "KFP-Default"]) == 0
    assert "'KFP-Default'" in capsys.readouterr().out


def test_a_local_runs_view_names_the_command_that_serves_its_own_store(tmp_path):
    from mlflow.tracking import MlflowClient

    from sdar.pipeline.runner import _view
    from sdar.tags import PIPELINE_JOB_TAG
    from sdar.tracking import prepare_sqlite_store

    root = (tmp_path / "root").resolve()
    root.mkdir()
    uri = prepare_sqlite_store(root / "mlflow.db")
    client = MlflowClient(uri)
    exp = client.create_experiment("sdar-comparison")
    parent = client.create_run(exp, tags={PIPELINE_JOB_TAG: "job-9"}).info.run_id
    view = _view(uri, parent, root)  # the pipeline root's own store: `sdar ui --root` finds it
    assert view["ui_command"] == f"sdar ui --root {root} --job job-9" and view["job_id"] == "job-9"
    assert view["view_url"].startswith(f"http://127.0.0.1:5000/#/experiments/{exp}/runs?workflowType=")
    # a store outside the root (MLFLOW_TRACKING_URI set to another sqlite file): the command names that store
    assert _view(uri, parent, tmp_path / "elsewhere")["ui_command"] == f"sdar ui --tracking-uri {uri} --job job-9"


def test_the_words_before_a_view_url_say_how_to_serve_it():
    from sdar.tracking.view import how_to_open

    local = {"ui_command": "sdar ui --root /r --job j", "view_url": "http://127.0.0.1:5000/#/x"}
    assert how_to_open(local) == "`sdar ui --root /r --job j` starts the MLflow UI on this store, then open"
    assert how_to_open(local, "the study's store").endswith("on the study's store, then open")
    # a tracking server serves its own UI: nothing to start
    assert how_to_open({"ui_command": "", "view_url": "http://mlflow:5000/#/x"}) == "open the tracking server's own UI at"


def test_two_jobs_publishing_at_once_on_one_store_both_get_their_view(mlflow_uri, monkeypatch):
    """The race the shared-store test met on PostgreSQL: another job inserts the experiment-kind tag between our
    read and our insert, and our insert fails on the unique key. The tag then holds the value; publishing goes on."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from sdar.tracking import view

    exp_id = MlflowClient(mlflow_uri).create_experiment("race")
    other = MlflowClient(mlflow_uri)
    calls = []

    class Racing(MlflowClient):
        def set_experiment_tag(self, experiment_id, key, value):
            calls.append(key)
            if len(calls) == 1:  # the other job wins the first insert; ours fails as PostgreSQL's would
                other.set_experiment_tag(experiment_id, key, value)
                raise MlflowException("duplicate key value violates unique constraint \"experiment_tag_pk\"")
            return super().set_experiment_tag(experiment_id, key, value)

    monkeypatch.setattr(view, "mlflow_client", lambda uri: Racing(uri))
    key = view.publish_view(mlflow_uri, exp_id, "job-race")
    tags = MlflowClient(mlflow_uri).get_experiment(exp_id).tags
    assert tags[view.EXPERIMENT_KIND_TAG] == view.TRAINING_KIND
    assert json.loads(tags[view.VIEW_TAG_PREFIX + key]) == view.view_state("job-race")
    assert calls == [view.EXPERIMENT_KIND_TAG, view.VIEW_TAG_PREFIX + key]  # no second insert of a tag already set
    # a second publish of the same job writes nothing: every tag already holds its value
    calls.clear()
    view.publish_view(mlflow_uri, exp_id, "job-race")
    assert calls == []

    # an insert that keeps failing while the tag differs is an error, not a silent view without its tag
    class Failing(MlflowClient):
        def set_experiment_tag(self, experiment_id, key, value):
            raise MlflowException("the store is read-only")

    monkeypatch.setattr(view, "mlflow_client", lambda uri: Failing(uri))
    with pytest.raises(MlflowException, match="read-only"):
        view.publish_view(mlflow_uri, exp_id, "job-other")
