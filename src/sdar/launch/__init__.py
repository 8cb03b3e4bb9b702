"""Training as a job of `nodes` x `procs_per_node` torchrun workers (`torchrun -m sdar.cli train ...`), launched
and waited for by the `gated_train` pipeline step: a Kubeflow Trainer TrainJob (`trainjob`) or a TorchX job
(`torchx_job`, also a TorchX component), the same command, config and pods either way.

What the two launchers share, each in its module: `job` (the command's arguments, the namespace, the result the
job publishes to the checkpoint store, stopping on SIGTERM), `pods` (the restricted security context and the
writable directories of a read-only root filesystem) and `secrets` (which Kubernetes Secrets reach the workers, and
how). Nothing here imports the pipeline layer above it (sdar.pipeline calls these).
"""
