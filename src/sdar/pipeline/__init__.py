"""The comparison pipeline's library: everything but the DAG and the KFP component shells.

settings  RunSettings (a run's sizes and arms) and ClusterSettings (what target="cluster" adds), no kfp import
steps     the work of each step as a plain function (paths and dicts in, plain values out), and the one place
          a step's config overrides are built (step_overrides, prepare_step)
services  the env service and the MLflow parent run of a pipeline run (launch_envs, teardown_envs)
cluster   the kfp-kubernetes settings of each step on a cluster (Secrets, resources, GPUs, pod security)
runner    compile / submit / run-local; it reaches the DAG (pipelines/sdar_comparison.py) through its entry
          point in group `sdar.pipelines`, never by importing pipelines/ or editing sys.path
cli       `sdar compile`, `sdar run --local`, `sdar submit`

components/ (one KFP component per file, each a thin shell over `steps` / `services`) and pipelines/ (the
DAG) are top-level packages of the same distribution. Importing this package imports nothing else.
"""
