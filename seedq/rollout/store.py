"""Unroll assembly: one sequence under construction per env slot.

`UnrollStore` keeps them in preallocated arrays [slots, length, ...], so
appending a whole inference batch is a handful of vectorised writes. A
finished sequence keeps its last `overlap` steps as the first steps of the
next one: one step for V-trace (the bootstrap observation of one unroll is
the first input of the next), burn-in + n steps for R2D2. Fields named in
`initial_only` (recurrent state) are emitted for the first step only.
"""

from __future__ import annotations

import numpy as np

from seedq.schema import StepFieldSpec


class UnrollStore:
    def __init__(
        self,
        length: int,
        fields: dict[str, StepFieldSpec],
        *,
        overlap: int = 1,
        initial_only: frozenset[str] = frozenset(),
        capacity: int = 64,
    ):
        if length < 2 or not 0 <= overlap < length:
            raise ValueError(f"sequence length={length}, overlap={overlap}: need 0 <= overlap < length, length >= 2")
        self.length = length
        self.overlap = overlap
        self.initial_only = frozenset(initial_only)
        self.fields = dict(fields)
        self._buffers = {
            name: np.zeros((capacity, self.length, *spec.shape), spec.dtype)
            for name, spec in self.fields.items()
        }
        self._position = np.zeros(capacity, np.int64)
        # Whether a slot has finished a sequence since it was last dropped: its
        # first `overlap` held steps then already went out with that sequence.
        self._emitted = np.zeros(capacity, bool)
        self.dropped_steps = 0  # env steps discarded by `drop`, over the store's life

    @property
    def capacity(self) -> int:
        return len(self._position)

    def ensure_capacity(self, num_slots: int) -> None:
        """Grows the slot arrays (doubling) so that slots [0, num_slots) exist."""
        if num_slots <= self.capacity:
            return
        new = max(num_slots, 2 * self.capacity)
        for name, buf in self._buffers.items():
            grown = np.zeros((new, *buf.shape[1:]), buf.dtype)
            grown[: len(buf)] = buf
            self._buffers[name] = grown
        position = np.zeros(new, np.int64)
        position[: self.capacity] = self._position
        emitted = np.zeros(new, bool)
        emitted[: self.capacity] = self._emitted
        self._position, self._emitted = position, emitted

    def drop(self, slots: np.ndarray) -> int:
        """Discards the partial unrolls of `slots` (actor gone or restarted);
        returns how many of their env steps no finished sequence carried (lost)."""
        held = self._position[slots]
        lost = int(np.maximum(np.where(self._emitted[slots], held - self.overlap, held), 0).sum())
        self._position[slots] = 0
        self._emitted[slots] = False
        self.dropped_steps += lost
        return lost

    def append(self, slots: np.ndarray, step: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Writes one step for each of `slots` (unique); returns finished sequences.

        step: name -> [n, *shape] for every field. Returns name -> [k, length, *shape]
        ([k, *shape] for `initial_only` fields) for the k slots whose sequence
        this step completed, or None.
        """
        if step.keys() != self._buffers.keys():
            raise KeyError(f"step fields {sorted(step)} != store fields {sorted(self._buffers)}")
        position = self._position[slots]
        for name, values in step.items():
            self._buffers[name][slots, position] = values
        position += 1
        self._position[slots] = position
        full = position == self.length
        if not full.any():
            return None
        done = slots[full]
        unrolls = {  # fancy indexing: copies
            name: buf[done, 0] if name in self.initial_only else buf[done]
            for name, buf in self._buffers.items()
        }
        if self.overlap:
            for buf in self._buffers.values():
                buf[done, : self.overlap] = buf[done, self.length - self.overlap :]
        self._position[done] = self.overlap
        self._emitted[done] = True
        return unrolls
