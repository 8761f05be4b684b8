"""Cloud TPU slice types: chips, hosts and topology of `v5litepod-16` and friends.

No library publishes this table (it lives in Google's "Plan TPUs in GKE" and
"TPU versions" pages), so it is written out here. The number in a type name
counts TensorCores for v4 and v5p (two per chip) and chips for v5e
(`v5litepod`) and v6e. Multi-host slices have 4 chips per host (GKE machine
types ct4p-hightpu-4t, ct5p-hightpu-4t, ct5lp-hightpu-4t, ct6e-standard-4t);
v5e and v6e slices of up to 8 chips are a single host.

| type            | chips | topology | hosts | GKE accelerator label  |
|-----------------|-------|----------|-------|------------------------|
| v5litepod-1/4/8 | 1/4/8 | 1x1/2x2/2x4 | 1  | tpu-v5-lite-podslice   |
| v5litepod-16    | 16    | 4x4      | 4     | tpu-v5-lite-podslice   |
| v5litepod-32    | 32    | 4x8      | 8     | tpu-v5-lite-podslice   |
| v5litepod-64    | 64    | 8x8      | 16    | tpu-v5-lite-podslice   |
| v5litepod-128   | 128   | 8x16     | 32    | tpu-v5-lite-podslice   |
| v5litepod-256   | 256   | 16x16    | 64    | tpu-v5-lite-podslice   |
| v6e-N           | same as v5litepod-N         | tpu-v6e-slice          |
| v4-8            | 4     | 2x2x1    | 1     | tpu-v4-podslice        |
| v4-16           | 8     | 2x2x2    | 2     | tpu-v4-podslice        |
| v4-32           | 16    | 2x2x4    | 4     | tpu-v4-podslice        |
| v4-64           | 32    | 2x4x4    | 8     | tpu-v4-podslice        |
| v4-128          | 64    | 4x4x4    | 16    | tpu-v4-podslice        |
| v4-256          | 128   | 4x4x8    | 32    | tpu-v4-podslice        |
| v4-512          | 256   | 4x8x8    | 64    | tpu-v4-podslice        |
| v4-1024         | 512   | 8x8x8    | 128   | tpu-v4-podslice        |
| v5p-N           | same as v4-N                | tpu-v5p-slice          |
"""

from __future__ import annotations

import dataclasses
import re

# chips -> topology (chips = product of the dimensions).
_TOPOLOGY_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_TOPOLOGY_3D = {
    4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4",
    128: "4x4x8", 256: "4x8x8", 512: "8x8x8",
}
CHIPS_PER_MULTI_HOST = 4


@dataclasses.dataclass(frozen=True)
class _Generation:
    gke_accelerator: str
    cores_per_chip: int  # what the number in the type name counts per chip
    topologies: dict
    max_single_host_chips: int


_GENERATIONS = {
    "v5litepod": _Generation("tpu-v5-lite-podslice", 1, _TOPOLOGY_2D, 8),
    "v6e": _Generation("tpu-v6e-slice", 1, _TOPOLOGY_2D, 8),
    "v4": _Generation("tpu-v4-podslice", 2, _TOPOLOGY_3D, 4),
    "v5p": _Generation("tpu-v5p-slice", 2, _TOPOLOGY_3D, 4),
}


@dataclasses.dataclass(frozen=True)
class TpuSlice:
    type: str  # e.g. v5litepod-16
    chips: int
    topology: str  # e.g. 4x4
    hosts: int
    gke_accelerator: str  # the cloud.google.com/gke-tpu-accelerator node label

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts


def tpu_slice(tpu_type: str) -> TpuSlice:
    """The slice behind a type name; ValueError naming the valid ones otherwise."""
    match = re.fullmatch(r"(v5litepod|v6e|v4|v5p)-(\d+)", tpu_type)
    if not match:
        raise ValueError(
            f"--tpu-type {tpu_type!r}: expected v5litepod-N, v6e-N, v4-N or v5p-N (e.g. v5litepod-16)"
        )
    generation = _GENERATIONS[match.group(1)]
    count = int(match.group(2))
    chips, remainder = divmod(count, generation.cores_per_chip)
    if remainder or chips not in generation.topologies:
        valid = ", ".join(f"{match.group(1)}-{c * generation.cores_per_chip}" for c in generation.topologies)
        raise ValueError(f"--tpu-type {tpu_type!r}: not a slice size; valid: {valid}")
    hosts = 1 if chips <= generation.max_single_host_chips else chips // CHIPS_PER_MULTI_HOST
    return TpuSlice(tpu_type, chips, generation.topologies[chips], hosts, generation.gke_accelerator)
