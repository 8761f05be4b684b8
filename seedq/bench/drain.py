"""The benches' stand-in for training (`--no-train`): finished unrolls are
taken off the learner's queue and dropped, so the actors never wait on
backpressure and a bench measures acting, transport and inference alone.

`Learner.start(consume=drain_unrolls)` runs it in the learner's training
thread, so the thread's CPU time is still counted where training's would be."""

from __future__ import annotations

from seedq.server.unrolls import UnrollQueue


def drain_unrolls(queue: UnrollQueue) -> None:
    """Drops finished unrolls until the queue is closed and empty (the learner's stop)."""
    # Whole chunks, not one unroll at a time: slicing them cost the server
    # thread GIL time in `seedq bench throughput --no-train`.
    while queue.take_all(timeout=0.2) is not None or not queue.closed:
        pass
