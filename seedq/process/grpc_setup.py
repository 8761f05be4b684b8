"""Process-wide gRPC settings and the event loop that seedq's gRPC code runs on.

The SEED loop's speed on small machines is set by the latency of each
message hop between processes, not by the work per message
(docs/benchmarks.md, "Transport tuning": ~600-700 rounds/s whatever a message carries).
Two settings cut that latency, and only together (2 actors x 32 CartPole
envs, inference only: median 53k frames/s over 8 runs against 45k with
gRPC and asyncio defaults; each setting alone: +3-5 %):

  * gRPC core's legacy poller instead of its EventEngine threads. With the
    EventEngine, a message read on an EventEngine thread is handed to the
    thread polling the completion queue and then to the asyncio loop; with
    the legacy poller the polling thread reads the socket itself. The
    switch is gRPC's documented `GRPC_EXPERIMENTS` environment variable,
    which gRPC reads when `grpc` is first imported, so `seedq/__init__`
    sets it before any seedq module imports grpc (child processes inherit
    it). A value the user set is kept.
  * uvloop as the asyncio event loop of the learner's server thread and of
    the actors (`run`), which wakes faster than the default selector loop
    when gRPC's poller thread hands it a completion.

`SEEDQ_GRPC_TUNING=0` turns both off (plain gRPC and asyncio defaults).
"""

from __future__ import annotations

import asyncio
import os
import sys
from importlib import metadata
from typing import Any, Coroutine

# gRPC core experiments that route socket I/O through EventEngine threads;
# disabled together ("-name"), i.e. the legacy iomgr poller everywhere.
EVENT_ENGINE_EXPERIMENTS = (
    "event_engine_client",
    "event_engine_listener",
    "event_engine_callback_cq",
    "event_engine_for_all_other_endpoints",
)
# grpcio releases measured with these experiment names. A newer gRPC that
# finalizes an experiment would log "Unknown experiment" for it, so other
# versions keep gRPC's defaults until re-measured
# (tests/process/test_grpc_setup.py fails on a version that rejects the names).
MEASURED_GRPC_VERSIONS = ((1, 85), (1, 86), (1, 87), (1, 88), (1, 89))


def tuning_enabled() -> bool:
    return os.environ.get("SEEDQ_GRPC_TUNING", "1").strip().lower() not in ("0", "off", "false", "no")


def _grpc_version() -> tuple[int, int] | None:
    try:
        major, minor = metadata.version("grpcio").split(".")[:2]
        return int(major), int(minor)
    except (metadata.PackageNotFoundError, ValueError):
        return None


def configure_environment() -> None:
    """Sets GRPC_EXPERIMENTS for this process and its children (see module docstring).

    Has no effect on this process if `grpc` was imported before seedq, and
    none at all if the user set GRPC_EXPERIMENTS or SEEDQ_GRPC_TUNING=0.
    """
    if not tuning_enabled() or "GRPC_EXPERIMENTS" in os.environ:
        return
    if _grpc_version() not in MEASURED_GRPC_VERSIONS:
        return
    os.environ["GRPC_EXPERIMENTS"] = ",".join("-" + name for name in EVENT_ENGINE_EXPERIMENTS)


def quiet_core_logs() -> None:
    """Actors: only gRPC core's errors on stderr (GRPC_VERBOSITY=ERROR, unless set).

    Core logs every failed TLS handshake at INFO; an actor that is refused
    already says why in its one-line exit message. Takes effect only before
    `grpc` is imported. The learner keeps core's default, so its log records
    the handshakes it refused."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def _loop_factory():
    if not tuning_enabled() or sys.platform == "win32":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """`asyncio.run(coro)`, on uvloop when it is installed and tuning is on."""
    factory = _loop_factory()
    if factory is None or not hasattr(asyncio, "Runner"):  # asyncio.Runner: Python 3.11+
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)
