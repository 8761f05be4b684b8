"""Scale: the delaying proxy, actor groups, and thousands of env slots on one learner.

Real learners on unix sockets or loopback TCP, real actor processes stepping
CartPole, and `seedq bench ingress`'s real load generators.
"""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from tests.queue_tap import QueueTap

from seedq.transport import netdelay
from seedq.actor.groups import (
    GROUP_SLACK,
    MAX_GROUPS,
    MIN_GROUPED_RTT_SECONDS,
    group_sizes,
    groups_for,
)
from seedq.config import ServerConfig, TrainConfig, VTraceConfig
from seedq.learner.learner import Learner

pytestmark = [pytest.mark.timeout(180)]

# CartPole's Euler step (gymnasium's CartPoleEnv.tau): x and theta advance by
# tau times their velocities of the step before.
CARTPOLE_TAU = 0.02
WAIT_SECONDS = 60.0


# --- the delaying proxy --------------------------------------------------------------


def echo_server() -> tuple[socket.socket, int]:
    """A loopback TCP server that echoes every connection's bytes (a thread each)."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    def echo(conn):
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        assert chunk, "connection closed early"
        data += chunk
    return data


@pytest.mark.e2e
def test_delay_proxy_delays_each_direction_by_what_it_says_and_keeps_the_bytes():
    one_way_ms = 40.0
    server, port = echo_server()
    proxy = netdelay.DelayProxy(f"127.0.0.1:{port}", one_way_ms)
    try:
        host, proxy_port = proxy.start().rsplit(":", 1)
        with socket.create_connection((host, int(proxy_port)), timeout=10) as conn:
            rng = np.random.default_rng(0)
            for size in (1, 1000, 300_000):  # one byte to many chunks of the proxy's reads
                payload = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
                sent = time.perf_counter()
                conn.sendall(payload)
                assert recv_exactly(conn, size) == payload
                # Two proxy hops per round trip, each held one_way_ms.
                assert time.perf_counter() - sent >= 2 * one_way_ms / 1000
            # Messages sent back to back are delayed, not queued behind each
            # other's delay: all are back before they would be one by one.
            burst = [bytes([i]) * 10 for i in range(5)]
            sent = time.perf_counter()
            for message in burst:
                conn.sendall(message)
            assert recv_exactly(conn, 50) == b"".join(burst)
            elapsed = time.perf_counter() - sent
            assert elapsed >= 2 * one_way_ms / 1000
            assert elapsed < len(burst) * 2 * one_way_ms / 1000
    finally:
        proxy.stop()
        server.close()


@pytest.mark.unit
def test_negative_delay_is_refused():
    with pytest.raises(ValueError, match="one_way_ms"):
        netdelay.DelayProxy("127.0.0.1:1", -1)


# --- the automatic group count ---------------------------------------------------------


@pytest.mark.unit
def test_groups_stay_one_below_the_round_trip_floor_or_where_stepping_is_cheap():
    assert groups_for(MIN_GROUPED_RTT_SECONDS / 2, 0.050, 64) == 1
    assert groups_for(0.025, 0.0005, 64) == 1  # CartPole-cheap steps: nothing to overlap


@pytest.mark.unit
def test_groups_hide_the_round_trip_behind_the_other_groups_steps():
    for rtt, step in ((0.025, 0.015), (0.025, 0.025), (0.005, 0.050)):
        groups = groups_for(rtt, step, 63)  # 63 envs: no count fills the learner's batch sizes exactly
        cycle = rtt + step / groups  # one group's: its round trip, then its share of the steps
        assert cycle <= GROUP_SLACK * max(rtt, step) + 1e-12
        if groups > 1:  # and one group fewer would not do
            assert rtt + step / (groups - 1) > GROUP_SLACK * max(rtt, step)
    assert groups_for(0.5, 0.4, 3) == 3  # never an empty group
    assert groups_for(0.5, 0.5, 64) <= MAX_GROUPS


@pytest.mark.unit
def test_group_sizes_cover_every_env_once():
    for num_envs, groups in ((32, 3), (4, 4), (7, 2)):
        sizes = group_sizes(num_envs, groups)
        assert sum(sizes) == num_envs and len(sizes) == groups and min(sizes) >= 1


# --- actor groups against a real learner --------------------------------------------------


class OrderTap(QueueTap):
    """Checks every unroll entering the queue: each step of a CartPole env
    that is not an episode's first follows from the step before it by the
    env's own dynamics, which steps out of order, or another env's steps,
    would break."""

    def __init__(self, queue):
        self.broken: list[str] = []
        super().__init__(queue)

    def record(self, chunk):
        obs, first = chunk["obs"], chunk["first"]  # [k, T+1, 4], [k, T+1]
        for k in range(len(obs)):
            following = ~first[k, 1:]
            for index, name in ((0, "x"), (2, "theta")):
                predicted = obs[k, :-1, index] + CARTPOLE_TAU * obs[k, :-1, index + 1]
                if not np.allclose(obs[k, 1:, index][following], predicted[following], atol=1e-4):
                    self.broken.append(f"unroll {k}: {name} does not follow its previous step")


def wait_until(predicate, what, learner, timeout=WAIT_SECONDS):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert learner.error is None, f"learner failed: {learner.error!r}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def start_actor(address, tmp_path, actor_id, num_envs, groups):
    with open(tmp_path / f"{actor_id}.log", "wb") as log:  # the child keeps its own copy of the fd
        return subprocess.Popen(
            [sys.executable, "-m", "seedq.cli", "actor", "--server", address, "--env", "CartPole-v1",
             "--num-envs", str(num_envs), "--actor-id", actor_id, "--groups", str(groups)],
            stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.e2e
def test_actor_groups_keep_every_env_in_order_beside_an_actor_of_todays_protocol(tmp_path):
    """Behind a 10 ms round trip, one actor whose 3 groups take turns, one
    that chooses its groups by pinging (CartPole's steps are too cheap to
    hide anything behind: one group), and one actor of today's protocol (one
    stream, its plain id) train one learner; every unroll holds one env's
    steps in order."""
    config = dataclasses.replace(
        TrainConfig(), env="CartPole-v1",
        vtrace=dataclasses.replace(VTraceConfig(), unroll_length=5, batch_size=4, lookahead=0),
        server=dataclasses.replace(ServerConfig(), queue_capacity_unrolls=64, max_batch_size=16),
    )
    learner = Learner(config, "127.0.0.1:0")
    tap = OrderTap(learner.queue)
    proxy = actors = None
    try:
        address = learner.start()
        proxy = netdelay.DelayProxy(address, one_way_ms=5.0)
        delayed = proxy.start()
        actors = [start_actor(delayed, tmp_path, "grouped", num_envs=4, groups=3),
                  start_actor(delayed, tmp_path, "auto", num_envs=4, groups=0),
                  start_actor(address, tmp_path, "today", num_envs=4, groups=1)]
        wait_until(lambda: learner.table.num_connected >= 5, "every actor's streams", learner)
        start = learner.train_steps
        wait_until(lambda: learner.train_steps >= start + 5, "5 train steps with both actors", learner)
        ids = sorted(entry.actor_id for entry in learner.table.entries())
        grouped = [i for i in ids if i.startswith("grouped/g")]
        assert grouped == ["grouped/g0", "grouped/g1", "grouped/g2"], ids
        assert "today" in ids and "auto" in ids, ids
        for proc in actors:
            assert proc.poll() is None, (tmp_path / "grouped.log").read_text()
        with tap.lock:
            assert tap.unrolls > 0
            assert not tap.broken, tap.broken[:3]
    finally:
        for proc in actors or []:
            proc.kill()
            proc.wait(timeout=10)
        if proxy is not None:
            proxy.stop()
        learner.stop()


# --- thousands of env slots -------------------------------------------------------------

# The learner's memory per env slot it serves (CartPole): its unroll buffers,
# per-env state and each stream's connection; RSS measured as `seedq bench
# ingress` reports it (docs/scaling.md gives the measured figure).
SLOT_MEMORY_BUDGET_BYTES = 64 << 10


@pytest.mark.e2e
def test_4096_env_slots_are_all_served_within_the_memory_budget():
    from seedq.bench import ingress

    load = ingress.IngressLoad(env_id="CartPole-v1", streams=256, envs_per_stream=16, seconds=1.0,
                               warmup_seconds=0.0, train=False, generators=1)
    result = ingress.run(load)
    every_key = {"frames_per_second", "messages_per_second", "rtt_p50_ms", "rtt_p99_ms", "slots_served",
                 "min_stream_frames_ratio", "learner_cpu_us_per_frame", "rss_bytes_per_slot",
                 "generator_cpu_share", "batching", "messages_per_batch"}
    assert every_key <= result.keys()
    assert set(result["learner_cpu_us_per_frame"]) == {"compute", "other"}
    assert all(value is not None for value in result["learner_cpu_us_per_frame"].values())
    assert result["refused_streams"] == 0, result["refusal"]
    assert result["slots_served"] == 256 * 16
    assert result["min_stream_frames_ratio"] > 0
    assert 0 < result["rss_bytes_per_slot"] <= SLOT_MEMORY_BUDGET_BYTES


# --- reporting the group count ---------------------------------------------------------


@pytest.mark.unit
def test_progress_line_and_summary_count_actors_and_their_groups():
    from tests.fake_learner import learner_stats

    from seedq.reporting.run_control import RunClock, TargetRecord
    from seedq.reporting.sinks import RunInfo, Tick, progress_line, summary_json
    from seedq.reporting.stats import ActorStats

    def line(stats):
        return progress_line(TrainConfig(), Tick(stats, {}, 10.0, 1000.0, 5.0))

    plain = learner_stats(actors=(ActorStats("a", "r", 4, 0), ActorStats("b", "r", 4, 0)), actor_groups=1)
    assert "| 2 actors" in line(plain) and "groups" not in line(plain)
    streams = tuple(ActorStats(f"{actor}/g{k}", "r", 2, 0) for actor in ("a", "b") for k in range(3))
    grouped = learner_stats(actors=streams, actor_groups=3)
    assert "| 2 actors x3 groups" in line(grouped)
    summary = summary_json(TrainConfig(), grouped, TargetRecord(), RunInfo(RunClock(0.0), 1, None, None, ()), stop_reason="max_seconds",
                           wall_seconds=1.0, segment_seconds=1.0, checkpoint="", evaluation=None)
    assert summary["actor_groups"] == 3


@pytest.mark.e2e
def test_the_actor_measures_the_channels_round_trip_with_health_pings_through_the_proxy():
    import asyncio

    import grpc

    from seedq.transport import channel as channel_lib
    from seedq.actor.groups import channel_rtt_seconds

    one_way_ms = 15.0

    async def measure() -> float:
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        await channel_lib.add_health_service(server)
        await server.start()
        proxy = netdelay.DelayProxy(f"127.0.0.1:{port}", one_way_ms)
        try:
            delayed = await asyncio.get_running_loop().run_in_executor(None, proxy.start)
            async with grpc.aio.insecure_channel(delayed) as channel:
                return await channel_rtt_seconds(channel)
        finally:
            proxy.stop()
            await server.stop(None)

    # Every ping crosses the proxy both ways: none can be shorter than that.
    assert asyncio.run(measure()) >= 2 * one_way_ms / 1000
