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
after `heartbeat_timeout_seconds` (a dead process 0 is noticed at once: its
service is gone) and reports the error to every live client, whose reaction
(jaxlib's, not configurable from Python: a callback cannot even receive the
status) is a fatal C++ log with a stack trace and an abort. So a group's
learner runs under `supervise`: the `seedq learner` command starts the
learner as its child, passes its output through, and when the child aborts
on that error prints one line naming the dead process instead of the trace
and exits with `DEAD_PEER_EXIT_CODE`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
from typing import Any, Callable

from seedq.process import exit_codes, lifetime
from seedq.config import DistributedConfig

# Exit status of a learner process whose group lost a member.
DEAD_PEER_EXIT_CODE = exit_codes.PEER_LOST
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
                f"{timeout_ms / 1000:g} s ({first_line(e)})"
            ) from None


SOLO = ProcessGroup()


class PeerLost(RuntimeError):
    """Another learner process of the group stopped answering (one-line message)."""


def first_line(e: BaseException) -> str:
    """The first line of an error's message (its type's name when it has none)."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _has_google_pci_device() -> bool:
    """Whether a Google PCI device (a TPU chip) is attached: what both
    `AUTO_DETECTED` environments need, asked without importing JAX."""
    import glob

    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        with contextlib.suppress(OSError), open(vendor) as f:
            if f.read().strip() == "0x1ae0":
                return True
    return False


def detected_environment() -> str | None:
    """The JAX cluster environment this process runs in, of `AUTO_DETECTED`, or None."""
    if not _has_google_pci_device():
        # Off TPU hosts JAX is not imported here: `seedq train` starts its
        # actors before JAX loads, so their start-up overlaps its import.
        return None
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


def dead_peer_line(index: int | None, size: int | None, message: str) -> str:
    """The one line a learner process's supervisor prints when the group lost
    a member (`index` / `size` None: not known, an auto-detected group)."""
    of = f" of {size}" if size else ""
    dead = [p for p in dead_processes(message) if p != index]
    if dead:
        what = f"{', '.join(f'learner process {p}' for p in dead)}{of} died (no heartbeat)"
    elif "coordination service" in message and index != 0:
        what = f"learner process 0{of} (the coordinator) died"
    else:
        what = f"the learner group failed ({first_line(Exception(message))})"
    me = "this learner process" if index is None else f"learner process {index}"
    return f"seedq learner: {what}; {me} stops (resume the group with --resume)"


# What a cross-process collective's error says when a peer went away (XLA:CPU's
# Gloo transport, seen in tests/test_distributed.py). Not the transport's name
# alone: any other Gloo or NCCL failure keeps its traceback.
_PEER_LOST_WORDS = ("Connection closed by peer", "Connection reset by peer")


def is_lost_peer_error(error: BaseException) -> bool:
    """Whether `error` is a collective failing because another learner process
    died: the supervisor names the dead process in one line, so the training
    thread logs no traceback for it."""
    import jax  # not at import time: initialize() must run before other JAX use

    return isinstance(error, jax.errors.JaxRuntimeError) and any(w in str(error) for w in _PEER_LOST_WORDS)


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
    try:
        jax.distributed.initialize(**kwargs)
    except Exception as e:  # noqa: BLE001 - a failed join is one line
        where = config.coordinator or f"the {detected} environment"
        raise ValueError(f"could not join the learner group at {where}: {first_line(e)}") from None
    from jax._src import distributed as jax_distributed  # the client jax created; no public handle

    _group = ProcessGroup(index=jax.process_index(), size=jax.process_count(),
                          client=jax_distributed.global_state.client,
                          timeout_seconds=float(config.initialization_timeout_seconds))
    return _group


# --- the supervisor of a group's learner process ---

# Set in the supervised child's environment (it runs the learner itself).
SUPERVISED = "SEEDQ_SUPERVISED_LEARNER"
# The first line of jaxlib's reaction to a lost group member; it and every
# line after it (the status, a C++ stack trace) are the supervisor's to summarise.
_FATAL_MARKERS = (
    "Use error polling to propagate the following error to all tasks",  # the coordinator's own
    "Polled an error from coordination service",
    "Terminating process because the JAX distributed service detected fatal errors",
)
_PRELUDE = re.compile(r"^[WE]\d{4} [\d:.]+\s+\d+ (preemption_sync_manager|coordination_service\w*)\.cc:\d+\]")
# Gloo's line per connected device pair, printed on every new collective
# (from several threads at once, so pieces of them share lines): noise.
_NOISE = re.compile(r"\[Gloo\] Rank \d+ is connected to|peer ranks\. Expected number of connected peer ranks")


def die_with_supervisor() -> None:
    """In a supervised learner (Linux): the kernel kills us when the supervisor
    dies, even by SIGKILL, so killing the `seedq learner` command kills the
    group member. A no-op elsewhere."""
    supervisor = int(os.environ.get(SUPERVISED) or 0)
    if supervisor:
        lifetime.die_with_parent(supervisor, signal.SIGKILL)


def is_supervised_child() -> bool:
    """Whether this process is the group member that `supervise` started."""
    return bool(os.environ.get(SUPERVISED))


def needs_supervisor(config: DistributedConfig) -> bool:
    """Whether this command's learner joins a group (so runs under `supervise`)."""
    if is_supervised_child():
        return False
    return config.explicit or (config.auto_detect and detected_environment() is not None)


