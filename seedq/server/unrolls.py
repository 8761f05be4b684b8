"""The bounded queue of finished unrolls between the server and training.

`UnrollQueue` is the hand-off to the training thread: when it is full, `put`
blocks (the inference loop then stops answering actors), so a learner that
falls behind slows acting down instead of growing memory. The queue also
measures how fast the learner takes unrolls, which pacing
(`seedq.server.pacing`) slows the inference loop to before the queue is full.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time

import numpy as np

from seedq.server.pacing import TARGET_BATCHES, TakeRate


class QueueClosed(Exception):
    pass


class UnrollQueue:
    """Bounded FIFO of unrolls, filled in chunks and drained in batches.

    A chunk is let in while the queue holds fewer than `capacity` unrolls, so
    it may end up to one chunk past `capacity`. A strict bound (let in only
    what fits) could deadlock: with fewer unrolls queued than the learner's
    batch and a chunk too big for the rest (one inference batch of many envs
    finishes its unrolls at once), the learner waited for unrolls that the
    inference loop waited to put. Any capacity >= the batch taken is safe.

    `drop_oldest`: a chunk that finds the queue full is let in at once and the
    oldest chunks are dropped to make room (counted in `dropped_unrolls`), so
    the inference loop never waits for training; the learner trains on the
    freshest unrolls it can keep up with.
    """

    def __init__(self, capacity: int, drop_oldest: bool = False):
        self.capacity = capacity
        self.drop_oldest = drop_oldest
        # How fast the learner takes unrolls, for pacing (seedq.server.pacing).
        self.take_rate = TakeRate()
        self.dropped_unrolls = 0
        self.put_unrolls = 0  # every unroll let in (the dropped ones too)
        self._chunks: collections.deque[dict[str, np.ndarray]] = collections.deque()
        self._size = 0
        self._closed = False
        self._cond = threading.Condition()
        # The unrolls a `get` is waiting for (None: no getter waits).
        self._getter_wants: int | None = None

    def __len__(self) -> int:
        return self._size

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def try_put(self, chunk: dict[str, np.ndarray]) -> bool:
        """Adds the chunk if there is room; never blocks."""
        with self._cond:
            if self._closed:
                raise QueueClosed()
            if not self._has_room():
                if not self.drop_oldest:
                    return False
                while self._chunks and not self._has_room():
                    dropped = _count(self._chunks.popleft())
                    self._size -= dropped
                    self.dropped_unrolls += dropped
            self._append(chunk)
            return True

    def put(self, chunk: dict[str, np.ndarray], timeout: float | None = None) -> bool:
        """Blocks until there is room."""
        with self._cond:
            ok = self._cond.wait_for(lambda: self._closed or self._has_room(), timeout)
            if self._closed:
                raise QueueClosed()
            if ok:
                self._append(chunk)
            return ok

    def get(self, batch_size: int, timeout: float | None = None) -> dict[str, np.ndarray] | None:
        """Exactly `batch_size` unrolls stacked along axis 0, or None on timeout/close."""
        with self._cond:
            self._getter_wants = batch_size
            self._cond.notify_all()  # wait_starved
            try:
                if not self._cond.wait_for(lambda: self._closed or self._size >= batch_size, timeout):
                    return None
            finally:
                self._getter_wants = None
            if self._size < batch_size:
                return None  # closed
            parts, need = [], batch_size
            while need:
                chunk = self._chunks[0]
                k = _count(chunk)
                if k <= need:
                    parts.append(self._chunks.popleft())
                    need -= k
                else:
                    parts.append({n: a[:need] for n, a in chunk.items()})
                    self._chunks[0] = {n: a[need:] for n, a in chunk.items()}
                    need = 0
            self._size -= batch_size
            self.take_rate.took(time.monotonic(), batch_size)
            self._cond.notify_all()
        if len(parts) == 1:
            return parts[0]
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    def wait_starved(self) -> None:
        """Blocks until the consumer waits in `get` for more unrolls than the
        queue holds (it has trained on everything it could take), or the queue
        is closed: a deterministic run's inference waits for this."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or (
                self._getter_wants is not None and self._size < self._getter_wants))

    def take_all(self, timeout: float | None = None) -> list[dict[str, np.ndarray]] | None:
        """Every chunk queued, as put (at least one unroll); None on timeout, or
        once the queue is closed and empty (what was queued before close still comes out)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._closed or self._size, timeout) or not self._size:
                return None
            chunks = list(self._chunks)
            self._chunks.clear()
            self.take_rate.took(time.monotonic(), self._size)
            self._size = 0
            self._cond.notify_all()
        return chunks

    def pace_target(self) -> int:
        """The backlog pacing keeps: TARGET_BATCHES of the learner's latest take (0 before any)."""
        return TARGET_BATCHES * self.take_rate.last_take

    def _has_room(self) -> bool:
        return self._size < self.capacity

    def _append(self, chunk):
        self._chunks.append(chunk)
        self._size += _count(chunk)
        self.put_unrolls += _count(chunk)
        self._cond.notify_all()


async def poll_until(done, *, give_up=lambda: False, first_wait: float = 0.001,
                     longest_wait: float = 0.02) -> bool:
    """Waits on the event loop until `done()` (returns True), or returns False
    as soon as `give_up()` is true. The queue is filled by the event loop and
    drained by the training thread, which cannot wake a coroutine cheaply; a
    short poll (1 ms growing to 20 ms) is the wake-up, only while waiting.
    Waiting on the loop (not in an executor thread) keeps the wait
    cancellable (a closed stream) and leaves the executor to other RPCs'
    work (parameter pulls)."""
    wait = first_wait
    while not done():
        if give_up():
            return False
        await asyncio.sleep(wait)
        wait = min(longest_wait, wait * 2)
    return True


async def put_when_room(queue: UnrollQueue, chunk: dict[str, np.ndarray], *, give_up=lambda: False) -> bool:
    """Puts `chunk` once `queue` has room (`poll_until`); returns False,
    without putting, as soon as `give_up()` is true; raises QueueClosed once
    the queue is closed."""
    return await poll_until(lambda: queue.try_put(chunk), give_up=give_up)


def _count(chunk: dict[str, np.ndarray]) -> int:
    return len(next(iter(chunk.values())))
