"""Driving an `InferenceServer` through its public batching path in tests.

`serve(server, entry, steps)` submits one actor request the way the gRPC
service does (`submit`, answered by the `run` batch loop) and collects what
the batch put on the learner queue, so tests never call the server's
internals."""

from __future__ import annotations

import asyncio


def serve(server, entry, steps):
    """(actions, policy version, finished unrolls or None) for one request."""

    async def one_request():
        batch_loop = asyncio.create_task(server.run())
        await asyncio.sleep(0)  # the loop starts before any stream submits, as in the learner
        try:
            answer = await server.submit(entry, steps)
            # The batch loop records the step one event-loop pass after it
            # answers (the actors step meanwhile): let it finish the batch.
            await asyncio.sleep(0)
            return answer
        finally:
            batch_loop.cancel()

    queued = len(server.queue)
    actions, version = asyncio.run(one_request())
    finished = len(server.queue) - queued
    return actions, version, server.queue.get(finished, timeout=0) if finished else None


def held_steps(store, slots):
    """Steps `store` (a `seedq.rollout.store.UnrollStore`) holds for each
    slot's unroll under construction: its write positions, which nothing
    outside the store needs to read."""
    return store._position[slots].copy()
