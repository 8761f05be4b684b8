"""The end of a run reaches every actor (docs/wire.md "The end of a run").

A real `Learner` serves a unix socket; real `seedq actor` processes and raw
clients (this process) connect. A learner that stops because its run is over
tells every stream so and the actors exit 0; one that stops to be restarted
(SIGTERM, a failure) does not, and the actors wait for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import threading
import time
import uuid

import grpc
import numpy as np
import pytest

from seedq.transport import channel
from seedq.config import ServerConfig, TrainConfig, VTraceConfig
from seedq.learner.learner import Learner
from seedq.v1 import seed_pb2_grpc
from seedq.wire import codec
from seedq import schema

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CARTPOLE = schema.EnvSpec("float32", (4,), num_actions=2)
CONFIG = dataclasses.replace(
    TrainConfig(), env="CartPole-v1",
    vtrace=dataclasses.replace(VTraceConfig(), unroll_length=5, batch_size=4, lookahead=0),
    server=dataclasses.replace(ServerConfig(), max_batch_size=16),
)


def wait_until(predicate, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.05)


def start_actor(address, tmp_path, actor_id):
    log = open(tmp_path / f"{actor_id}.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "seedq.cli", "actor", "--server", address, "--env", "CartPole-v1",
         "--num-envs", "4", "--actor-id", actor_id, "--stats-file", str(tmp_path / f"{actor_id}.json")],
        stdout=log, stderr=subprocess.STDOUT,
    )
    log.close()
    proc.log = tmp_path / f"{actor_id}.log"
    proc.stats = tmp_path / f"{actor_id}.json"
    return proc


def stop(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def raw_stream(address, reads_run_ended):
    """A client's stream, handshake answered; returns `step()`, which sends one StepBatch and returns the reply."""
    channel_ = grpc.insecure_channel(address)
    requests = []

    def messages():
        yield codec.encode_handshake(CARTPOLE, actor_id=f"raw-{uuid.uuid4().hex[:6]}", run_id=uuid.uuid4().hex,
                                     num_envs=2, reads_run_ended=reads_run_ended)
        while True:
            while not requests:
                time.sleep(0.01)
            message = requests.pop()
            if message is None:
                return
            yield message

    call = seed_pb2_grpc.LearnerStub(channel_).Stream(messages(), timeout=30)
    assert next(call).WhichOneof("kind") == "ack"

    def step():
        zeros = np.zeros(2)
        requests.append(codec.encode_steps(np.arange(2), zeros, zeros, zeros, np.zeros((2, 4), np.float32)))
        return next(call)

    return step


def health(address: str, service: str):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def test_a_run_that_ends_tells_every_actor_and_they_exit_0(tmp_path):
    learner = Learner(CONFIG, f"unix:{tmp_path}/learner.sock")
    actors = []
    try:
        address = learner.start()
        assert health(address, channel.RUN_SERVICE) == "SERVING"
        actors = [start_actor(address, tmp_path, f"actor-{i}") for i in range(2)]
        wait_until(lambda: learner.table.num_connected == 2, "both actors connected")
        old_client = raw_stream(address, reads_run_ended=False)
        new_client = raw_stream(address, reads_run_ended=True)
        # (stop() returns once the learner has stopped serving: the actors hear first.)
        stopping = threading.Thread(target=learner.stop, kwargs={"run_ended": "target_return"})
        stopping.start()
        wait_until(lambda: health(address, channel.RUN_SERVICE) == "NOT_SERVING", "the health service to say so")
        # The learner serves on (for a while) until every open stream has heard.
        # A client that connects now (an actor restarting) hears the end in answer to its handshake, then OK.
        with grpc.insecure_channel(address) as late_channel:
            late = seed_pb2_grpc.LearnerStub(late_channel).Stream(iter([codec.encode_handshake(
                CARTPOLE, actor_id="late", run_id=uuid.uuid4().hex, num_envs=2, reads_run_ended=True)]), timeout=30)
            assert [(r.WhichOneof("kind"), r.run_ended.stop_reason) for r in late] == [("run_ended", "target_return")]
        # A client that reads RunEnded gets it as its last message, then OK.
        reply = new_client()
        assert reply.WhichOneof("kind") == "run_ended" and reply.run_ended.stop_reason == "target_return"
        # One that does not (every client before the field) ends with UNAVAILABLE, as before.
        with pytest.raises(grpc.RpcError) as info:
            old_client()
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert info.value.details().startswith(codec.RUN_ENDED_MARKER)
        codes = [proc.wait(10) for proc in actors]
        stopping.join()
    finally:
        stop(actors)
        learner.stop()
    assert codes == [0, 0], [a.log.read_text() for a in actors]
    for actor in actors:
        assert json.loads(actor.stats.read_text())["run_ended"] == "target_return"
        assert "ended (target_return)" in actor.log.read_text()


