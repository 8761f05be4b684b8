"""`seedq bench stuck`: a healthy actor's round trip with and without a stuck one.

One learner (gRPC server, dynamic batcher, jitted policy and, unless
--no-train, V-trace updates) serves `actors` real actor processes in
alternating phases of `seconds` each, all in one run:

  alone: the healthy actors only;
  stuck: plus `stuck_actors` streams that handshake, send one step, and then
         hold their stream open without sending again;
  slow:  (with --slow-actors) plus streams that send one step a second.

The stuck and slow streams live in a process of their own, as real actors
would (never in the learner's process, where their client threads would
compete with the server for the GIL). Each phase starts fresh actor processes
(their warm-up is skipped in their statistics) and reports the median over them of their round-trip p50/p99,
frames/s, and how many inference batches waited on the batch timeout for a
silent stream. Phases alternate for `rounds` rounds, so that drifting machine
load falls on every phase alike.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import tempfile
import threading
import time
import uuid

import numpy as np


class SilentStream:
    """A raw stream that handshakes, then steps every `every` seconds (0: once, then never)."""

    def __init__(self, address: str, spec, num_envs: int, every: float = 0.0):
        import grpc

        from seedq.v1 import seed_pb2_grpc
        from seedq.wire import codec

        self._codec, self.spec, self.num_envs, self.every = codec, spec, num_envs, every
        self._requests: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self.channel = grpc.insecure_channel(address)
        self.call = seed_pb2_grpc.LearnerStub(self.channel).Stream(iter(self._requests.get, None))
        self._requests.put(codec.encode_handshake(
            spec, actor_id=f"silent-{uuid.uuid4().hex[:8]}", run_id=uuid.uuid4().hex, num_envs=num_envs,
        ))
        next(self.call)  # the ack
        self.sent = 0
        self.step()
        self._thread = threading.Thread(target=self._run, daemon=True) if every else None
        if self._thread:
            self._thread.start()

    def step(self) -> None:
        zeros = np.zeros(self.num_envs)
        obs = np.zeros((self.num_envs, *self.spec.obs_shape), self.spec.obs_dtype)
        self._requests.put(self._codec.encode_steps(np.arange(self.num_envs), zeros, zeros, zeros, obs))
        next(self.call)
        self.sent += 1

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.step()

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        self._requests.put(None)
        self.call.cancel()
        self.channel.close()


def _silent_worker(address, spec, num_envs, count, every, ready, stop, sent) -> None:
    streams = [SilentStream(address, spec, num_envs, every) for _ in range(count)]
    ready.set()
    stop.wait()
    sent.put(sum(s.sent for s in streams))
    for stream in streams:
        stream.close()


class SilentActors:
    """`count` SilentStreams in a process of their own; `close()` returns the steps they sent."""

    def __init__(self, address, spec, num_envs: int, count: int, every: float):
        ctx = multiprocessing.get_context("spawn")  # never fork a process that imported JAX
        self._ready, self._stop, self._sent = ctx.Event(), ctx.Event(), ctx.Queue()
        self.process = ctx.Process(
            target=_silent_worker,
            args=(address, spec, num_envs, count, every, self._ready, self._stop, self._sent),
        )
        self.process.start()
        if not self._ready.wait(120):
            self.process.kill()
            raise RuntimeError("the silent streams did not connect within 120 s")

    def close(self) -> int:
        self._stop.set()
        sent = self._sent.get(timeout=60)
        self.process.join(timeout=30)
        return sent


def _phase(learner, address, config, phase: str, args, stats_dir: str, round_index: int) -> dict:
    from seedq.bench.throughput import _wait_for_actors, read_json
    from seedq.local import spawn_actors, stop_processes

    count = {"stuck": args["stuck_actors"], "slow": args["slow_actors"]}.get(phase, 0)
    silent = SilentActors(address, learner.spec, args["envs_per_actor"], count,
                          every=1.0 if phase == "slow" else 0.0) if count else None
    phase_dir = os.path.join(stats_dir, f"{round_index}-{phase}")
    os.makedirs(phase_dir)
    stats = learner.inference.stats
    actors = spawn_actors(address, config, phase_dir, stats_skip_seconds=args["warmup_seconds"])
    try:
        _wait_for_actors(learner, args["actors"] + count, actors)
        time.sleep(args["warmup_seconds"])
        waits0, batches0, steps0 = stats.timed_out_waits, stats.batches, stats.env_steps
        time.sleep(args["seconds"])
        waits, batches = stats.timed_out_waits - waits0, stats.batches - batches0
        steps = stats.env_steps - steps0
    finally:
        stop_processes(actors)
        silent_sent = silent.close() if silent else 0
    summaries = [read_json(os.path.join(phase_dir, f"actor-{i}.json")) for i in range(args["actors"])]
    summaries = [s for s in summaries if s and s["rtt_p99_ms"] is not None]
    if not summaries:
        raise RuntimeError(f"phase {phase}: no actor wrote its statistics")
    return {
        "rtt_p50_ms": float(np.median([s["rtt_p50_ms"] for s in summaries])),
        "rtt_p99_ms": float(np.median([s["rtt_p99_ms"] for s in summaries])),
        "frames_per_second": float(sum(s["steady"]["frames"] / s["steady"]["seconds"] for s in summaries
                                       if s["steady"])),
        "timed_out_waits": waits,
        "inference_batches": batches,
        "mean_inference_batch": steps / batches if batches else 0.0,
        "silent_messages": silent_sent,
    }


def run(
    env_id: str = "CartPole-v1",
    num_actors: int = 1,
    envs_per_actor: int = 32,
    stuck_actors: int = 1,
    slow_actors: int = 0,
    seconds: float = 10.0,
    warmup_seconds: float = 2.0,
    rounds: int = 2,
    train: bool = True,
) -> dict:
    if stuck_actors < 1:
        raise ValueError("--stuck-actors must be >= 1 (the benchmark compares with and without them)")
    if rounds < 1 or seconds <= 0:
        raise ValueError("--rounds must be >= 1 and --seconds > 0")
    from seedq.config import TrainConfig
    from seedq.learner.learner import Learner
    from seedq.bench.drain import drain_unrolls
    from seedq.local import default_address
    config = TrainConfig(env=env_id, num_actors=num_actors, envs_per_actor=envs_per_actor)
    config.validate()
    phases = ["alone", "stuck"] + (["slow"] if slow_actors else [])
    args = dict(actors=num_actors, envs_per_actor=envs_per_actor, stuck_actors=stuck_actors,
                slow_actors=slow_actors, seconds=seconds, warmup_seconds=warmup_seconds)
    results: dict[str, list[dict]] = {phase: [] for phase in phases}
    address = default_address()
    learner = Learner(config, address)
    try:
        learner.start(consume=None if train else drain_unrolls)
        with tempfile.TemporaryDirectory(prefix="seedq-bench-stuck-") as stats_dir:
            for r in range(rounds):
                for phase in phases:
                    results[phase].append(_phase(learner, address, config, phase, args, stats_dir, r))
    finally:
        learner.stop()

    def median(phase, key):
        return float(np.median([p[key] for p in results[phase]]))

    out = {
        "env": env_id, "actors": num_actors, "envs_per_actor": envs_per_actor,
        "stuck_actors": stuck_actors, "slow_actors": slow_actors, "seconds": seconds,
        "rounds": rounds, "training": train, "batch_timeout_ms": config.server.batch_timeout_ms,
        "phases": {phase: {k: [p[k] for p in runs] for k in runs[0]} for phase, runs in results.items()},
    }
    for phase in phases[1:]:
        out[f"rtt_p99_ratio_{phase}_to_alone"] = median(phase, "rtt_p99_ms") / median("alone", "rtt_p99_ms")
        out[f"fps_ratio_{phase}_to_alone"] = median(phase, "frames_per_second") / median("alone", "frames_per_second")
    out["cpu_count"] = os.cpu_count()
    return out

