"""Which devices infer and train, and a learner of several processes."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DevicesConfig:
    """Which of this host's JAX devices run inference and which train
    (seedq.devices; docs/devices.md). 0 means auto: on one device both share
    it; on more, 1 device infers and training takes the largest count of the
    others that divides the training batch (in a multi-host learner: that
    divides this host's share of it; docs/devices.md)."""

    # Devices that run the inference server's batches (0: auto).
    inference: int = 0
    # Devices the update runs data-parallel over; must divide the training
    # batch (vtrace.batch_size or r2d2.batch_size) (0: auto).
    training: int = 0

    def validate(self, batch_size: int, batch_name: str) -> None:
        """ValueError unless the counts are >= 0 and an explicit training count divides the batch."""
        for name in ("inference", "training"):
            if getattr(self, name) < 0:
                raise ValueError(f"devices.{name}={getattr(self, name)}: must be >= 0 (0: auto)")
        if self.training and batch_size % self.training:
            raise ValueError(
                f"devices.training={self.training} does not divide the training batch "
                f"{batch_name}={batch_size} (each training device takes an equal share)"
            )


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """A learner of several processes (hosts) training one model together
    (jax.distributed; docs/devices.md "Multi-host"). All three of coordinator,
    num_processes and process_id, or none: then Cloud TPU VMs and GKE TPU
    pods are detected by JAX (`auto_detect`) and anything else runs as one
    process."""

    # HOST:PORT of the coordination service, which process 0 starts (the same on every process).
    coordinator: str = ""
    # Learner processes in the group (0: one, or what auto-detection finds).
    num_processes: int = 0
    # This process's index, 0 .. num_processes - 1 (-1: unset).
    process_id: int = -1
    # Without a coordinator, ask JAX's cluster detection (Cloud TPU VM metadata,
    # GKE TPU worker variables); false: one process.
    auto_detect: bool = True
    # A process that has sent no heartbeat for this long is dead: the others
    # stop with one line naming it (a dead coordinator is noticed at once).
    heartbeat_timeout_seconds: int = 10
    # How long start-up waits for every process to join the coordinator.
    initialization_timeout_seconds: int = 300
    # How long a finished process waits for the others at the exit barrier
    # (process 0 evaluates before it gets there).
    shutdown_timeout_seconds: int = 300

    @property
    def explicit(self) -> bool:
        """Whether the group was given on the command line (coordinator, size and index)."""
        return bool(self.coordinator)

    def validate(self) -> None:
        given = {"coordinator": bool(self.coordinator), "num_processes": self.num_processes > 0,
                 "process_id": self.process_id >= 0}
        if any(given.values()) and not all(given.values()):
            missing = ", ".join(f"distributed.{k}" for k, v in given.items() if not v)
            raise ValueError(
                f"distributed.coordinator, distributed.num_processes and distributed.process_id go "
                f"together (missing: {missing})"
            )
        if self.coordinator and (":" not in self.coordinator or not self.coordinator.rsplit(":", 1)[1].isdigit()):
            raise ValueError(f"distributed.coordinator={self.coordinator!r}: expected HOST:PORT")
        if self.num_processes < 0:
            raise ValueError(f"distributed.num_processes={self.num_processes}: must be >= 0")
        if self.coordinator and not 0 <= self.process_id < self.num_processes:
            raise ValueError(
                f"distributed.process_id={self.process_id}: must be in 0..{self.num_processes - 1} "
                f"(distributed.num_processes={self.num_processes})"
            )
        for name in ("heartbeat_timeout_seconds", "initialization_timeout_seconds", "shutdown_timeout_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"distributed.{name}={getattr(self, name)}: must be > 0")
