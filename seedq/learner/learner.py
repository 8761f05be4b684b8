"""The learner process: gRPC inference server plus the training loop.

Threads:
  * server thread (`seedq.learner.server_thread`): an asyncio loop running the
    gRPC server and the dynamic batcher (all per-env state lives there);
  * training thread: queue -> prefetch -> jitted update -> publish params
    (`_train_loop`, readable top to bottom); in a learner group it meets the
    other processes after each step (`seedq.learner.group`);
  * the caller's thread: starts/stops, and reads `stats()` (the reporter).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable

import jax
import numpy as np

from seedq import config as config_lib
from seedq import schema
from seedq.process import jax_setup
from seedq.agents import make_agent
from seedq.agents.base import Agent
from seedq.config import TrainConfig
from seedq.devices import (
    data_parallel, global_training_devices, inference_placement, local_copy, resolve_split,
)
from seedq.distributed import SOLO, ProcessGroup, first_line, is_lost_peer_error
from seedq.envs import env_spec
from seedq.learner.group import GroupControl
from seedq.learner.server_thread import ServerThread
from seedq.rollout.core import training_reward_clip
from seedq.reporting.stats import ActorStats, LearnerStats, PolicyLagLog, StepTiming
from seedq.quant.mode import InferencePrecision
from seedq.schema import BEHAVIOUR_VERSION, EnvSpec
from seedq.server.batching import BatchingRule
from seedq.server.env_table import EnvTable, EpisodeLog, slot_budget
from seedq.server.inference import InferenceServer, bucket_sizes
from seedq.server.service import LearnerService
from seedq.server.unrolls import QueueClosed, UnrollQueue

log = logging.getLogger("seedq.learner")


def lockstep_point_frames(config: TrainConfig) -> int:
    """Frames between two curves.csv rows of a deterministic run: a hundredth
    of max_frames, or 10,000 without a frame budget."""
    return max(config.max_frames // 100, 1) if config.max_frames else 10_000


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
        jax_setup.configure()
        self.address: str | None = None  # where actors dial, once serving
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
        self.queue = UnrollQueue(capacity, drop_oldest=config.server.queue_full == "drop_oldest")
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
            pace=config.server.queue_full == "pace",
        )
        self.inference.publish(self.published_params(self.state), self.version)
        # Deterministic runs: inference waits for training (`_lockstep`), which
        # records the curve points (stats, metrics) at fixed frame counts.
        self.lockstep_points: list[tuple[LearnerStats, dict]] = []
        self.lockstep_done = False
        self._next_point_frames = 0
        if config.deterministic:
            self.inference.lockstep = self._lockstep
        self.learner_run = uuid.uuid4().hex[:12]
        self.train_steps = 0
        self.trained_frames = 0
        self.step_timing = StepTiming()  # stalls (seedq.reporting.stats)
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
        self._server = ServerThread(self._make_service, self.inference, address, config)
        self._threads: list[threading.Thread] = []
        self._update = self._parallel.update if self._parallel else jax.jit(self.agent.update)
        _, batch_size = config.training_batch
        self.batches = self.agent.make_batch_source(self.queue, batch_size // group.size)
        # A group's stop and checkpoint decisions, in band with the update.
        self._group = (
            GroupControl(self._parallel, self._state_lock, self._stop, lambda: self.training)
            if group.multi else None
        )

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
        return self.config.checkpoints_replay

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

    def start(self, consume: Callable[[UnrollQueue], None] | None = None) -> str:
        """Starts serving and training; returns the address actors dial.
        `consume(queue)`, where given, runs in the training thread instead of
        training (the benches' `--no-train`: seedq.bench.drain)."""
        self.step_timing.frames_at_start = self.table.frames  # restored counters, if resumed
        try:
            self.address = self._server.start()
        finally:
            if self._server.thread is not None:
                self._threads.append(self._server.thread)
        target = self._train_loop if consume is None else functools.partial(consume, self.queue)
        consumer = threading.Thread(target=target, name="seedq-train", daemon=True)
        consumer.start()
        self._threads.append(consumer)
        return self.address

    def training_thread_ids(self) -> set[int]:
        """Native ids of the thread that trains on (or, in a bench, drains) the unroll queue."""
        return {t.native_id for t in self._threads if t.name == "seedq-train"}

    def server_thread_cpu_seconds(self) -> float | None:
        """CPU seconds the server thread (gRPC, batching, inference) has used so
        far; None before start() or where the OS has no per-thread CPU clock."""
        return self._server.cpu_seconds()

    @property
    def ingress_hub(self):
        """The ingress processes' hub (server.ingress_processes > 1, once started), else None."""
        return self._server.hub

    def stop(self, run_ended: str | None = None, notice_least_seconds: float = 0.0) -> None:
        """Stops training and serving. `run_ended` (the stop reason of a run
        that is over for good) is first told to the connected actors and to
        those that connect within `notice_least_seconds` (docs/wire.md "The end
        of a run"); without it they reconnect to a restart."""
        self._stop.set()
        self._server.mark_run_ended(run_ended)
        self.queue.close()
        self._server.stop(run_ended, notice_least_seconds)
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

    # --- the service the server thread runs ---

    def _make_service(self) -> LearnerService:
        """SEED mode: central inference; IMPALA mode: parameter pulls and unroll pushes."""
        max_envs = self.config.server.max_envs_per_actor
        peer_timeout = self.config.server.peer_timeout_seconds
        if self.config.architecture != "impala":
            return LearnerService(self.inference, self.learner_run, max_envs, peer_timeout, env_id=self.config.env)
        from seedq.impala.service import ImpalaLearnerService, ParamsPublisher

        # The same agent at the actors' precision (ActorQ int8).
        actor_precision = InferencePrecision(self.agent, self.spec, self.config.actor_precision)
        self.params_publisher = ParamsPublisher(self.agent, actor_precision, self.snapshot)
        return ImpalaLearnerService(
            self.agent, self.spec, self.table, self.queue, self.learner_run, max_envs,
            publisher=self.params_publisher,
            config_json=json.dumps(config_lib.to_dict(self.config)),
            current_version=lambda: self.version, fail=self.inference.fail, peer_timeout_seconds=peer_timeout,
            pace=self.config.server.queue_full == "pace",
        )

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
                # (A deterministic run takes its next batch after publishing: see _lockstep.)
                next_batch = None if self.config.deterministic else self._next_batch()
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
                    self.step_timing.record(time.monotonic(), self.table.frames)
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
                if self._group is not None and self._group.step_done(
                    lambda: (state, self.train_steps, self.trained_frames, self.version)
                ):
                    break
                batch = self._next_batch() if self.config.deterministic else next_batch
        except QueueClosed:
            pass
        except Exception as e:
            if self.group.multi and is_lost_peer_error(e):
                log.warning("training stopped: a collective with the group failed (%s)", first_line(e))
            else:
                log.exception("training failed")
            self.error = e
            self._stop.set()

    # --- a learner group's decisions (seedq.learner.group; the reporter's thread) ---

    def resume_training(self) -> None:
        """Ends a group checkpoint's pause."""
        self._group.resume_training()

    def request_group_stop(self) -> None:
        """A group's stop decision: every process stops after the same step."""
        self._group.request_stop()

    def request_checkpoint(self) -> int:
        """A group's checkpoint decision; returns its number for `pinned_snapshot`."""
        return self._group.request_checkpoint()

    def pinned_snapshot(self, number: int, timeout: float) -> tuple | None:
        """The (state, train_steps, trained_frames, version) the group pinned
        for checkpoint `number`, or None if training ended or `timeout` passed first."""
        return self._group.pinned_snapshot(number, timeout)

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

    def _warm_up(self) -> None:
        """Compiles the update while the first sequences are being collected."""
        zeros = self.batches.example_batch()
        if zeros is None:
            zeros = {
                name: np.zeros((self.batches.batch_size, *f.shape), f.dtype)
                for name, f in schema.stored_sequence_shapes(self.agent, self.spec).items()
            }
        zeros = zeros if self._parallel is None else self._parallel.place_batch(zeros)
        jax.block_until_ready(self._update(self.state, zeros))  # result discarded

    def _lockstep(self) -> bool:
        """A deterministic run's inference calls this after every finished set
        of unrolls: returns once training waits for unrolls it does not have
        (every full batch trained on and published), after recording a curve
        point every `lockstep_point_frames(config)` frames; True once
        max_frames is reached (inference stops, the run ends on it)."""
        self.queue.wait_starved()
        stats = self.stats()
        done = bool(self.config.max_frames) and stats.frames >= self.config.max_frames
        if stats.frames >= self._next_point_frames or done:
            self.lockstep_points.append((stats, self.metrics()))
            self._next_point_frames = stats.frames + lockstep_point_frames(self.config)
        self.lockstep_done = done
        return done

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
        """One snapshot of this learner's counters (seedq.reporting.stats); its
        interval figures cover what happened since `since`, an earlier one.
        Counters that change together are read under the lock they change under."""
        with self._state_lock:
            now = time.monotonic()
            train_steps, trained_frames, version = self.train_steps, self.trained_frames, self.version
            timing = self.step_timing
            last_step, max_gap = timing.last_step_at, timing.max_gap
            max_gap_ended, long_gaps = timing.max_gap_ended_at, tuple(timing.long_gaps)
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
            batch_source=dict(self.batches.stats()),
            int8_plan=None if self.int8_plan is None else self.int8_plan.to_dict(),
            devices=self.describe_devices(),
            inference_busy_seconds=inference.busy_seconds, queue_held_seconds=inference.backpressure_seconds,
            server_thread_cpu_seconds=self.server_thread_cpu_seconds(),
            queue_put_unrolls=self.queue.put_unrolls, queue_dropped_unrolls=self.queue.dropped_unrolls,
            actor_groups=table.max_groups,
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
            config=config_lib.saved_dict(self.config),
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
