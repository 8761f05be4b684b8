"""End-to-end tests of the learner's gRPC service with real processes and sockets.

A real `Learner` (training on) listens on a unix socket in a temporary
directory; real actor processes (`python -m seedq.cli actor`) step CartPole
against it, and raw clients (in this process, or in a subprocess that the
test SIGKILLs) send exactly the messages a test needs.

Raw clients send CartPole-shaped observations whose pole angle (obs[2]) is a
marker value no real CartPole observation reaches (|angle| > 0.21 ends an
episode), so every unroll that enters the learner's queue can be traced back
to the client that sent it.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import grpc
import numpy as np
import pytest

from seedq.bench.drain import drain_unrolls
from seedq.config import ServerConfig, TrainConfig, VTraceConfig
from seedq.envs import env_spec
from seedq.learner.learner import Learner
from seedq.wire import codec
from seedq import schema

from tests.queue_tap import QueueTap
from tests.serving import held_steps

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

UNROLL_LENGTH = 5
WAIT_SECONDS = 30.0
CONFIG = dataclasses.replace(
    TrainConfig(),
    env="CartPole-v1",
    # Unrolls of UNROLL_LENGTH + 1 steps (no lookahead), which the raw clients count out.
    vtrace=dataclasses.replace(VTraceConfig(), unroll_length=UNROLL_LENGTH, batch_size=4, lookahead=0),
    server=dataclasses.replace(ServerConfig(), queue_capacity_unrolls=64, max_batch_size=16),
)

# Pole-angle markers of the raw clients (real CartPole angles stay within ~0.3).
MARK_VICTIM = 3.25
MARK_AFTER = -3.25
MARK_OLD_RUN = 2.75
MARK_NEW_RUN = -2.75
MARKERS = (MARK_VICTIM, MARK_AFTER, MARK_OLD_RUN, MARK_NEW_RUN)

RAW_CLIENT_SOURCE = r'''
"""A raw seedq.v1 client: sends exactly the messages it is told to."""
import queue
import sys
import time

import grpc
import numpy as np

from seedq.v1 import seed_pb2_grpc
from seedq.wire import codec
from seedq import schema

CARTPOLE = schema.EnvSpec("float32", (4,), num_actions=2)


class RawStream:
    def __init__(self, address, timeout=60.0):
        self._requests = queue.Queue()
        self.channel = grpc.insecure_channel(address)
        stub = seed_pb2_grpc.LearnerStub(self.channel)
        # The deadline bounds every blocking recv().
        self.call = stub.Stream(self._iterate(), timeout=timeout)

    def _iterate(self):
        while True:
            message = self._requests.get()
            if message is None:
                return
            yield message

    def send(self, message):
        self._requests.put(message)

    def recv(self):
        return next(self.call)

    def handshake(self, actor_id, run_id, num_envs, spec=CARTPOLE, version=None):
        message = codec.encode_handshake(spec, actor_id=actor_id, run_id=run_id, num_envs=num_envs)
        if version is not None:
            message.handshake.protocol_version = version
        self.send(message)
        reply = self.recv()
        assert reply.WhichOneof("kind") == "ack", reply
        return reply.ack

    def step(self, num_envs, angle=0.0):
        obs = np.zeros((num_envs, 4), np.float32)
        obs[:, 2] = angle
        zeros = np.zeros(num_envs)
        self.send(codec.encode_steps(np.arange(num_envs), zeros, zeros, zeros, obs))
        return codec.decode_actions(self.recv(), CARTPOLE, num_envs)

    def close(self):
        self._requests.put(None)
        self.call.cancel()
        self.channel.close()


def main(address, actor_id, num_envs, steps, angle, ready_file, then):
    num_envs, steps, angle = int(num_envs), int(steps), float(angle)
    stream = RawStream(address)
    stream.handshake(actor_id, "run-" + actor_id, num_envs)
    for _ in range(steps):
        actions = stream.step(num_envs, angle)
        assert actions.shape == (num_envs,)
    with open(ready_file, "w") as f:
        f.write("ready")
    if then == "hang":
        time.sleep(600)  # until SIGKILLed
    stream.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
'''


# --- helpers -----------------------------------------------------------------------


def wait_until(predicate, what, timeout=WAIT_SECONDS, interval=0.05, learners=()):
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / interval) + 2):
        for learner in learners:
            assert learner.error is None, f"learner training failed: {learner.error!r}"
        if predicate():
            return
        if time.monotonic() > deadline:
            break
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def connected_entry(learner, actor_id):
    """The table's live entry for `actor_id` (None if not connected)."""
    return next((e for e in learner.table.entries() if e.actor_id == actor_id), None)


