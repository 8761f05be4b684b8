"""Energy of one benchmark run: measured where the kernel exposes it, else estimated.

Three sources, the first that works is used and named in every row
(`energy_source`):

* ``rapl``: Linux RAPL counters, /sys/class/powercap/intel-rapl:<N>/energy_uj
  of every CPU package, read before and after the run (a counter that passed
  its max_energy_range_uj wrapped once). They measure the whole package, so
  whatever else runs on the machine at the same time is counted too.
  (Read here directly, once before and once after the run: a few files,
  wraparound included; codecarbon samples the same counters at an interval
  in a thread, which a before/after difference does not need.)
* ``codecarbon``: codecarbon's offline tracker in process mode: CPU power from
  the CPU model's TDP times this process's and its children's share of the
  CPU time, plus its RAM power model. An estimate.
* ``cpu_seconds_model``: the CPU seconds of the run's processes times an
  assumed power per fully busy core (where codecarbon is not installed).
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import re

POWERCAP_ROOT = "/sys/class/powercap"
# Package domains only ("intel-rapl:0"); "intel-rapl:0:1" (core, dram, ...) are
# parts of a package already counted in its total.
_PACKAGE = re.compile(r"^intel-rapl:\d+$")


def read_rapl(root: str = POWERCAP_ROOT) -> dict[str, tuple[int, int]] | None:
    """{package domain: (energy_uj, max_energy_range_uj)} under `root`, or None
    where there is none or they cannot be read (no RAPL; root-only counters)."""
    readings = {}
    for path in sorted(glob.glob(os.path.join(root, "intel-rapl:*"))):
        name = os.path.basename(path)
        if not _PACKAGE.match(name):
            continue
        try:
            with open(os.path.join(path, "energy_uj")) as f:
                energy = int(f.read().strip())
            with open(os.path.join(path, "max_energy_range_uj")) as f:
                top = int(f.read().strip())
        except (OSError, ValueError):
            return None
        readings[name] = (energy, top)
    return readings or None


def rapl_joules(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> float:
    """Joules between two `read_rapl` readings, summed over packages; a counter
    lower after than before wrapped at its max_energy_range_uj (once: reads
    are far more frequent than a wrap, minutes to hours apart)."""
    total_uj = 0
    for name, (start, top) in before.items():
        if name not in after:
            continue
        end = after[name][0]
        total_uj += end - start if end >= start else top - start + end
    return total_uj / 1e6


@dataclasses.dataclass
class EnergyReading:
    joules: float
    source: str  # rapl | codecarbon | cpu_seconds_model
    cpu_joules: float | None = None  # the CPU's share, where the source splits it
    detail: str = ""  # what the estimate assumed


class EnergyMeter:
    """Started before a run and stopped after it; `stop(cpu_seconds)` is the
    reading. `rapl_root` is where powercap lives (tests pass a fake tree);
    `use_codecarbon` False skips the library (the model is used)."""

    def __init__(self, *, watts_per_core: float, rapl_root: str = POWERCAP_ROOT, use_codecarbon: bool = True):
        self.watts_per_core = watts_per_core
        self.rapl_root = rapl_root
        self.use_codecarbon = use_codecarbon
        self._rapl_before = None
        self._tracker = None

    def start(self) -> "EnergyMeter":
        self._rapl_before = read_rapl(self.rapl_root)
        if self._rapl_before is None and self.use_codecarbon:
            self._tracker = _start_codecarbon()
        return self

    def stop(self, cpu_seconds: float) -> EnergyReading:
        """The run's energy; `cpu_seconds`: its processes' CPU time (the model's input)."""
        if self._rapl_before is not None:
            after = read_rapl(self.rapl_root)
            if after is not None:
                joules = rapl_joules(self._rapl_before, after)
                return EnergyReading(joules, "rapl", joules, f"packages {', '.join(sorted(after))}")
        if self._tracker is not None:
            reading = _stop_codecarbon(self._tracker)
            self._tracker = None
            if reading is not None:
                return reading
        joules = cpu_seconds * self.watts_per_core
        return EnergyReading(joules, "cpu_seconds_model", joules, f"{self.watts_per_core:g} W per busy core")


def _start_codecarbon():
    """codecarbon's offline tracker of this process and its children, started;
    None where the library is not installed or will not start."""
    try:
        from codecarbon import OfflineEmissionsTracker
    except ImportError:
        return None
    logging.getLogger("codecarbon").setLevel(logging.ERROR)
    try:
        tracker = OfflineEmissionsTracker(
            country_iso_code="USA", tracking_mode="process", output_methods=[], log_level="error",
            # Children's CPU time is sampled: a short period loses little of a child's last interval.
            measure_power_secs=1, allow_multiple_runs=True,
        )
        tracker.start()
    except Exception:  # noqa: BLE001 - an estimate must not stop a benchmark
        return None
    return tracker


def _stop_codecarbon(tracker) -> EnergyReading | None:
    try:
        tracker.stop()
        data = tracker.final_emissions_data
    except Exception:  # noqa: BLE001
        return None
    if data is None:
        return None
    kwh_to_j = 3.6e6
    return EnergyReading(
        float(data.energy_consumed) * kwh_to_j, "codecarbon", float(data.cpu_energy) * kwh_to_j,
        f"codecarbon {_version()}: {data.cpu_model}, CPU load x TDP model, RAM {data.ram_power:.0f} W",
    )


def _version() -> str:
    from importlib.metadata import version

    return version("codecarbon")
