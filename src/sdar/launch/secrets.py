"""How credentials reach a training job's workers: from the Kubernetes Secrets sdar.config.secrets names, never as
parameters. A TorchX job's pods read a Secret whole (envFrom: each key becomes the variable of its name); a
TrainJob's trainer has no envFrom, so it names each key (secretKeyRef)."""

from __future__ import annotations

from typing import Any, Iterable

from sdar.config.secrets import MLFLOW_KEYS, MLFLOW_SECRET, S3_KEYS, S3_SECRET, TEACHER_KEYS, TEACHER_SECRET

# environment variables that hold credentials or endpoints: they come from Kubernetes Secrets
# (or, for local_cwd, from the launching process's environment), never from a parameter
SECRET_ENV = frozenset({
    "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "SDAR_S3_ENDPOINT_URL",
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "MLFLOW_S3_ENDPOINT_URL",
})
SECRET_KEYS = {MLFLOW_SECRET: MLFLOW_KEYS, S3_SECRET: S3_KEYS, TEACHER_SECRET: TEACHER_KEYS}


def teacher_vars(cfg) -> set[str]:
    """The environment variables holding the API keys of the teachers a replaying arm asks (none otherwise)."""
    if cfg.resolved_arm().replay_coef == 0.0:
        return set()
    return {t.api_key_env for t in cfg.replay.teachers if t.api_key_env}


def teacher_secret_of(cfg) -> str:
    """The Secret a replaying arm's TorchX workers read its teachers' API keys from (envFrom: each key becomes the
    variable of its name), "" for an arm that asks no teacher for a key. A key stored under another name than
    its variable cannot arrive that way and is refused."""
    wanted = teacher_vars(cfg)
    if not wanted:
        return ""
    renamed = sorted(var for var in wanted if TEACHER_KEYS.get(var) != var)
    if renamed:
        raise ValueError(f"the teachers' api_key_env {', '.join(renamed)} is no key of the Secret {TEACHER_SECRET} "
                         f"(ClusterSettings.teacher_keys: {dict(TEACHER_KEYS)}): a TorchX job's workers read that "
                         "Secret whole, each key as the variable of its name; store the key under the variable's name, "
                         "or use launch.launcher=trainjob, which maps keys to variables")
    return TEACHER_SECRET


def env_from(secrets: list[str], teacher_secret: str = "") -> list[dict[str, Any]]:
    """A TorchX worker's envFrom: each of `secrets`, then the teachers' Secret, optional as in gated_train's pod."""
    out: list[dict[str, Any]] = [{"secretRef": {"name": s.strip()}} for s in secrets]
    if teacher_secret:
        out.append({"secretRef": {"name": teacher_secret, "optional": True}})
    return out


def secret_env(secrets: list[str], tracking: bool, teacher_vars: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The env entries (secretKeyRef) of the Secrets in `secrets`, key by key as the pipeline's steps get them
    (ClusterSettings: the MLflow Secret's keys only when the run tracks), then those of the teachers' Secret that
    `teacher_vars` names (the api_key_env of a replaying arm's teachers), optional as in gated_train's pod.
    A TrainJob's trainer has no envFrom: a Secret other than the pipeline's has no known keys and is refused."""
    wanted = {secret: dict(SECRET_KEYS.get(secret, {})) for secret in (s.strip() for s in secrets if s.strip())}
    unknown = [secret for secret in wanted if secret not in SECRET_KEYS]
    if unknown:
        raise ValueError(f"launch.secrets names {unknown[0]!r}, whose keys a TrainJob cannot know (it has no envFrom); "
                         f"use the pipeline's Secrets {', '.join(SECRET_KEYS)}")
    if not tracking:
        wanted.pop(MLFLOW_SECRET, None)
    teacher_vars = set(teacher_vars)
    missing = sorted(teacher_vars - set(TEACHER_KEYS))
    if missing:
        raise ValueError(f"the teachers' api_key_env {', '.join(missing)} is no key of the Secret {TEACHER_SECRET} "
                         f"(ClusterSettings.teacher_keys: {', '.join(TEACHER_KEYS)}): a TrainJob's workers could not "
                         "read it")
    if teacher_vars:
        wanted[TEACHER_SECRET] = {**wanted.get(TEACHER_SECRET, {}),
                                  **{var: TEACHER_KEYS[var] for var in sorted(teacher_vars)}}
    return [{"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key,
                                                         **({"optional": True} if secret == TEACHER_SECRET else {})}}}
            for secret, pairs in wanted.items() for var, key in pairs.items()]
