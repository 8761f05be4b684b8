"""server.ingress_processes > 1: ingress processes on the learner's TCP port
(SO_REUSEPORT) serve the actors' streams and hand their steps to the learner's
process (seedq.server.ingress, seedq.server.ingress_hub)."""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import grpc
import numpy as np
import pytest

from seedq.transport import channel as channel_lib
from seedq.process import exit_codes
from seedq.config import AuthConfig
from seedq.envs import env_spec, run_defaults
from seedq.bench.drain import drain_unrolls
from seedq.learner.learner import Learner
from seedq.v1 import seed_pb2
from seedq.wire import codec

pytestmark = pytest.mark.e2e

ENV = "CartPole-v1"
TOKEN = "ingress-test-token"
# Connections opened until both ingress processes have served one: the kernel
# spreads them by a hash of their addresses, so a few suffice (bounded).
MAX_CONNECTIONS = 40
# The learner's env-slot budget (server.max_envs): above what the tests hold at once.
SLOT_BUDGET = 128


def learner_config(tmp_path, **server):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    base = run_defaults(ENV)
    return dataclasses.replace(
        base, env=ENV, num_actors=4, envs_per_actor=8, auth=AuthConfig(token_file=str(token)),
        server=dataclasses.replace(base.server, ingress_processes=2, max_envs=SLOT_BUDGET, **server))


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    learner = Learner(learner_config(tmp_path_factory.mktemp("ingress")), "127.0.0.1:0")
    learner.start(consume=drain_unrolls)
    yield learner
    learner.stop()


async def one_step(address: str, num_envs: int, token: str | None) -> np.ndarray:
    """Handshake and one vector step on a connection of its own; the actions answered."""
    spec = env_spec(ENV)
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        call = channel.stream_stream("/seedq.v1.Learner/Stream")(metadata=metadata)
        await call.write(codec.encode_handshake(spec, actor_id=f"test-{uuid.uuid4().hex[:8]}",
                                                run_id=uuid.uuid4().hex, num_envs=num_envs,
                                                env_id=ENV).SerializeToString())
        codec.decode_handshake_ack(seed_pb2.LearnerMessage.FromString(await call.read()))
        observations = np.zeros((num_envs, *spec.obs_shape), spec.obs_dtype)
        await call.write(codec.encode_steps(np.arange(num_envs, dtype=np.int32), np.zeros(num_envs, np.float32),
                                            np.zeros(num_envs, bool), np.zeros(num_envs, bool),
                                            observations).SerializeToString())
        reply = seed_pb2.LearnerMessage.FromString(await call.read())
        await call.done_writing()
        return codec.decode_actions(reply, spec, num_envs)


def test_both_ingress_processes_serve_and_each_stream_gets_its_own_envs_actions(learner):
    hub = learner.ingress_hub
    assert len(hub.pids()) == 2 and all(pid != os.getpid() for pid in hub.pids())

    async def until_both_served():
        # Streams of different env counts, all in flight together: a reply
        # routed to another stream would carry another count of actions.
        for first in range(0, MAX_CONNECTIONS, 8):
            counts = [1 + (first + k) % 7 for k in range(8)]
            answers = await asyncio.gather(*(one_step(learner.address, n, TOKEN) for n in counts))
            assert [len(actions) for actions in answers] == counts
            if all(frames > 0 for frames in hub.frames):
                return first + 8
        return None

    opened = asyncio.run(until_both_served())
    assert opened is not None, f"{MAX_CONNECTIONS} connections all went to one process: frames {hub.frames}"
    assert sum(hub.frames) == learner.table.frames


async def stream_status(address: str, token: str | None) -> grpc.StatusCode:
    """The status a stream opened with `token` (None: no token) ends with, sending
    nothing (a write racing the server's refusal can end in gRPC core's INTERNAL instead)."""
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        call = channel.stream_stream("/seedq.v1.Learner/Stream")(metadata=metadata)
        try:
            # A process that let it through would wait for the handshake (server.peer_timeout_seconds).
            return await asyncio.wait_for(call.code(), 10)
        finally:
            call.cancel()


