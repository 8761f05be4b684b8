"""`seedq bench ingress`: what one learner can take in, and what it costs its host.

Load-generator processes stand in for actor hosts without stepping envs:
each replays vector steps recorded once from the real env (observations,
rewards, flags) on `streams` real gRPC streams, each its own connection, as
that many actors would. The learner is the real one (handshake, env table,
batching, unroll store, inference with the run's network; training unless
--no-train), on a real transport: loopback TCP, optionally through the
delaying proxy (`seedq.transport.netdelay`), or a unix socket.

The learner's CPU over the measured window is split into the network's
compute (the server thread inside the jitted policy, XLA's worker threads,
and with training the training thread) and everything else (gRPC, decoding,
the env table, batching, the unroll store): the "other" part is what bounds
how many frames one ingress thread takes in (docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import tempfile
import time
import uuid

import numpy as np

# Recorded vector steps each stream replays in a loop (streams start at
# different offsets). Enough for varied messages; small enough to record in seconds.
RECORDED_STEPS = 16
# Bounds the RTT samples a generator sends back.
MAX_RTT_SAMPLES = 200_000
# Messages per stream (on average) answered before the warm-up seconds
# start: every inference batch size the load produces is compiled by then,
# however long a round takes (a compile in the window would count as ingress CPU).
WARM_ROUNDS = 3
# Phases a generator follows (a shared int the parent sets).
WARMING, MEASURING, STOPPING = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class IngressLoad:
    env_id: str = "CartPole-v1"
    streams: int = 16
    envs_per_stream: int = 16
    seconds: float = 10.0
    warmup_seconds: float = 3.0
    train: bool = False
    rtt_ms: float = 0.0
    generators: int = 2
    transport: str = "tcp"
    # The offered load: frames/s over all streams, each stream sending at its
    # share of it (one message in flight, so never faster than served); 0: as
    # fast as the learner answers. A fixed rate compares two learner setups
    # at the same load, where a saturating load would give each its own.
    frames_per_second: float = 0.0

    def message_interval(self) -> float:
        """Seconds between one stream's messages at the offered load (0: unpaced)."""
        if not self.frames_per_second:
            return 0.0
        return self.streams * self.envs_per_stream / self.frames_per_second

    def validate(self) -> None:
        for name in ("streams", "envs_per_stream", "generators"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}: {getattr(self, name)} must be at least 1")
        if self.seconds <= 0:
            raise ValueError(f"--seconds: {self.seconds:g} must be positive")
        if self.warmup_seconds < 0:
            raise ValueError(f"--warmup-seconds: {self.warmup_seconds:g} must not be negative")
        if self.rtt_ms < 0:
            raise ValueError(f"--rtt-ms: {self.rtt_ms:g} must not be negative")
        if self.frames_per_second < 0:
            raise ValueError(f"--frames-per-second: {self.frames_per_second:g} must not be negative")
        if self.transport not in ("tcp", "unix"):
            raise ValueError(f"--transport: {self.transport!r} is neither tcp nor unix")
        if self.rtt_ms and self.transport != "tcp":
            raise ValueError("--rtt-ms needs --transport tcp (the delaying proxy is a TCP proxy)")


def record_steps(env_id: str, num_envs: int, steps: int, seed: int = 0, options=None) -> dict[str, np.ndarray]:
    """`steps` vector steps of the real env under random actions, as the
    actor would send them: [steps, num_envs, ...] per field (the first a reset)."""
    from seedq.config import EnvOptions
    from seedq.envs import make_vector_env, random_actions
    from seedq.schema import spec_from_spaces

    env = make_vector_env(env_id, num_envs, options=options or EnvOptions())
    try:
        spec = spec_from_spaces(env.single_observation_space, env.single_action_space)
        rng = np.random.default_rng(seed)
        obs, _ = env.reset(seed=seed)
        rewards, terminated, truncated = np.zeros(num_envs, np.float32), np.zeros(num_envs, bool), np.zeros(num_envs, bool)
        fields = {"observations": [], "rewards": [], "terminated": [], "truncated": []}
        for _ in range(steps):
            for name, value in zip(fields, (obs, rewards, terminated, truncated)):
                fields[name].append(np.array(value))
            obs, rewards, terminated, truncated, _ = env.step(random_actions(spec, num_envs, rng))
        return {name: np.stack(values) for name, values in fields.items()}
    finally:
        env.close()


