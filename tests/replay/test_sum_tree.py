"""The sum tree behind prioritized replay: totals, prefix search, sampling only
non-empty leaves, and refusing bad values."""

from __future__ import annotations

import numpy as np
import pytest

from seedq.replay.sum_tree import SumTree

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("capacity", [1, 5, 8, 13])
def test_sum_tree_totals_and_prefix_search(capacity):
    tree = SumTree(capacity)
    values = np.arange(1, capacity + 1, dtype=np.float64)
    tree.set(np.arange(capacity), values)
    assert tree.total == pytest.approx(values.sum())
    np.testing.assert_array_equal(tree.get(np.arange(capacity)), values)
    bounds = np.concatenate([[0.0], np.cumsum(values)])
    # Each leaf owns [bounds[i], bounds[i+1]): probe both ends of every interval.
    for i in range(capacity):
        assert tree.find([bounds[i]])[0] == i
        assert tree.find([bounds[i + 1] - 1e-9])[0] == i
    # Changing a leaf updates every ancestor (recomputed, duplicates allowed).
    if capacity > 1:
        tree.set([0, 0, capacity - 1], [5.0, 2.0, 0.0])
        assert tree.total == pytest.approx(values.sum() - 1.0 + 2.0 - capacity)


def test_sum_tree_never_returns_empty_leaves():
    tree = SumTree(6)
    tree.set([1, 4], [1.0, 3.0])
    rng = np.random.default_rng(0)
    drawn = np.concatenate([tree.sample(64, rng) for _ in range(50)])
    assert set(drawn.tolist()) == {1, 4}
    # Masses at (or rounding past) the total still land on a non-empty leaf.
    assert tree.find([tree.total, tree.total * (1 + 1e-12)]).tolist() == [4, 4]


def test_sum_tree_rejects_bad_values():
    tree = SumTree(4)
    with pytest.raises(ValueError):
        tree.set([0], [-1.0])
    with pytest.raises(ValueError):
        tree.set([0], [np.nan])
    with pytest.raises(IndexError):
        tree.set([4], [1.0])
    with pytest.raises(ValueError):
        tree.sample(1, np.random.default_rng(0))
