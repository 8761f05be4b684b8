"""The latency ring: percentiles over the latest values, and since a mark."""

import pytest

from seedq.latency import LatencyRing

pytestmark = pytest.mark.unit


def test_latency_ring_percentiles_cover_the_latest_values_since_a_mark():
    ring = LatencyRing(4)
    assert ring.percentiles() is None
    for seconds in (10.0, 1.0, 2.0, 3.0, 4.0):  # the first falls out of the ring
        ring.record(seconds)
    assert ring.count == 5
    assert ring.percentiles((0, 100)) == (1.0, 4.0)
    assert ring.percentiles((0, 100), since=3) == (3.0, 4.0)  # recorded after the 3rd
    assert ring.percentiles(since=5) is None
