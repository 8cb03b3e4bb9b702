"""Kubeflow Pipelines DAGs of sdar, each registered as an entry point of group `sdar.pipelines` (pyproject.toml);
compile / submit / run-local live in the library (sdar.pipeline.runner)."""
