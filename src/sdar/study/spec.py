"""What a study runs: families x arms x seeds at a fixed step budget, read from a small YAML file.

A study is a list of matrices (each: families, arms, seeds) over one step budget; every cell is one
training run of an arm on a family's config at a seed, evaluated on the family's held-out tasks at
the study's `eval_steps`. The family's seed is also its warm start's seed, so seed variance includes
the warm start's (a ~13-point swing at this scale, see docs/results.md), and the arms of one seed
share one warm start: differences between arms are paired by seed and task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sdar.algos.arm_config import ARMS

_TOP_KEYS = {"study", "steps", "eval_steps", "configs", "matrices", "set", "family_set", "against"}
_MATRIX_KEYS = {"families", "arms", "seeds"}


@dataclass(frozen=True)
class Cell:
    """One run of a study: `arm` trained on `family` at `seed`."""

    family: str
    arm: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.family}/seed{self.seed}/{self.arm}"


@dataclass
class StudySpec:
    """A study read by `load_spec`.

    name: the study's name (its results directory and MLflow experiment `study-<name>`).
    steps: RL steps of every run.
    eval_steps: the steps at which each run is evaluated on the held-out tasks (the last is `steps`).
    configs: family -> experiment config (a YAML path, relative to the working directory: the repository root).
    matrices: [{families, arms, seeds}], their union is the study's cells.
    overrides: config overrides for every run (`--set` grammar: dotted keys).
    family_overrides: family -> overrides for that family's runs only.
    against: another study (its name) that this one varies in one setting: the report adds each arm's paired
        difference from the same arm, seed and held-out tasks there (and from its grpo when this study runs no
        grpo), and the warm starts' (which should be 0).
    """

    name: str
    steps: int
    eval_steps: list[int]
    configs: dict[str, str]
    matrices: list[dict[str, list]]
    overrides: dict[str, Any] = field(default_factory=dict)
    family_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    path: str = ""
    against: str | None = None

    def cells(self) -> list[Cell]:
        """Every run, family by family and seed by seed (the arms of one warm start together), no repeats."""
        seen: dict[Cell, None] = {}
        for m in self.matrices:
            for family in m["families"]:
                for seed in m["seeds"]:
                    for arm in m["arms"]:
                        seen.setdefault(Cell(family, arm, int(seed)))
        order = {f: i for i, f in enumerate(self.configs)}
        return sorted(seen, key=lambda c: (order[c.family], c.seed))

    def warm_starts(self) -> list[tuple[str, int]]:
        """The (family, seed) pairs of the study: one warm start and one step-0 evaluation each."""
        return list(dict.fromkeys((c.family, c.seed) for c in self.cells()))

    def overrides_for(self, family: str) -> dict[str, Any]:
        return {**self.overrides, **self.family_overrides.get(family, {})}


def _fail(path: str, msg: str) -> ValueError:
    return ValueError(f"study spec {path}: {msg}")


def parse_spec(data: Any, path: str = "<spec>") -> StudySpec:
    """A StudySpec from the YAML's mapping, checked: unknown keys, arms, eval steps, families without config."""
    if not isinstance(data, dict):
        raise _fail(path, "must be a mapping with keys study, steps, eval_steps, configs, matrices")
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise _fail(path, f"unknown key(s) {unknown}; the keys are {sorted(_TOP_KEYS)}")
    for key in ("study", "steps", "configs", "matrices"):
        if key not in data:
            raise _fail(path, f"missing {key!r}")
    steps = data["steps"]
    if not isinstance(steps, int) or steps < 1:
        raise _fail(path, f"steps={steps!r} must be a positive integer")
    eval_steps = sorted({int(s) for s in data.get("eval_steps", [steps])})
    if not eval_steps or eval_steps[-1] != steps or eval_steps[0] < 1:
        raise _fail(path, f"eval_steps={data.get('eval_steps')} must lie in 1..{steps} and end at steps={steps} "
                          f"(e.g. [{steps // 2}, {steps}])")
    configs = data["configs"]
    if not isinstance(configs, dict) or not configs:
        raise _fail(path, "configs must map each family to its experiment config, e.g. household: "
                          "configs/household-tiny.yaml")
    matrices = data["matrices"]
    if not isinstance(matrices, list) or not matrices:
        raise _fail(path, "matrices must be a list of {families, arms, seeds}")
    for i, m in enumerate(matrices):
        if not isinstance(m, dict) or set(m) != _MATRIX_KEYS:
            raise _fail(path, f"matrices[{i}] must have exactly the keys {sorted(_MATRIX_KEYS)}, got {m!r}")
        for key in _MATRIX_KEYS:
            if not isinstance(m[key], list) or not m[key]:
                raise _fail(path, f"matrices[{i}].{key} must be a non-empty list")
        missing = [f for f in m["families"] if f not in configs]
        if missing:
            raise _fail(path, f"matrices[{i}] names families {missing} that have no entry under configs "
                              f"(known: {sorted(configs)})")
        bad = [a for a in m["arms"] if a not in ARMS]
        if bad:
            raise _fail(path, f"matrices[{i}] names unknown arms {bad}; choose from {', '.join(ARMS)}")
        if not all(isinstance(s, int) and s >= 0 for s in m["seeds"]):
            raise _fail(path, f"matrices[{i}].seeds must be non-negative integers, got {m['seeds']}")
    overrides = data.get("set") or {}
    family_overrides = data.get("family_set") or {}
    if not isinstance(overrides, dict) or not isinstance(family_overrides, dict):
        raise _fail(path, "set must map dotted config keys to values; family_set must map a family to such a mapping")
    for key in ("arm", "seed", "steps", "output_dir", "experiment", "parent_run_id"):
        if key in overrides or any(key in v for v in family_overrides.values()):
            raise _fail(path, f"{key!r} is set by the study itself for each run; remove it from set/family_set")
    name = str(data["study"])
    if not name or "/" in name or name.startswith("."):
        raise _fail(path, f"study name {name!r} must be a plain directory name")
    against = data.get("against")
    if against is not None and (not isinstance(against, str) or not against or "/" in against
                                or against.startswith(".") or against == name):
        raise _fail(path, f"against={against!r} must name another study (its results directory, e.g. smollm2)")
    return StudySpec(name=name, steps=steps, eval_steps=eval_steps, configs={str(k): str(v) for k, v in configs.items()},
                     matrices=matrices, overrides=dict(overrides), family_overrides=dict(family_overrides), path=path,
                     against=against)


def load_spec(path: str | Path) -> StudySpec:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"study spec {p} not found; see configs/study/ for examples")
    return parse_spec(yaml.safe_load(p.read_text()), str(p))
