"""The learner's devices: which run inference, which train, and training
data-parallel over the training ones (docs/devices.md).

Split rule (`split_devices`, over this host's devices in `jax.local_devices()`
order; `devices.inference` / `devices.training`, 0 meaning auto):

* One device: inference and training share it (today's single-device
  learner); explicit counts above 1 are refused.
* More devices: inference takes the first `devices.inference` of them
  (auto: 1), training the next `devices.training` (auto: the largest count
  of the remaining devices that divides the training batch, so every
  training device gets an equal share of every batch). Devices left over
  stay idle. With the default batches (V-trace 16, R2D2 32) a v5e-8 host
  (8 devices) gets 1 inference + 4 training devices, a v4-8 host (4 devices)
  1 + 2; raising the batch to a multiple of 7 (or 3) uses all of them.
* An explicit split that asks for more devices than exist, or an explicit
  training count that does not divide the batch, is refused with one line
  (naming the devices found, or both numbers).

The global batch stays `batch_size` whatever the split (it is not per
device), so hyperparameters mean the same on one device and on eight.

Data-parallel training (`data_parallel`): a one-axis `Mesh` over the training
devices, every batch leaf sharded along its leading (batch) axis, the learner
state replicated, and the agent's own `update` jitted with those shardings.
The agents' losses are means over the whole batch, so XLA's SPMD partitioner
computes per-device partial gradients and inserts the all-reduce that makes
them the global mean; nothing here writes a collective by hand, and the
sharded update equals the single-device one up to float summation order.

A multi-host learner (seedq.distributed) splits each process's devices the
same way, against its share of the batch, and trains over the global mesh of
every process's training devices (`global_training_devices`): each process
places its share of every batch (`make_array_from_process_local_data`) and
reads replicated results through `local_copy`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from seedq.config import DevicesConfig

BATCH_AXIS = "batch"


@dataclasses.dataclass(frozen=True)
class DeviceSplit:
    """The devices inference runs on and the devices training runs over (the
    same single device when `shared`)."""

    inference: tuple
    training: tuple
    idle: tuple = ()

    @property
    def shared(self) -> bool:
        return self.inference == self.training

    def describe(self) -> dict[str, list[int]]:
        """Device ids per role, as `summary.json` records them."""
        return {"inference": [d.id for d in self.inference], "training": [d.id for d in self.training]}


def device_names(devices: Sequence) -> str:
    """'cpu:0, cpu:1, ...': the devices an error message names."""
    return ", ".join(f"{d.platform}:{d.id}" for d in devices)


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(k for k in range(1, limit + 1) if n % k == 0)


def split_devices(devices: Sequence, wanted: DevicesConfig, batch_size: int,
                  batch_name: str = "batch_size") -> DeviceSplit:
    """The inference/training split of `devices` (see the module docstring);
    ValueError with a one-line message for a split that cannot be had."""
    devices = tuple(devices)
    if not devices:
        raise ValueError("no JAX devices found")
    wanted.validate(batch_size, batch_name)
    found = f"found {len(devices)}: {device_names(devices)}"
    if len(devices) == 1:
        if wanted.inference > 1 or wanted.training > 1:
            raise ValueError(
                f"devices.inference={wanted.inference} devices.training={wanted.training} asks for "
                f"more devices than exist ({found}; one device is shared by inference and training)"
            )
        return DeviceSplit(inference=devices, training=devices)
    inference = wanted.inference or 1
    rest = len(devices) - inference
    if rest < 1 or wanted.training > rest:
        asked = inference + max(wanted.training, 1)
        raise ValueError(
            f"devices.inference={wanted.inference} devices.training={wanted.training} asks for "
            f"{asked} devices ({found})"
        )
    training = wanted.training or _largest_divisor_at_most(batch_size, rest)
    return DeviceSplit(
        inference=devices[:inference],
        training=devices[inference:inference + training],
        idle=devices[inference + training:],
    )


def resolve_split(config, devices: Sequence | None = None) -> DeviceSplit:
    """The split a run's `TrainConfig` asks for, over `devices` (default: this
    host's devices). In a multi-host learner each process splits its own
    devices against its share of the batch (batch / processes)."""
    batch_name, batch_size = config.training_batch
    processes = jax.process_count()
    if processes > 1:
        batch_size //= processes
        batch_name = f"{batch_name} / {processes} processes"
    return split_devices(jax.local_devices() if devices is None else devices, config.devices,
                         batch_size, batch_name)


def global_training_devices(config) -> tuple:
    """Every process's training devices, process by process: the global
    training mesh of a multi-host learner. Each process applies the same
    split rule to its own devices (hosts alike), so no process has to ask
    the others; process p's devices hold rows p*B/P .. (p+1)*B/P - 1 of every
    global batch."""
    by_process: dict[int, list] = {}
    for d in jax.devices():
        by_process.setdefault(d.process_index, []).append(d)
    devices = []
    for p in sorted(by_process):
        devices += resolve_split(config, by_process[p]).training
    return tuple(devices)


@dataclasses.dataclass(frozen=True)
class DataParallel:
    """An agent's update, data-parallel over `mesh`: `update(state, batch)`
    takes a state from `place_state` and a batch from `place_batch` and
    returns the new (replicated) state and metrics, every metric replicated
    (R2D2's per-sequence priorities [B] come back whole, in batch order)."""

    mesh: Mesh
    update: Callable[[Any, Any], tuple[Any, dict]]
    replicated: NamedSharding
    batch_sharding: NamedSharding

    @property
    def multi_process(self) -> bool:
        """Whether the mesh spans several processes (a multi-host learner)."""
        return not self.batch_sharding.is_fully_addressable

    def place_batch(self, batch):
        """A host batch ({name: [B, ...]}) on the training devices, each holding
        B / num_devices consecutive rows of every field. Across processes the
        batch is this process's share, and the result the global batch."""
        if self.multi_process:
            return jax.tree.map(
                lambda x: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(x)), batch
            )
        return jax.device_put(batch, self.batch_sharding)

    def place_state(self, state):
        """The learner state (parameters, optimiser state, counters) copied to
        every training device (of every process: each passes the same values)."""
        if self.multi_process:
            def replicate(x):
                x = np.asarray(x)
                return jax.make_array_from_callback(x.shape, self.replicated, lambda index: x[index])

            return jax.tree.map(replicate, jax.device_get(state))
        return jax.device_put(state, self.replicated)

    def local_rows(self, x):
        """This process's rows of a replicated [B, ...] result (R2D2's
        priorities), as numpy; the whole array in one process."""
        x = np.asarray(local_copy(x))
        processes = jax.process_count()
        if not self.multi_process or processes == 1:
            return x
        share = x.shape[0] // processes
        index = jax.process_index()
        return x[index * share:(index + 1) * share]


