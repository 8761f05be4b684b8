"""The learner processes of one run (a multi-host learner; docs/devices.md "Multi-host").

`initialize(config.distributed)` joins the group through `jax.distributed`
before anything else touches JAX, and returns a `ProcessGroup`: this
process's index, the group size, and `exchange`, the run's small control
plane. One process (no `--distributed.*` flags, no detected cluster) gets
`SOLO`, a group of one whose `exchange` is a plain function call, so a
single-process run is exactly today's.

The control plane is the coordination service's key-value store (the gRPC
service process 0 runs for `jax.distributed`), not device collectives: the
reporter thread decides stops and checkpoints while the training thread runs
the data-parallel update, and two threads issuing device collectives in an
order that can differ between hosts could deadlock; the key-value store is
independent of the devices. Each round every process posts a small JSON
report, process 0 reads them all, decides, and posts one decision that every
process reads: decided once, acted on everywhere.

A dead process: the coordination service notices its missing heartbeats
after `heartbeat_timeout_seconds` (a dead process 0 is noticed at once, its
service is gone) and reports the error to every live client. JAX's default
reaction is a fatal C++ log with a stack trace; seedq hands the client a
callback instead that prints one line naming the dead process and exits
(`DEAD_PEER_EXIT_CODE`). `jax.distributed.initialize` does not take that
callback, so it is added where jax creates its client (`_client_with_callback`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sys
from typing import Any, Callable

from seedq.config import DistributedConfig

# Exit status of a learner process whose group lost a member.
DEAD_PEER_EXIT_CODE = 3
# JAX's cluster environments seedq lets auto-detection use (jax._src.clusters
# names): Cloud TPU VMs (GCE metadata) and TPU pods on GKE (TPU_WORKER_HOSTNAMES
# / TPU_PROCESS_ADDRESSES). JAX's plain Kubernetes, Slurm and Open MPI
# detection is not used: it would turn every single-learner pod or batch job
# into a "group" (and Kubernetes detection needs pod-reading RBAC).
AUTO_DETECTED = ("gcetpu", "gketpu")
_KEY = "seedq/control"


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """This process's place in the group and the control plane's exchange."""

    index: int = 0
    size: int = 1
    client: Any = None  # jax's DistributedRuntimeClient (None: one process)
    timeout_seconds: float = 300.0
    _round: list = dataclasses.field(default_factory=lambda: [0])

    @property
    def is_leader(self) -> bool:
        """Process 0: the one that decides, and alone writes the run directory."""
        return self.index == 0

    @property
    def multi(self) -> bool:
        return self.size > 1

    def describe(self) -> str:
        return f"learner process {self.index} of {self.size}"

    def exchange(self, report: dict, decide: Callable[[list[dict]], dict]) -> dict:
        """One round: every process's `report` (JSON-able) goes to process 0,
        which calls `decide(reports)` (reports in process order) and whose
        decision every process returns. Blocks until the round is complete."""
        if not self.multi:
            return decide([report])
        r = self._round[0]
        self._round[0] += 1
        timeout_ms = int(self.timeout_seconds * 1000)
        if self.is_leader:
            reports = [report]
            for p in range(1, self.size):
                reports.append(json.loads(self._get(f"{_KEY}/{r}/report/{p}", timeout_ms, p)))
            decision = decide(reports)
            self.client.key_value_set(f"{_KEY}/{r}/decision", json.dumps(decision))
            if r >= 2:  # every process has read round r - 2's decision (they posted round r - 1)
                with contextlib.suppress(Exception):
                    self.client.key_value_delete(f"{_KEY}/{r - 2}/")
            return decision
        self.client.key_value_set(f"{_KEY}/{r}/report/{self.index}", json.dumps(report))
        return json.loads(self._get(f"{_KEY}/{r}/decision", timeout_ms, 0))

    def _get(self, key: str, timeout_ms: int, peer: int) -> str:
        try:
            return self.client.blocking_key_value_get(key, timeout_ms)
        except Exception as e:  # noqa: BLE001 - the coordination service's errors are one line here
            raise PeerLost(
                f"learner process {peer} of {self.size} did not answer within "
                f"{timeout_ms / 1000:g} s ({_first_line(e)})"
            ) from None


SOLO = ProcessGroup()


class PeerLost(RuntimeError):
    """Another learner process of the group stopped answering (one-line message)."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def detected_environment() -> str | None:
    """The JAX cluster environment this process runs in, of `AUTO_DETECTED`, or None."""
    # Private but stable for years: jax lists its cluster environments here
    # and offers no public way to ask whether one is present.
    from jax._src import clusters

    for env in clusters.ClusterEnv._cluster_types:
        if getattr(env, "name", "") in AUTO_DETECTED:
            with contextlib.suppress(Exception):
                if env.is_env_present():
                    return env.name
    return None


