"""Loading a config: a YAML file, dotted overrides (`--set KEY=VALUE`, a pipeline's JSON) and the family's defaults
made one TrainConfig, checked once; every setting that cannot be used is a ConfigError naming its key."""

from __future__ import annotations

import argparse
import copy
import sys
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from sdar.config.compat import MOVED_KEYS, drop_retired
from sdar.config.schema import TrainConfig
from sdar.config.sections import EnvConfig
from sdar.config.values import coerce_number


class ConfigError(ValueError):
    """A setting that cannot be used; the message names its key and what it may be. `sdar` prints it, no
    traceback, and exits with status 2."""


def from_dict(cls, data: dict[str, Any], where: str = "config"):
    """Build dataclass `cls` from a nested dict, rejecting unknown keys with the valid list (and a setting that
    moved into a section with its new place)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping, got {type(data).__name__}")
    if cls is TrainConfig:  # a retired switch (compat.RETIRED) loads, said once
        data = copy.deepcopy(data)
        for note in drop_retired(data, where):
            print(note, file=sys.stderr)
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if cls is TrainConfig and (old := [k for k in unknown if k in MOVED_KEYS]):
        raise ValueError("; ".join(f"{k} is now {MOVED_KEYS[k]}" for k in old) + f" (in {where}: the settings were "
                         "grouped into sections optim, ppo, scoring, teacher, eval and checkpoint; write e.g. "
                         f"`{MOVED_KEYS[old[0]].split('.')[0]}: {{{MOVED_KEYS[old[0]].split('.')[1]}: ...}}` in YAML or "
                         f"--set {MOVED_KEYS[old[0]]}=...)")
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; valid keys: {', '.join(sorted(known))}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        tp = hints[name]
        if is_dataclass(tp):
            kwargs[name] = from_dict(tp, value or {}, f"{where}.{name}")
        else:
            kwargs[name] = coerce_number(tp, value, f"{where}.{name}")
    return cls(**kwargs)


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    for p in parts[:-1]:
        data = data.setdefault(p, {})
    data[parts[-1]] = value


SET_HELP = "override a config key: a dotted KEY and a YAML VALUE, e.g. rollout.max_turns=10 (repeatable)"


def parse_set(item: str) -> tuple[str, Any]:
    """One `KEY=VALUE` of `--set` (the argparse type of every command's --set, and of `sdar submit
    --arg`): a dotted key and a YAML value, e.g. `rollout.max_turns=10`, `env.kwargs={backend: alfworld}`,
    `optim.lr=2e-3`, `checkpoint.uri=` (null)."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not all(part.strip() for part in key.split(".")):
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE, a dotted key and a YAML value (e.g. rollout.max_turns=10), got {item!r}")
    try:
        return key, yaml.safe_load(text)
    except yaml.YAMLError as exc:
        why = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise argparse.ArgumentTypeError(f"the value of {key} is not YAML ({why}): {text!r}") from None


def parse_overrides(text: str | None) -> dict[str, Any]:
    """Dotted config overrides from a JSON object (how pipeline components receive them: a KFP
    dict parameter would turn ints into floats)."""
    import json

    ov = json.loads(text or "{}")
    if not isinstance(ov, dict):
        raise ValueError("overrides must be a JSON object of dotted config keys, e.g. "
                         f"'{{\"rollout.max_turns\": 8}}', got {text!r}")
    return ov


# Settings that differ by task family in the reference's example scripts (ZJU-REAL/SDAR
# examples/sdar_trainer/run_{alfworld,webshop,search}_3b.sh: env.max_steps, env.history_length,
# actor.kl_loss_coef, actor.invalid_action_penalty_coef, actor.ppo_mini_batch_size). `load_config`
# fills each one the config file and the overrides leave unset.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    # KL 0.01 for household and shop is every arm's own default (ArmConfig.kl_coef)
    "household": {"rollout.max_turns": 50, "rollout.history": 2, "rollout.invalid_penalty": 0.1,
                  "ppo.mini_batch_size": 256},
    "shop": {"rollout.max_turns": 15, "rollout.history": 2, "rollout.invalid_penalty": 0.1, "ppo.mini_batch_size": 64},
    "searchqa": {"rollout.max_turns": 4, "rollout.history": 4, "arm_overrides.kl_coef": 0.001,
                 "rollout.invalid_penalty": 0.01, "ppo.mini_batch_size": 256},
}


def _has_dotted(data: dict[str, Any], key: str) -> bool:
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def apply_family_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the family's defaults (FAMILY_DEFAULTS) for every key it does not set itself."""
    family = (data.get("env") or {}).get("family", EnvConfig.family)
    for key, value in FAMILY_DEFAULTS.get(family, {}).items():
        if not _has_dotted(data, key):
            _set_dotted(data, key, value)
    return data


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """A TrainConfig from a YAML file (or the defaults) plus dotted overrides
    (`{"steps": 3, "rollout.max_turns": 10}`), with the family's defaults (FAMILY_DEFAULTS) for the
    keys neither sets. Settings are checked here, once."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"config file {p} not found; see configs/ for examples")
        data = yaml.safe_load(p.read_text()) or {}
    for k, v in (overrides or {}).items():
        _set_dotted(data, k, v)
    if isinstance(data, dict):
        apply_family_defaults(data)
    try:
        cfg = from_dict(TrainConfig, data, where=str(path or "config"))
        cfg.validate()
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:  # every check names its key: one kind of error for every caller
        raise ConfigError(str(exc)) from exc
    return cfg