def local_copy(tree):
    """A replicated (possibly multi-process) array tree as arrays on one of
    this process's devices: what can be read, published or copied on."""
    def local(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x.addressable_data(0)
        return x

    return jax.tree.map(local, tree)


def batch_mesh(devices: Sequence) -> Mesh:
    """A one-axis mesh ("batch") over `devices`, in their order."""
    return Mesh(np.asarray(tuple(devices)), (BATCH_AXIS,))


def data_parallel(agent, devices: Sequence) -> DataParallel:
    """`agent.update` jitted over a one-axis mesh of `devices`: batch sharded
    along its leading axis, state replicated; XLA derives the gradient mean
    across devices from these shardings (module docstring)."""
    mesh = batch_mesh(devices)
    replicated = NamedSharding(mesh, PartitionSpec())
    batch_sharding = NamedSharding(mesh, PartitionSpec(BATCH_AXIS))
    update = jax.jit(
        agent.update,
        in_shardings=(replicated, batch_sharding),
        out_shardings=(replicated, replicated),
    )
    return DataParallel(mesh, update, replicated, batch_sharding)


def inference_placement(devices: Sequence) -> NamedSharding:
    """Where the inference parameters live: a copy on every inference device."""
    return NamedSharding(batch_mesh(devices), PartitionSpec())


def sharded_act(act: Callable, devices: Sequence) -> Callable:
    """An acting function `act(params, rng, obs, first, core, inputs)` jitted
    over several inference devices: each inference batch is split along its
    env axis across them (so its padded size must be a multiple of their
    count), parameters and the PRNG key replicated, every device running the
    same program on its share with its own copy of the parameters."""
    mesh = batch_mesh(devices)
    replicated = NamedSharding(mesh, PartitionSpec())
    rows = NamedSharding(mesh, PartitionSpec(BATCH_AXIS))
    return jax.jit(act, in_shardings=(replicated, replicated, rows, rows, rows, rows),
                   out_shardings=(rows, rows, rows, replicated))
