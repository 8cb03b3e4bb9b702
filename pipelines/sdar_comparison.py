"""The comparison pipeline as a Kubeflow Pipelines DAG; nothing else. `sdar compile`, `sdar submit` and `sdar run
--local` (sdar.pipeline.runner) reach it through its entry point (group `sdar.pipelines`, name
`sdar-comparison`, in pyproject.toml), the settings are sdar.pipeline.settings and the work of each step is
in sdar.pipeline.steps / services, called by the components in components/.

DAG: run_matrix -> launch_envs -> baseline evaluate (warm-started policy) -> ParallelFor over
(arm, seed): [rollout -> teacher_replay -> gated_train] x replay_rounds -> evaluate -> compare;
teardown_envs is the ExitHandler's exit task, so it runs even when a branch fails. Each round's
rollout plays the newest policy, teacher_replay scores it with the self-teacher and (arms with a
replay weight) turns the N-teacher pool's verdicts into DPO pairs, and gated_train continues the
arm's run with those pairs in its first step while on-policy RL goes on in-process. `target="cluster"` adds
GPUs, node selector, tolerations, the env-server image and namespace, and secrets
(sdar.pipeline.cluster); `target="local"` leaves them out, because the local runner ignores or rejects them.
"""

from typing import Any, List

from kfp import dsl

import components
from sdar.pipeline.cluster import apply_cluster_settings
from sdar.pipeline.settings import (DEFAULT_ARMS, DEFAULT_CONFIG, DEFAULT_EXPERIMENT, PIPELINE_NAME, TARGETS,
                                    ClusterSettings)


