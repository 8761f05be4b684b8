"""A sum tree over a fixed number of non-negative leaf values (numpy).

Used by prioritized replay to sample index i with probability
value[i] / sum(values) in O(log n), and to change values in O(log n).

Layout: a complete binary tree in one float64 array `nodes` of size
2 * width, where `width` is the capacity rounded up to a power of two. Node k
has children 2k and 2k+1, node 1 is the root (the total), node 0 is unused,
and leaf i lives at node width + i. Leaves past the capacity stay 0, so they
are never sampled.

Both `set` and `sample` work on whole batches: every operation is one
vectorised numpy step per tree level (log2(width) levels), not a Python loop
per element.
"""

from __future__ import annotations

import numpy as np


class SumTree:
    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError(f"sum tree capacity {capacity}: must be > 0")
        self.capacity = int(capacity)
        self.width = 1 << max(0, (self.capacity - 1).bit_length())
        self.depth = self.width.bit_length() - 1  # levels below the root
        self.nodes = np.zeros(2 * self.width, np.float64)

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def get(self, indices) -> np.ndarray:
        """Leaf values at `indices` [k] -> [k] float64."""
        return self.nodes[self.width + np.asarray(indices, np.int64)]

    def set(self, indices, values) -> None:
        """Sets leaves `indices` [k] to `values` [k] (>= 0, finite).

        Duplicate indices are allowed; the last value written wins (numpy
        assignment order). Parents are recomputed from their two children
        rather than adjusted by deltas, so duplicates cannot double count and
        rounding errors do not accumulate over millions of updates.
        """
        indices = np.asarray(indices, np.int64).reshape(-1)
        values = np.asarray(values, np.float64).reshape(-1)
        if indices.shape != values.shape:
            raise ValueError(f"{indices.shape[0]} indices but {values.shape[0]} values")
        if indices.size == 0:
            return
        if indices.min() < 0 or indices.max() >= self.capacity:
            raise IndexError(f"sum tree index out of range [0, {self.capacity})")
        if not np.all(np.isfinite(values)) or values.min() < 0:
            raise ValueError("sum tree values must be finite and >= 0")
        nodes = self.nodes
        k = self.width + indices
        nodes[k] = values
        for _ in range(self.depth):
            k = np.unique(k >> 1)
            nodes[k] = nodes[2 * k] + nodes[2 * k + 1]

    def find(self, mass) -> np.ndarray:
        """For each prefix mass u in [0, total), the leaf i whose interval holds u.

        Leaf i owns [sum(values[:i]), sum(values[:i+1])). Descending from the
        root, a query goes right (subtracting the left subtree's sum) when
        u >= left sum. A step right into an empty subtree (possible only
        through floating-point rounding at the top end) goes left instead, so
        a zero-valued leaf is never returned while the total is positive.
        """
        u = np.asarray(mass, np.float64).reshape(-1).copy()
        nodes = self.nodes
        k = np.ones(u.shape, np.int64)
        for _ in range(self.depth):
            left = nodes[2 * k]
            right_nonempty = nodes[2 * k + 1] > 0
            go_right = (u >= left) & right_nonempty
            u = np.where(go_right, u - left, u)
            k = 2 * k + go_right
        return k - self.width

    def sample(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """`batch_size` leaf indices drawn in proportion to their values.

        Stratified: the total mass is cut into `batch_size` equal strata and
        one uniform point is drawn in each, which keeps the marginal
        probability of every leaf exactly value / total while spreading a
        batch over the whole buffer (lower variance than i.i.d. draws).
        """
        total = self.total
        if not total > 0:
            raise ValueError("cannot sample from an empty sum tree")
        edges = (np.arange(batch_size) + rng.random(batch_size)) / batch_size
        return self.find(edges * total)