def test_every_ingress_process_refuses_a_stream_without_the_token(learner):
    async def refusals():
        # 16 connections: both processes take some.
        return [await stream_status(learner.address, token) for token in [None, "wrong-token"] * 8]

    assert set(asyncio.run(refusals())) == {grpc.StatusCode.UNAUTHENTICATED}
    assert len(asyncio.run(one_step(learner.address, 3, TOKEN))) == 3  # the learner still serves


def test_every_ingress_process_keeps_the_slot_budget_and_the_health_services_limits(learner):
    from grpc_health.v1 import health_pb2

    async def checks():
        results = []
        for _ in range(16):  # 16 connections of each kind: both processes take some
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await one_step(learner.address, SLOT_BUDGET + 1, TOKEN)
            results.append((refused.value.code(), "server.max_envs" in refused.value.details()))
            async with grpc.aio.insecure_channel(
                    learner.address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
                check = channel.unary_unary("/grpc.health.v1.Health/Check")
                reply = health_pb2.HealthCheckResponse.FromString(
                    await check(health_pb2.HealthCheckRequest(service="").SerializeToString()))
                results.append(reply.status == health_pb2.HealthCheckResponse.SERVING)
                with pytest.raises(grpc.aio.AioRpcError) as oversized:
                    await check(b"\n" + b"x" * (channel_lib.MAX_HEALTH_REQUEST_BYTES + 1))
                results.append(oversized.value.code())
        return results

    assert set(asyncio.run(checks())) == {(grpc.StatusCode.RESOURCE_EXHAUSTED, True), True,
                                          grpc.StatusCode.RESOURCE_EXHAUSTED}


def test_a_unix_socket_learner_refuses_several_ingress_processes(tmp_path):
    learner = Learner(learner_config(tmp_path), f"unix:{tmp_path}/learner.sock")
    with pytest.raises(ValueError, match="server.ingress_processes=2 needs a TCP address"):
        learner.start(consume=drain_unrolls)
    learner.stop()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_actor_served_by_ingress_processes_reaches_max_frames_and_hears_the_runs_end(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    learner = subprocess.Popen(
        [sys.executable, "-m", "seedq.cli", "learner", "--address", address, "--env", ENV,
         "--logdir", str(tmp_path / "run"), "--max-frames", "3000", "--max-seconds", "120",
         "--eval-episodes", "0", "--server.ingress-processes", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    actor = subprocess.Popen(
        [sys.executable, "-m", "seedq.cli", "actor", "--server", address, "--env", ENV, "--num-envs", "16",
         "--actor-id", "a0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        learner_out, _ = learner.communicate(timeout=180)
        actor_out, _ = actor.communicate(timeout=60)
    finally:
        for proc in (learner, actor):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert learner.returncode == 0 and "done (max_frames)" in learner_out, learner_out[-2000:]
    assert actor.returncode == 0 and "ended (max_frames)" in actor_out, actor_out[-2000:]


def ingress_children(pid: int) -> list[int]:
    """The spawned ingress processes of process `pid` (not multiprocessing's resource tracker)."""
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            children += [int(c) for c in f.read().split()]
    found = []
    for child in children:
        with open(f"/proc/{child}/cmdline", "rb") as f:
            cmdline = f.read()
        if b"multiprocessing" in cmdline and b"resource_tracker" not in cmdline:
            found.append(child)
    return found


def test_an_ingress_process_killed_mid_run_ends_the_run_with_learner_error(tmp_path):
    run = tmp_path / "run"
    log = tmp_path / "learner.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "seedq.cli", "learner", "--address", "127.0.0.1:0", "--env", ENV,
         "--logdir", str(run), "--log-every-seconds", "0.5", "--eval-episodes", "0",
         "--server.ingress-processes", "2"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "learner listening on" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "learner listening on" in log.read_text(), log.read_text()[-2000:]
        children = ingress_children(proc.pid)
        assert len(children) == 2, children
        os.kill(children[0], signal.SIGKILL)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert code == exit_codes.RUNTIME_FAILURE, text[-2000:]
    assert f"(pid {children[0]}) ended with exit code -9" in text, text[-2000:]
    (summary,) = glob.glob(str(run / "**" / "summary.json"), recursive=True)
    assert json.loads(open(summary).read())["stop_reason"] == "learner_error"
