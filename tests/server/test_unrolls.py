"""The unroll queue between the server and the learner: exact FIFO batches,
capacity and backpressure, closing, taking everything at once."""

import threading

import numpy as np
import pytest

from seedq.server.unrolls import QueueClosed, UnrollQueue

pytestmark = pytest.mark.unit

JOIN_SECONDS = 10.0


def chunk(ids):
    ids = np.asarray(ids)
    return {"id": ids.astype(np.int64), "obs": np.stack([ids, -ids], 1).astype(np.float32)}


def test_queue_get_returns_exact_batches_in_fifo_order():
    q = UnrollQueue(capacity=100)
    assert q.try_put(chunk([0, 1, 2]))
    assert q.try_put(chunk([3, 4]))
    assert q.try_put(chunk([5, 6, 7, 8]))
    assert len(q) == 9
    batch = q.get(4, timeout=1)
    np.testing.assert_array_equal(batch["id"], [0, 1, 2, 3])  # spans two chunks
    np.testing.assert_array_equal(batch["obs"][:, 1], [0, -1, -2, -3])
    assert batch["obs"].shape == (4, 2)
    assert len(q) == 5
    batch = q.get(2, timeout=1)  # the rest of a split chunk plus part of the next
    np.testing.assert_array_equal(batch["id"], [4, 5])
    batch = q.get(3, timeout=1)
    np.testing.assert_array_equal(batch["id"], [6, 7, 8])
    assert len(q) == 0


def test_queue_get_times_out_with_too_few():
    q = UnrollQueue(capacity=10)
    q.try_put(chunk([0, 1]))
    assert q.get(3, timeout=0.05) is None
    assert len(q) == 2  # nothing consumed
    np.testing.assert_array_equal(q.get(2, timeout=1)["id"], [0, 1])


def test_queue_try_put_lets_a_chunk_in_while_below_capacity_and_refuses_at_it():
    q = UnrollQueue(capacity=4)
    assert q.try_put(chunk([0, 1, 2]))
    assert q.try_put(chunk([3, 4]))  # 3 < 4 queued: in, one chunk past capacity
    assert len(q) == 5
    assert not q.try_put(chunk([5]))  # at or past capacity: full
    np.testing.assert_array_equal(q.get(4, timeout=1)["id"], [0, 1, 2, 3])
    assert q.try_put(chunk(range(10, 16)))  # a chunk bigger than the capacity, into a queue below it
    assert len(q) == 7


def test_queue_put_with_timeout_gives_up_when_full():
    q = UnrollQueue(capacity=2)
    assert q.put(chunk([0, 1]), timeout=1)
    assert q.put(chunk([2]), timeout=0.05) is False
    assert len(q) == 2


def test_queue_put_blocks_until_get_takes_it_below_capacity():
    q = UnrollQueue(capacity=3)
    q.put(chunk([0, 1, 2, 3]))
    result = {}

    def producer():
        try:
            result["ok"] = q.put(chunk([4, 5]))
        except BaseException as e:  # pragma: no cover - reported below
            result["error"] = e

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    thread.join(0.3)
    assert thread.is_alive(), "put returned although the queue was full"
    assert len(q) == 4
    np.testing.assert_array_equal(q.get(1, timeout=1)["id"], [0])  # 3 queued: still full
    thread.join(0.3)
    assert thread.is_alive()
    np.testing.assert_array_equal(q.get(1, timeout=1)["id"], [1])  # 2 < 3: room
    thread.join(JOIN_SECONDS)
    assert not thread.is_alive()
    assert result == {"ok": True}
    np.testing.assert_array_equal(q.get(4, timeout=1)["id"], [2, 3, 4, 5])


def test_a_chunk_too_big_for_the_rest_never_starves_a_learner_waiting_for_its_batch():
    """The learner takes 64 (a reuse pool of 4 batches of 16) from a queue of
    64; 40 are queued and the next inference batch finished 32 unrolls at once.
    Under a strict bound (40 + 32 > 64) the put waited for room and the get
    for unrolls, for ever: a MinAtar run with `--server.queue-capacity-unrolls
    64 --vtrace.reuse-pool 4` stopped training after 59k frames."""
    q = UnrollQueue(capacity=64)
    assert q.try_put(chunk(range(40)))
    putter = threading.Thread(target=q.put, args=(chunk(range(40, 72)),), daemon=True)
    putter.start()
    batch = q.get(64, timeout=JOIN_SECONDS)
    putter.join(JOIN_SECONDS)
    assert batch is not None, "the learner's get starved"
    np.testing.assert_array_equal(batch["id"], range(64))
    assert not putter.is_alive() and len(q) == 8


def test_queue_close_wakes_blocked_get():
    q = UnrollQueue(capacity=8)
    q.put(chunk([0]))
    result = {}

    def consumer():
        result["batch"] = q.get(4)  # no timeout: only close can end this

    thread = threading.Thread(target=consumer, daemon=True)
    thread.start()
    thread.join(0.2)
    assert thread.is_alive()
    q.close()
    thread.join(JOIN_SECONDS)
    assert not thread.is_alive()
    assert result == {"batch": None}


def test_queue_close_wakes_blocked_put():
    q = UnrollQueue(capacity=1)
    q.put(chunk([0]))
    result = {}

    def producer():
        try:
            result["ok"] = q.put(chunk([1]))
        except QueueClosed:
            result["closed"] = True

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    thread.join(0.2)
    assert thread.is_alive()
    q.close()
    thread.join(JOIN_SECONDS)
    assert not thread.is_alive()
    assert result == {"closed": True}
    with pytest.raises(QueueClosed):
        q.try_put(chunk([2]))
    with pytest.raises(QueueClosed):
        q.put(chunk([2]), timeout=1)


def test_queue_take_all_returns_every_chunk_and_empties_the_queue():
    q = UnrollQueue(capacity=8)
    assert q.take_all(timeout=0.05) is None  # empty: times out
    q.put(chunk([0, 1, 2]))
    q.put(chunk([3, 4]))
    chunks = q.take_all(timeout=1)
    assert [list(c["id"]) for c in chunks] == [[0, 1, 2], [3, 4]]
    assert len(q) == 0
    assert q.try_put(chunk(list(range(8))))  # all the room is free again
    q.close()
    assert [len(c["id"]) for c in q.take_all(timeout=1)] == [8]  # closed: what is queued still comes out
    assert q.take_all() is None  # closed and empty: no wait
