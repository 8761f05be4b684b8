"""A tap on a learner's unroll queue for tests: sees every chunk that enters it."""

from __future__ import annotations

import threading


class QueueTap:
    """Wraps `queue.try_put` / `queue.put` so that `record(chunk)` runs (under
    `self.lock`) for every chunk the queue accepts; `unrolls` counts them."""

    def __init__(self, queue):
        self.lock = threading.Lock()
        self.unrolls = 0
        try_put, put = queue.try_put, queue.put

        def tapped_try_put(chunk):
            ok = try_put(chunk)
            if ok:
                self._seen(chunk)
            return ok

        def tapped_put(chunk, timeout=None):
            ok = put(chunk, timeout)
            if ok:
                self._seen(chunk)
            return ok

        queue.try_put, queue.put = tapped_try_put, tapped_put

    def _seen(self, chunk) -> None:
        with self.lock:
            self.unrolls += len(chunk["obs"])
            self.record(chunk)

    def record(self, chunk) -> None:
        """Called for every accepted chunk, holding the lock."""
