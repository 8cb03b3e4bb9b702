"""The MLflow tags sdar writes and reads in more than one module, named once."""

from __future__ import annotations

# the tag that ties a pipeline's runs to its KFP job (sdar.pipeline.mlflow_runs opens and ends its parent run; the
# arms' runs inherit it from their parent); the comparison's MLflow view filters on it (sdar.tracking.view)
PIPELINE_JOB_TAG = "sdar.pipeline_job_id"
