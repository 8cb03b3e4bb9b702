"""Experiment configuration: one tree of dataclasses with a help text per field, loaded from YAML.

`load_config("configs/household-tiny.yaml", overrides={"steps": 3})` returns a TrainConfig; unknown keys
are errors that list the valid ones, and every setting is checked there, once. `sdar config show` prints
the result, `sdar config fields` the help. Light imports only: reading a config never pulls torch.

The modules, each one concept: `sections` (the sections' fields, each with its help and, for a number with a range,
its bound), `schema` (TrainConfig, their root, and its check), `bounds` (the ranges and their check), `values`
(values typed as their fields), `compat` (moved settings and fields added later: what keeps older configs and
identities valid), `load` (file + overrides + family defaults -> TrainConfig), `help` (every setting's help),
`replay` (the N-teacher pool's settings). Import from `sdar.config` itself.
"""

from sdar.algos.arm_config import ARMS, OVERRIDABLE, ArmConfig, get_arm
from sdar.config.bounds import Bound, check_numbers, field_bounds
from sdar.config.compat import ADDED_DEFAULTS, MOVED_KEYS, RETIRED, drop_added_defaults, flat_layout
from sdar.config.help import config_fields
from sdar.config.load import (FAMILY_DEFAULTS, SET_HELP, ConfigError, apply_family_defaults, from_dict, load_config,
                              parse_overrides, parse_set)
from sdar.config.replay import ReplayConfig, TeacherEndpoint
from sdar.config.schema import NUMBER_BOUNDS, TrainConfig
from sdar.config.sections import (PENALIZE, PLACEMENTS, PRETOKENIZERS, REWARDS, SAMPLERS, STRATEGIES, CheckpointConfig,
                                  DistributedConfig, EnvConfig, EvalConfig, LaunchConfig, ModelConfig, OptimConfig,
                                  PPOConfig, RolloutConfig, ScoringConfig, TeacherConfig, VLLMConfig, WarmStartConfig)
from sdar.config.values import RENAMED_ARM_SETTINGS, check_arm_overrides

__all__ = [
    "ADDED_DEFAULTS", "ARMS", "FAMILY_DEFAULTS", "MOVED_KEYS", "NUMBER_BOUNDS", "OVERRIDABLE", "PENALIZE", "RETIRED",
    "PLACEMENTS", "PRETOKENIZERS", "RENAMED_ARM_SETTINGS", "REWARDS", "SAMPLERS", "SET_HELP", "STRATEGIES",
    "ArmConfig", "Bound",
    "CheckpointConfig", "ConfigError", "DistributedConfig", "EnvConfig", "EvalConfig", "LaunchConfig", "ModelConfig",
    "OptimConfig", "PPOConfig", "ReplayConfig", "RolloutConfig", "ScoringConfig", "TeacherConfig", "TeacherEndpoint",
    "TrainConfig", "VLLMConfig", "WarmStartConfig", "apply_family_defaults", "check_arm_overrides", "check_numbers",
    "config_fields", "drop_added_defaults", "field_bounds", "flat_layout", "from_dict", "get_arm", "load_config",
    "parse_overrides", "parse_set",
]
