"""The learner process: gRPC inference server plus the training loop.

Threads:
  * server thread: an asyncio loop running the gRPC server and the dynamic
    batcher (all per-env state lives here);
  * training thread: queue -> prefetch -> jitted update -> publish params
    (`_train_loop`, readable top to bottom);
  * the caller's thread: starts/stops, and reads `stats()` (the reporter).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import threading
import time
import uuid

import jax
import numpy as np

from seedq import config as config_lib
from seedq import grpc_setup, jax_setup, schema
from seedq.acting.core import training_reward_clip
from seedq.agents import make_agent
from seedq.agents.base import Agent
from seedq.config import TrainConfig
from seedq.devices import (
    data_parallel, global_training_devices, inference_placement, local_copy, resolve_split,
)
from seedq.distributed import SOLO, ProcessGroup, first_line, is_lost_peer_error
from seedq.envs import env_spec
from seedq.learner.stats import ActorStats, LearnerStats, PolicyLagLog
from seedq.quant.mode import InferencePrecision
from seedq.schema import BEHAVIOUR_VERSION, EnvSpec
from seedq.server.batching import BatchingRule
from seedq.server.env_table import EnvTable, EpisodeLog, slot_budget
from seedq.server.inference import InferenceServer, bucket_sizes
from seedq.server.service import LearnerService, start_server
from seedq.server.unrolls import QueueClosed, UnrollQueue

log = logging.getLogger("seedq.learner")

# Train-step gaps longer than this are kept (stats.json `long_train_step_gaps`).
LONG_GAP_SECONDS = 0.5


class Learner:
    """`group`: the learner processes of a multi-host learner (seedq.distributed;
    SOLO: this process alone). In a group every process serves its own actors
    and infers on its own inference devices, and all train one model
    data-parallel over every process's training devices, each contributing
    its share (batch / processes) of every global batch.

    `spec` and `agent`: the run's env spec and agent where the caller built
    them already (`seedq.local.train`); otherwise they are built here."""

    def __init__(
        self, config: TrainConfig, address: str, group: ProcessGroup = SOLO, *,
        spec: EnvSpec | None = None, agent: Agent | None = None,
    ):
        self.config = config
        self.group = group
        self.requested_address = address
        jax_setup.configure()
        self.address: str | None = None
        self.spec = env_spec(config.env, config.env_options) if spec is None else spec
        self.agent = make_agent(config, self.spec) if agent is None else agent
        rng = jax.random.PRNGKey(config.seed)
        init_rng, act_rng = jax.random.split(rng)
        if group.index:  # each process's actors explore with their own random stream
            act_rng = jax.random.fold_in(act_rng, group.index)
        # Which devices run inference and which train (seedq.devices): on one
        # device both share it and nothing is placed explicitly; otherwise
        # training is data-parallel over its devices and the inference
        # parameters are copied to every inference device after each update.
        self.devices = resolve_split(config)
        # A group trains over every process's training devices, even where a
        # process has one device that infers and trains.
        self._training_devices = global_training_devices(config) if group.multi else self.devices.training
        self._parallel = (
            data_parallel(self.agent, self._training_devices)
            if group.multi or not self.devices.shared else None
        )
        self._inference_placement = (
            None if self.devices.shared else inference_placement(self.devices.inference)
        )
        self.state = self._place_state(jax.jit(self.agent.init)(init_rng))
        # Inference precision is a mode of the server, for any agent.
        self.precision = InferencePrecision(self.agent, self.spec, config.precision)
        # int8: the per-layer int8/fp32 choice at the server's padded batch
        # sizes, fixed for the run (seedq.quant.plan); None otherwise.
        plan = self.precision.plan_int8(
            self.agent.inference_params(local_copy(self.state)), bucket_sizes(config.server.max_batch_size),
            force=config.quant.force_int8,
        )
        if plan is not None:
            log.info("%s", plan.describe())
        self.version = 0
        self.episodes = EpisodeLog(window=config.return_window)
        self.table = EnvTable(self.episodes, max_envs=slot_budget(config.server.max_envs, self.agent, self.spec))
        # A group's processes share the capacity, as they share the batch: the
        # same unrolls in flight per update (policy lag) as one process has.
        capacity = config.server.queue_capacity_unrolls
        if group.multi:
            capacity = max(capacity // group.size, config.training_batch[1] // group.size)
        self.queue = UnrollQueue(capacity)
        self.inference = InferenceServer(
            self.agent,
            self.spec,
            self.table,
            self.queue,
            max_batch_size=config.server.max_batch_size,
            batch_timeout_ms=config.server.batch_timeout_ms,
            rng=act_rng,
            reward_clip=training_reward_clip(config),
            precision=self.precision,
            devices=self.devices.inference if len(self.devices.inference) > 1 else None,
            batching=BatchingRule(config.server.batching),
        )
        self.inference.publish(self.published_params(self.state), self.version)
        self.learner_run = uuid.uuid4().hex[:12]
        self.train_steps = 0
        self.trained_frames = 0
        # Train-step timing (time.monotonic()), for stalls: the last step and the
        # longest gap between two consecutive steps of this process. The clock
        # starts at the first step after this process booked an env step: a
        # resumed replay learner's first steps on restored data alone, before
        # its actors are back, are part of its restart.
        self._frames_at_start: int | None = None
        self.last_train_step_at: float | None = None
        self.max_train_step_gap = 0.0
        self.max_train_step_gap_ended_at: float | None = None  # when that gap ended
        # The latest gaps over LONG_GAP_SECONDS: (seconds, monotonic time it ended).
        self.long_train_step_gaps: collections.deque[tuple[float, float]] = collections.deque(maxlen=20)
        # (state, train_steps, trained_frames, version) change together under
        # this lock, so a checkpoint never pairs parameters with stale counters;
        # the train-step timing and publish counters too, for `stats()`.
        self._state_lock = threading.Lock()
        # Cumulative publish timing (`stats()`: publish_ms since a mark).
        self.publish_seconds_total = 0.0
        self.publishes = 0
        self.policy_lag = PolicyLagLog()
        self.params_publisher = None  # IMPALA mode: serialized parameters for actors
        self.waiting_for_actors = False
        self.last_metrics: dict | None = None
        self._metrics_pending = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server_ready = threading.Event()
        self._server_error: BaseException | None = None
        self._threads: list[threading.Thread] = []
        self._server_thread: threading.Thread | None = None
        self._update = self._parallel.update if self._parallel else jax.jit(self.agent.update)
        _, batch_size = config.training_batch
        self.batches = self.agent.make_batch_source(self.queue, batch_size // group.size)
        # Group control, in band with the update (`_group_flags`): a stop
        # request, and the number of checkpoint requests this process has
        # received; the maximum over the group after a step says, identically
        # on every process, whether to stop after that step and which
        # checkpoint pins it (`pinned_snapshot`).
        self._stop_requested = False
        self._checkpoint_requests = 0
        self._last_pin = 0
        self._pins: dict[int, tuple] = {}
        self._pinned = threading.Condition(self._state_lock)
        # Set while training may run: a group's checkpoint parks every
        # training thread at the pinned step until its save is done, because
        # orbax's multi-process saves use device collectives of their own
        # (barriers, broadcasts of the step list), which must not interleave
        # with the update's.
        self._may_train = threading.Event()
        self._may_train.set()
        self._group_flags = _group_flags_fn(self._parallel) if group.multi else None

    @property
    def int8_plan(self):
        """The run's int8 plan (`seedq.quant.plan.Int8Plan`), None unless int8."""
        return self.precision.plan

    def published_params(self, state):
        """The parameters the server acts with: the agent's fp32 inference
        parameters at the server's precision."""
        params = self.precision.publish(self.agent.inference_params(local_copy(state)))
        return params if self._inference_placement is None else jax.device_put(params, self._inference_placement)

    def _place_state(self, state):
        """The learner state on the training devices (replicated when data-parallel)."""
        return jax.device_put(state) if self._parallel is None else self._parallel.place_state(state)

    # --- lifecycle ---

    def restore(self, snapshot) -> None:
        """Continues from a checkpoint (call before `start`): learner state,
        counters, the recent episode window and the inference RNG key."""
        counters = snapshot.counters
        with self._state_lock:
            self.state = self._place_state(snapshot.state)
            self.version = int(counters["policy_version"])
            self.train_steps = int(counters["train_steps"])
            self.trained_frames = int(counters["trained_frames"])
        self.table.frames = int(counters["frames"])
        window = snapshot.episode_window
        self.episodes.restore(counters["episodes"], window.get("returns", []), window.get("lengths", []))
        self.inference.set_rng(jax.device_put(snapshot.rng))
        self.inference.publish(self.published_params(self.state), self.version)
        if snapshot.replay is not None and self.checkpoints_replay:
            from seedq.checkpoint import CheckpointError

            try:
                self.batches.restore_checkpoint_state(*snapshot.replay)
            except ValueError as e:
                raise CheckpointError(
                    f"cannot restore the checkpoint's replay: {e} "
                    "(--r2d2.checkpoint-replay false resumes with an empty replay)"
                ) from None
            log.info("restored %d replay sequences", self.batches.replay.size)

    @property
    def checkpoints_replay(self) -> bool:
        """Whether checkpoints carry this learner's replay (--r2d2.checkpoint-replay)."""
        return (
            self.config.agent == "r2d2" and self.config.r2d2.checkpoint_replay
            and hasattr(self.batches, "checkpoint_state")
        )

    def replay_checkpoint(self) -> tuple[dict, dict] | None:
        """(arrays, scalars) of the replay for a checkpoint, or None (not checkpointed, or
        still empty: orbax cannot write empty arrays, and there is nothing to keep)."""
        if not self.checkpoints_replay or self.batches.replay.size == 0:
            return None
        return self.batches.checkpoint_state()

    def snapshot(self) -> tuple:
        """(learner state, train_steps, trained_frames, policy version), consistent."""
        with self._state_lock:
            return self.state, self.train_steps, self.trained_frames, self.version

    def start(self, train: bool = True) -> str:
        """Starts serving (and training); returns the address actors dial."""
        self._frames_at_start = self.table.frames  # restored counters, if resumed
        server_thread = threading.Thread(target=self._serve, name="seedq-server", daemon=True)
        server_thread.start()
        self._server_thread = server_thread
        self._threads.append(server_thread)
        self._server_ready.wait()
        if self._server_error is not None:
            raise self._server_error
        # Without training (inference benchmarks) finished unrolls are drained
        # and dropped, so backpressure does not stall the actors.
        target = self._train_loop if train else self._drain_loop
        consumer = threading.Thread(target=target, name="seedq-train", daemon=True)
        consumer.start()
        self._threads.append(consumer)
        return self.address

    def server_thread_cpu_seconds(self) -> float | None:
        """CPU seconds the server thread (gRPC, batching, inference) has used so
        far; None before start() or where the OS has no per-thread CPU clock."""
        thread = self._server_thread
        if thread is None or thread.ident is None or not hasattr(time, "pthread_getcpuclockid"):
            return None
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except OSError:  # the thread has ended
            return None

    def stop(self) -> None:
        self._stop.set()
        self.queue.close()
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._shutdown_event.set)
        for thread in self._threads:
            thread.join(timeout=10)
        if self.training:
            # A train step or compile in flight (the first compile of a large
            # update takes minutes on a busy machine) must end before the
            # interpreter does: a daemon thread inside XLA at exit aborts the
            # process ("FATAL: exception not rethrown"). It always ends; the
            # queue is closed, so no step follows it.
            log.warning("waiting for the train step in flight to finish before exiting")
            self.wait_training_stopped(timeout=None)

    # --- server thread ---

    def _make_service(self) -> LearnerService:
        """SEED mode: central inference; IMPALA mode: parameter pulls and unroll pushes."""
        max_envs = self.config.server.max_envs_per_actor
        peer_timeout = self.config.server.peer_timeout_seconds
        if self.config.architecture != "impala":
            return LearnerService(self.inference, self.learner_run, max_envs, peer_timeout)
        from seedq.server.impala_service import ImpalaLearnerService, ParamsPublisher

        # The same agent at the actors' precision (ActorQ int8).
        actor_precision = InferencePrecision(self.agent, self.spec, self.config.actor_precision)
        self.params_publisher = ParamsPublisher(self.agent, actor_precision, self.snapshot)
        return ImpalaLearnerService(
            self.agent, self.spec, self.table, self.queue, self.learner_run, max_envs,
            publisher=self.params_publisher,
            config_json=json.dumps(config_lib.to_dict(self.config)),
            current_version=lambda: self.version, peer_timeout_seconds=peer_timeout,
        )

    def _serve(self) -> None:
        grpc_setup.run(self._serve_async())

    async def _serve_async(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._shutdown_event = asyncio.Event()
        service = self._make_service()
        try:
            server, self.address, set_serving = await start_server(
                service, self.requested_address, server_config=self.config.server,
                tls=self.config.tls, auth=self.config.auth,
            )
        except BaseException as e:  # reported to start()
            self._server_error = e
            self._server_ready.set()
            return
        batcher = asyncio.create_task(self.inference.run())
        await set_serving(True)
        self._server_ready.set()
        try:
            await self._shutdown_event.wait()
        finally:
            await set_serving(False)
            # Answer every waiting stream with UNAVAILABLE (actors reconnect
            # or exit) before the server stops taking messages.
            self.inference.close()
            service.idle.close()
            await server.stop(grace=1.0)
            batcher.cancel()

    # --- training thread ---

    def _train_loop(self) -> None:
        frames_per_batch = None
        try:
            self._warm_up()
            self._wait_for_actors()
            batch = self._next_batch()
            while batch is not None:
                # Dispatch is asynchronous: the update runs while we fetch and
                # transfer the next batch (prefetching).
                state, metrics = self._update(self.state, batch)
                next_batch = self._next_batch()
                # Publish only finished parameters, so inference never stalls
                # waiting for an update in flight.
                jax.block_until_ready(state.params)
                if frames_per_batch is None:
                    frames_per_batch = self._frames_in(batch)
                with self._state_lock:
                    self.state = state
                    self.version += 1
                    self.train_steps += 1
                    self.trained_frames += frames_per_batch
                    self._record_step_time(time.monotonic())
                published = time.perf_counter()
                params = jax.block_until_ready(self.published_params(state))
                self.inference.publish(params, self.version)
                with self._state_lock:
                    self.publish_seconds_total += time.perf_counter() - published
                    self.publishes += 1
                if self.group.multi:
                    metrics = {k: self._parallel.local_rows(v) if np.ndim(v) else v for k, v in metrics.items()}
                self.batches.after_update(batch, metrics)
                self._metrics_pending = metrics
                if self._group_flags is not None and self._group_step_done(state):
                    break
                batch = next_batch
        except QueueClosed:
            pass
        except Exception as e:
            if self.group.multi and is_lost_peer_error(e):
                log.warning("training stopped: a collective with the group failed (%s)", first_line(e))
            else:
                log.exception("training failed")
            self.error = e
            self._stop.set()

    def _group_step_done(self, state) -> bool:
        """After a step of a group: pins the state for a checkpoint the group
        asked for, and says whether the group stops after this step (the same
        answer on every process: the flags are reduced over the group)."""
        stop, checkpoints = self._group_flags(self._stop_requested, self._checkpoint_requests)
        with self._state_lock:
            pinned = checkpoints and checkpoints > self._last_pin
            if pinned:
                self._last_pin = checkpoints
                self._may_train.clear()
                self._pins[checkpoints] = (state, self.train_steps, self.trained_frames, self.version)
                self._pinned.notify_all()
        while pinned and not self._may_train.wait(0.2) and not self._stop.is_set():
            pass  # parked until this process's save of the pinned step is done (`resume_training`)
        return bool(stop)

    def resume_training(self) -> None:
        """Ends a group checkpoint's pause (see `_may_train`)."""
        self._may_train.set()

    def request_group_stop(self) -> None:
        """A group's stop decision: every process stops after the same step."""
        self._stop_requested = True

    def request_checkpoint(self) -> int:
        """A group's checkpoint decision; returns its number for `pinned_snapshot`."""
        self._checkpoint_requests += 1
        return self._checkpoint_requests

    def pinned_snapshot(self, number: int, timeout: float) -> tuple | None:
        """The (state, train_steps, trained_frames, version) of the step the
        group pinned for checkpoint `number` (the same step on every process),
        or None if training ended or `timeout` passed first."""
        with self._state_lock:
            self._pinned.wait_for(
                lambda: number in self._pins or not self.training, timeout=timeout
            )
            pin = self._pins.pop(number, None)
            for old in [n for n in self._pins if n < number]:
                del self._pins[old]
            return pin

    @property
    def training(self) -> bool:
        """Whether the training thread is still running."""
        return any(t.name == "seedq-train" and t.is_alive() for t in self._threads)

    def wait_training_stopped(self, timeout: float | None) -> bool:
        """Waits for the training thread to end (a group's stop); False if it has not."""
        for thread in self._threads:
            if thread.name == "seedq-train":
                thread.join(timeout)
        return not self.training

    def _record_step_time(self, now: float) -> None:
        """Books a train step's time (called under `_state_lock`)."""
        if self.last_train_step_at is None and self.table.frames == self._frames_at_start:
            return  # no env step of this process yet (restored replay only)
        if self.last_train_step_at is not None:
            gap = now - self.last_train_step_at
            if gap > self.max_train_step_gap:
                self.max_train_step_gap, self.max_train_step_gap_ended_at = gap, now
            if gap > LONG_GAP_SECONDS:
                self.long_train_step_gaps.append((gap, now))
        self.last_train_step_at = now

    def _drain_loop(self) -> None:
        # Whole chunks, not one unroll at a time: slicing them cost the server
        # thread GIL time in `seedq bench throughput --no-train`.
        while self.queue.take_all(timeout=0.2) is not None or not self._stop.is_set():
            pass

    def _warm_up(self) -> None:
        """Compiles the update while the first sequences are being collected."""
        source = getattr(self.batches, "example_batch", None)
        if source is None:
            size = getattr(self.batches, "batch_size", 1)
            zeros = {
                name: np.zeros((size, *f.shape), f.dtype)
                for name, f in schema.stored_sequence_shapes(self.agent, self.spec).items()
            }
        else:
            zeros = source()
        zeros = zeros if self._parallel is None else self._parallel.place_batch(zeros)
        jax.block_until_ready(self._update(self.state, zeros))  # result discarded

    def _frames_in(self, batch) -> int:
        """New env steps in a batch of sequences (overlapping steps counted once)."""
        sequence = self.agent.sequence_spec()
        return int(np.shape(batch["reward"])[0]) * (sequence.length - sequence.overlap)

    def _next_batch(self):
        batch = self.batches.next_batch(self._stop)
        if batch is None:
            return None
        self._record_lag(batch)
        # Data-parallel: already sharded along the batch over the training devices.
        return jax.device_put(batch) if self._parallel is None else self._parallel.place_batch(batch)

    def _wait_for_actors(self) -> None:
        """Holds training until `config.min_actors` actors are connected."""
        need = self.config.min_actors
        if not need or self.table.num_connected >= need:
            return
        self.waiting_for_actors = True
        log.info("waiting for %d actors before training", need)
        while not self._stop.is_set() and self.table.num_connected < need:
            self._stop.wait(0.05)
        self.waiting_for_actors = False

    def _record_lag(self, batch) -> None:
        """Policy lag: learner version when a batch is taken for training minus
        the version that chose each of its actions."""
        behaviour = batch.get(BEHAVIOUR_VERSION) if isinstance(batch, dict) else None
        if behaviour is None:
            return
        self.policy_lag.record(self.version - np.asarray(behaviour))

    # --- reporting (caller's thread) ---

    def stats(self, since: LearnerStats | None = None) -> LearnerStats:
        """One snapshot of this learner's counters (seedq.learner.stats); its
        interval figures cover what happened since `since`, an earlier one.
        Counters that change together are read under the lock they change under."""
        with self._state_lock:
            now = time.monotonic()
            train_steps, trained_frames, version = self.train_steps, self.trained_frames, self.version
            last_step, max_gap = self.last_train_step_at, self.max_train_step_gap
            max_gap_ended, long_gaps = self.max_train_step_gap_ended_at, tuple(self.long_train_step_gaps)
            publishes, publish_seconds = self.publishes, self.publish_seconds_total
        episodes, mean_return, mean_length, window_full = self.episodes.snapshot()
        inference = self.inference.stats
        latency_count = inference.latency_count
        interval = {}
        if since is None:
            lag = self.policy_lag.totals()
        else:
            lag, lag_mean, lag_max = self.policy_lag.since(since.lag)
            latency = inference.latency_percentiles(since.latency_count)
            interval = dict(
                latency_p50_seconds=None if latency is None else latency[0],
                latency_p99_seconds=None if latency is None else latency[1],
                policy_lag_mean=lag_mean, policy_lag_max=lag_max,
                publish_ms=(
                    1e3 * (publish_seconds - since.publish_seconds_total) / (publishes - since.publishes)
                    if publishes > since.publishes else None
                ),
            )
        source_stats = getattr(self.batches, "stats", None)
        table = self.table
        return LearnerStats(
            time=now, learner_run=self.learner_run,
            frames=int(table.frames), frames_dropped=int(self.inference.store.dropped_steps),
            episodes=int(episodes), mean_return=mean_return, mean_length=mean_length,
            return_window_full=window_full,
            train_steps=int(train_steps), trained_frames=int(trained_frames), policy_version=int(version),
            last_train_step_at=last_step, max_train_step_gap=max_gap,
            max_train_step_gap_ended_at=max_gap_ended, long_train_step_gaps=long_gaps,
            publishes=publishes, publish_seconds_total=publish_seconds,
            waiting_for_actors=self.waiting_for_actors, error=self.error or self.inference.failure, lag=lag,
            inference_batches=inference.batches, mean_inference_batch=inference.mean_batch_size(),
            inference_compiles=inference.compiles, latency_count=latency_count,
            batching=self.inference.batching.choice, greedy_batches=inference.greedy_batches,
            queue_depth=len(self.queue), queue_capacity=self.queue.capacity,
            actors=tuple(
                ActorStats(e.actor_id, e.run_id, e.num_envs, e.timed_out_waits) for e in table.entries()
            ),
            actor_runs_started=table.runs_started, actor_runs_ended=table.runs_dropped,
            batch_source=dict(source_stats()) if source_stats is not None else {},
            int8_plan=None if self.int8_plan is None else self.int8_plan.to_dict(),
            devices=self.describe_devices(),
            **interval,
        )

    def describe_devices(self) -> dict:
        """Device ids per role (summary.json); a group's training devices are
        every process's, and `processes` its size."""
        devices = self.devices.describe()
        if self.group.multi:
            devices["training"] = [d.id for d in self._training_devices]
            devices["processes"] = self.group.size
        return devices

    def checkpoint_snapshot(self, *, counters: dict, target: dict, pinned: tuple | None = None):
        """Everything needed to continue this run as host arrays (what `restore`
        reads back), a `checkpoint.Snapshot`; `counters` adds the run's own
        (elapsed seconds, segments), `target` when the target was reached."""
        from seedq.checkpoint import Snapshot

        state, train_steps, trained_frames, version = pinned or self.snapshot()
        episodes, _, _, _ = self.episodes.snapshot()
        returns, lengths = self.episodes.window()
        return Snapshot(
            state=jax.device_get(local_copy(state)),
            rng=np.asarray(jax.device_get(self.inference.rng)),
            counters={
                "train_steps": int(train_steps),
                "trained_frames": int(trained_frames),
                "policy_version": int(version),
                "frames": int(self.table.frames),
                "episodes": int(episodes),
                **counters,
            },
            episode_window={"returns": returns, "lengths": lengths},
            target=target,
            config=config_lib.to_dict(self.config),
            replay=self.replay_checkpoint(),
        )

    def metrics(self) -> dict:
        """Latest training metrics as floats (blocks on the newest update)."""
        pending = self._metrics_pending
        if pending is not None:
            self.last_metrics = {
                k: float(v) for k, v in jax.device_get(local_copy(pending)).items() if np.ndim(v) == 0
            }
        return dict(self.last_metrics or {})

    def params_numpy(self):
        return jax.device_get(local_copy(self.state))


def _group_flags_fn(parallel):
    """flags(stop: bool, checkpoints: int) -> (any process stopping, the most
    checkpoint requests any process has): a max over the group's training
    mesh, run by every process's training thread after each step (in the same
    order as the updates, so it cannot interleave differently between hosts)."""
    import jax.numpy as jnp

    local_devices = sum(1 for d in parallel.mesh.devices.flat if d.process_index == jax.process_index())
    reduce = jax.jit(lambda flags: jnp.max(flags, axis=0), out_shardings=parallel.replicated)

    def flags(stop: bool, checkpoints: int) -> tuple[int, int]:
        local = np.tile(np.asarray([[int(stop), int(checkpoints)]], np.int32), (local_devices, 1))
        out = reduce(jax.make_array_from_process_local_data(parallel.batch_sharding, local))
        return tuple(int(v) for v in np.asarray(local_copy(out)))

    return flags


