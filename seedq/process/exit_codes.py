"""The exit status of every seedq command, in one table.

Supervisors read these: a Kubernetes podFailurePolicy (launch/k8s.py), a
shell loop, `seedq compare` waiting on its runs. docs/reliability.md lists
them for users.
"""

from __future__ import annotations

import signal

# The run met its stop condition (target return, frame or time budget), or
# the command did what it was asked.
FINISHED = 0
# Something failed while running (a learner error, an unreadable file, a lost
# learner for an actor that gave up): the same command may work on a retry.
RUNTIME_FAILURE = 1
# Bad flags, config or credentials: the same command fails the same way again.
USAGE = 2
# A process of a multi-host learner group stopped answering; the group must restart together.
PEER_LOST = 3
# Ctrl-C (SIGINT), after the run's checkpoint.
INTERRUPTED = 128 + signal.SIGINT
# SIGTERM (an eviction, a preemption, `kubectl delete`), after the run's
# checkpoint, when the run had not met its stop condition yet: a supervisor
# must start it again (`--resume auto` continues it).
TERMINATED = 128 + signal.SIGTERM


class UsageError(ValueError):
    """A configuration the command refuses before it starts (exit USAGE)."""


def for_stop_reason(stop_reason: str) -> int:
    """The exit status of a learner run that ended with `stop_reason`
    (summary.json's): 0 for its stop conditions, non-zero for the rest."""
    return {
        "interrupted": INTERRUPTED,
        "terminated": TERMINATED,
        "learner_error": RUNTIME_FAILURE,
        "actors_exited": RUNTIME_FAILURE,
        "no_actors": RUNTIME_FAILURE,
    }.get(stop_reason, FINISHED)
