"""The wire contract as another language would read it (docs/wire.md).

`ContractClient` is written only from docs/wire.md and the comments in
seed.proto: raw protobuf messages through the generated stubs, arrays packed
with NumPy by the documented byte rules, real gymnasium CartPole envs stepped
with the documented reset rule. None of seedq's actor or codec code is used
on the client side, so a rule the document gets wrong (or the learner breaks)
fails here.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import subprocess
import sys
import uuid

import grpc
import gymnasium as gym
import numpy as np
import pytest

from seedq.config import ServerConfig, TrainConfig, VTraceConfig
from seedq.learner.learner import Learner
from seedq.v1 import seed_pb2, seed_pb2_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CONFIG = dataclasses.replace(
    TrainConfig(),
    env="CartPole-v1",
    vtrace=dataclasses.replace(VTraceConfig(), unroll_length=5, batch_size=4),
    server=dataclasses.replace(ServerConfig(), queue_capacity_unrolls=64, max_batch_size=16),
)
DEADLINE_SECONDS = 60.0


# --- the client: docs/wire.md only -------------------------------------------------


class ContractClient:
    """One Stream call. Arrays are raw little-endian bytes (wire.md, "Byte order")."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        # One request in flight: every send() is followed by its recv().
        self._queue: queue.Queue = queue.Queue()
        stub = seed_pb2_grpc.LearnerStub(self.channel)
        self.call = stub.Stream(iter(self._queue.get, None), timeout=DEADLINE_SECONDS)

    def send(self, message: seed_pb2.ActorMessage) -> None:
        self._queue.put(message)

    def recv(self) -> seed_pb2.LearnerMessage:
        return next(self.call)

    def handshake(self, num_envs: int, dtype: str = "<f4", shape=(4,), actions: int = 2,
                  actor_id: str = "contract") -> seed_pb2.LearnerMessage:
        self.send(seed_pb2.ActorMessage(handshake=seed_pb2.Handshake(
            protocol_version=1, actor_id=actor_id, run_id=uuid.uuid4().hex, num_envs=num_envs,
            observation=seed_pb2.TensorSpec(dtype=dtype, shape=list(shape)),
            action_space=seed_pb2.ActionSpace(discrete=actions), env_id="CartPole-v1",
        )))
        return self.recv()

    def step(self, indices, rewards, terminated, truncated, observations) -> np.ndarray:
        self.send(seed_pb2.ActorMessage(steps=seed_pb2.StepBatch(
            env_indices=np.asarray(indices, "<i4").tobytes(),
            rewards=np.asarray(rewards, "<f4").tobytes(),
            terminated=np.asarray(terminated, "u1").tobytes(),
            truncated=np.asarray(truncated, "u1").tobytes(),
            observations=np.asarray(observations, "<f4").tobytes(),
        )))
        reply = self.recv()
        assert reply.WhichOneof("kind") == "actions", reply
        # Discrete: int32[n], one per env of the batch, in the batch's order.
        actions = np.frombuffer(reply.actions.actions, "<i4")
        assert actions.shape == (len(indices),)
        return actions

    def close(self) -> None:
        self._queue.put(None)
        self.call.cancel()
        self.channel.close()