def assert_training_continues(learner, steps=3, procs=()):
    start = learner.train_steps
    wait_until(
        lambda: learner.train_steps >= start + steps,
        f"{steps} more train steps (at {start})",
        learners=[learner],
    )
    for proc in procs:
        assert proc.poll() is None, f"actor process exited with {proc.returncode}"


class MarkerTap(QueueTap):
    """Counts the unrolls entering a learner's queue, per raw-client marker."""

    def __init__(self, queue):
        self.marked = collections.Counter()
        super().__init__(queue)

    def record(self, chunk):
        angle = chunk["obs"][..., 2]  # [k, T+1]
        for marker in MARKERS:
            self.marked[marker] += int((angle == np.float32(marker)).any(axis=1).sum())

    def count(self, marker):
        with self.lock:
            return self.marked[marker]


def start_actor(address, tmp_path, actor_id, num_envs=4, extra=()):
    stats = tmp_path / f"{actor_id}.json"
    log = open(tmp_path / f"{actor_id}.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "seedq.cli", "actor",
            "--server", address, "--env", "CartPole-v1",
            "--num-envs", str(num_envs), "--actor-id", actor_id,
            "--stats-file", str(stats), *extra,
        ],
        stdout=log, stderr=subprocess.STDOUT,
    )
    log.close()
    proc.stats_file = stats
    proc.log_file = tmp_path / f"{actor_id}.log"
    return proc


def kill(proc):
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