def dead_processes(message: str) -> list[int]:
    """Process indices named in a coordination-service error ("The following
    tasks are unhealthy ...:\\n1\\n", "/job:jax_worker/replica:0/task:1")."""
    found = [int(x) for x in re.findall(r"task:(\d+)", message)]
    unhealthy = re.search(r"unhealthy[^\n]*:\s*\n((?:\s*\d+\s*\n?)+)", message)
    if unhealthy:
        found += [int(x) for x in unhealthy.group(1).split()]
    return sorted(set(found))


def dead_peer_line(index: int, size: int, message: str) -> str:
    """The one line a learner process prints when its group lost a member."""
    dead = [p for p in dead_processes(message) if p != index]
    if dead:
        who = ", ".join(f"learner process {p}" for p in dead)
        what = f"{who} of {size} died (no heartbeat)"
    elif "coordination service" in message and index != 0:
        what = f"learner process 0 of {size} (the coordinator) died"
    else:
        what = f"the learner group of {size} failed ({_first_line(Exception(message))})"
    return f"seedq learner: {what}; learner process {index} stops (resume the group with --resume)"


def _on_fatal_error(index: int, size: int, cleanup: Callable[[], None]):
    def callback(status) -> None:
        # Called on a coordination-service thread: say it once and exit now
        # (the group cannot checkpoint without its lost member; the last
        # periodic checkpoint is where --resume continues).
        print(dead_peer_line(index, size, str(status)), file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            cleanup()
        os._exit(DEAD_PEER_EXIT_CODE)

    return callback


@contextlib.contextmanager
def _client_with_callback(callback):
    """jax.distributed.initialize, with `callback` as the client's
    missed-heartbeat/fatal-error callback (jax passes none: the default aborts
    with a C++ stack trace)."""
    from jax._src import distributed as jax_distributed

    real = jax_distributed._jax

    class _Shim:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def get_distributed_runtime_client(*args, **kwargs):
            kwargs.setdefault("missed_heartbeat_callback", callback)
            return real.get_distributed_runtime_client(*args, **kwargs)

    jax_distributed._jax = _Shim()
    try:
        yield
    finally:
        jax_distributed._jax = real


_cleanups: list[Callable[[], None]] = []


def at_fatal_error(fn: Callable[[], None]) -> None:
    """Runs `fn` (cheap, local: remove a socket file) before a lost-peer exit."""
    _cleanups.append(fn)


def _run_cleanups() -> None:
    for fn in _cleanups:
        with contextlib.suppress(Exception):
            fn()


_group: ProcessGroup | None = None


def initialize(config: DistributedConfig) -> ProcessGroup:
    """Joins the group `config` names (or a detected one); SOLO without one.
    Call before any other JAX use. ValueError (one line) on a bad group."""
    global _group
    if _group is not None:
        return _group
    detected = None
    if not config.explicit:
        detected = detected_environment() if config.auto_detect else None
        if detected is None:
            _group = SOLO
            return SOLO
    import jax

    # Cross-process collectives on CPU hosts need a CPU collectives
    # implementation (gloo, jax 0.10's default; set so it stays so).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs = dict(
        initialization_timeout=config.initialization_timeout_seconds,
        heartbeat_timeout_seconds=config.heartbeat_timeout_seconds,
        shutdown_timeout_seconds=config.shutdown_timeout_seconds,
    )
    if config.explicit:
        kwargs.update(coordinator_address=config.coordinator, num_processes=config.num_processes,
                      process_id=config.process_id)
    else:
        kwargs.update(cluster_detection_method=detected)
    index = config.process_id if config.explicit else None
    size = config.num_processes if config.explicit else None

    def late_callback(status):  # index and size are known by the time an error can come
        _on_fatal_error(jax.process_index(), jax.process_count(), _run_cleanups)(status)

    try:
        with _client_with_callback(late_callback):
            jax.distributed.initialize(**kwargs)
    except Exception as e:  # noqa: BLE001 - a failed join is one line
        where = config.coordinator or f"the {detected} environment"
        raise ValueError(f"could not join the learner group at {where}: {_first_line(e)}") from None
    index, size = jax.process_index(), jax.process_count()
    from jax._src import distributed as jax_distributed  # the client jax created

    _group = ProcessGroup(index=index, size=size, client=jax_distributed.global_state.client,
                          timeout_seconds=float(config.initialization_timeout_seconds))
    return _group