def build_pipeline(target: str = "local", image: str | None = None, cluster: ClusterSettings | None = None,
                   parallelism: int = 0, replay_rounds: int = 1):
    """The pipeline function for `target` ("local": the KFP local runner; "cluster": Kubeflow).

    image: the container image of every component (default: SDAR_IMAGE or the trainer image); on a
    cluster gated_train also gets it as SDAR_IMAGE, the image of the TorchX jobs it launches.
    cluster: GPU, scheduling, env-service and secret settings, applied only for target="cluster".
    parallelism: at most this many arms train at once (0: no limit; the local runner uses <= 2).
    replay_rounds: rollout -> teacher_replay -> gated_train rounds per arm, unrolled at compile time; round
        r trains to step ceil(steps * (r + 1) / R) from round r-1's run, so later rounds replay a newer policy.
    """
    if replay_rounds < 1:
        raise ValueError(f"replay_rounds must be >= 1, got {replay_rounds}")
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    from sdar.images import env_server_image

    c = components.for_image(image)
    cs = cluster or ClusterSettings()
    if cs.gpus < 0:
        raise ValueError(f"ClusterSettings.gpus must be >= 0 (0 = no GPU), got {cs.gpus}")
    on_cluster = target == "cluster"
    # the image the components were built for (SDAR_IMAGE or the trainer image when `image` is None)
    pipeline_image = c.gated_train.component_spec.implementation.container.image
    # the env server's image and namespace matter on a cluster only; locally launch_envs starts a process
    env_kw = {"env_image": cs.env_image or env_server_image(pipeline_image)} if on_cluster else {}
    default_namespace = cs.env_namespace if on_cluster else ""

    @dsl.pipeline(name=PIPELINE_NAME, description=(
        "GRPO vs GRPO+OPSD vs SDAR (and the Composer arms) on the same budget: launch environment services, "
        "evaluate the warm-started policy, then per arm and seed in parallel: rollout -> teacher replay -> gated "
        "training (x replay rounds) -> evaluate; compare; teardown always runs."))
    def sdar_comparison(
        family: str = "",
        model: str = "",
        arms: List[str] = DEFAULT_ARMS,
        seeds: List[int] = [0],
        steps: int = 0,
        group_size: int = 0,
        tasks_per_step: int = 0,
        eval_tasks: int = 0,
        episodes_per_task: int = 1,
        eval_temperature: float = 0.4,
        greedy: bool = False,
        config_path: str = DEFAULT_CONFIG,
        overrides: str = "{}",
        experiment: str = DEFAULT_EXPERIMENT,
        tracking: bool = True,
        tracking_uri: str = "",
        parent_run_id: str = "",
        output_root: str = "runs/kfp",
        checkpoint_root: str = "",
        namespace: str = default_namespace,
        report_dir: str = "",
        teacher_pool: str = "",
        replay_episodes: int = 8,
    ):
        """Sizes left at 0 and family/model left empty keep the config's values; `overrides` is a JSON
        object of dotted config keys applied to every step (e.g. '{"rollout.max_turns": 8}');
        `namespace` is where the env services go on a cluster ("" = the pipeline pods' own).
        `teacher_pool`: a YAML of the N-teacher pool (replay settings; "" = the config's, by default the
        local pool); `replay_episodes`: episodes each round's rollout step plays for teacher replay."""
        job_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        common = {"config_path": config_path, "overrides": overrides, "family": family}
        track = {"experiment": experiment, "tracking": tracking, "tracking_uri": tracking_uri, "output_root": output_root}

        teardown = c.teardown_envs(job_id=job_id, target=target, namespace=namespace, **track)
        with dsl.ExitHandler(teardown, name="comparison"):
            matrix = c.run_matrix(arms=arms, seeds=seeds, model=model, **common)
            launch = c.launch_envs(job_id=job_id, target=target, namespace=namespace, parent_run_id=parent_run_id,
                                   run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER, **env_kw, **common, **track).after(matrix)
            endpoints = launch.outputs["endpoints"]
            evals = {"model": model, "eval_tasks": eval_tasks, "episodes_per_task": episodes_per_task,
                     "temperature": eval_temperature, "greedy": greedy, "job_id": job_id}
            # the warm start of every seed (it depends on the seed): each arm is compared with its own seed's
            baseline = c.evaluate(label="baseline", arm="grpo", seed=0, seeds=seeds, endpoints=endpoints,
                                  **common, **evals, **track)
            # arms and seeds arrive as one flat list of {arm, seed}: the local runner mis-binds an outer
            # loop's item inside a nested ParallelFor, so there is a single loop
            with dsl.ParallelFor(matrix.output, parallelism=parallelism or None) as run:
                newest: dict[str, Any] = {}  # the previous round's policy (round 0: the config's warm start)
                rounds = []
                for r in range(replay_rounds):
                    roll = c.rollout(arm=run.arm, seed=run.seed, replay_round=r, episodes=replay_episodes,
                                     endpoints=endpoints, job_id=job_id, model=model, output_root=output_root,
                                     **common, **newest)
                    if r == 0:
                        roll.after(baseline)  # the warm starts are built once, by the baseline, before the arms share them
                    replay = c.teacher_replay(trajectories=roll.outputs["trajectories"], arm=run.arm, seed=run.seed,
                                              replay_round=r, teacher_pool=teacher_pool, job_id=job_id, model=model,
                                              output_root=output_root, **common, **newest)
                    train = c.gated_train(
                        arm=run.arm, seed=run.seed, endpoints=endpoints, job_id=job_id, model=model, steps=steps,
                        group_size=group_size, tasks_per_step=tasks_per_step, eval_tasks=eval_tasks,
                        checkpoint_root=checkpoint_root, pairs=replay.outputs["pairs"], replay_round=r,
                        replay_rounds=replay_rounds, **common, **track,
                    )
                    newest = {"checkpoint": train.outputs["checkpoint"]}
                    rounds.append((roll, replay, train))
                final = c.evaluate(checkpoint=train.outputs["checkpoint"], run_id=train.outputs["run_id"],
                                   arm=run.arm, seed=run.seed, endpoints=endpoints, **common, **evals, **track)
            report = c.compare(
                evaluations=dsl.Collected(final.outputs["result"]), histories=dsl.Collected(train.outputs["history"]),
                baseline=baseline.outputs["result"], endpoints=endpoints, tracking=tracking,
                tracking_uri=tracking_uri, output_root=output_root, report_dir=report_dir,
            )

        # every task's Python output line by line (a pipe block-buffers it): progress in the KFP logs as it happens
        for task in (matrix, launch, baseline, final, report, teardown, *(t for r in rounds for t in r)):
            task.set_env_variable("PYTHONUNBUFFERED", "1")
        if on_cluster:
            steps = {matrix: "run_matrix", launch: "launch_envs", baseline: "evaluate", final: "evaluate",
                     report: "compare", teardown: "teardown_envs"}
            for roll, replay, train_r in rounds:
                steps.update({roll: "rollout", replay: "teacher_replay", train_r: "gated_train"})
            apply_cluster_settings(steps, cs, pipeline_image)
            names = [(matrix, "run matrix"), (launch, "launch env services"), (baseline, "baseline eval"),
                     (final, "evaluate arm"), (report, "compare"), (teardown, "teardown env services")]
            for r, (roll, replay, train_r) in enumerate(rounds):
                tail = f" (round {r + 1})" if replay_rounds > 1 else ""
                names += [(roll, f"rollout{tail}"), (replay, f"teacher replay{tail}"), (train_r, f"train arm{tail}")]
            for task, name in names:
                task.set_display_name(name)

    return sdar_comparison
