"""Values as a config file or --set writes them, made typed settings: YAML's and KFP's numbers coerced, a value of
the wrong type refused naming its key, and arm_overrides checked against the ArmConfig fields a config may set."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from sdar.algos.arm_config import OVERRIDABLE, ArmConfig


def coerce_number(tp: Any, value: Any, where: str) -> Any:
    """Numbers for float/int fields: YAML 1.1 reads `2e-3` (no dot) as a string, and a KFP dict
    parameter turns ints into floats; anything else that is not a number is a clear error."""
    if tp is float and isinstance(value, (str, int)) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{where} must be a number, got {value!r}") from None
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if tp is int and isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{where} must be an integer, got {value!r}") from None
    return value


def typed_setting(tp: Any, value: Any, where: str) -> Any:
    """`value` as a setting of type `tp` (bool, int, float, str, `X | None`, or ArmConfig.extra_coefs'
    (name, weight) pairs, also written as a mapping); a value of another type is an error naming `where`."""
    args = typing.get_args(tp)
    if type(None) in args:  # X | None
        return None if value is None else typed_setting(next(a for a in args if a is not type(None)), value, where)
    if typing.get_origin(tp) is tuple:  # extra_coefs: tuple[tuple[str, float], ...]
        pairs = value.items() if isinstance(value, Mapping) else value
        try:
            return tuple((str(k), float(coerce_number(float, w, where))) for k, w in pairs)
        except (TypeError, ValueError):
            raise ValueError(f"{where} must map loss-term weight names to numbers (e.g. {{sq_coef: 0.5}}), "
                             f"got {value!r}") from None
    value = coerce_number(tp, value, where)
    if tp in (int, float) and (isinstance(value, bool) or not isinstance(value, tp)):
        raise ValueError(f"{where} must be {'an integer' if tp is int else 'a number'}, got {value!r}")
    if tp in (bool, str) and not isinstance(value, tp):
        raise ValueError(f"{where} must be {'true or false' if tp is bool else 'a string'}, got {value!r}")
    return value


RENAMED_ARM_SETTINGS = {"sdar_beta": "gate_beta"}  # old name -> new name, for a clear error


def check_arm_overrides(overrides: Any, where: str = "arm_overrides") -> dict[str, Any]:
    """`overrides` checked against the ArmConfig fields a config may set (every one but `name`) and
    their types; a misspelled setting is an error that names it and lists the valid ones."""
    if not isinstance(overrides, Mapping):
        raise ValueError(f"{where} must be a mapping of arm settings (e.g. {{kl_coef: 0.001}}), got {overrides!r}")
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    renamed = {old: new for old, new in RENAMED_ARM_SETTINGS.items() if old in unknown}
    if renamed:
        raise ValueError(f"{where}: " + "; ".join(f"{old!r} is now called {new!r}" for old, new in renamed.items())
                         + " (one name for each beta: gate_beta, jsd_beta, dpo_beta, and replay_coef)")
    if unknown:
        raise ValueError(f"unknown arm setting(s) {unknown} in {where}; valid settings: "
                         f"{', '.join(sorted(OVERRIDABLE))}")
    hints = typing.get_type_hints(ArmConfig)
    return {k: typed_setting(hints[k], v, f"{where}.{k}") for k, v in overrides.items()}

