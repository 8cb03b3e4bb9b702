"""The `replay:` settings live in the config layer (`sdar.config.replay`); this module keeps their old import path."""

from sdar.config.replay import DEFAULT_LOCAL_EXPERTS, ReplayConfig, TeacherEndpoint, load_pool_file

__all__ = ["DEFAULT_LOCAL_EXPERTS", "ReplayConfig", "TeacherEndpoint", "load_pool_file"]
