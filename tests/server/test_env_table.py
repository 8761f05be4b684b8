"""Bounds a connected peer cannot pass: the learner's total env-slot budget
(server.max_envs), the length of the ids it logs and keys on."""

from __future__ import annotations

import dataclasses
import os
import queue
import time

import grpc
import numpy as np
import pytest

from seedq import schema
from seedq.bench.drain import drain_unrolls
from seedq.config import ServerConfig, TrainConfig, VTraceConfig
from seedq.server.env_table import EnvTable, EpisodeLog, SlotBudgetExhausted, auto_max_envs
from seedq.v1 import seed_pb2_grpc
from seedq.wire import codec

CARTPOLE = schema.EnvSpec("float32", (4,), num_actions=2)


@pytest.mark.unit
def test_the_slot_budget_counts_every_actor_and_frees_with_them():
    table = EnvTable(EpisodeLog(), max_envs=64)
    first, _ = table.connect("a", "r1", 40)
    with pytest.raises(SlotBudgetExhausted, match="40 of this learner's 64 env slots .* asks for 32"):
        table.connect("b", "r1", 32)
    second, _ = table.connect("b", "r1", 24)
    # A restart of the same actor counts its old block as free.
    restarted, superseded = table.connect("a", "r2", 40)
    assert superseded is first and first.closed
    table.release(second)
    table.connect("c", "r1", 24)
    assert table.num_slots <= 64  # every per-slot array stays within the budget


@pytest.mark.unit
def test_scattered_free_blocks_never_take_slots_past_the_budget():
    table = EnvTable(EpisodeLog(), max_envs=8)
    entries = [table.connect(str(i), "r", 2)[0] for i in range(4)]
    table.release(entries[0])
    table.release(entries[2])  # 4 slots free, in two blocks of 2
    with pytest.raises(SlotBudgetExhausted, match="no free block of 4"):
        table.connect("wide", "r", 4)
    assert table.num_slots == 8
    table.release(entries[3])  # the top block joins the free block below it
    assert table.connect("wide", "r", 4)[0].first_slot == 4


@pytest.mark.unit
def test_the_automatic_budget_follows_memory_within_its_bounds():
    atari_r2d2 = 80 * 84 * 84 * 4  # one slot's unroll of stacked 84x84 frames, ~2.3 MB
    assert auto_max_envs(atari_r2d2, memory=64 << 30) == int(0.25 * (64 << 30) / (2 * atari_r2d2))
    assert auto_max_envs(atari_r2d2, memory=1 << 30) == 1024  # the floor: launch defaults still fit
    assert auto_max_envs(16 * 20, memory=64 << 30) == 1 << 16  # the ceiling


@pytest.mark.unit
@pytest.mark.parametrize("actor_id, run_id, field, words", [
    ("a" * 129, "r", "handshake.actor_id", "129 characters, at most 128"),
    ("a", "r" * 10_000, "handshake.run_id", "10000 characters"),
    ("a\nseedq.server: forged log line", "r", "handshake.actor_id", "printable"),
    ("", "r", "handshake.actor_id", "must not be empty"),
])
def test_ids_are_bounded_and_printable(actor_id, run_id, field, words):
    message = codec.encode_handshake(CARTPOLE, actor_id=actor_id, run_id=run_id, num_envs=1)
    with pytest.raises(codec.ProtocolError) as refused:
        codec.decode_handshake(message)
    assert field in str(refused.value) and words in str(refused.value)


class RawStream:
    """A seedq.v1 Stream that sends exactly what it is told."""

    def __init__(self, address):
        self._requests = queue.Queue()
        self.channel = grpc.insecure_channel(address)
        self.call = seed_pb2_grpc.LearnerStub(self.channel).Stream(iter(self._requests.get, None), timeout=60)

    def handshake(self, actor_id, num_envs):
        self._requests.put(codec.encode_handshake(CARTPOLE, actor_id=actor_id, run_id="run", num_envs=num_envs))
        return next(self.call)

    def step(self, num_envs):
        zeros = np.zeros(num_envs)
        self._requests.put(codec.encode_steps(np.arange(num_envs), zeros, zeros, zeros,
                                              np.zeros((num_envs, 4), np.float32)))
        return codec.decode_actions(next(self.call), CARTPOLE, num_envs)

    def close(self):
        self._requests.put(None)
        self.channel.close()


@pytest.mark.e2e
def test_a_handshake_past_max_envs_is_refused_while_the_first_stream_is_served(tmp_path):
    from seedq.learner.learner import Learner

    config = dataclasses.replace(
        TrainConfig(), env="CartPole-v1",
        vtrace=dataclasses.replace(VTraceConfig(), unroll_length=5, batch_size=4),
        server=dataclasses.replace(ServerConfig(), max_envs=64),
    )
    learner = Learner(config, f"unix:{tmp_path}/learner.sock")
    address = learner.start(consume=drain_unrolls)
    first, second = RawStream(address), RawStream(address)
    try:
        first.handshake("first", 40)
        assert first.step(40).shape == (40,)
        with pytest.raises(grpc.RpcError) as refused:
            second.handshake("second", 32)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = refused.value.details()
        assert details.startswith(codec.SLOT_BUDGET_MARKER) and "server.max_envs" in details and "64" in details
        for _ in range(3):  # the first stream is still open and served
            assert first.step(40).shape == (40,)
        assert learner.table.num_connected == 1
    finally:
        first.close()
        second.close()
        learner.stop()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.e2e
