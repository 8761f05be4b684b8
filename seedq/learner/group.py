"""A learner group's control, in band with the update: stop together, and
checkpoint the same step on every process (seedq.distributed; docs/devices.md
"Multi-host")."""

from __future__ import annotations

import threading
from typing import Callable

import jax
import numpy as np

from seedq.devices import local_copy


class GroupControl:
    """A stop request, and the number of checkpoint requests this process has
    received; their maximum over the group after a step says, identically on
    every process, whether to stop after that step and which checkpoint pins
    it (`pinned_snapshot`).

    `state_lock` guards the learner's (state, counters); `stop` is the
    learner's stop event; `training()` whether its training thread runs."""

    def __init__(self, parallel, state_lock: threading.Lock, stop: threading.Event, training: Callable[[], bool]):
        self._flags = group_flags_fn(parallel)
        self._stop = stop
        self._training = training
        self._stop_requested = False
        self._checkpoint_requests = 0
        self._last_pin = 0
        self._pins: dict[int, tuple] = {}
        self._pinned = threading.Condition(state_lock)
        # Set while training may run: a group's checkpoint parks every
        # training thread at the pinned step until its save is done, because
        # orbax's multi-process saves use device collectives of their own
        # (barriers, broadcasts of the step list), which must not interleave
        # with the update's.
        self._may_train = threading.Event()
        self._may_train.set()

    def step_done(self, pin: Callable[[], tuple]) -> bool:
        """After a step: pins `pin()` (the step's (state, train_steps,
        trained_frames, version), read under the state lock) for a checkpoint
        the group asked for, and says whether the group stops after this step
        (the same answer on every process: the flags are reduced over the group)."""
        stop, checkpoints = self._flags(self._stop_requested, self._checkpoint_requests)
        with self._pinned:
            pinned = checkpoints and checkpoints > self._last_pin
            if pinned:
                self._last_pin = checkpoints
                self._may_train.clear()
                self._pins[checkpoints] = pin()
                self._pinned.notify_all()
        while pinned and not self._may_train.wait(0.2) and not self._stop.is_set():
            pass  # parked until this process's save of the pinned step is done (`resume_training`)
        return bool(stop)

    def resume_training(self) -> None:
        """Ends a group checkpoint's pause."""
        self._may_train.set()

    def request_stop(self) -> None:
        """A group's stop decision: every process stops after the same step."""
        self._stop_requested = True

    def request_checkpoint(self) -> int:
        """A group's checkpoint decision; returns its number for `pinned_snapshot`."""
        self._checkpoint_requests += 1
        return self._checkpoint_requests

    def pinned_snapshot(self, number: int, timeout: float) -> tuple | None:
        """The (state, train_steps, trained_frames, version) of the step the
        group pinned for checkpoint `number` (the same step on every process),
        or None if training ended or `timeout` passed first."""
        with self._pinned:
            self._pinned.wait_for(lambda: number in self._pins or not self._training(), timeout=timeout)
            pin = self._pins.pop(number, None)
            for old in [n for n in self._pins if n < number]:
                del self._pins[old]
            return pin


def group_flags_fn(parallel):
    """flags(stop: bool, checkpoints: int) -> (any process stopping, the most
    checkpoint requests any process has): a max over the group's training
    mesh, run by every process's training thread after each step (in the same
    order as the updates, so it cannot interleave differently between hosts)."""
    import jax.numpy as jnp

    local_devices = sum(1 for d in parallel.mesh.devices.flat if d.process_index == jax.process_index())
    reduce = jax.jit(lambda flags: jnp.max(flags, axis=0), out_shardings=parallel.replicated)

    def flags(stop: bool, checkpoints: int) -> tuple[int, int]:
        local = np.tile(np.asarray([[int(stop), int(checkpoints)]], np.int32), (local_devices, 1))
        out = reduce(jax.make_array_from_process_local_data(parallel.batch_sharding, local))
        return tuple(int(v) for v in np.asarray(local_copy(out)))

    return flags
