"""A bounded ring of recent durations and their percentiles: the inference
server's batch latencies and an actor's round trips use the same one."""

from __future__ import annotations

import numpy as np


class LatencyRing:
    """The latest `size` durations (seconds); `count` is every one ever recorded."""

    def __init__(self, size: int):
        self._values = np.zeros(size)
        self.count = 0

    def record(self, seconds: float) -> None:
        self._values[self.count % len(self._values)] = seconds
        self.count += 1

    def percentiles(self, qs=(50, 99), since: int = 0) -> tuple[float, ...] | None:
        """The `qs` percentiles (seconds) of the durations recorded after the
        `since`-th (a ring's worth at most), or None if there are none."""
        recent = min(self.count - since, len(self._values))
        if recent <= 0:
            return None
        idx = np.arange(self.count - recent, self.count) % len(self._values)
        return tuple(float(v) for v in np.percentile(self._values[idx], qs))