def test_a_learner_stopped_for_a_restart_leaves_its_actors_waiting(tmp_path):
    learner = Learner(CONFIG, f"unix:{tmp_path}/learner.sock")
    actors = []
    try:
        address = learner.start()
        actors = [start_actor(address, tmp_path, "actor-0")]
        wait_until(lambda: learner.table.num_connected == 1, "the actor connected")
        learner.stop()  # SIGTERM under --resume auto, or a failure: no run_ended
        wait_until(lambda: "waiting for the learner" in actors[0].log.read_text(), "the actor to wait", 30)
        assert actors[0].poll() is None
    finally:
        stop(actors)


def test_health_service_reports_the_end_of_the_run(tmp_path):
    """The health service's seedq.v1.Run: SERVING while the run goes on, NOT_SERVING once it ended."""
    address = f"unix:{tmp_path}/health.sock"

    async def main():
        server = grpc.aio.server()
        set_serving = await channel.add_health_service(server)
        server.add_insecure_port(address)
        await server.start()
        try:
            seen = [await asyncio.to_thread(health, address, channel.RUN_SERVICE)]
            await set_serving(False)  # a stop to be restarted
            seen.append(await asyncio.to_thread(health, address, channel.RUN_SERVICE))
            await set_serving(False, run_ended=True)
            seen.append(await asyncio.to_thread(health, address, channel.RUN_SERVICE))
            seen.append(await asyncio.to_thread(health, address, channel.LEARNER_SERVICE))
            return seen
        finally:
            await server.stop(None)

    assert asyncio.run(main()) == ["SERVING", "SERVING", "NOT_SERVING", "NOT_SERVING"]



def test_an_actor_between_reconnects_hears_the_end_of_a_run(tmp_path):
    """A learner whose run is over at once (a resumed run whose restored return
    window already meets the target) serves the notice for a while: an actor
    that was retrying meanwhile connects and exits 0 instead of waiting on."""
    from seedq.learner.server_thread import RUN_END_RECONNECT_SECONDS

    address = f"unix:{tmp_path}/learner.sock"
    actor = start_actor(address, tmp_path, "late")  # before the learner: it retries every second at most
    try:
        wait_until(lambda: "waiting for the learner" in actor.log.read_text(), "the actor to retry", 60)
        learner = Learner(CONFIG, address)
        learner.start()
        learner.stop(run_ended="target_return", notice_least_seconds=RUN_END_RECONNECT_SECONDS)
        assert actor.wait(10) == 0, actor.log.read_text()
    finally:
        stop([actor])
    assert json.loads(actor.stats.read_text())["run_ended"] == "target_return"


def test_an_impala_actor_hears_the_end_of_the_run_and_exits_0(tmp_path):
    config = dataclasses.replace(CONFIG, architecture="impala")
    learner = Learner(config, f"unix:{tmp_path}/learner.sock")
    actor = None
    try:
        address = learner.start()
        log = open(tmp_path / "impala.log", "wb")
        actor = subprocess.Popen(
            [sys.executable, "-m", "seedq.cli", "impala-actor", "--server", address, "--env", "CartPole-v1",
             "--num-envs", "4", "--actor-id", "impala-0"], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_until(lambda: learner.stats().frames > 0, "the IMPALA actor's first unrolls", 120)
        stopping = threading.Thread(target=learner.stop, kwargs={"run_ended": "max_frames"})
        stopping.start()
        code = actor.wait(10)
        stopping.join()
    finally:
        if actor is not None:
            stop([actor])
        learner.stop()
    assert code == 0, (tmp_path / "impala.log").read_text()
    assert "ended (max_frames)" in (tmp_path / "impala.log").read_text()


def test_a_learner_that_served_no_actor_frames_exits_1_with_no_actors(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "seedq.cli", "learner", "--env", "CartPole-v1", "--address",
         f"unix:{tmp_path}/learner.sock", "--max-seconds", "3", "--logdir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "stop_reason no_actors" in result.stderr and "Traceback" not in result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "no_actors" and summary["frames"] == 0
    assert summary["eval"] is None  # nothing trained: no evaluation of it
