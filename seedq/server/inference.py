"""Central batched inference: the dynamic batcher and the jitted policy call.

Stream handlers `submit` one decoded StepBatch each and await its actions.
The batch loop gathers requests across streams until it holds
`max_batch_size` env steps, every stream the previous batch answered has sent
its next request, or `batch_timeout_ms` passed since the first one arrived
(the `wait` rule; the `greedy` rule takes what is queued at once, and `auto`
picks one by measurement: `seedq.server.batching`); then it hands the whole
batch to the acting core (`seedq.rollout.core`: one jitted `act` at the
server's inference precision, padded to a fixed bucket size so steady state
never recompiles; episode book-keeping), answers, and
only then records the step into every env's unroll and hands finished
unrolls to the learner queue (waiting while it is full: backpressure), so
the actors step their envs while the server does its book-keeping.

The batcher never waits on a particular stream for longer than one batch
timeout: a stream that missed a batch's deadline is no longer awaited until
it sends again, so a stuck actor (connected, silent) costs the others at most
one timeout, and a slow one at most one per message it sends. A stuck stream
holds only its own env slots (at most server.max_envs_per_actor) and no
request: the service reads a stream's next message only after answering it.

All of this runs on the server's asyncio thread; only `publish` is called from
the training thread (an atomic swap of the (params, version) pair).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import time

import jax
import numpy as np

from seedq.rollout.core import ActingCore
from seedq.latency import LatencyRing
from seedq.quant.mode import InferencePrecision
from seedq.schema import EnvSpec
from seedq.server.batching import GREEDY, BatchingRule
from seedq.server.env_table import ActorEntry, EnvTable
from seedq.server.errors import LearnerFailed, RunEnded, RunSuperseded, ServerClosing
from seedq.server.pacing import pace_interval
from seedq.server.unrolls import QueueClosed, UnrollQueue
from seedq.wire.codec import Steps
from seedq.wire.groups import SMALLEST_BATCH_BUCKET

log = logging.getLogger("seedq.server")


def bucket_sizes(max_batch_size: int, smallest: int = SMALLEST_BATCH_BUCKET) -> tuple[int, ...]:
    """Powers of two from `smallest` up to (and including) max_batch_size."""
    sizes, size = [], smallest
    while size < max_batch_size:
        sizes.append(size)
        size *= 2
    sizes.append(max_batch_size)
    return tuple(sizes)


@dataclasses.dataclass
class _Request:
    entry: ActorEntry
    steps: Steps
    future: asyncio.Future


@dataclasses.dataclass
class InferenceStats:
    """Running counters, read by the metrics thread (plain ints/floats)."""

    batches: int = 0
    # Actor messages answered (one vector step of one actor each; a batch joins several).
    requests: int = 0
    env_steps: int = 0
    busy_seconds: float = 0.0
    # Waits for the learner: for room in a full unroll queue, and pacing's.
    backpressure_seconds: float = 0.0
    paced_seconds: float = 0.0  # pacing's share of those (server.queue_full pace)
    compiles: int = 0
    # Batches run by the greedy rule (no wait for the streams; seedq.server.batching).
    greedy_batches: int = 0
    # Batches that fired on the batch timeout while a stream it awaited was silent.
    timed_out_waits: int = 0
    # Seconds per inference batch (batching done to actions ready).
    latencies: LatencyRing = dataclasses.field(default_factory=lambda: LatencyRing(4096))

    def mean_batch_size(self) -> float:
        return self.env_steps / self.batches if self.batches else 0.0

    @property
    def latency_count(self) -> int:
        return self.latencies.count

    def latency_percentiles(self, since: int = 0) -> tuple[float, float] | None:
        """(p50, p99) seconds over the batches after the `since`-th (the ring's worth at most)."""
        return self.latencies.percentiles((50, 99), since)


class InferenceServer:
    def __init__(
        self,
        agent,
        spec: EnvSpec,
        table: EnvTable,
        queue: UnrollQueue,
        *,
        max_batch_size: int,
        batch_timeout_ms: float,
        rng: jax.Array,
        reward_clip: float = 0.0,
        precision: InferencePrecision | None = None,
        devices=None,
        batching: BatchingRule | None = None,
        pace: bool = False,
    ):
        """`precision`: the inference precision mode (fp32 when None); `publish`
        takes parameters already published at it. `reward_clip` > 0: training
        rewards are clipped to [-reward_clip, reward_clip] (Atari); episode
        returns are booked from the unclipped rewards. `devices`: several
        inference devices, each batch split across them (`seedq.devices`).
        `batching`: the batcher's rule (default: always wait for the streams).
        `pace`: slow the batch loop to the learner's rate before the unroll
        queue is full (`seedq.server.pacing`)."""
        self.agent = agent
        self.spec = spec
        self.table = table
        self.queue = queue
        self.max_batch_size = max_batch_size
        self.timeout = batch_timeout_ms / 1000.0
        self.buckets = bucket_sizes(max_batch_size)
        self.batching = batching or BatchingRule("wait")
        self.precision = precision or InferencePrecision(agent, spec, "fp32")
        self.core = ActingCore(agent, spec, self.precision, reward_clip=reward_clip, devices=devices)
        self.stats = InferenceStats()
        self._rng = rng
        self._published: tuple[object, int] | None = None
        self._pending: collections.deque[_Request] = collections.deque()
        self._pending_steps = 0
        # Streams the previous batch answered that have not sent again: the
        # only ones the next batch waits for (never longer than the timeout).
        self._awaited: set[ActorEntry] = set()
        self._closing = False
        # The error that failed an inference batch: the learner stops on it
        # (`Learner.stats().error`), as on a failed train step.
        self.failure: BaseException | None = None
        # The stop reason of a run that has ended for good (close(run_ended=...)).
        self.run_ended: str | None = None
        self._has_work: asyncio.Event | None = None
        self._compiled: set[int] = set()
        self._compile_thread: concurrent.futures.ThreadPoolExecutor | None = None
        # The answered batch whose step is not in the unroll store yet, and
        # the sequences recording it finished (`_record_answered`).
        self._unrecorded = None
        self._recorded_unrolls: dict | None = None
        # Deterministic runs (TrainConfig.deterministic): called, off the event
        # loop, after every batch that finished unrolls; it returns once the
        # learner has trained on every full batch, True when serving must stop.
        self.lockstep = None
        self._halted = False
        self.pace = pace
        # Pacing: the loop time before which the next batch does not start.
        self._next_batch_at = 0.0

    @property
    def store(self):
        """The unroll store (sequences under construction, per env slot)."""
        return self.core.store

    # --- called from the training thread ---

    def publish(self, params, version: int) -> None:
        """Makes `params` (published at `self.precision`) the policy for every
        following inference batch."""
        self._published = (params, version)

    @property
    def policy_version(self) -> int:
        return self._published[1] if self._published else -1

    @property
    def rng(self):
        """The acting PRNG key (checkpoints save it)."""
        return self._rng

    def set_rng(self, rng) -> None:
        """Continues from a checkpointed key; call before serving."""
        self._rng = rng

    def waiting(self) -> list[ActorEntry]:
        """The streams whose request waits for the next batch (any thread: a copy)."""
        return [request.entry for request in list(self._pending)]

    # --- stream side (event-loop thread) ---

    def connect(self, actor_id: str, run_id: str, num_envs: int) -> tuple[ActorEntry, ActorEntry | None]:
        """Registers an actor's stream; returns (entry, the run it superseded or None)."""
        self._record_answered()  # a reused block must not receive an old run's step afterwards
        entry, superseded = self.table.connect(actor_id, run_id, num_envs)
        if superseded is not None:  # the table already released its slots
            self.core.drop(superseded.slots)
            self._awaited.discard(superseded)
        self.core.ensure_capacity(self.table.num_slots)
        self.core.start(entry.slots)  # a reused block must not inherit steps
        return entry, superseded

    def release(self, entry: ActorEntry) -> None:
        """Actor gone or restarted: forget its envs and its partial unrolls."""
        self._awaited.discard(entry)
        self._record_answered()  # then drop the whole partial unroll, its last step included
        slots = self.table.release(entry)
        if slots is not None:
            self.core.drop(slots)

    def close(self, run_ended: str | None = None) -> None:
        """Fails every waiting and future request with ServerClosing (LearnerFailed
        after a failure; RunEnded with `run_ended`, the run's stop reason)."""
        self._closing = True
        self.run_ended = run_ended
        while self._pending:
            request = self._pending.popleft()
            if not request.future.done():
                request.future.set_exception(self._closing_error())
        self._pending_steps = 0

    def _closing_error(self) -> ServerClosing:
        if self.failure is not None:
            return LearnerFailed(self.failure)
        return RunEnded(self.run_ended) if self.run_ended else ServerClosing()

    async def submit(self, entry: ActorEntry, steps: Steps) -> tuple[np.ndarray, int]:
        """Queues one actor's vector step; resolves to (actions [n, ...], policy version)."""
        return await self.enqueue(entry, steps)

    def enqueue(self, entry: ActorEntry, steps: Steps) -> asyncio.Future:
        """`submit` without a coroutine: the future resolves as `submit` does
        (the ingress hub answers from its callback, with no task per step)."""
        if self._closing:
            raise self._closing_error()
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(entry, steps, future))
        self._pending_steps += len(steps)
        self._awaited.discard(entry)
        self._has_work.set()
        return future

    async def run(self) -> None:
        """The batch loop; runs until cancelled."""
        self._has_work = asyncio.Event()
        loop = asyncio.get_running_loop()
        while True:
            if self._halted:  # a deterministic run's last frame is acted on: no more batches
                await asyncio.Event().wait()
            await self._has_work.wait()
            if self.pace and self._next_batch_at > loop.time():
                await self._wait_for_pace(loop)
            now = loop.time()
            greedy = self.batching.current(now, self.stats.env_steps, self.table.num_connected) == GREEDY
            deadline = now + self.timeout
            # Wait for the streams the previous batch answered, up to the deadline.
            while not greedy and self._pending_steps < self.max_batch_size and self._awaited:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    self._count_timed_out_wait()
                    break
                self._has_work.clear()
                # A timer that sets the event, not asyncio.wait_for: that wraps
                # the wait in a new task per batch, a cost the size of the
                # batch's own book-keeping on this thread.
                alarm = loop.call_at(deadline, self._has_work.set)
                try:
                    await self._has_work.wait()
                finally:
                    alarm.cancel()
            batch = self._take_batch()
            # Awaited next time: the streams answered now (none has a request
            # queued: one request in flight per stream). Silent ones drop out.
            self._awaited = {request.entry for request in batch}
            if not self._pending:
                self._has_work.clear()
            if batch:
                await self._run_batch(batch, greedy)
                if self.pace:
                    self._next_batch_at = now + self._pace_interval(sum(len(r.steps) for r in batch))

    async def _wait_for_pace(self, loop) -> None:
        """Holds the next batch until its paced start; requests gather meanwhile.
        The wait is the learner's, as a full queue's is (counted alike)."""
        waited = time.perf_counter()
        await asyncio.sleep(self._next_batch_at - loop.time())
        seconds = time.perf_counter() - waited
        self.stats.backpressure_seconds += seconds
        self.stats.busy_seconds += seconds
        self.stats.paced_seconds += seconds

    def _pace_interval(self, env_steps: int) -> float:
        store = self.core.store
        if store is None:
            return 0.0
        produced = env_steps / (store.length - store.overlap)
        return pace_interval(produced, len(self.queue), self.queue.pace_target(), self.queue.take_rate.per_second())

    def _count_timed_out_wait(self) -> None:
        if not self._awaited:
            return
        self.stats.timed_out_waits += 1
        for entry in self._awaited:
            entry.timed_out_waits += 1

    def _take_batch(self) -> list[_Request]:
        batch, steps = [], 0
        while self._pending:
            request = self._pending[0]
            if batch and steps + len(request.steps) > self.max_batch_size:
                break
            self._pending.popleft()
            self._pending_steps -= len(request.steps)
            if request.future.done():
                continue  # its stream was cancelled while it waited
            if request.entry.closed:
                request.future.set_exception(RunSuperseded())
                continue
            batch.append(request)
            steps += len(request.steps)
        return batch

    def _batch_size(self, n: int) -> int:
        """The padded size `n` env steps run at: the smallest bucket that fits,
        or chunks of the largest (`ActingCore.act`'s max_rows)."""
        bucket = next((b for b in self.buckets if b >= n), None)
        return self.core.padded_size(n, bucket) if bucket else self.core.padded_size(self.buckets[-1])

    async def _compile_off_the_loop(self, batch: list[_Request]) -> None:
        """Compiles the program of this batch's size, the first time it is
        needed, on a thread of its own: the event loop keeps answering
        health checks and keepalives and running the idle watchdog meanwhile
        (a compile can take minutes)."""
        size = self._batch_size(sum(len(r.steps) for r in batch))
        if size in self._compiled:
            return
        log.info("compiling inference for batch size %d", size)
        if self._compile_thread is None:
            self._compile_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="seedq-compile")
        warm = self.core.warm_up(self._published[0], self._rng, batch[0].steps.observations, size)
        await asyncio.get_running_loop().run_in_executor(self._compile_thread, warm)
        self._compiled.add(size)

    async def _run_batch(self, batch: list[_Request], greedy: bool = False) -> None:
        started = time.perf_counter()
        try:
            await self._compile_off_the_loop(batch)
            actions, version, pending = self._infer(batch, greedy)
        except Exception as e:  # never leave a stream hanging on a bad batch
            # A failure here (a device error, a learner bug) would fail every
            # batch after it too: the learner stops rather than idling on.
            log.exception("inference failed; the learner stops")
            self.fail(e)
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(self._closing_error())
            return
        self.stats.latencies.record(time.perf_counter() - started)
        offset = 0
        for request in batch:
            n = len(request.steps)
            if not request.future.done():
                request.future.set_result((actions[offset : offset + n], version))
            offset += n
        # The actors are answered before the step is recorded: one pass of the
        # event loop lets their stream handlers send the actions, so the actors
        # step their envs while this thread writes the unroll store (the next
        # batch still waits for it). Backpressure holds: a full queue stops the
        # next batch, one step later than if the step were recorded before the
        # answers.
        self._unrecorded = pending
        await asyncio.sleep(0)
        self._record_answered()
        unrolls, self._recorded_unrolls = self._recorded_unrolls, None
        try:
            if unrolls is not None and not self.queue.try_put(unrolls):
                waited = time.perf_counter()
                await asyncio.get_running_loop().run_in_executor(None, self.queue.put, unrolls)
                self.stats.backpressure_seconds += time.perf_counter() - waited
        except QueueClosed:
            # The learner is stopping while actors are still connected (`seedq
            # learner` with remote actors): the streams end with UNAVAILABLE at
            # their next request instead of being cancelled mid-request.
            self.close()
            return
        if self.lockstep is not None and unrolls is not None:
            # The next step acts with the parameters trained on every full batch
            # so far. The wait is the learner's, as a full queue's is.
            waited = time.perf_counter()
            self._halted = await asyncio.get_running_loop().run_in_executor(None, self.lockstep)
            self.stats.backpressure_seconds += time.perf_counter() - waited
        self.stats.busy_seconds += time.perf_counter() - started

    def _record_answered(self) -> None:
        """Writes the answered batch's step into the unroll store, if not done
        yet. The batch loop does it one event-loop pass after answering;
        connecting and releasing streams do it first, so that no step lands
        in slots that changed hands after it was acted on."""
        pending, self._unrecorded = self._unrecorded, None
        if pending is None:
            return
        try:
            self._recorded_unrolls = self.core.record(pending)
        except Exception as e:  # a learner bug: the actors already have their actions
            # Every later batch would lose its steps too, and the learner
            # would idle to --max-seconds: it stops instead.
            log.exception("recording an inference batch failed; the learner stops")
            self.fail(e)

    def fail(self, error: BaseException) -> None:
        """Stops serving because of `error`: the learner stops on it
        (`Learner.stats().error`) and every stream ends with LearnerFailed.
        The first failure is the one reported."""
        if self.failure is None:
            self.failure = error
        self.close()

    def _infer(self, batch: list[_Request], greedy: bool = False):
        """Acts on the joined batch; returns (actions [n, ...], policy version, PendingRecord)."""
        slots = np.concatenate([r.entry.first_slot + r.steps.env_indices for r in batch])

        def joined(name: str) -> np.ndarray:  # one request (the usual case): no copy
            parts = [getattr(r.steps, name) for r in batch]
            return parts[0] if len(parts) == 1 else np.concatenate(parts)

        obs, rewards, terminated, truncated = map(joined, ("observations", "rewards", "terminated", "truncated"))
        n = len(slots)
        # The smallest bucket that fits; a request larger than the largest
        # bucket (one actor with more envs than max_batch_size) runs in chunks
        # of it: the compiled batch sizes are the buckets, whatever peers send.
        size = self._batch_size(n)
        params, version = self._published
        result, self._rng, pending = self.core.act(
            params, version, self._rng, slots, obs, rewards, terminated, truncated, pad_to=size,
            max_rows=self.buckets[-1],
        )
        self.table.book_episodes(n, *self.core.reported_episodes(result))
        self.stats.compiles = self.core.compiles
        self.stats.batches += 1
        self.stats.greedy_batches += greedy
        self.stats.requests += len(batch)
        self.stats.env_steps += n
        return result.actions, version, pending