def run_episodes(client: ContractClient, num_envs: int, episodes: int, max_batches: int, seed: int):
    """Steps real CartPole envs by the reset-step rule until `episodes` ended.

    Reset steps carry a deliberately wrong reward (1000) and set flags: the
    contract says the learner ignores both, so the episode returns it books
    must equal the true ones. Batches alternate between all envs (reversed
    order) and a subset, which the contract allows. Returns the episodes'
    (return, length) in the order they ended.
    """
    envs = [gym.make("CartPole-v1") for _ in range(num_envs)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    reward = np.full(num_envs, 1000.0)  # ignored: every first step is a reset step
    terminated = np.ones(num_envs, bool)
    truncated = np.ones(num_envs, bool)
    reset_step = np.ones(num_envs, bool)
    ep_return, ep_length = np.zeros(num_envs), np.zeros(num_envs, int)
    finished = []
    for batch in range(max_batches):
        if len(finished) >= episodes:
            break
        subset = np.arange(num_envs)[::-1] if batch % 2 == 0 else np.arange(0, num_envs, 2)
        actions = client.step(subset, reward[subset], terminated[subset], truncated[subset], obs[subset])
        assert set(actions.tolist()) <= {0, 1}, actions
        for i, action in zip(subset, actions):
            if (terminated[i] or truncated[i]) and not reset_step[i]:
                # The answer to a final observation is discarded: reset instead.
                finished.append((ep_return[i], ep_length[i]))
                obs[i] = envs[i].reset()[0]
                reward[i], terminated[i], truncated[i] = 1000.0, True, False
                reset_step[i] = True
                ep_return[i], ep_length[i] = 0.0, 0
                continue
            obs[i], reward[i], terminated[i], truncated[i], _ = envs[i].step(int(action))
            reset_step[i] = False
            ep_return[i] += reward[i]
            ep_length[i] += 1
    for env in envs:
        env.close()
    return finished


# --- fixtures ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    learner = Learner(CONFIG, f"unix:{tmp_path_factory.mktemp('contract')}/learner.sock")
    try:
        learner.address = learner.start()
        yield learner
    finally:
        learner.stop()


def refusal(client_fn) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        client_fn()
    return info.value


def assert_no_error_logged(caplog):
    bad = [r for r in caplog.records if r.name.startswith("seedq") and (r.exc_info or r.levelno >= logging.ERROR)]
    assert not bad, [r.getMessage() for r in bad]


# --- tests ------------------------------------------------------------------------


def test_contract_client_is_answered_through_cartpole_episodes(learner, caplog):
    """The handshake reply carries the expected spec; every step is answered with
    one valid action per env; the learner books exactly the episodes the client
    played (reset steps' rewards and flags ignored)."""
    caplog.set_level(logging.INFO, logger="seedq")
    client = ContractClient(learner.address)
    booked_before = learner.table.episodes.count
    try:
        reply = client.handshake(num_envs=4)
        assert reply.WhichOneof("kind") == "ack", reply
        ack = reply.ack
        assert ack.protocol_version == 1
        assert ack.learner_run
        assert ack.observation.dtype == "float32" and list(ack.observation.shape) == [4]
        assert ack.action_space.WhichOneof("kind") == "discrete" and ack.action_space.discrete == 2
        # 30 episodes of a near-random CartPole policy take ~600 env steps; the
        # batch bound (4000 batches of 2-4 envs, ~12,000 env steps) is ample.
        finished = run_episodes(client, num_envs=4, episodes=30, max_batches=4000, seed=11)
    finally:
        client.close()
    assert len(finished) >= 30
    returns, lengths = learner.table.episodes.window()
    booked = learner.table.episodes.count - booked_before
    assert booked == len(finished)
    # Same episodes, ended in the same order (the learner books on each final step).
    np.testing.assert_allclose(returns[-booked:], [r for r, _ in finished])
    assert lengths[-booked:] == [n for _, n in finished]
    assert all(r < 1000 for r in returns[-booked:]), "a reset step's reward was booked"
    assert_no_error_logged(caplog)


@pytest.mark.parametrize("dtype", ["S16", "U4", "V16", "f4,", ">f4"])
def test_unreadable_and_big_endian_dtypes_are_refused_naming_the_field(learner, dtype, caplog):
    caplog.set_level(logging.INFO, logger="seedq")
    client = ContractClient(learner.address)
    try:
        error = refusal(lambda: client.handshake(num_envs=1, dtype=dtype))
    finally:
        client.close()
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert error.details().startswith("handshake.observation.dtype:"), error.details()
    assert repr(dtype) in error.details()
    assert_no_error_logged(caplog)


@pytest.mark.parametrize("dtype", ["float32", "<f4", "f4", "=f4"])
def test_little_endian_and_native_spellings_of_the_dtype_are_accepted(learner, dtype):
    client = ContractClient(learner.address)
    try:
        assert client.handshake(num_envs=1, dtype=dtype).WhichOneof("kind") == "ack"
    finally:
        client.close()


def test_mismatch_refusal_names_both_sides(learner):
    client = ContractClient(learner.address)
    try:
        error = refusal(lambda: client.handshake(num_envs=1, shape=(5,)))
    finally:
        client.close()
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = error.details()
    assert details.startswith("handshake.observation.shape:"), details
    assert "actor sends [5]" in details and "learner expects [4]" in details
    assert "Discrete(2)" in details  # the learner's whole expected spec


def test_an_actor_for_another_env_is_refused_in_one_line_naming_both_env_ids(learner):
    """`seedq actor --env Acrobot-v1` at a CartPole learner: the env ids, not only two shapes."""
    actor = subprocess.run(
        [sys.executable, "-m", "seedq.cli", "actor", "--server", learner.address, "--env", "Acrobot-v1",
         "--num-envs", "2", "--actor-id", "acrobot", "--retry-max-seconds", "30"],
        capture_output=True, text=True, timeout=120,
    )
    assert actor.returncode == 2, actor.stderr
    lines = actor.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in actor.stderr, actor.stderr
    assert "Acrobot-v1" in lines[0] and "CartPole-v1" in lines[0], lines[0]
    client = ContractClient(learner.address)  # the learner serves on
    try:
        assert client.handshake(num_envs=1).WhichOneof("kind") == "ack"
    finally:
        client.close()


def test_step_before_handshake_is_failed_precondition(learner):
    client = ContractClient(learner.address)
    try:
        error = refusal(lambda: client.step([0], [0.0], [0], [0], np.zeros((1, 4))))
    finally:
        client.close()
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
    assert error.details().startswith("handshake:"), error.details()


def test_an_unexpected_error_is_internal_and_logged_with_its_traceback(learner, caplog, monkeypatch):
    """Never gRPC's UNKNOWN: a learner bug is INTERNAL, with a traceback in the log."""
    caplog.set_level(logging.INFO, logger="seedq")

    async def broken_submit(entry, steps):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(learner.inference, "submit", broken_submit)
    client = ContractClient(learner.address)
    try:
        assert client.handshake(num_envs=1).WhichOneof("kind") == "ack"
        error = refusal(lambda: client.step([0], [0.0], [0], [0], np.zeros((1, 4))))
    finally:
        client.close()
    assert error.code() == grpc.StatusCode.INTERNAL, error
    assert "RuntimeError: injected fault" in error.details()
    logged = [r for r in caplog.records if r.exc_info and r.levelno >= logging.ERROR]
    assert len(logged) == 1 and "injected fault" in str(logged[0].exc_info[1])
