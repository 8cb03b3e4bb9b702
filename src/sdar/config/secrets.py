"""The Kubernetes Secrets that hold a cluster run's credentials (k8s/ creates them): each a name and {environment
variable: key in the Secret}. The pipeline's steps (sdar.pipeline.settings.ClusterSettings) and the training jobs
(sdar.launch) read the same ones; a config names them (launch.secrets) and never holds a credential."""

from __future__ import annotations

from types import MappingProxyType

# MLflow's tracking URI (and, where the server wants them, its credentials): for the steps that log runs
MLFLOW_SECRET = "sdar-mlflow"
MLFLOW_KEYS = MappingProxyType({"MLFLOW_TRACKING_URI": "MLFLOW_TRACKING_URI"})
# S3 (or MinIO): for the checkpoints, which only training reads and writes
S3_SECRET = "sdar-s3"
S3_KEYS = MappingProxyType({"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
                            "SDAR_S3_ENDPOINT_URL": "SDAR_S3_ENDPOINT_URL"})
# the teacher pool's API keys, by the variable an endpoint's api_key_env names; optional wherever it is mounted (a
# pool of local models needs none)
TEACHER_SECRET = "sdar-teachers"
TEACHER_KEYS = MappingProxyType({"OPENAI_API_KEY": "OPENAI_API_KEY"})