def encoded_messages(recording: dict[str, np.ndarray]) -> list[bytes]:
    """The recording as serialized StepBatch messages, every env in order."""
    from seedq.wire import codec

    steps, num_envs = recording["rewards"].shape[:2]
    indices = np.arange(num_envs, dtype=np.int32)
    return [
        codec.encode_steps(indices, recording["rewards"][i], recording["terminated"][i],
                           recording["truncated"][i], recording["observations"][i]).SerializeToString()
        for i in range(steps)
    ]


def _process_cpu_seconds() -> float:
    return sum(os.times()[:2])


def pid_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far (Linux /proc; 0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ingress_cpu_seconds(learner) -> float:
    """CPU seconds of the learner's ingress processes (0 without: its own thread serves the streams)."""
    hub = learner.ingress_hub
    return sum(pid_cpu_seconds(pid) for pid in hub.pids()) if hub else 0.0


def frames_by_process(learner) -> list[int]:
    """Env steps answered so far through each process serving streams (one: the learner's own)."""
    hub = learner.ingress_hub
    return list(hub.frames) if hub else [learner.table.frames]


def next_due(due: float, interval: float, now: float) -> float:
    """When a paced stream sends next, its last send due at `due` and sent by
    `now`: an interval later, or now if its reply came later than that. The
    schedule never catches up on late replies, so a stream's n-th send is never
    due before its first plus n intervals: the offered rate is a ceiling."""
    return max(due + interval, now)


async def _replay_streams(address, channel_config, stream_ids, recording_path, env_id, phase,
                          interval: float, streams: int) -> dict:
    """Drives one stream per id until the phase says stop; counts what was served while measuring.
    `interval`: seconds from one of a stream's sends to its next (0: send on each reply); the
    `streams` of the whole load start spread over one interval."""
    import grpc

    from seedq.transport import channel as channel_lib
    from seedq.envs import env_spec
    from seedq.v1 import seed_pb2
    from seedq.wire import codec

    with np.load(recording_path) as data:
        recording = {k: data[k] for k in data.files}
    messages = encoded_messages(recording)
    num_envs = recording["rewards"].shape[1]
    spec = env_spec(env_id)
    metadata = channel_lib.call_metadata(channel_config)
    frames = {k: 0 for k in stream_ids}
    rtts: list[float] = []
    refused: dict[int, str] = {}
    window = {"measuring": False, "cpu": 0.0}

    async def watch_phase() -> None:
        while phase.value == WARMING:
            await asyncio.sleep(0.01)
        window["cpu"] = _process_cpu_seconds()
        window["measuring"] = True
        while phase.value == MEASURING:
            await asyncio.sleep(0.01)
        window["measuring"] = False
        window["cpu"] = _process_cpu_seconds() - window["cpu"]

    async def serve_stream(k: int) -> None:
        # A connection of its own per stream, as separate actor hosts have
        # (gRPC would otherwise share one subchannel between equal targets).
        async with channel_lib.open_channel(address, channel_config,
                                            [("grpc.use_local_subchannel_pool", 1)]) as channel:
            call = channel.stream_stream("/seedq.v1.Learner/Stream")(metadata=metadata)
            try:
                await call.write(codec.encode_handshake(
                    spec, actor_id=f"ingress-{k}", run_id=uuid.uuid4().hex, num_envs=num_envs,
                    env_id=env_id).SerializeToString())
                codec.decode_handshake_ack(seed_pb2.LearnerMessage.FromString(await call.read()))
                i = k % len(messages)
                due = time.perf_counter() + interval * k / streams
                while phase.value != STOPPING:
                    if interval:
                        await asyncio.sleep(max(0.0, due - time.perf_counter()))
                        due = next_due(due, interval, time.perf_counter())
                    sent = time.perf_counter()
                    await call.write(messages[i])
                    reply = await call.read()
                    if reply is grpc.aio.EOF:
                        raise ConnectionError("learner closed the stream")
                    rtt = time.perf_counter() - sent
                    codec.decode_actions(seed_pb2.LearnerMessage.FromString(reply), spec, num_envs)
                    if window["measuring"]:
                        frames[k] += num_envs
                        if len(rtts) < MAX_RTT_SAMPLES:
                            rtts.append(rtt)
                    i = (i + 1) % len(messages)
            except grpc.aio.AioRpcError as e:
                if phase.value != STOPPING:
                    refused[k] = f"{e.code().name}: {e.details()}"
            except (ConnectionError, ValueError) as e:
                if phase.value != STOPPING:
                    refused[k] = str(e)
            finally:
                call.cancel()

    watcher = asyncio.create_task(watch_phase())
    await asyncio.gather(*(serve_stream(k) for k in stream_ids))
    await watcher
    return {"frames": frames, "rtts": np.asarray(rtts, np.float32), "refused": refused,
            "cpu_seconds": window["cpu"]}


def _generator(address, channel_config, stream_ids, recording_path, env_id, phase, out, interval, streams) -> None:
    from seedq.process import grpc_setup

    try:
        out.put(grpc_setup.run(_replay_streams(address, channel_config, stream_ids, recording_path, env_id, phase,
                                               interval, streams)))
    except Exception as e:  # noqa: BLE001 - reported to the parent, not lost with the process
        out.put({"error": f"{type(e).__name__}: {e}"})


def thread_cpu_seconds() -> dict[int, tuple[str, float]]:
    """{thread id: (name, CPU seconds)} of every thread of this process (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    threads = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                text = f.read()
        except OSError:
            continue  # the thread ended meanwhile
        name = text[text.index("(") + 1: text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        threads[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / ticks)
    return threads


def is_xla_worker(name: str) -> bool:
    """XLA's CPU backend runs intra-op work on threads named tf_XLA... (Eigen pools)."""
    return name.startswith("tf_") or "XLA" in name or "Eigen" in name


def compute_cpu_seconds(learner, train: bool) -> float:
    """CPU seconds so far of the network's compute in this learner process:
    the server thread inside the jitted policy, XLA's worker threads, and
    (training) the training thread."""
    training_ids = learner.training_thread_ids() if train else set()
    total = learner.inference.core.compute_cpu_seconds
    for tid, (name, seconds) in thread_cpu_seconds().items():
        if is_xla_worker(name) or tid in training_ids:
            total += seconds
    return total


def rss_bytes() -> int:
    """This process's resident memory, once the garbage it holds is collected
    and the C heap's free pages are handed back (glibc's malloc_trim): what
    the slots hold, not what earlier work in the process (a compile, a test
    run before in the same process) has freed but not yet returned."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the reading keeps the free pages
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def min_stream_ratio(frames_per_stream: list[int]) -> float:
    """The smallest stream's frames over the median stream's (1.0: perfectly fair)."""
    median = float(np.median(frames_per_stream)) if frames_per_stream else 0.0
    return min(frames_per_stream) / median if median else 0.0


def learner_config(load: IngressLoad, base=None, server=None, devices=None):
    import dataclasses as dc

    from seedq.envs import run_defaults

    base = base if base is not None else run_defaults(load.env_id)
    config = dc.replace(base, env=load.env_id, num_actors=load.streams, envs_per_actor=load.envs_per_stream,
                        server=server or base.server, devices=devices or base.devices)
    config.validate()
    return config


def run(load: IngressLoad, base=None, server=None, devices=None) -> dict:
    """Serves `load` from a real learner for its window; returns the JSON figures."""
    from seedq.transport import netdelay
    from seedq.bench.throughput import _wait_for_batching_choice
    from seedq.learner.learner import Learner
    from seedq.bench.drain import drain_unrolls
    from seedq.local import default_address, local_channel_config

    load.validate()
    config = learner_config(load, base, server, devices)
    ctx = multiprocessing.get_context("spawn")  # never fork a process that imported JAX
    with tempfile.TemporaryDirectory(prefix="seedq-ingress-") as tmp:
        recording_path = os.path.join(tmp, "recording.npz")
        np.savez(recording_path, **record_steps(load.env_id, load.envs_per_stream, RECORDED_STEPS,
                                                options=config.env_options))
        address = "127.0.0.1:0" if load.transport == "tcp" else default_address()
        learner = Learner(config, address)
        proxy = None
        generators = []
        phase = ctx.Value("i", WARMING, lock=False)
        out = ctx.Queue()
        try:
            address = learner.start(consume=None if load.train else drain_unrolls)
            rss_before = rss_bytes()
            if load.rtt_ms:
                proxy, address = netdelay.start_process(address, load.rtt_ms / 2)
            shares = np.array_split(np.arange(load.streams), min(load.generators, load.streams))
            for ids in shares:
                generators.append(ctx.Process(target=_generator, args=(
                    address, local_channel_config(config), ids.tolist(), recording_path, load.env_id, phase, out,
                    load.message_interval(), load.streams)))
                generators[-1].start()
            _wait_for_streams(learner, load.streams, generators)
            _wait_for_batching_choice(learner.inference.batching)
            _wait_for_rounds(learner, load.streams, WARM_ROUNDS)
            time.sleep(load.warmup_seconds)
            stats = learner.inference.stats
            frames0, messages0, batches0 = learner.table.frames, stats.requests, stats.batches
            ingress0, compute0 = ingress_cpu_seconds(learner), compute_cpu_seconds(learner, load.train)
            cpu0 = time.process_time()
            served0 = frames_by_process(learner)
            train0 = learner.train_steps
            phase.value = MEASURING
            started = time.perf_counter()
            time.sleep(load.seconds)
            phase.value = STOPPING
            elapsed = time.perf_counter() - started
            ingress_cpu = ingress_cpu_seconds(learner) - ingress0
            cpu = time.process_time() - cpu0 + ingress_cpu  # the learner's processes together
            compute = compute_cpu_seconds(learner, load.train) - compute0
            by_process = [after - before for after, before in zip(frames_by_process(learner), served0)]
            frames, messages = learner.table.frames - frames0, stats.requests - messages0
            batches = stats.batches - batches0
            batching = learner.inference.batching.choice
            train_steps = learner.train_steps - train0
            rss_after = rss_bytes()
            results = [out.get(timeout=60) for _ in generators]
        finally:
            phase.value = STOPPING
            for p in generators:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
            if proxy is not None:
                proxy.terminate()
                proxy.join(timeout=10)
            learner.stop()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"a load generator failed: {errors[0]}")
    per_stream = {k: v for r in results for k, v in r["frames"].items()}
    refused = {k: v for r in results for k, v in r["refused"].items()}
    rtts = np.concatenate([r["rtts"] for r in results]) if results else np.zeros(0)
    served = [k for k, v in per_stream.items() if v > 0]
    slots = len(served) * load.envs_per_stream
    machine_cpu = elapsed * (os.cpu_count() or 1)
    return {
        "env": load.env_id,
        "streams": load.streams,
        "envs_per_stream": load.envs_per_stream,
        "seconds": load.seconds,
        "training": load.train,
        "transport": load.transport,
        "rtt_ms": load.rtt_ms,
        "generators": len(generators),
        "offered_frames_per_second": load.frames_per_second or None,  # None: as fast as served
        "frames_per_second": frames / elapsed,
        "messages_per_second": messages / elapsed,
        "rtt_p50_ms": float(np.percentile(rtts, 50) * 1e3) if len(rtts) else None,
        "rtt_p99_ms": float(np.percentile(rtts, 99) * 1e3) if len(rtts) else None,
        "slots_served": slots,
        "refused_streams": len(refused),
        "refusal": next(iter(refused.values()), None),
        "min_stream_frames_ratio": min_stream_ratio(list(per_stream.values())),
        "learner_cpu_us_per_frame": {
            "compute": compute / frames * 1e6 if frames else None,
            "other": (cpu - compute) / frames * 1e6 if frames else None,
        },
        "learner_cpu_us_per_message": cpu / messages * 1e6 if messages else None,
        # The batcher's rule at the window's end (server.batching; auto's choice) and the
        # messages each inference batch answered: what the CPU per frame depends on most.
        "batching": batching,
        "messages_per_batch": messages / batches if batches else None,
        # The learner's processes that served streams (server.ingress_processes), and each one's share of the frames.
        "ingress_processes": len(by_process),
        "ingress_frames_share": [n / sum(by_process) if sum(by_process) else 0.0 for n in by_process],
        # The ingress processes' part of `other` (0 with one: the learner's process serves the streams).
        "ingress_processes_cpu_us_per_frame": ingress_cpu / frames * 1e6 if frames else None,
        "learner_cpu_cores": cpu / elapsed,
        "train_steps_per_second": train_steps / elapsed,
        "rss_bytes_per_slot": (rss_after - rss_before) / slots if slots else None,
        "generator_cpu_share": sum(r["cpu_seconds"] for r in results) / machine_cpu,
        "cpu_count": os.cpu_count(),
    }


def _wait_for_streams(learner, streams: int, generators, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while learner.table.num_connected < streams:
        if time.monotonic() > deadline or not any(p.is_alive() for p in generators):
            raise RuntimeError(f"only {learner.table.num_connected}/{streams} streams connected within "
                               f"{timeout:.0f}s (server.max_envs may be below streams x envs-per-stream)")
        time.sleep(0.05)


def _wait_for_rounds(learner, streams: int, rounds: int, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    stats = learner.inference.stats
    start = stats.requests
    while stats.requests - start < rounds * streams and time.monotonic() < deadline:
        time.sleep(0.05)