def load_raw_client(path):
    spec = importlib.util.spec_from_file_location("seedq_raw_client", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- fixtures ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("e2e")
    (path / "raw_client.py").write_text(RAW_CLIENT_SOURCE)
    return path


@pytest.fixture(scope="module")
def raw(workdir):
    return load_raw_client(workdir / "raw_client.py")


@pytest.fixture(scope="module")
def cluster(workdir):
    """A training learner with one real actor ("real-1", 4 envs), shared by the module."""
    learner = Learner(CONFIG, f"unix:{workdir}/learner.sock")
    tap = MarkerTap(learner.queue)
    actor = None
    try:
        address = learner.start()
        actor = start_actor(address, workdir, "real-1", num_envs=4)
        wait_until(lambda: learner.train_steps > 0, "the first train step", learners=[learner])
        yield learner, address, actor, tap
    finally:
        if actor is not None:
            kill(actor)
        learner.stop()


@pytest.fixture
def healthy(cluster):
    """The shared cluster, checked to be training with exactly its real actor."""
    learner, address, actor, tap = cluster
    assert actor.poll() is None, actor.log_file.read_text()
    wait_until(lambda: learner.table.num_connected == 1, "only real-1 connected")
    assert connected_entry(learner, "real-1") is not None
    return cluster


# --- a. malformed messages ---------------------------------------------------------


def expect_refused(stream_fn, field_word):
    with pytest.raises(grpc.RpcError) as info:
        stream_fn()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    assert field_word in info.value.details(), info.value.details()
    return info.value.details()


def test_malformed_messages_get_invalid_argument_while_actor_trains(healthy, raw):
    learner, address, actor, _ = healthy
    cartpole = env_spec("CartPole-v1")
    assert cartpole == raw.CARTPOLE
    runs_before = learner.table.runs_started
    zeros2 = np.zeros(2)
    obs2 = np.zeros((2, 4), np.float32)
    streams = []

    def open_stream():
        stream = raw.RawStream(address, timeout=WAIT_SECONDS)
        streams.append(stream)
        return stream

    try:
        # Unknown env index (handshake declared 2 envs).
        def unknown_index():
            s = open_stream()
            s.handshake("bad-index", uuid.uuid4().hex, 2)
            s.step(2)  # a valid step first: the stream really was being served
            s.send(codec.encode_steps([0, 5], zeros2, zeros2, zeros2, obs2))
            s.recv()

        details = expect_refused(unknown_index, "env_indices")
        assert "5" in details

        # Negative env index.
        def negative_index():
            s = open_stream()
            s.handshake("bad-negative", uuid.uuid4().hex, 2)
            s.send(codec.encode_steps([-1, 0], zeros2, zeros2, zeros2, obs2))
            s.recv()

        expect_refused(negative_index, "env_indices")

        # Wrong observation byte length (3 floats per env instead of 4).
        def short_observations():
            s = open_stream()
            s.handshake("bad-obs", uuid.uuid4().hex, 2)
            s.send(codec.encode_steps([0, 1], zeros2, zeros2, zeros2, np.zeros((2, 3), np.float32)))
            s.recv()

        expect_refused(short_observations, "observations")

        # More envs than the learner accepts per actor (bounds learner memory).
        def too_many_envs():
            s = open_stream()
            s.handshake("bad-num-envs", uuid.uuid4().hex, 2**31)
            s.recv()

        expect_refused(too_many_envs, "num_envs")

        # Wrong byte length of another array.
        def short_rewards():
            s = open_stream()
            s.handshake("bad-rewards", uuid.uuid4().hex, 2)
            s.send(codec.encode_steps([0, 1], np.zeros(1), zeros2, zeros2, obs2))
            s.recv()

        expect_refused(short_rewards, "rewards")

        # Protocol version the learner does not speak.
        def bad_version():
            open_stream().handshake("bad-version", uuid.uuid4().hex, 2, version=99)

        details = expect_refused(bad_version, "protocol_version")
        assert "99" in details

        # Observation shape of another env.
        def bad_shape():
            spec = schema.EnvSpec("float32", (5,), num_actions=2)
            open_stream().handshake("bad-shape", uuid.uuid4().hex, 2, spec=spec)

        details = expect_refused(bad_shape, "shape")
        assert "[5]" in details and "[4]" in details

        # Action space of another env.
        def bad_actions():
            spec = schema.EnvSpec("float32", (4,), num_actions=3)
            open_stream().handshake("bad-actions", uuid.uuid4().hex, 2, spec=spec)

        expect_refused(bad_actions, "action_space")

        # A second stream claiming an already connected (actor, run).
        run = uuid.uuid4().hex
        first = open_stream()
        first.handshake("dup", run, 1)

        def duplicate_run():
            open_stream().handshake("dup", run, 1)

        expect_refused(duplicate_run, "already connected")
        # ... and the original stream is still served.
        assert first.step(1).shape == (1,)
        first.close()
    finally:
        for stream in streams:
            stream.close()

    # Only the streams whose handshake passed ever became runs.
    assert learner.table.runs_started == runs_before + 5
    wait_until(lambda: learner.table.num_connected == 1, "refused streams to be released")
    assert connected_entry(learner, "real-1") is not None
    assert_training_continues(learner, procs=[actor])


# --- b. killed actors ----------------------------------------------------------------


def test_sigkilled_raw_actor_loses_only_its_partial_unroll(healthy, workdir):
    learner, address, actor, tap = healthy
    num_envs, sent = 2, 3  # 3 < T+1 steps: a partial unroll
    assert sent < UNROLL_LENGTH + 1
    ready = workdir / "victim.ready"
    victim = subprocess.Popen(
        [sys.executable, str(workdir / "raw_client.py"), address, "victim", str(num_envs),
         str(sent), str(MARK_VICTIM), str(ready), "hang"],
    )
    try:
        wait_until(lambda: ready.exists() or victim.poll() is not None, "the victim's steps")
        assert victim.poll() is None, f"raw client exited with {victim.returncode}"
        entry = connected_entry(learner, "victim")
        assert entry is not None and entry.num_envs == num_envs
        assert learner.table.num_connected == 2
        # The server records a step just after answering it.
        wait_until(lambda: list(held_steps(learner.inference.store, entry.slots)) == [sent] * num_envs,
                   "the victim's steps in the store")
        os.kill(victim.pid, signal.SIGKILL)
        assert victim.wait(timeout=10) == -signal.SIGKILL
    finally:
        kill(victim)

    wait_until(lambda: entry.closed, "the learner to notice the killed stream")
    wait_until(lambda: learner.table.num_connected == 1, "the victim to leave the table")
    assert connected_entry(learner, "victim") is None
    assert connected_entry(learner, "real-1") is not None
    # Its partial unroll was discarded (no one has reused the slots since).
    np.testing.assert_array_equal(held_steps(learner.inference.store, entry.slots), [0] * num_envs)
    assert tap.count(MARK_VICTIM) == 0
    assert_training_continues(learner, procs=[actor])

    # A client reusing the freed slots gets unrolls made of its own steps only;
    # this also shows that the tap does see marked unrolls.
    after_before = tap.count(MARK_AFTER)
    stream_ready = workdir / "after.ready"
    after = subprocess.Popen(
        [sys.executable, str(workdir / "raw_client.py"), address, "after", str(num_envs),
         str(UNROLL_LENGTH + 1), str(MARK_AFTER), str(stream_ready), "finish"],
    )
    try:
        assert after.wait(timeout=WAIT_SECONDS) == 0
    finally:
        kill(after)
    assert stream_ready.exists()
    wait_until(lambda: tap.count(MARK_AFTER) - after_before == num_envs,  # one full unroll per env
               "the new client's unrolls")
    assert tap.count(MARK_VICTIM) == 0
    wait_until(lambda: learner.table.num_connected == 1, "the finished client to leave")
    assert_training_continues(learner, procs=[actor])


def test_sigkilled_real_actor_while_another_trains(healthy, workdir):
    learner, address, actor, _ = healthy
    doomed = start_actor(address, workdir, "doomed", num_envs=2)
    try:
        wait_until(lambda: connected_entry(learner, "doomed") is not None, "the doomed actor to connect")
        entry = connected_entry(learner, "doomed")
        frames = learner.table.frames
        wait_until(lambda: learner.table.frames > frames + 50, "frames from both actors")
        assert learner.table.num_connected == 2
        doomed.send_signal(signal.SIGKILL)
        assert doomed.wait(timeout=10) == -signal.SIGKILL
    finally:
        kill(doomed)
    wait_until(lambda: entry.closed, "the learner to notice the killed actor")
    wait_until(lambda: learner.table.num_connected == 1, "the killed actor to leave the table")
    assert connected_entry(learner, "doomed") is None
    np.testing.assert_array_equal(held_steps(learner.inference.store, entry.slots), [0, 0])
    assert not doomed.stats_file.exists()  # SIGKILL: no clean exit
    frames = learner.table.frames
    assert_training_continues(learner, procs=[actor])
    assert learner.table.frames > frames


# --- c. restarts ----------------------------------------------------------------------


def test_restarted_actor_is_a_new_run_and_old_stream_is_aborted(healthy, raw):
    learner, address, actor, tap = healthy
    runs_before = learner.table.runs_started
    old = raw.RawStream(address, timeout=WAIT_SECONDS)
    new = None
    try:
        old.handshake("a", "r1", 2)
        for _ in range(2):
            assert old.step(2, MARK_OLD_RUN).shape == (2,)
        old_entry = connected_entry(learner, "a")
        assert old_entry.run_id == "r1"
        wait_until(lambda: list(held_steps(learner.inference.store, old_entry.slots)) == [2, 2],
                   "a/r1's steps in the store")
        assert learner.table.runs_started == runs_before + 1

        new = raw.RawStream(address, timeout=WAIT_SECONDS)
        new.handshake("a", "r2", 2)
        assert learner.table.runs_started == runs_before + 2
        new_entry = connected_entry(learner, "a")
        assert new_entry is not old_entry and new_entry.run_id == "r2"
        assert old_entry.closed
        assert learner.table.num_connected == 2  # real-1 and a/r2

        # The old stream is refused on its next message.
        with pytest.raises(grpc.RpcError) as info:
            old.step(2, MARK_OLD_RUN)
        assert info.value.code() == grpc.StatusCode.ABORTED, info.value
        assert "superseded" in info.value.details()

        # The new run is served, and its unrolls hold none of the old run's steps.
        new_before = tap.count(MARK_NEW_RUN)
        for _ in range(UNROLL_LENGTH + 1):
            assert new.step(2, MARK_NEW_RUN).shape == (2,)
        wait_until(lambda: tap.count(MARK_NEW_RUN) - new_before == 2, "a/r2's unrolls")
        assert tap.count(MARK_OLD_RUN) == 0
        assert connected_entry(learner, "a") is new_entry and not new_entry.closed
        assert learner.table.num_connected == 2
    finally:
        old.close()
        if new is not None:
            new.close()
    wait_until(lambda: learner.table.num_connected == 1, "a/r2 to leave after closing")
    assert_training_continues(learner, procs=[actor])


def test_superseded_run_partial_unroll_is_dropped_from_store(healthy, raw):
    learner, address, actor, tap = healthy
    old = raw.RawStream(address, timeout=WAIT_SECONDS)
    new = None
    try:
        old.handshake("b", "r1", 2)
        for _ in range(3):
            old.step(2, MARK_OLD_RUN)
        old_entry = connected_entry(learner, "b")
        wait_until(lambda: list(held_steps(learner.inference.store, old_entry.slots)) == [3, 3],
                   "b/r1's steps in the store")
        # More envs after the restart: the new block may grow over the old one
        # (the env table keeps slots within its budget); either way the old
        # run's partial unrolls are gone from those slots.
        new = raw.RawStream(address, timeout=WAIT_SECONDS)
        new.handshake("b", "r2", 7)
        assert connected_entry(learner, "b").run_id == "r2"
        np.testing.assert_array_equal(held_steps(learner.inference.store, old_entry.slots), [0, 0])
    finally:
        old.close()
        if new is not None:
            new.close()
        wait_until(lambda: learner.table.num_connected == 1, "b to leave")


def test_actor_reconnects_to_a_restarted_learner(tmp_path):
    address = f"unix:{tmp_path}/restart.sock"
    first = Learner(CONFIG, address)
    second = None
    actor = None
    try:
        dialed = first.start()
        assert dialed == address
        actor = start_actor(
            dialed, tmp_path, "phoenix", num_envs=2, extra=("--retry-max-seconds", "30")
        )
        wait_until(lambda: connected_entry(first, "phoenix") is not None, "phoenix on learner 1",
                   learners=[first])
        frames = first.table.frames
        wait_until(lambda: first.table.frames > frames + 20, "frames on learner 1", learners=[first])
        second = Learner(CONFIG, address)  # compile before taking the first one down
        first.stop()
        first_frames = first.table.frames
        assert second.start() == address
        wait_until(lambda: connected_entry(second, "phoenix") is not None, "phoenix on learner 2",
                   learners=[second])
        wait_until(lambda: second.table.frames > 20, "frames on learner 2", learners=[second])
        assert second.table.runs_started == 1
        assert first.table.frames == first_frames  # learner 1 is really gone
        assert actor.poll() is None
        actor.send_signal(signal.SIGTERM)
        assert actor.wait(timeout=WAIT_SECONDS) == 0, actor.log_file.read_text()
        stats = json.loads(actor.stats_file.read_text())
        assert stats["connections"] >= 2, stats
        # Every frame learner 1 booked but the connection step's came from this actor.
        assert stats["frames"] >= first_frames - 2, (stats, first_frames)
    finally:
        if actor is not None:
            kill(actor)
        first.stop()
        if second is not None:
            second.stop()


def test_superseded_run_with_request_in_flight_is_aborted(tmp_path, raw):
    """a/r1's request waits in the batcher (blocked on a full queue) when a/r2 connects."""
    config = dataclasses.replace(
        CONFIG, server=dataclasses.replace(CONFIG.server, queue_capacity_unrolls=4)
    )
    learner = Learner(config, f"unix:{tmp_path}/inflight.sock")
    # The learner's own consumer sees an empty queue: the test drains it itself.
    real_get = learner.queue.get

    def gated_get(*args, timeout=None):
        time.sleep(min(timeout or 0.2, 0.2))
        return None

    learner.queue.get = learner.queue.take_all = gated_get  # the drain thread takes nothing
    streams = []
    try:
        address = learner.start(consume=drain_unrolls)

        def open_stream(timeout=WAIT_SECONDS):
            streams.append(raw.RawStream(address, timeout=timeout))
            return streams[-1]

        old = open_stream(timeout=10)
        old.handshake("a", "r1", 2)
        old.step(2)
        # Fill the queue, then let a full unroll block the batcher on it.
        assert learner.queue.try_put(
            {k: np.zeros((4, *v.shape), v.dtype)
             for k, v in schema.stored_sequence_shapes(learner.agent, learner.spec).items()}
        )
        filler = open_stream()
        filler.handshake("filler", "r", 2)
        for _ in range(UNROLL_LENGTH):
            filler.step(2)
        filler.send(codec.encode_steps([0, 1], np.zeros(2), np.zeros(2), np.zeros(2),
                                       np.zeros((2, 4), np.float32)))
        filler_entry = connected_entry(learner, "filler")
        wait_until(
            lambda: list(held_steps(learner.inference.store, filler_entry.slots)) == [1, 1],
            "the filler's unrolls to be finished",
        )
        old.send(codec.encode_steps([0, 1], np.zeros(2), np.zeros(2), np.zeros(2),
                                    np.zeros((2, 4), np.float32)))
        wait_until(lambda: len(learner.inference.waiting()) == 1, "a/r1's request to wait")
        new = open_stream()
        new.handshake("a", "r2", 2)
        assert learner.table.runs_started == 3
        # The filler was answered before its unroll met the full queue.
        assert filler.recv().WhichOneof("kind") == "actions"
        # Unblock the batcher.
        assert real_get(4, timeout=WAIT_SECONDS) is not None
        assert new.step(2).shape == (2,)
        with pytest.raises(grpc.RpcError) as info:
            old.recv()
        assert info.value.code() == grpc.StatusCode.ABORTED, info.value
    finally:
        for stream in streams:
            stream.close()
        learner.stop()


# --- parameters and compilation in steady state ---------------------------------------


def test_actions_use_fresh_parameters_and_steady_state_never_recompiles(healthy, raw):
    """Every reply names the policy version that chose it: it tracks the learner's
    version (published after every train step) and grows while training runs.
    The jitted policy compiles once per padded batch size, never again."""
    learner, address, _, _ = healthy
    stream = raw.RawStream(address, timeout=WAIT_SECONDS)
    versions = []
    try:
        stream.handshake("version-probe", uuid.uuid4().hex, 2)
        obs = np.zeros((2, 4), np.float32)
        zeros = np.zeros(2)
        compiles_before = None
        for i in range(60):
            learner_version = learner.version
            stream.send(codec.encode_steps([0, 1], zeros, zeros, zeros, obs))
            reply = stream.recv()
            versions.append(reply.actions.policy_version)
            # Published right after the learner's counter moves: never older than that.
            assert reply.actions.policy_version >= learner_version - 1
            assert reply.actions.policy_version <= learner.version
            if i == 10:
                compiles_before = learner.inference.stats.compiles
            time.sleep(0.01)
    finally:
        stream.close()
    assert versions == sorted(versions)
    assert versions[-1] > versions[0], "training went on, so the policy must have changed"
    # Both batch sizes in play (the real actor's 4 envs, this client's 2, both
    # together) pad to buckets compiled during the first steps.
    assert learner.inference.stats.compiles == compiles_before


# --- slow and stuck actors ---------------------------------------------------------------


def test_stuck_and_slow_actors_never_hold_back_a_healthy_one(healthy, raw):
    """A stuck stream (answered once, then silent) and a slow one (a message a
    second) beside a healthy one: the healthy one's steps keep being answered,
    the batcher waits for the stuck one at most once and for the slow one at
    most once per message it sends, and neither holds more than its own slots."""
    learner, address, actor, _ = healthy
    stuck = raw.RawStream(address, timeout=WAIT_SECONDS)
    slow = raw.RawStream(address, timeout=WAIT_SECONDS)
    probe = raw.RawStream(address, timeout=WAIT_SECONDS)
    slow_sent = []
    try:
        stuck.handshake("stuck", uuid.uuid4().hex, 3)
        assert stuck.step(3).shape == (3,)  # answered once; then it never sends again
        stuck_entry = connected_entry(learner, "stuck")
        slow.handshake("slow", uuid.uuid4().hex, 2)
        slow_entry = connected_entry(learner, "slow")
        probe.handshake("probe", uuid.uuid4().hex, 2)

        def slow_actor():
            for _ in range(3):
                slow.step(2)
                slow_sent.append(None)
                time.sleep(1.0)

        slow_thread = threading.Thread(target=slow_actor)
        slow_thread.start()
        answered = 0
        while slow_thread.is_alive() or answered < 300:
            assert probe.step(2).shape == (2,)
            answered += 1
            assert answered < 100_000
        slow_thread.join()
        # The stuck stream is still connected, holding only its own 3 slots and no request.
        assert connected_entry(learner, "stuck") is stuck_entry and not stuck_entry.closed
        np.testing.assert_array_equal(held_steps(learner.inference.store, stuck_entry.slots), [1, 1, 1])
        assert stuck_entry not in learner.inference.waiting()
        assert stuck_entry.timed_out_waits <= 1, stuck_entry.timed_out_waits
        assert slow_entry.timed_out_waits <= len(slow_sent) == 3, slow_entry.timed_out_waits
    finally:
        for stream in (stuck, slow, probe):
            stream.close()
    wait_until(lambda: learner.table.num_connected == 1, "the three streams to leave")
    assert_training_continues(learner, procs=[actor])


def test_bench_stuck_reports_each_phase_side_by_side():
    """`seedq bench stuck`, shortest run: every phase measured, and (counts, not
    times) the batcher waited for the stuck stream at most once, and for the
    slow one no more often than the steps it sent."""
    result = subprocess.run(
        [sys.executable, "-m", "seedq.cli", "bench", "stuck", "--envs-per-actor", "4", "--seconds", "1",
         "--warmup-seconds", "0.5", "--rounds", "1", "--slow-actors", "1", "--no-train", "--json"],
        capture_output=True, text=True, timeout=150,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    phases = report["phases"]
    assert set(phases) == {"alone", "stuck", "slow"}
    for phase in phases.values():
        assert phase["inference_batches"][0] > 0 and phase["rtt_p99_ms"][0] > 0
    assert phases["stuck"]["silent_messages"] == [1]
    assert phases["stuck"]["timed_out_waits"][0] <= 1  # at most the one after its step
    assert phases["slow"]["timed_out_waits"][0] <= phases["slow"]["silent_messages"][0]
    assert report["rtt_p99_ratio_stuck_to_alone"] > 0 and report["rtt_p99_ratio_slow_to_alone"] > 0
