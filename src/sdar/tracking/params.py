"""Params and metrics as MLflow takes them: nested settings flattened to dotted keys, numbers only."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any

_MAX_PARAM_CHARS = 6000
_MAX_KEY_CHARS = 250


def _plain(value: Any) -> Any:
    """A nested dict for dataclasses / pydantic models / mappings; the value itself otherwise."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump") and callable(value.model_dump):
        return value.model_dump()
    return value


def flatten_params(params: Any, max_chars: int = 500, prefix: str = "") -> dict[str, str]:
    """`params` (mapping, dataclass, pydantic model, nested freely) as {'a.b.c': str}, values cut to max_chars.

    Lists become JSON; a cut value ends with '...'; an empty nested mapping is kept as '{}'.
    """
    if not 4 <= max_chars <= _MAX_PARAM_CHARS:
        raise ValueError(f"max_chars must be in [4, {_MAX_PARAM_CHARS}] (MLflow's limit), got {max_chars}")
    out: dict[str, str] = {}

    def text(v: Any) -> str:
        if isinstance(v, enum.Enum):
            v = v.value
        if isinstance(v, (list, tuple, set, frozenset)):
            seq = sorted(v, key=str) if isinstance(v, (set, frozenset)) else list(v)
            return json.dumps([_plain(x) for x in seq], default=str)
        return str(v)

    def walk(obj: Any, key: str) -> None:
        obj = _plain(obj)
        if isinstance(obj, Mapping):
            if not obj and key:
                out[key] = "{}"
            for k, v in obj.items():
                walk(v, f"{key}.{k}" if key else str(k))
            return
        if not key:
            raise TypeError(f"params must be a mapping or a dataclass, got {type(obj).__name__}")
        if len(key) > _MAX_KEY_CHARS:
            raise ValueError(f"param key {key[:60]!r}... is {len(key)} chars; MLflow allows {_MAX_KEY_CHARS}")
        s = text(obj)
        out[key] = s if len(s) <= max_chars else s[: max_chars - 3] + "..."

    walk(params, prefix)
    return out


def metric_value(key: str, value: Any) -> float:
    if hasattr(value, "item") and callable(value.item):  # torch / numpy scalars
        value = value.item()
    if isinstance(value, (bool, int, float)):
        return float(value)
    raise TypeError(f"metric {key!r} has a non-numeric value {value!r} ({type(value).__name__}); log numbers only")


