"""Which capacity sets a run's rate: `env`, `inference`, `training` or
`transport`, from what the server's batch loop already measures (its busy
time, its waits for room in the unroll queue, its thread's CPU time, the
frames dropped unseen). `seedq bench throughput --json`, the progress line
and summary.json give the same verdict: more actors help where it is `env`,
more or faster accelerators where it is `inference` or `training`.

Standard library only: the learner's reporter and the benchmarks share it.
"""

from __future__ import annotations

# A capacity binds when the loop spends at least this share of its time on it.
BINDING_SHARE = 0.5


def bottleneck_of(train: bool, queue_full_share: float, inference_share: float,
                  server_thread_busy: float | None, dropped_share: float = 0.0) -> str:
    """Which capacity set the loop's rate, from what the loop measured:
    `training` when the batch loop waited for the learner to make room for
    at least BINDING_SHARE of the time (the actors were held back), or that
    share of the frames was dropped unseen (the learner could not keep up), else
    `inference` when running the policy took that share of the server
    thread's wall time, else `transport` when the server thread was that
    busy all the same (gRPC, batching, decoding), else `env`: the loop was
    waiting for the actors' steps."""
    if train and (queue_full_share >= BINDING_SHARE or dropped_share >= BINDING_SHARE):
        return "training"
    if inference_share >= BINDING_SHARE:
        return "inference"
    if server_thread_busy is not None and server_thread_busy >= BINDING_SHARE:
        return "transport"
    return "env"


def run_bottleneck(seconds: float, *, busy_seconds: float, held_seconds: float,
                   thread_cpu_seconds: float | None, frames: int, dropped_frames: int) -> str | None:
    """The verdict over `seconds` of a running learner, from the batch loop's
    busy seconds (waits for queue room included), those waits (`held`), the
    server thread's CPU seconds, and what reached the unroll queue and what
    it dropped (any unit: unrolls); None when the interval is empty."""
    if seconds <= 0:
        return None
    return bottleneck_of(
        True, held_seconds / seconds, max(busy_seconds - held_seconds, 0.0) / seconds,
        None if thread_cpu_seconds is None else thread_cpu_seconds / seconds,
        dropped_frames / frames if frames > 0 else 0.0,
    )
