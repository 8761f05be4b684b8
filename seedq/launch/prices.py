"""Hourly list prices of the machines a VM launch creates: the plan's estimate.

No library publishes Google Cloud prices offline (the Cloud Billing Catalog API
needs credentials), so the few the launchers default to are written out here:
on-demand list prices in us-central1 (USD per hour) from the Compute Engine
"VM instance pricing" page (N2: $0.031611 per vCPU-hour + $0.004237 per
GB-hour) and the Cloud TPU pricing page (per chip-hour). Other regions, spot
VMs and committed-use discounts differ, and lists change: the plan prints
these as an estimate, and a type not listed as "price not known".
"""

from __future__ import annotations

import re

_N2_VCPU_HOUR = 0.031611
_N2_GB_HOUR = 0.004237
# GB of memory per vCPU of the N2 shapes.
_N2_SHAPES = {"standard": 4, "highmem": 8, "highcpu": 1}
TPU_CHIP_HOUR = {"v5litepod": 1.20, "v4": 3.22, "v5p": 4.20, "v6e": 2.70}


def machine_hourly(machine_type: str) -> float | None:
    """On-demand USD per hour of a Compute Engine machine type; None where not known."""
    match = re.fullmatch(r"n2-(standard|highmem|highcpu)-(\d+)", machine_type)
    if not match:
        return None
    vcpus = int(match.group(2))
    return vcpus * (_N2_VCPU_HOUR + _N2_SHAPES[match.group(1)] * _N2_GB_HOUR)


def tpu_hourly(tpu_type: str, chips: int) -> float | None:
    """On-demand USD per hour of a TPU slice of `chips` chips; None where not known."""
    per_chip = TPU_CHIP_HOUR.get(tpu_type.split("-")[0])
    return None if per_chip is None else per_chip * chips
