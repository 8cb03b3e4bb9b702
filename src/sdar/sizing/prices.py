"""AWS GPU instances with their on-demand list prices (what a run costs on one: `sdar.sizing.fit.run_cost`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

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
