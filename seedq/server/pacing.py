"""Pacing: backpressure spread over the inference batches.

When training is slower than the actors, the actors must slow down to the
learner's rate. Waiting only once the unroll queue is full (`queue_full
wait`) does that in lumps: the batch loop runs at full speed until the queue
fills, then holds one batch until a whole train step frees room, so one
round trip in every few waits out a train step (on Pong here, 0.6 s), and
the learner trains on a full queue's worth of old unrolls (the policy lags
by capacity / batch updates).

Pacing (`queue_full pace`) slows the loop before that: once more than two
learner batches are queued, the next batch starts no sooner than the time
the learner takes to consume what the previous batch produced, stretched by
how far the backlog is past that target. Each round trip then grows by a few
milliseconds instead of one growing by a train step, and the queue holds
about two batches: the learner never waits for data, and trains on unrolls
about two updates old. A full queue still waits, as under `wait`.
"""

from __future__ import annotations

import collections

# How far past the target the backlog slows the loop at most (the backlog
# over the target, capped): a backlog twice the target halves the rate.
MAX_SLOWDOWN = 2.0
# Learner batches the queue holds before pacing starts.
TARGET_BATCHES = 2


class TakeRate:
    """Unrolls per second the learner takes from the queue, over its last `window` takes."""

    def __init__(self, window: int = 8):
        self._takes: collections.deque[tuple[float, int]] = collections.deque(maxlen=window)
        self.last_take = 0  # unrolls in the latest take

    def took(self, now: float, unrolls: int) -> None:
        self._takes.append((now, unrolls))
        self.last_take = unrolls

    def per_second(self) -> float | None:
        """None until two takes are seen (or when they came at one instant)."""
        if len(self._takes) < 2:
            return None
        span = self._takes[-1][0] - self._takes[0][0]
        if span <= 0:
            return None
        return sum(n for _, n in list(self._takes)[1:]) / span


def pace_interval(produced_unrolls: float, backlog: int, target: int, take_rate: float | None) -> float:
    """Seconds from one inference batch's start to the next one's.

    `produced_unrolls`: the unrolls' worth of env steps the batch recorded
    (its steps / the new steps per unroll); `backlog`: unrolls queued;
    `target`: the backlog pacing keeps (TARGET_BATCHES learner batches);
    `take_rate`: unrolls per second the learner takes. 0 (no pacing) while
    the backlog is at or under the target or the rate is not known yet.
    """
    if take_rate is None or take_rate <= 0 or target <= 0 or backlog <= target:
        return 0.0
    slowdown = min(backlog / target, MAX_SLOWDOWN)
    return produced_unrolls / take_rate * slowdown


def push_ack_backlog(pushed_unrolls: int, target: int) -> int:
    """IMPALA mode's pacing: the backlog (unrolls queued, the push included)
    at or under which the acknowledgement of `pushed_unrolls` goes out.

    IMPALA actors push whole unrolls past the inference batch loop and send
    the next ones only after the acknowledgement, so holding it holds the
    actor. A push is often larger than `target` (32 unrolls from an actor of
    32 envs against 2 batches of 4 on Pong), so a rate schedule would hold
    every push and starve the learner while the actor waits and then steps;
    instead the acknowledgement waits until the learner has drained the
    queue down to this push and `target`: the actor then steps its next
    unrolls while the learner trains on these, and the backlog stays within
    one push per actor plus the target instead of filling the queue.
    """
    return pushed_unrolls + target