def remove_socket(path: str) -> None:
    """Removes `path` if it is a unix socket; anything else there (a file the
    address named by mistake) is left alone."""
    with contextlib.suppress(OSError):
        if path and stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)


def supervise(argv: list[str], index: int | None, size: int | None, socket_path: str = "",
              env: dict[str, str] | None = None) -> int:
    """Runs `python -m seedq.cli *argv` as a child and passes its output
    through; returns its exit status, or DEAD_PEER_EXIT_CODE after printing
    one line when it died of a lost group member (removing `socket_path`,
    its unix socket, which it had no time to). SIGTERM is passed on to the
    child (it checkpoints and exits as it would alone). `env`: added to the
    child's environment."""
    env = {**os.environ, **(env or {}), SUPERVISED: str(os.getpid())}
    child = subprocess.Popen([sys.executable, "-m", "seedq.cli", *argv], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1)

    def pass_stdout():  # gloo prints its noise on stdout, next to the progress lines
        for line in child.stdout:
            if not _NOISE.search(line):
                sys.stdout.write(line)
                sys.stdout.flush()

    stdout = threading.Thread(target=pass_stdout, name="seedq-supervised-stdout", daemon=True)
    stdout.start()
    signal.signal(signal.SIGTERM, lambda n, frame: child.poll() is None and child.send_signal(n))
    # Ctrl-C reaches the child from the terminal itself (one process group).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fatal: list[str] = []
    # Lines from the coordination client's neighbours (the preemption notifier
    # losing the service, with their continuation lines) often come just before
    # the fatal ones: held back, dropped if the fatal block follows, else passed on.
    held: list[str] = []
    for line in child.stderr:
        if fatal or any(m in line for m in _FATAL_MARKERS):
            fatal.append(line)
        elif held or _PRELUDE.search(line):
            held.append(line)
            if len(held) > 200:  # not a prelude after all
                sys.stderr.writelines(held)
                held.clear()
        elif not _NOISE.search(line):
            sys.stderr.write(line)
            sys.stderr.flush()
    code = child.wait()
    stdout.join(timeout=5)
    if not fatal:
        sys.stderr.writelines(held)
        return code
    remove_socket(socket_path)
    print(dead_peer_line(index, size, "".join(fatal)), file=sys.stderr, flush=True)
    return DEAD_PEER_EXIT_CODE
