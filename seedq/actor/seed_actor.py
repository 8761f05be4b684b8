"""SEED actor: steps a vector of envs and asks the learner for every action.

The actor holds no model and never imports JAX, so it starts fast and stays
light. One gRPC message goes out per *vector* step (per-message cost
dominates in Python gRPC), carrying all envs' rewards, flags and
observations; the reply carries their actions.

If the learner is not up yet or goes away, the actor reconnects with
exponential backoff; every (re)connection uses a fresh run id and fresh
episodes, so the learner drops whatever partial unrolls it held for us.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import time
import uuid
import zlib

import grpc
import numpy as np

from seedq.transport import channel as channel_lib
from seedq.process import grpc_setup
from seedq.process import lifetime
from seedq.config import ActorChannelConfig, EnvOptions
from seedq.envs import make_vector_env
from seedq.latency import LatencyRing
from seedq.wire import codec
from seedq.actor.groups import Regroup, group_envs, make_groups, probe_env, rechoose_groups
from seedq.wire.groups import group_stream_id
from seedq.wire.metered import ByteCounter, MeteredStub
from seedq import schema

log = logging.getLogger("seedq.actor")

# Errors that retrying cannot fix: our messages or spec are wrong.
# Reconnect delays double from 50 ms up to this cap: short enough that actors
# started before their learner join within a second of it listening.
MAX_BACKOFF_SECONDS = 1.0
# An actor without a learner says so once, then every this many seconds.
WAITING_NOTICE_SECONDS = 30.0
# The first notice waits this long, so that a refusal that ends the actor
# within a few reconnects (a TLS or token mismatch) is its only line.
FIRST_NOTICE_SECONDS = 2.0

# Vector steps before the time split's steady-state window opens.
WARM_STEPS = 50

# docs/wire.md: a malformed or mismatching message, one out of order, or one
# over the learner's message size limit.
FATAL_CODES = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)


def slots_full(error: grpc.aio.AioRpcError) -> bool:
    """The learner's env-slot budget is full (docs/wire.md): a refusal to retry."""
    return error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and (error.details() or "").startswith(
        codec.SLOT_BUDGET_MARKER)


def learner_failed(error: grpc.aio.AioRpcError) -> bool:
    """The learner stopped on a failure (docs/wire.md): reconnect to its restart."""
    return error.code() == grpc.StatusCode.UNAVAILABLE and (error.details() or "").startswith(
        codec.LEARNER_FAILED_MARKER)


class FatalActorError(RuntimeError):
    """The learner refused this actor for a reason reconnecting will not fix."""


