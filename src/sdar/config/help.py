"""The help of every setting, read from the fields themselves: what `sdar config fields` prints."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from dataclasses import fields, is_dataclass

from sdar.algos.arm_config import OVERRIDABLE, ArmConfig
from sdar.config.schema import TrainConfig


def config_fields(cls: type = TrainConfig, prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """(dotted key, type, default, help) of every setting under `cls`, depth first; the default as JSON
    (which is YAML), or `required`. `arm_overrides.*` are the ArmConfig settings a config may set (default:
    the arm's own), `replay.teachers[].*` the fields of one teacher endpoint."""
    import json

    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        key, tp = f"{prefix}{f.name}", hints[f.name]
        if is_dataclass(tp):
            yield from config_fields(tp, f"{key}.")
            continue
        default = (json.dumps(f.default) if f.default is not dataclasses.MISSING else
                   json.dumps(f.default_factory()) if f.default_factory is not dataclasses.MISSING else "required")
        yield key, str(f.type), default, f.metadata.get("help", "")
        if cls is TrainConfig and f.name == "arm_overrides":
            arm_fields = {g.name: g for g in fields(ArmConfig)}
            for name in OVERRIDABLE:
                yield f"{key}.{name}", str(arm_fields[name].type), "the arm's", arm_fields[name].metadata["help"]
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        if is_dataclass(item):
            yield from config_fields(item, f"{key}[].")
