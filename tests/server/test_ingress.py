"""seedq.server.ingress: an error the learner's process answers an ingress
process's request with ends the actor's stream with the status it would have
had from the learner's own process; steps, actions and other messages cross
the link between the processes intact."""

from __future__ import annotations

import numpy as np
import pytest

from seedq.schema import EnvSpec
from seedq.server import ingress
from seedq.server.env_table import SlotBudgetExhausted
from seedq.server.errors import LearnerFailed, RunEnded, RunSuperseded, ServerClosing
from seedq.server.service import StreamGuard
from seedq.wire.codec import Steps

pytestmark = pytest.mark.unit


class _Context:
    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


ERRORS = [
    RunEnded("target_return"),
    LearnerFailed(RuntimeError("device lost")),
    ServerClosing(),
    RunSuperseded(),
    SlotBudgetExhausted("slot budget: 8 of this learner's 8 env slots are in use (server.max_envs)"),
    ValueError("actor a run r is already connected"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_a_forwarded_error_ends_the_stream_as_in_the_learners_process(error):
    guard = StreamGuard(_Context())
    rebuilt = ingress.rebuilt_error(*ingress.error_reply(error))
    assert type(rebuilt) is type(error)
    assert str(rebuilt) == str(error)
    assert guard.status_of(rebuilt) == guard.status_of(error)


def test_the_run_end_keeps_its_stop_reason():
    assert ingress.rebuilt_error(*ingress.error_reply(RunEnded("max_frames"))).stop_reason == "max_frames"


def test_an_unexpected_error_is_internal_and_named():
    rebuilt = ingress.rebuilt_error(*ingress.error_reply(KeyError("slot")))
    code, details = StreamGuard(_Context()).status_of(rebuilt)
    assert code.name == "INTERNAL" and "KeyError" in details


def _link_round_trip(send, spec) -> tuple:
    """What `ingress.receive` reads at one end of a real socket pair after `send(writer)` at the other."""
    import asyncio
    import socket

    async def main():
        mine, theirs = socket.socketpair()
        _, writer = await asyncio.open_unix_connection(sock=mine)
        reader, other_writer = await asyncio.open_unix_connection(sock=theirs)
        send(writer)
        await writer.drain()
        message = await ingress.receive(reader, spec)
        writer.close()
        other_writer.close()
        return message

    return asyncio.run(main())


PONG = EnvSpec(obs_dtype="uint8", obs_shape=(84, 84, 4), num_actions=6)
CHEETAH = EnvSpec(obs_dtype="float32", obs_shape=(17,), action_shape=(6,), action_low=(-1.0,) * 6,
                  action_high=(1.0,) * 6)


@pytest.mark.parametrize("spec", [PONG, CHEETAH], ids=["pong", "cheetah"])
def test_a_step_crosses_the_link_with_every_array_intact(spec):
    rng = np.random.default_rng(0)
    n = 5
    steps = Steps(np.array([4, 0, 2, 1, 3], dtype="<i4"), rng.normal(size=n).astype("<f4"),
                  np.array([1, 0, 0, 1, 0], bool), np.array([0, 0, 1, 0, 0], bool),
                  rng.integers(0, 255, (n, *spec.obs_shape)).astype(spec.obs_dtype))
    kind, request_id, handle, received = _link_round_trip(
        lambda w: ingress.send_steps(w, 7, 2**63 + 5, steps), spec)
    assert (kind, request_id, handle) == ("steps", 7, 2**63 + 5)
    for name in ("env_indices", "rewards", "terminated", "truncated", "observations"):
        sent, got = getattr(steps, name), getattr(received, name)
        assert got.dtype == sent.dtype and got.shape == sent.shape, name
        np.testing.assert_array_equal(got, sent, err_msg=name)


@pytest.mark.parametrize("spec", [PONG, CHEETAH], ids=["pong", "cheetah"])
def test_the_actions_that_answer_a_step_read_as_a_pickled_reply_would(spec):
    rng = np.random.default_rng(1)
    shape = (3, *spec.action_shape)
    actions = (rng.integers(0, spec.num_actions, shape) if spec.discrete else rng.normal(size=shape)
               ).astype(spec.action_dtype)
    message = _link_round_trip(lambda w: ingress.send_actions(w, 11, actions, 42), spec)
    assert message[:3] == ("reply", 11, True)
    got, version = message[3]
    assert version == 42 and got.dtype == actions.dtype
    np.testing.assert_array_equal(got, actions)


def test_other_messages_cross_the_link_as_they_were_sent():
    message = ("reply", 3, False, ingress.error_reply(RunEnded("max_frames")))
    assert _link_round_trip(lambda w: ingress.send(w, message), PONG) == message