@dataclasses.dataclass
class ActorStats:
    """Counters an actor reports at exit (benchmarks read them)."""

    frames: int = 0
    steps: int = 0
    connections: int = 0
    groups: int = 1  # env groups, one stream each (0 until chosen)
    env_seconds: float = 0.0
    wait_seconds: float = 0.0  # send + inference + receive, seen from the actor
    # Time split (seconds). SEED: inference = awaiting the learner's answer
    # (batching + inference + transport); communication = encoding, sending
    # and decoding. IMPALA: inference = the local jitted policy; communication
    # = encoding/sending unrolls and awaiting their acks (learner backpressure);
    # pull = receiving parameters; load = deserializing them onto the device.
    inference_seconds: float = 0.0
    communication_seconds: float = 0.0
    pull_seconds: float = 0.0
    load_seconds: float = 0.0
    pulls: int = 0
    pull_bytes: int = 0  # serialized parameter bytes received by the pulls
    params_pulled: int = 0  # pulls that brought parameters (not "nothing newer")
    unroll_batches: int = 0
    # The learner's stop reason when it told this actor that the run ended (None: it did not).
    run_ended: str | None = None
    # Serialized message bytes actually sent / received (seedq.wire.metered).
    bytes: ByteCounter = dataclasses.field(default_factory=ByteCounter)
    # Counters at the WARM_STEPS-th vector step: `summary()["steady"]` is the
    # rest of the run, without start-up (imports, connecting, compiling).
    _mark: dict | None = None
    started: float = dataclasses.field(default_factory=time.perf_counter)
    # Round trips before this perf_counter() time are not recorded (warm-up).
    record_after: float = 0.0
    # Round-trip latency of recent vector steps (seconds).
    _rtts: LatencyRing = dataclasses.field(default_factory=lambda: LatencyRing(1 << 16))
    # Every request's time, warm-up included (the automatic group count reads them).
    requests: LatencyRing = dataclasses.field(default_factory=lambda: LatencyRing(1 << 10))

    def record_rtt(self, seconds: float, now: float) -> None:
        self.wait_seconds += seconds
        self.steps += 1
        self.requests.record(seconds)
        if now >= self.record_after:
            self._rtts.record(seconds)

    def counters(self) -> dict:
        """The cumulative counters that `steady` reports as differences."""
        return {
            "frames": self.frames, "vector_steps": self.steps,
            "seconds": time.perf_counter() - self.started, "cpu_seconds": sum(os.times()[:2]),
            "env_seconds": self.env_seconds, "inference_seconds": self.inference_seconds,
            "communication_seconds": self.communication_seconds, "pull_seconds": self.pull_seconds,
            "load_seconds": self.load_seconds, "bytes_sent": self.bytes.sent,
            "bytes_received": self.bytes.received, "pulls": self.pulls, "pull_bytes": self.pull_bytes,
            "params_pulled": self.params_pulled,
        }

    def step_done(self) -> None:
        """Call after every vector step: marks the end of the warm-up."""
        if self._mark is None and self.steps >= WARM_STEPS:
            self._mark = self.counters()

    def summary(self) -> dict:
        rtts = self._rtts.percentiles((50, 99))
        elapsed = time.perf_counter() - self.started
        end = self.counters()
        steady = {k: end[k] - self._mark[k] for k in end} if self._mark else None
        return {
            "steady": steady,
            "frames": self.frames,
            "vector_steps": self.steps,
            "connections": self.connections,
            "groups": self.groups,
            "seconds": elapsed,
            "frames_per_second": self.frames / elapsed if elapsed > 0 else 0.0,
            "env_seconds": self.env_seconds,
            "wait_seconds": self.wait_seconds,
            "rtt_p50_ms": rtts[0] * 1e3 if rtts else None,
            "rtt_p99_ms": rtts[1] * 1e3 if rtts else None,
            "inference_seconds": self.inference_seconds,
            "communication_seconds": self.communication_seconds,
            "pull_seconds": self.pull_seconds,
            "load_seconds": self.load_seconds,
            "pulls": self.pulls,
            "pull_bytes": self.pull_bytes,
            "params_pulled": self.params_pulled,
            "unroll_batches": self.unroll_batches,
            "run_ended": self.run_ended,
            "bytes_sent": self.bytes.sent,
            "bytes_received": self.bytes.received,
            # CPU time of the whole actor process (all its threads), user + system.
            "cpu_seconds": sum(os.times()[:2]),
            # The cores this process may run on (pinned with --cores; None where the OS does not say).
            "cpu_cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        }


def channel_target(address: str) -> str:
    """gRPC target for `unix:/path` or `host:port` addresses."""
    if address.startswith(("unix:", "unix-abstract:")) or ":" in address:
        return address
    raise ValueError(f"server address {address!r}: expected unix:/path/to.sock or host:port")


async def _serve_groups(stub, envs, spec, *, actor_id, seed, connection, watcher=None, **kwargs):
    """One stream per group, concurrently; the first to fail ends them all
    (the actor then reconnects every group with fresh run ids), and so does
    `watcher` (a coroutine, or None) if it raises. Group k's envs are seeded
    as envs offset_k.. of one vector would be."""
    offsets = np.cumsum([0] + [env.num_envs for env in envs])
    tasks = [
        asyncio.create_task(connection(
            stub, env, spec, actor_id=group_stream_id(actor_id, k, len(envs)), num_envs=env.num_envs,
            seed=seed + int(offsets[k]), **kwargs))
        for k, env in enumerate(envs)
    ]
    if watcher is not None:
        tasks.append(asyncio.create_task(watcher))
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _serve_one_connection(
    stub, env, spec, *, actor_id, num_envs, env_id, seed, stats, skip_seconds=0.0
):
    run_id = uuid.uuid4().hex
    call = stub.Stream()
    try:
        await call.write(
            codec.encode_handshake(
                spec, actor_id=actor_id, run_id=run_id, num_envs=num_envs, env_id=env_id,
                reads_run_ended=True,
            )
        )
        reply = await call.read()
        if reply is grpc.aio.EOF:
            raise ConnectionError("learner closed the stream during the handshake")
        codec.raise_if_run_ended(reply)
        ack, expected = codec.decode_handshake_ack(reply)
        mismatch = expected.describe_mismatch(spec) if expected is not None else None
        if mismatch:  # the learner refuses a mismatch itself; this guards a buggy one
            raise FatalActorError(f"learner {ack.learner_run} expects another spec: {mismatch}")
        stats.connections += 1
        if stats.connections == 1 and skip_seconds:
            stats.record_after = time.perf_counter() + skip_seconds
        log.info("actor %s connected (run %s, learner run %s)", actor_id, run_id, ack.learner_run)
        obs, _ = env.reset(seed=seed)
        rewards = np.zeros(num_envs, np.float32)
        terminated = np.zeros(num_envs, bool)
        truncated = np.zeros(num_envs, bool)
        indices = np.arange(num_envs, dtype=np.int32)
        while True:
            sent = time.perf_counter()
            await call.write(codec.encode_steps(indices, rewards, terminated, truncated, obs))
            written = time.perf_counter()
            reply = await call.read()
            received = time.perf_counter()
            if reply is grpc.aio.EOF:
                raise ConnectionError("learner closed the stream")
            codec.raise_if_run_ended(reply)
            actions = codec.decode_actions(reply, spec, num_envs)
            decoded = time.perf_counter()
            stats.record_rtt(received - sent, received)
            stats.inference_seconds += received - written
            stats.communication_seconds += (written - sent) + (decoded - received)
            obs, rewards, terminated, truncated, _ = env.step(actions)
            stats.env_seconds += time.perf_counter() - decoded
            stats.frames += num_envs
            stats.step_done()
    finally:
        call.cancel()


async def run_actor(
    address: str,
    env_id: str,
    num_envs: int,
    *,
    actor_id: str,
    seed: int = 0,
    max_seconds: float = 0.0,
    retry_max_seconds: float = 0.0,
    parent_pid: int = 0,
    stats: ActorStats | None = None,
    stats_skip_seconds: float = 0.0,
    options: EnvOptions = EnvOptions(),
    connection=None,
    channel_config: ActorChannelConfig = ActorChannelConfig(),
    groups: int = 1,
) -> ActorStats:
    """Runs until cancelled, `max_seconds` elapse, the learner says the run
    ended (returns, `stats.run_ended` set), or the learner refuses us.

    `retry_max_seconds` > 0 gives up after that long without a connection;
    with `parent_pid` (the local learner that started us), only once that
    process is gone (`learner_may_still_come`).
    `connection` serves one connection (default: the SEED stream; the IMPALA
    actor passes its own) with the keyword arguments of `_serve_one_connection`.
    `channel_config` sets TLS, the token and keepalive; a refusal of those
    credentials is a FatalActorError (retrying cannot fix it).
    `groups`: the env groups, one stream each (0: chosen at the first
    connection from the channel's round trip and the env step time, then
    once more from the requests' measured waits; always 1 on a unix socket).
    """
    connection = connection or _serve_one_connection
    stats = stats or ActorStats()
    if groups == 0 and address.startswith(("unix:", "unix-abstract:")):
        groups = 1  # a socket on this host: no network round trip to hide
    envs, step_seconds, rtt = None, 0.0, None

    async def settle_groups() -> None:
        """The automatic count, chosen once more from the requests' measured waits."""
        nonlocal rtt
        chosen = await rechoose_groups(stats, rtt, num_envs, len(envs), actor_id)
        rtt = None  # once only: a second choice would measure waits its own count shaped
        if chosen != len(envs):
            raise Regroup(chosen)

    if groups == 1:
        envs = [make_vector_env(env_id, num_envs, options=options)]
        spec = schema.spec_from_spaces(envs[0].single_observation_space, envs[0].single_action_space)
    else:
        # The groups' envs are made once their count is known; a one-env
        # probe gives the spec and, for the automatic count, the step time.
        spec, step_seconds = probe_env(env_id, num_envs, options, timed=groups == 0)
    stats.groups = groups
    backoff, disconnected_since = 0.05, time.monotonic()
    # Local actors (parent_pid: their learner is starting beside them) stay
    # quiet for the first interval; an actor started by hand says so soon.
    next_notice = disconnected_since + (WAITING_NOTICE_SECONDS if parent_pid else FIRST_NOTICE_SECONDS)
    suspected_in_a_row = 0
    told: set[str] = set()  # refusals already printed (each once)
    try:
        metadata = channel_lib.call_metadata(channel_config)
        async with channel_lib.open_channel(channel_target(address), channel_config) as channel:
            stub = MeteredStub(channel, stats.bytes, metadata)
            while True:
                connections_before = stats.connections
                try:
                    # A fresh episode seed per connection made, so a restart
                    # does not replay the same episodes (attempts that found no
                    # learner do not count: the first episodes follow the seed alone).
                    if envs is None:
                        envs, rtt = await group_envs(channel, metadata, env_id, num_envs, options, groups,
                                                      step_seconds, actor_id)
                        stats.groups = len(envs)
                    serve_kwargs = {"env_id": env_id, "seed": seed + 7919 * stats.connections, "stats": stats,
                                    "skip_seconds": stats_skip_seconds}
                    # The automatic count, not yet chosen from measured waits, is watched.
                    watcher = settle_groups() if rtt is not None else None
                    if len(envs) == 1 and watcher is None:
                        await connection(stub, envs[0], spec, actor_id=actor_id, num_envs=num_envs, **serve_kwargs)
                    else:  # (the first group told that the run ended ends them all)
                        await _serve_groups(stub, envs, spec, actor_id=actor_id, connection=connection,
                                            watcher=watcher, **serve_kwargs)
                except Regroup as e:
                    for each in envs:
                        each.close()
                    envs = make_groups(env_id, num_envs, options, e.groups)
                    stats.groups = e.groups
                    backoff, disconnected_since = 0.05, time.monotonic()
                    continue  # at once: the learner is there
                except codec.RunEnded as e:
                    stats.run_ended = e.stop_reason
                    print(f"actor {actor_id}: {e}; stopping", file=sys.stderr, flush=True)
                    return stats
                except grpc.aio.AioRpcError as e:
                    if slots_full(e) or learner_failed(e):
                        # Slots free as other actors leave; a failed learner is
                        # restarted by its supervisor: wait, saying why once.
                        if e.details() not in told:
                            print(f"actor {actor_id}: {e.details()}", file=sys.stderr, flush=True)
                            told.add(e.details())
                    elif e.code() in FATAL_CODES:
                        raise FatalActorError(f"learner refused actor {actor_id}: {e.details()}") from None
                    refused = channel_lib.auth_failure(e)
                    suspected = channel_lib.suspected_refusal(e, tls=bool(channel_config.tls.ca))
                    suspected_in_a_row = suspected_in_a_row + 1 if suspected else 0
                    if suspected_in_a_row >= channel_lib.SUSPECTED_REFUSALS_IN_A_ROW:
                        refused = suspected
                    if refused:
                        raise FatalActorError(f"learner at {address} refused actor {actor_id}: {refused}") from None
                    # A refusal already said once above is named by its code alone.
                    reason = e.code().name if e.details() in told else f"{e.code().name}: {e.details()}"
                except ConnectionError as e:
                    reason = str(e)
                    suspected_in_a_row = 0
                if stats.connections > connections_before:
                    # We had a learner and lost it: restart the backoff clock.
                    backoff, disconnected_since = 0.05, time.monotonic()
                    next_notice = disconnected_since + FIRST_NOTICE_SECONDS
                now = time.monotonic()
                if now >= next_notice:
                    print(f"actor {actor_id}: waiting for the learner at {address} "
                          f"({now - disconnected_since:.0f}s so far; {reason})", file=sys.stderr, flush=True)
                    next_notice = now + WAITING_NOTICE_SECONDS
                if (retry_max_seconds and now - disconnected_since > retry_max_seconds
                        and not learner_may_still_come(parent_pid)):
                    raise ConnectionError(
                        f"no learner at {address} for {retry_max_seconds:.0f}s ({reason}); giving up"
                    )
                log.info("actor %s: %s; retrying in %.2fs", actor_id, reason, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
    finally:
        for each in envs or []:
            each.close()


def learner_may_still_come(parent_pid: int) -> bool:
    """Whether `parent_pid` (0: none), the local learner that started this
    actor, is still its parent. While it lives its socket may just not be
    listening yet: building the learner (the model, the first compile) took
    over 30 s on a loaded 2-core machine, and local actors that gave up then
    failed the run."""
    return lifetime.is_parent(parent_pid)


def env_seed(args) -> int:
    """The seed of the actor's first episodes: `--seed`, or with
    `--seed-from-actor-id` `--seed` mixed with a stable hash of the actor id
    (the ids of one Deployment's pods or one VM template's units differ, their
    command lines do not). Identical resets would start every replica's
    episodes in the same states, and an env's own randomness (Atari's sticky
    actions) would repeat across them."""
    if not args.seed_from_actor_id:
        return args.seed
    # crc32, not hash(): Python salts str hashes per process. Below 2**30, so
    # the per-env and per-reconnect offsets stay inside a 32-bit seed.
    return (args.seed * 1_000_003 + zlib.crc32(actor_name(args).encode())) % 2**30


def actor_name(args) -> str:
    return args.actor_id or f"{os.uname().nodename}-{os.getpid()}"


def main(args, connection=None, prog: str = "seedq actor") -> int:
    """Entry point of `seedq actor` (and, with its `connection`, of `seedq
    impala-actor`); returns the process exit code."""
    from seedq.flags import config_from_args

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    parent_pid = getattr(args, "parent_pid", 0)
    if parent_pid:
        # A clean stop when the local learner dies; elsewhere than Linux the
        # actor gives up after --retry-max-seconds once it is gone.
        lifetime.die_with_parent(parent_pid, signal.SIGTERM)
    stats = ActorStats()
    actor_id = actor_name(args)
    channel_config = config_from_args(args, ActorChannelConfig)
    groups = getattr(args, "groups", 1)
    if not 0 <= groups <= max(args.num_envs, 1):
        print(f"{prog}: --groups {groups}: must be 0 (automatic) to --num-envs ({args.num_envs})",
              file=sys.stderr, flush=True)
        return 2
    try:
        channel_config.validate()
        # Credential files are read now: a bad path is a one-line error, not a retry loop.
        channel_lib.channel_credentials(channel_config)
        channel_lib.call_metadata(channel_config)
    except (ValueError, OSError) as e:
        print(f"{prog}: {e}", file=sys.stderr, flush=True)
        return 2

    async def _main():
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        stop_signals = (signal.SIGTERM, signal.SIGINT)

        def stop() -> None:
            # One signal is enough (Ctrl-C reaches us as SIGINT, then the local
            # learner sends SIGTERM): ignore the rest, so a second one cannot
            # land in asyncio's teardown of the signal wakeup fd.
            for sig in stop_signals:
                loop.remove_signal_handler(sig)
                signal.signal(sig, signal.SIG_IGN)
            task.cancel()

        for sig in stop_signals:
            loop.add_signal_handler(sig, stop)
        coro = run_actor(
            args.server, args.env, args.num_envs, actor_id=actor_id, seed=env_seed(args),
            retry_max_seconds=args.retry_max_seconds, parent_pid=parent_pid, stats=stats,
            stats_skip_seconds=args.stats_skip_seconds, connection=connection,
            options=config_from_args(args, EnvOptions), channel_config=channel_config,
            groups=groups,
        )
        if args.max_seconds:
            try:
                await asyncio.wait_for(coro, args.max_seconds)
            except asyncio.TimeoutError:
                pass
        else:
            await coro

    code = 0
    try:
        grpc_setup.run(_main())
    except asyncio.CancelledError:
        pass  # SIGTERM / SIGINT: a clean stop
    except KeyboardInterrupt:
        pass
    except FatalActorError as e:
        print(f"{prog}: {e}", file=sys.stderr, flush=True)
        code = 2
    except (ConnectionError, ValueError) as e:
        print(f"{prog}: {e}", file=sys.stderr, flush=True)
        code = 1
    if args.stats_file:
        tmp = args.stats_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(stats.summary(), f)
        os.replace(tmp, args.stats_file)
    return code
