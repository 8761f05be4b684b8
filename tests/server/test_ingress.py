"""seedq.server.ingress: an error the learner's process answers an ingress
process's request with ends the actor's stream with the status it would have
had from the learner's own process."""

from __future__ import annotations

import pytest

from seedq.server import ingress
from seedq.server.env_table import SlotBudgetExhausted
from seedq.server.errors import LearnerFailed, RunEnded, RunSuperseded, ServerClosing
from seedq.server.service import StreamGuard

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
