"""`seedq bench throughput`: the SEED loop's env frames/s against raw stepping.

Both phases run in one invocation, one after the other, with the same number
of processes and envs, so their ratio is the cost of central inference (gRPC
round trips, batching, the policy, and by default training) on this machine:

  1. raw: `actors` processes each step their vector env with random actions;
  2. system: a real learner (gRPC server, dynamic batcher, jitted policy,
     V-trace updates unless --no-train) and `actors` real actor processes.

With training, `trained_fps` is the new env frames the learner trained on per
second (a batch trained `reuse` times counts once; frames that never reached
an update do not count), and `bottleneck` names the capacity that set the
rate (`bottleneck_of`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import time

import numpy as np

from seedq.reporting.bottleneck import BINDING_SHARE, bottleneck_of  # noqa: F401 (this module's API)


def _raw_worker(env_id: str, num_envs: int, seconds: float, seed: int, out) -> None:
    from seedq.envs import env_spec, make_vector_env, random_actions

    spec = env_spec(env_id)
    env = make_vector_env(env_id, num_envs)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    frames, started = 0, time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        env.step(random_actions(spec, num_envs, rng))
        frames += num_envs
    out.put(frames / (time.perf_counter() - started))
    env.close()


def raw_stepping_fps(env_id: str, num_actors: int, envs_per_actor: int, seconds: float) -> float:
    """Aggregate frames/s of `num_actors` processes stepping envs with random actions."""
    ctx = multiprocessing.get_context("spawn")  # never fork a process that imported JAX
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_raw_worker, args=(env_id, envs_per_actor, seconds, i, out))
        for i in range(num_actors)
    ]
    for p in procs:
        p.start()
    rates = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return float(sum(rates))


def system_fps(config, seconds: float, warmup_seconds: float, train: bool, rtt_ms: float | None = None) -> dict:
    """The SEED loop's frames/s for a validated TrainConfig (env, actors,
    envs per actor, devices, server). `rtt_ms`: None, a unix socket (as
    `seedq train`); a number, loopback TCP through the delaying proxy
    (`seedq.transport.netdelay`) with that round trip added (0: the same path, no delay)."""
    from seedq.transport import netdelay
    from seedq.learner.learner import Learner
    from seedq.bench.drain import drain_unrolls
    from seedq.local import default_address, spawn_actors, stop_processes

    num_actors = config.num_actors
    with tempfile.TemporaryDirectory(prefix="seedq-bench-") as stats_dir:
        proxy, actors = None, []
        if rtt_ms is None:
            address = default_address()
            actors = spawn_actors(address, config, stats_dir, stats_skip_seconds=warmup_seconds)
        learner = Learner(config, address if rtt_ms is None else "127.0.0.1:0")
        try:
            address = learner.start(consume=None if train else drain_unrolls)
            if rtt_ms is not None:  # the proxy needs the learner's port; the actors, the proxy's
                proxy, address = netdelay.start_process(address, rtt_ms / 2)
                actors = spawn_actors(address, config, stats_dir, stats_skip_seconds=warmup_seconds)
            _wait_for_actors(learner, num_actors, actors)
            time.sleep(warmup_seconds)
            _wait_for_batching_choice(learner.inference.batching)
            stats = learner.inference.stats
            f0, b0, s0, t0 = learner.table.frames, stats.batches, stats.env_steps, learner.train_steps
            busy0, m0, g0 = stats.busy_seconds, stats.requests, stats.greedy_batches
            held0, dropped0 = stats.backpressure_seconds, learner.queue.dropped_unrolls
            paced0, lag0 = stats.paced_seconds, learner.policy_lag.totals()
            cpu0, thread_cpu0 = time.process_time(), learner.server_thread_cpu_seconds()
            started = time.perf_counter()
            time.sleep(seconds)
            elapsed = time.perf_counter() - started
            cpu, thread_cpu1 = time.process_time() - cpu0, learner.server_thread_cpu_seconds()
            # The server thread's CPU seconds over the window (None without a per-thread clock).
            thread_cpu = thread_cpu1 - thread_cpu0 if None not in (thread_cpu0, thread_cpu1) else None
            frames = learner.table.frames - f0
            batches, steps = stats.batches - b0, stats.env_steps - s0
            messages = stats.requests - m0
            train_steps = learner.train_steps - t0
            busy = stats.busy_seconds - busy0
            held = stats.backpressure_seconds - held0
            paced = stats.paced_seconds - paced0
            _, lag_mean, _ = learner.policy_lag.since(lag0)
            dropped = (learner.queue.dropped_unrolls - dropped0) * config.new_frames_per_unroll
            greedy_batches = stats.greedy_batches - g0
            batching = learner.inference.batching
            split = learner.devices.describe()
            groups = actor_groups(learner.table.entries())
        finally:
            stop_processes(actors)
            if proxy is not None:
                proxy.terminate()
                proxy.join(timeout=10)
            learner.stop()
        actor_stats = [read_json(os.path.join(stats_dir, f"actor-{i}.json")) for i in range(num_actors)]
    rtts_p50 = [s["rtt_p50_ms"] for s in actor_stats if s and s["rtt_p50_ms"] is not None]
    rtts_p99 = [s["rtt_p99_ms"] for s in actor_stats if s and s["rtt_p99_ms"] is not None]
    inference_devices = len(split["inference"])
    # The batch loop's time spent waiting for room in the unroll queue is part
    # of `busy` (it runs inside a batch) but is the learner's, not inference's.
    inference_share = max(busy - held, 0.0) / elapsed
    held_share = held / elapsed
    thread_busy = thread_cpu / elapsed if thread_cpu is not None else None
    return {
        "system_fps": frames / elapsed,
        # Env groups (streams) per actor, as connected in the window.
        "actor_groups": groups,
        "trained_fps": train_steps * config.new_frames_per_train_step / elapsed,
        "bottleneck": bottleneck_of(train, held_share, inference_share, thread_busy,
                                    dropped / frames if frames else 0.0),
        # Share of the window the batch loop waited for the learner to take
        # unrolls (the queue was full, or pacing): the actors were held back by training.
        "queue_full_share": held_share,
        # Its share pacing (server.queue_full pace): slowed to the learner's rate before the queue was full.
        "paced_share": paced / elapsed,
        # Updates between the parameters that acted and those trained on, mean over the window.
        "policy_lag_mean": lag_mean,
        # Frames dropped unseen when the queue was full (server.queue_full drop_oldest), per second.
        "dropped_fps": dropped / elapsed,
        "devices": split,
        "mean_inference_batch": steps / batches if batches else 0.0,
        # Each batch is split evenly across the inference devices (seedq.devices.sharded_act),
        # so every one of them is busy for the same share of the time.
        "per_device_inference_batch": steps / batches / inference_devices if batches else 0.0,
        "inference_calls_per_second": batches / elapsed,
        # The batcher's rule over the window (seedq.server.batching): the one in
        # force, the share of batches it ran greedily, and under `auto` the
        # median env steps/s of each rule in the measurement that chose it.
        "batching": batching.choice,
        "greedy_batch_share": greedy_batches / batches if batches else 0.0,
        "batching_trial_steps_per_second": {
            rule: float(np.median(rates)) for rule, rates in batching.last_rates.items() if rates
        },
        # The per-message cost that caps how many actors one learner serves:
        # actor messages answered per second, and the CPU time per message of
        # the whole learner process (this process: it runs only the learner
        # while measuring) and of its server thread alone (gRPC, batching,
        # inference; the asyncio thread every message passes through).
        "learner_messages_per_second": messages / elapsed,
        "learner_cpu_us_per_message": cpu / messages * 1e6 if messages else None,
        "server_thread_cpu_us_per_message": (
            thread_cpu / messages * 1e6 if messages and thread_cpu is not None else None
        ),
        "server_thread_busy_fraction": thread_busy,
        "train_steps_per_second": train_steps / elapsed,
        # Share of wall time the server thread spent running inference batches
        # (waits for room in the unroll queue left out).
        "inference_busy_fraction": inference_share,
        # Median over actors of each actor's percentile.
        "rtt_p50_ms": float(np.median(rtts_p50)) if rtts_p50 else None,
        "rtt_p99_ms": float(np.median(rtts_p99)) if rtts_p99 else None,
    }


# (bottleneck_of and BINDING_SHARE live in seedq.reporting.bottleneck: the running learner shares them.)


def _wait_for_batching_choice(rule, timeout: float = 60.0) -> None:
    """Under `server.batching auto`, until the batcher has measured its two
    rules and chosen one: the window measures the rule the run settles on,
    not the trial (a few seconds; seedq.server.batching)."""
    deadline = time.monotonic() + timeout
    while rule.rule == "auto" and rule.trials == 0 and time.monotonic() < deadline:
        time.sleep(0.05)


def _wait_for_actors(learner, num_actors: int, actors, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(actor_ids(learner.table.entries())) < num_actors:
        if time.monotonic() > deadline or all(p.poll() is not None for p in actors):
            raise RuntimeError(
                f"only {learner.table.num_connected}/{num_actors} actors connected within {timeout:.0f}s"
            )
        time.sleep(0.05)


def actor_ids(entries) -> set[str]:
    """The actors behind connected streams: a group's stream `<id>/g<k>` is actor `<id>`'s."""
    from seedq.wire.groups import actor_of

    return {actor_of(entry.actor_id) for entry in entries}


def actor_groups(entries) -> float:
    """Streams per actor among connected entries (1.0 without groups; 0 without any)."""
    actors = actor_ids(entries)
    return len(entries) / len(actors) if actors else 0.0


def read_json(path: str) -> dict | None:
    """The JSON object in `path`, or None if it is missing or unreadable (a killed process's stats)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run(
    env_id: str = "CartPole-v1",
    num_actors: int = 2,
    envs_per_actor: int = 32,
    seconds: float = 10.0,
    warmup_seconds: float = 3.0,
    train: bool = True,
    devices=None,
    server=None,
    base=None,
    rtt_ms: float | None = None,
    actor_groups: int | None = None,
) -> dict:
    """`devices`: a `DevicesConfig` split for the learner (default: auto);
    `server`: the learner's `ServerConfig` (default: the base's, the env's defaults);
    `base`: the run config the agent sections come from (default: the env's
    defaults, as `seedq train` resolves them)."""
    import dataclasses

    from seedq.bench.learner import learner_fields
    from seedq.envs import run_defaults

    base = base if base is not None else run_defaults(env_id)
    config = dataclasses.replace(
        base, env=env_id, num_actors=num_actors, envs_per_actor=envs_per_actor,
        devices=devices or base.devices, server=server or base.server,
        actor_groups=base.actor_groups if actor_groups is None else actor_groups,
    )
    if rtt_ms is not None and rtt_ms < 0:
        raise ValueError(f"--rtt-ms: {rtt_ms:g} must not be negative")
    config.validate()  # bad flags are refused before the raw phase spends its seconds
    raw = raw_stepping_fps(env_id, num_actors, envs_per_actor, seconds)
    system = system_fps(config, seconds, warmup_seconds, train, rtt_ms)
    return {
        "env": env_id,
        "actors": num_actors,
        "envs_per_actor": envs_per_actor,
        "seconds": seconds,
        "training": train,
        # None: a unix socket; else the round trip the proxy added on loopback TCP.
        "rtt_ms": rtt_ms,
        "agent": config.agent,
        "server.queue_full": config.server.queue_full,
        **learner_fields(config),
        "system_fps": system["system_fps"],
        "raw_env_fps": raw,
        "ratio_system_to_raw": system["system_fps"] / raw if raw else None,
        **{k: v for k, v in system.items() if k != "system_fps"},
        "cpu_count": os.cpu_count(),
    }

