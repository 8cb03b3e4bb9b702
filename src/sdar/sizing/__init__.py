"""`sdar size` (alias `sdar plan`): GPU memory per model role (actor, reference, rollout engine,
teacher) of the SDAR on-policy loop, whether it fits, which AWS instance to rent and what a run
costs.

Everything is computed from the architecture with the formulas written next to each number, so a
person can check them by hand (tests/sizing/test_sizing.py does). `size_run(model, gpus=8,
gpu_mem=80)` is the importable entry point; `sdar size` prints it as a table (or `--json`).
`sdar size --config configs/paper/alfworld-qwen2.5-7b.yaml` takes the run's settings from a
training config (`settings_from_config`); flags given explicitly override them.

Modules: `arch` (the architecture table), `prices` (instances, prices, run cost), `settings` (the
knobs, and reading them from a training config), `memory` (bytes per role and phase), `fit` (where
it fits, the recommendation, `size_run`), `render` (tables), `cli` (the command).

Units: B = bytes, GiB = 2**30 bytes. `--gpu-mem` is the card's nominal size, read as GiB.
"""

from sdar.sizing.arch import ARCHS, Arch, arch_from_config, parse_size, resolve_model
from sdar.sizing.fit import Sizing, options_that_fit, recommend, run_cost, size_run, suggestions
from sdar.sizing.memory import (
    PHASES,
    MemoryBudget,
    activation_bytes_per_layer,
    forward_working_bytes,
    memory_budget,
)
from sdar.sizing.prices import INSTANCE_BY_NAME, INSTANCES, PRICES_AS_OF, Instance
from sdar.sizing.render import render
from sdar.sizing.settings import (
    CONFIG_KEYS,
    ConfigSettings,
    SizingSettings,
    resolve_config_model,
    settings_from_config,
)
from sdar.sizing.units import GiB, SizingError

__all__ = [
    "ARCHS", "CONFIG_KEYS", "GiB", "INSTANCES", "INSTANCE_BY_NAME", "PHASES", "PRICES_AS_OF",
    "Arch", "ConfigSettings", "Instance", "MemoryBudget", "Sizing", "SizingError",
    "SizingSettings", "activation_bytes_per_layer", "arch_from_config", "forward_working_bytes",
    "memory_budget", "options_that_fit", "parse_size", "recommend", "render",
    "resolve_config_model", "resolve_model", "run_cost", "settings_from_config", "size_run",
    "suggestions",
]
