"""`LearnerStats`: one snapshot of a learner's counters, as `Learner.stats()` takes it.

Everything the reporter shows or writes (progress line, TensorBoard,
stats.json, summary.json) and every stop and checkpoint decision is read from
one of these, so the readers never reach into the learner's parts and a fake
learner in a test is a function returning these values.

Counters are cumulative over the learner process (resumed ones continue from
their checkpoint). The *interval* figures (latency percentiles, policy lag,
publish time) cover what happened since an earlier snapshot passed as
`since`; without one they are None.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any

import numpy as np

from seedq.wire.groups import actor_of


@dataclasses.dataclass(frozen=True)
class ActorStats:
    """One connected actor (an open stream)."""

    actor_id: str
    run_id: str
    num_envs: int
    # Inference batches that fired on the batch timeout while this stream was silent.
    timed_out_waits: int


@dataclasses.dataclass(frozen=True)
class LearnerStats:
    """A learner's counters at one moment (see the module docstring)."""

    time: float  # time.monotonic() of the learner process when taken
    learner_run: str
    # --- env steps and episodes ---
    frames: int
    # Env steps of partial unrolls dropped with an actor's stream (lost to training).
    frames_dropped: int
    episodes: int
    mean_return: float | None  # over the return window (None: no episode yet)
    mean_length: float | None
    return_window_full: bool
    # --- training: these six change together (one lock) ---
    train_steps: int
    trained_frames: int
    policy_version: int
    last_train_step_at: float | None  # time.monotonic(); None before this process's first step
    max_train_step_gap: float
    max_train_step_gap_ended_at: float | None  # time.monotonic()
    # The latest gaps over LONG_GAP_SECONDS: (seconds, time.monotonic() it ended).
    long_train_step_gaps: tuple[tuple[float, float], ...]
    publishes: int
    publish_seconds_total: float
    waiting_for_actors: bool
    error: BaseException | None  # the training thread's failure, if it failed
    # --- policy lag (learner version minus behaviour version, per trained step) ---
    lag: "LagTotals"
    # --- inference ---
    inference_batches: int
    mean_inference_batch: float  # env steps per inference batch, over the process
    inference_compiles: int
    latency_count: int  # inference batches timed so far
    # The batcher's rule in force, "wait" or "greedy" (seedq.server.batching),
    # and the batches the greedy rule ran.
    batching: str
    greedy_batches: int
    queue_depth: int  # unrolls waiting for training
    queue_capacity: int
    # --- actors ---
    actors: tuple[ActorStats, ...]
    actor_runs_started: int
    actor_runs_ended: int
    # The batch source's own scalars (R2D2: replay size, priorities, ...); may be empty.
    batch_source: dict[str, Any]
    # int8 precision: the per-layer plan (`Int8Plan.to_dict()`); None otherwise.
    int8_plan: dict | None
    # Device ids per role: {"inference": [...], "training": [...]} (seedq.devices).
    devices: dict[str, list[int]]
    # --- since `since` (None without it, or when nothing of the kind happened) ---
    latency_p50_seconds: float | None = None
    latency_p99_seconds: float | None = None
    policy_lag_mean: float | None = None
    policy_lag_max: int | None = None
    publish_ms: float | None = None  # mean milliseconds per parameter publish
    # --- the server's batch loop, cumulative (seedq.reporting.bottleneck) ---
    inference_busy_seconds: float = 0.0  # running batches, waits for queue room included
    queue_held_seconds: float = 0.0  # those waits: training held the actors back
    server_thread_cpu_seconds: float | None = None
    queue_put_unrolls: int = 0
    queue_dropped_unrolls: int = 0  # server.queue_full drop_oldest
    # The most env groups (streams) one actor has had open at once (docs/wire.md "Actor groups").
    actor_groups: int = 0

    @property
    def num_connected(self) -> int:
        return len(self.actors)

    @property
    def num_actor_processes(self) -> int:
        """Connected actors, each counted once however many groups it streams."""
        return len({actor_of(a.actor_id) for a in self.actors})


@dataclasses.dataclass(frozen=True)
class LagTotals:
    """Cumulative policy-lag counters: the mark an interval starts from."""

    batches: int = 0  # trained batches with a behaviour version
    steps: int = 0  # their steps
    total: float = 0.0  # sum of the steps' lags

    @property
    def mean(self) -> float | None:
        return self.total / self.steps if self.steps else None


class PolicyLagLog:
    """Policy lag of every trained batch, for the whole-run mean and for the
    mean and max since any earlier `LagTotals` (any number of readers; a
    take-and-reset counter would serve one). Thread-safe."""

    def __init__(self, ring: int = 4096):
        self._lock = threading.Lock()
        self._totals = LagTotals()
        # Each batch's largest lag, a ring: an interval's max covers its latest `ring` batches.
        self._max = np.zeros(ring, np.int64)

    def record(self, lag: np.ndarray) -> None:
        with self._lock:
            t = self._totals
            self._max[t.batches % len(self._max)] = int(lag.max())
            self._totals = LagTotals(t.batches + 1, t.steps + int(lag.size), t.total + float(lag.sum()))

    def totals(self) -> LagTotals:
        with self._lock:
            return self._totals

    def since(self, mark: LagTotals) -> tuple[LagTotals, float | None, int | None]:
        """(totals now, mean lag since `mark`, max lag since `mark`), consistent."""
        with self._lock:
            now = self._totals
            recent = min(now.batches - mark.batches, len(self._max))
            if recent <= 0 or now.steps == mark.steps:
                return now, None, None
            idx = np.arange(now.batches - recent, now.batches) % len(self._max)
            worst = int(self._max[idx].max())
        return now, (now.total - mark.total) / (now.steps - mark.steps), worst


# Train-step gaps longer than this are kept (stats.json `long_train_step_gaps`).
LONG_GAP_SECONDS = 0.5


class StepTiming:
    """Train-step timing (time.monotonic()), for stalls: the last step and the
    longest gap between two consecutive steps of this process, and the latest
    gaps over LONG_GAP_SECONDS as (seconds, time it ended). The clock starts
    at the first step after this process booked an env step: a resumed replay
    learner's first steps on restored data alone, before its actors are back,
    are part of its restart. Not locked: the learner books and reads it under
    its state lock."""

    def __init__(self):
        self.frames_at_start: int | None = None  # env steps booked when training started
        self.last_step_at: float | None = None
        self.max_gap = 0.0
        self.max_gap_ended_at: float | None = None
        self.long_gaps: collections.deque[tuple[float, float]] = collections.deque(maxlen=20)

    def record(self, now: float, frames: int) -> None:
        """Books a train step at `now`, with `frames` env steps booked so far."""
        if self.last_step_at is None and frames == self.frames_at_start:
            return  # no env step of this process yet (restored replay only)
        if self.last_step_at is not None:
            gap = now - self.last_step_at
            if gap > self.max_gap:
                self.max_gap, self.max_gap_ended_at = gap, now
            if gap > LONG_GAP_SECONDS:
                self.long_gaps.append((gap, now))
        self.last_step_at = now
