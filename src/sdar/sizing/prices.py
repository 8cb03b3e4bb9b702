"""AWS GPU instances with their on-demand list prices, and what a run costs on one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sdar.sizing.settings import SizingSettings

# us-east-1 on-demand Linux list prices (USD per instance hour) as of 2025-01. They change: AWS cut
# P4/P5 on-demand prices by up to 45% in June 2025. Check https://aws.amazon.com/ec2/pricing/on-demand/
# (or `aws pricing get-products`) before trusting a cost, and pass --price to override.
PRICES_AS_OF = "2025-01"


@dataclass(frozen=True)
class Instance:
    name: str
    gpus: int
    gpu: str
    gpu_mem: int  # GiB per GPU (nominal)
    on_demand: float  # USD per hour, us-east-1, PRICES_AS_OF


INSTANCES: tuple[Instance, ...] = (
    Instance("g6.xlarge", 1, "L4", 24, 0.805),
    Instance("g5.xlarge", 1, "A10G", 24, 1.006),
    Instance("g6e.xlarge", 1, "L40S", 48, 1.861),
    Instance("g6.12xlarge", 4, "L4", 24, 4.602),
    Instance("g5.12xlarge", 4, "A10G", 24, 5.672),
    Instance("g6e.12xlarge", 4, "L40S", 48, 10.493),
    Instance("g6.48xlarge", 8, "L4", 24, 13.350),
    Instance("g5.48xlarge", 8, "A10G", 24, 16.288),
    Instance("g6e.48xlarge", 8, "L40S", 48, 30.131),
    Instance("p4d.24xlarge", 8, "A100", 40, 32.773),
    Instance("p4de.24xlarge", 8, "A100", 80, 40.966),
    Instance("p5.48xlarge", 8, "H100", 80, 98.320),
)
INSTANCE_BY_NAME = {i.name: i for i in INSTANCES}


def instances_needed(inst: Instance, gpus: int) -> int:
    return math.ceil(gpus / inst.gpus)


def run_cost(s: SizingSettings, inst: Instance) -> dict[str, float]:
    """cost = runs * steps * step_seconds / 3600 * hourly price * instances; spot adds the overhead
    wall time (interruptions, restarts from checkpoint) at the spot price."""
    count = instances_needed(inst, s.gpus)
    hourly = s.price if s.price is not None else inst.on_demand
    spot_hourly = s.spot_price if s.spot_price is not None else hourly * (1 - s.spot_discount)
    hours = s.runs * s.steps * s.step_seconds / 3600
    spot_hours = hours * (1 + s.spot_overhead)
    return {
        "instance": inst.name,
        "instances": count,
        "gpus_rented": count * inst.gpus,
        "on_demand_hourly": hourly * count,
        "spot_hourly": spot_hourly * count,
        "hours": hours,
        "spot_hours": spot_hours,
        "on_demand_cost": hours * hourly * count,
        "spot_cost": spot_hours * spot_hourly * count,
    }

