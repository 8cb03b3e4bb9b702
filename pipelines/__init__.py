"""Kubeflow Pipelines DAGs of sdar and their compile / submit / run-local helpers."""