def test_a_thousand_handshakes_of_distinct_ids_leave_memory_and_compiled_programs_bounded(tmp_path):
    """Every new actor id may connect, but what it leaves behind is bounded:
    slots return to the budget, and requests of any size (past the largest
    bucket too) run on the programs compiled for the buckets."""
    from seedq.learner.learner import Learner

    config = dataclasses.replace(
        TrainConfig(), env="CartPole-v1",
        vtrace=dataclasses.replace(VTraceConfig(), unroll_length=5, batch_size=4),
        server=dataclasses.replace(ServerConfig(), max_envs=2048, max_batch_size=64),
    )
    learner = Learner(config, f"unix:{tmp_path}/learner.sock")
    address = learner.start(consume=drain_unrolls)
    sizes = [1, 7, 64, 65, 300, 1000]  # within, at and past the largest bucket (64)
    try:
        def connect_and_step(i: int, num_envs: int) -> None:
            stream = RawStream(address)
            try:
                stream.handshake(f"actor-{i}-{'x' * 100}", num_envs)
                assert stream.step(num_envs).shape == (num_envs,)
            finally:
                stream.close()

        for i, n in enumerate(sizes):  # every bucket that these sizes use, compiled once
            connect_and_step(i, n)
        compiled, rss_before = learner.inference.stats.compiles, _rss_bytes()
        for i in range(1000):
            connect_and_step(len(sizes) + i, sizes[i % len(sizes)])
        compiles_after, rss_after = learner.inference.stats.compiles, _rss_bytes()
        deadline = time.monotonic() + 30
        while learner.table.num_connected and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        learner.stop()
    assert compiled <= len(learner.inference.buckets)  # never one for a size past the largest
    assert compiles_after == compiled
    assert learner.table.num_slots <= 2048 and learner.table.num_connected == 0
    assert learner.table.runs_started == len(sizes) + 1000
    print(f"1,000 handshakes: compiled programs {compiled} -> {compiles_after}; "
          f"RSS {rss_before / 2**20:.0f} MiB -> {rss_after / 2**20:.0f} MiB; slots {learner.table.num_slots}")
    assert rss_after - rss_before < 64 << 20


@pytest.mark.e2e
def test_a_compile_runs_off_the_event_loop_which_keeps_serving(tmp_path, monkeypatch):
    """While a batch size compiles, the server thread's event loop still
    answers health checks (kubelet probes) and runs the idle watchdog."""
    import threading

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from seedq.learner.learner import Learner
    from seedq.rollout.core import ActingCore

    compiling, release = threading.Event(), threading.Event()
    real_warm_up = ActingCore.warm_up

    def slow_warm_up(self, *args):
        compile_program = real_warm_up(self, *args)

        def held():
            compiling.set()
            release.wait(60)
            compile_program()
        return held

    monkeypatch.setattr(ActingCore, "warm_up", slow_warm_up)
    config = dataclasses.replace(TrainConfig(), env="CartPole-v1",
                                 vtrace=dataclasses.replace(VTraceConfig(), unroll_length=5, batch_size=4))
    learner = Learner(config, f"unix:{tmp_path}/learner.sock")
    address = learner.start(consume=drain_unrolls)
    stream = RawStream(address)
    try:
        stepped = threading.Thread(target=lambda: (stream.handshake("a", 4), stream.step(4)), daemon=True)
        stepped.start()
        assert compiling.wait(60)
        with grpc.insecure_channel(address) as ch:  # answered while the compile is held
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        release.set()
        stepped.join(60)
        assert not stepped.is_alive()
    finally:
        release.set()
        stream.close()
        learner.stop()


@pytest.mark.unit
def test_an_actor_refused_for_a_full_budget_says_why_once_and_retries(capsys):
    """Unlike a message over the size limit, a full slot budget frees up: the
    actor waits and tries again (and so after a learner failure)."""
    import asyncio

    from seedq.actor.seed_actor import FatalActorError, run_actor

    def rpc_error(code, details):
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)

    full = rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{codec.SLOT_BUDGET_MARKER}: 64 of 64 in use")
    failed = rpc_error(grpc.StatusCode.UNAVAILABLE, f"{codec.LEARNER_FAILED_MARKER} (ValueError: x) and is stopping")
    outcomes = [full, full, full, failed, failed,
                rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max")]
    calls = []

    async def connection(*args, **kwargs):
        calls.append(1)
        raise outcomes[len(calls) - 1]

    with pytest.raises(FatalActorError, match="larger than max"):
        asyncio.run(run_actor("unix:/nonexistent.sock", "CartPole-v1", 1, actor_id="a", connection=connection))
    assert len(calls) == len(outcomes)  # retried through both, fatal on the oversized message
    err = capsys.readouterr().err
    assert err.count(codec.SLOT_BUDGET_MARKER) == 1 and err.count(codec.LEARNER_FAILED_MARKER) == 1, err
