"""The ranges numeric settings may take. A field declares its own beside its help (`metadata={"help": ..., "bound":
">= 1"}`); `check_numbers` reads them at load, so a range and its setting are read and changed in one place."""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

_ONE_SIDED = re.compile(r"^(>=|>|<=|<)\s*(\S+)$")
_INTERVAL = re.compile(r"^(?:in\s+)?([\[(])\s*(\S+)\s*,\s*(\S+)\s*([\])])$")


@dataclass(frozen=True)
class Bound:
    """The values a numeric setting may take: lo (inclusive unless lo_open) up to hi (same); None = no bound."""

    lo: float | None = None
    lo_open: bool = False
    hi: float | None = None
    hi_open: bool = False

    @classmethod
    def parse(cls, text: str) -> Bound:
        """A bound as a field's metadata writes it: `>= 0`, `> 0`, `<= 1`, `< 1`, or an interval `[0, 1]`, `(0, 1]`
        (the same notation the errors print)."""
        text = text.strip()
        if m := _ONE_SIDED.match(text):
            op, number = m.group(1), float(m.group(2))
            if op.startswith(">"):
                return cls(lo=number, lo_open=op == ">")
            return cls(hi=number, hi_open=op == "<")
        if m := _INTERVAL.match(text):
            return cls(float(m.group(2)), m.group(1) == "(", float(m.group(3)), m.group(4) == ")")
        raise ValueError(f"bound {text!r} is not one of >= x, > x, <= x, < x or an interval such as [0, 1) or (0, 1]")

    def holds(self, value: float) -> bool:
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)

    def __str__(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {self.lo:g}"
        if self.lo is None:
            return f"{'<' if self.hi_open else '<='} {self.hi:g}"
        return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"


def field_bounds(cls: type, prefix: str = "", names: Iterable[str] | None = None) -> dict[str, Bound]:
    """Dotted key -> Bound of every field under dataclass `cls` (depth first) whose metadata has a "bound";
    `names` keeps only those fields of `cls` itself (ArmConfig: the settings a config may override)."""
    hints = typing.get_type_hints(cls)
    keep = set(names) if names is not None else None
    out: dict[str, Bound] = {}
    for f in fields(cls):
        if keep is not None and f.name not in keep:
            continue
        if is_dataclass(hints[f.name]):
            out.update(field_bounds(hints[f.name], f"{prefix}{f.name}."))
        elif "bound" in f.metadata:
            out[f"{prefix}{f.name}"] = Bound.parse(f.metadata["bound"])
    return out


def _numbers(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every number in a config tree: dataclass fields, mappings (arm_overrides) and
    lists (replay.teachers, as key[i])."""
    if is_dataclass(obj):
        items = ((f.name, getattr(obj, f.name)) for f in fields(obj))
    elif isinstance(obj, Mapping):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = ((f"[{i}]", v) for i, v in enumerate(obj))
    else:
        return
    for name, value in items:
        key = f"{prefix}{name}" if str(name).startswith("[") or not prefix else f"{prefix}.{name}"
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            yield key, value
        else:
            yield from _numbers(value, key)


def check_numbers(cfg: Any, bounds: Mapping[str, Bound]) -> None:
    """Every number in `cfg` is finite (NaN and infinities are refused) and inside its bound in `bounds`; the
    error names the key and its range."""
    for key, value in _numbers(cfg):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{key}={value} is not a finite number; give a number"
                             + (f" {bounds[key]}" if key in bounds else "")
                             + f" (`sdar config fields {key.split('[')[0]}` shows its default and meaning)")
        bound = bounds.get(key)
        if bound is not None and not bound.holds(value):
            raise ValueError(f"{key}={value} is out of range: it must be {bound} "
                             f"(`sdar config fields {key}` shows its default and meaning)")
