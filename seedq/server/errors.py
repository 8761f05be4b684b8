"""Why a stream's request is not answered with actions: the errors the
batching `InferenceServer` raises and the service maps to a status (a module
without JAX, so that an ingress process (`seedq.server.ingress`) need not load it)."""

from __future__ import annotations

from seedq.wire import codec


class ServerClosing(Exception):
    """The learner is shutting down; the stream should end with UNAVAILABLE."""


class RunEnded(ServerClosing):
    """The run is over for good (target, budget, the user's interrupt): streams
    that read RunEnded are told so, the others end with UNAVAILABLE."""

    def __init__(self, stop_reason: str):
        super().__init__(f"{codec.RUN_ENDED_MARKER} ({stop_reason})")
        self.stop_reason = stop_reason


class RunSuperseded(Exception):
    """The actor reconnected with a new run id while this request waited."""


class LearnerFailed(ServerClosing):
    """Inference failed: the learner stops (summary.json names `cause`); every
    stream ends with UNAVAILABLE saying so, and actors reconnect to its restart."""

    def __init__(self, cause: BaseException):
        super().__init__(f"{codec.LEARNER_FAILED_MARKER} ({type(cause).__name__}: {cause}) and is stopping")
        self.cause = cause
