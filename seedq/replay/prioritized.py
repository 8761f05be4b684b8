"""Prioritized sequence replay held by the learner, and the batch source that
feeds it from the server's sequence queue.

`PrioritizedReplay` stores whole sequences (every field of a sequence in one
row of a preallocated numpy array [capacity, ...]), evicts the oldest when
full (FIFO: a ring buffer), and samples rows with probability
P(i) = p_i^alpha / sum_j p_j^alpha through a `SumTree`. Sampled rows come
with importance-sampling weights w_i = (N P(i))^-beta / max_batch w, i.e.
normalised by the largest weight in the batch so that weights only ever
scale updates down. New sequences enter with the largest priority seen so far,
so each is likely to be trained on at least once before its TD error is known.

`PrioritizedBatches` is the learner-side `BatchSource`: it moves finished
sequences from the `UnrollQueue` into replay, samples training batches, and
writes the new priorities back after each update. All of this runs on the
training thread; `stats()` is also read by the reporting thread (plain
numbers, read without locks), and so is `checkpoint_state()`: a copy of the
replay as it was when the copy began, taken in chunks of a few MB, each under
the lock, so the training thread's add/sample wait for one chunk at most;
rows that an add overwrites before their chunk is copied are kept aside
first (copy-on-write), which keeps the copy consistent.

Checkpoints (`--r2d2.checkpoint-replay`) hold `checkpoint_state()`: the
stored sequences, their raw priorities and insertion serials, the counters
and the sampling RNG's state; the sum tree is rebuilt from the priorities.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import numpy as np

from seedq.schema import StepFieldSpec
from seedq.replay.sum_tree import SumTree

# Priorities are floored here so that a sequence whose TD errors are all zero
# keeps a (tiny) chance of being sampled again.
MIN_PRIORITY = 1e-6
# How much of the stored sequences a checkpoint copies per hold of the lock.
SNAPSHOT_CHUNK_BYTES = 8 << 20


class _SnapshotInProgress:
    """The copy-on-write bookkeeping of one `state_dict` (read and written under the replay's lock)."""

    def __init__(self, until: int):
        self.until = until  # rows [0, until) are in the snapshot
        self.copied = 0  # rows [0, copied) are copied already
        self.kept: dict[int, dict[str, np.ndarray]] = {}  # row -> its fields as the snapshot began

    def keep_before_overwrite(self, rows: np.ndarray, data: dict[str, np.ndarray]) -> None:
        for row in rows[(rows >= self.copied) & (rows < self.until)]:
            row = int(row)
            if row not in self.kept:
                self.kept[row] = {name: values[row].copy() for name, values in data.items()}


class PrioritizedReplay:
    def __init__(
        self,
        capacity: int,
        fields: dict[str, StepFieldSpec],
        *,
        priority_exponent: float = 0.9,
        importance_exponent: float = 0.6,
        seed: int = 0,
    ):
        """fields: name -> per-sequence shape and dtype (e.g. obs: ((L, 4), float32))."""
        if capacity <= 0:
            raise ValueError(f"replay capacity {capacity}: must be > 0")
        self.capacity = int(capacity)
        self.fields = dict(fields)
        self.alpha = float(priority_exponent)
        self.beta = float(importance_exponent)
        self._data = {
            name: np.zeros((self.capacity, *spec.shape), spec.dtype) for name, spec in self.fields.items()
        }
        self._tree = SumTree(self.capacity)
        # Insertion serial number of the sequence in each row: a priority
        # update for a row that was overwritten since it was sampled is dropped.
        self._serial = np.full(self.capacity, -1, np.int64)
        self._priority = np.zeros(self.capacity, np.float64)  # p_i, before the exponent
        self._next = 0  # row the next insert writes (the oldest row once full)
        self.size = 0
        self.inserted = 0  # sequences ever inserted
        self.sampled = 0  # sequences ever sampled (a batch of B counts B)
        self.max_priority = 1.0
        self._rng = np.random.default_rng(seed)
        # Held by every mutation and by `state_dict`, so a checkpoint taken on
        # another thread never sees half an insert.
        self._lock = threading.Lock()
        # While `state_dict` copies: rows [copied, until) still to copy, and the
        # former content of such rows that an add has overwritten since.
        self._snapshot: _SnapshotInProgress | None = None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._data.values())

    def add(self, sequences: dict[str, np.ndarray], priorities=None) -> np.ndarray:
        """Inserts k sequences (name -> [k, ...]); returns their rows [k].

        Without `priorities` they enter with the largest priority seen so far.
        When the buffer is full the oldest sequences are overwritten.
        """
        with self._lock:
            return self._add(sequences, priorities)

    def _add(self, sequences, priorities) -> np.ndarray:
        if sequences.keys() != self._data.keys():
            raise KeyError(f"sequence fields {sorted(sequences)} != replay fields {sorted(self._data)}")
        k = len(next(iter(sequences.values())))
        if k == 0:
            return np.zeros(0, np.int64)
        if k > self.capacity:  # only the newest `capacity` would survive anyway
            sequences = {name: v[k - self.capacity :] for name, v in sequences.items()}
            self.inserted += k - self.capacity
            if priorities is not None:
                priorities = np.asarray(priorities)[k - self.capacity :]
            k = self.capacity
        rows = (self._next + np.arange(k)) % self.capacity
        if self._snapshot is not None:
            self._snapshot.keep_before_overwrite(rows, self._data)
        for name, values in sequences.items():
            self._data[name][rows] = values
        if priorities is None:
            priorities = np.full(k, self.max_priority)
        else:
            priorities = np.maximum(np.asarray(priorities, np.float64), MIN_PRIORITY)
            self.max_priority = max(self.max_priority, float(priorities.max()))
        self._tree.set(rows, priorities**self.alpha)
        self._priority[rows] = priorities
        self._serial[rows] = self.inserted + np.arange(k)
        self.inserted += k
        self._next = int((self._next + k) % self.capacity)
        self.size = min(self.capacity, self.size + k)
        return rows

    def sample(self, batch_size: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """A batch of sequences drawn by priority; returns (batch, serials).

        batch: every field [batch_size, ...] plus "weights" float32 [B]
        (importance-sampling weights, max-normalised within the batch) and
        "indices" int32 [B] (replay rows, for `update_priorities`).
        serials [B] identify the sampled sequences (see `update_priorities`).
        """
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay")
        with self._lock:
            rows = self._tree.sample(batch_size, self._rng)
            batch = {name: data[rows] for name, data in self._data.items()}
            batch["weights"] = self.importance_weights(rows)
            batch["indices"] = rows.astype(np.int32)
            self.sampled += batch_size
            return batch, self._serial[rows].copy()

    def probabilities(self, rows) -> np.ndarray:
        """Sampling probabilities P(i) of `rows` [k] -> float64 [k]."""
        return self._tree.get(rows) / self._tree.total

    def importance_weights(self, rows) -> np.ndarray:
        """(N P(i))^-beta / max over `rows`, float32 [k]; N = current size."""
        weights = (self.size * self.probabilities(rows)) ** (-self.beta)
        return (weights / weights.max()).astype(np.float32)

    def update_priorities(self, rows, priorities, serials=None) -> int:
        """Sets new priorities (before the exponent) for `rows`; returns how many were set.

        With `serials` (from `sample`), rows that have since been overwritten
        by newer sequences are left alone. If a row appears more than once,
        the last of its priorities wins.
        """
        rows = np.asarray(rows, np.int64)
        priorities = np.maximum(np.asarray(priorities, np.float64), MIN_PRIORITY)
        if not np.all(np.isfinite(priorities)):
            raise ValueError(f"non-finite priorities: {priorities}")
        with self._lock:
            if serials is not None:
                live = self._serial[rows] == np.asarray(serials)
                rows, priorities = rows[live], priorities[live]
            if len(rows):
                self._tree.set(rows, priorities**self.alpha)
                self._priority[rows] = priorities
                self.max_priority = max(self.max_priority, float(priorities.max()))
            return len(rows)

    def field_specs(self) -> dict[str, list]:
        """name -> [shape, dtype string] of one stored sequence (checkpoint compatibility)."""
        return {
            name: [list(spec.shape), np.dtype(spec.dtype).str] for name, spec in self.fields.items()
        }

    def state_dict(self) -> tuple[dict, dict]:
        """(arrays, scalars): a consistent copy of everything stored, as it
        was when the call began, taken without holding the lock for long.

        arrays: "data" (one array [size, ...] per field, in `fields` order),
        "priority" and "serial" [size]; scalars (JSON): the field specs,
        capacity, counters and the sampling RNG's state. Rows [0, size) are
        all the rows in use: the ring fills from row 0 and only wraps when full.
        """
        with self._lock:
            if self._snapshot is not None:
                raise RuntimeError("a replay snapshot is already in progress")
            n = self.size
            arrays = {
                "data": [np.empty_like(self._data[name][:n]) for name in self.fields],
                "priority": self._priority[:n].copy(),
                "serial": self._serial[:n].copy(),
            }
            scalars = {
                "fields": self.field_specs(),
                "capacity": self.capacity,
                "size": n,
                "next": self._next,
                "inserted": self.inserted,
                "sampled": self.sampled,
                "max_priority": self.max_priority,
                "rng": self._rng.bit_generator.state,
            }
            self._snapshot = snapshot = _SnapshotInProgress(until=n)
        row_bytes = max(1, sum(a[0].nbytes for a in arrays["data"]) if n else 1)
        chunk = max(1, SNAPSHOT_CHUNK_BYTES // row_bytes)
        try:
            for start in range(0, n, chunk):
                stop = min(n, start + chunk)
                with self._lock:
                    for out, name in zip(arrays["data"], self.fields):
                        out[start:stop] = self._data[name][start:stop]
                    snapshot.copied = stop
        finally:
            with self._lock:
                self._snapshot = None
        for out, name in zip(arrays["data"], self.fields):
            for row, kept in snapshot.kept.items():
                out[row] = kept[name]
        return arrays, scalars

    def describe_mismatch(self, scalars: dict) -> str | None:
        """Why a saved `state_dict` cannot be loaded into this replay, or None."""
        if scalars["capacity"] != self.capacity:
            return f"replay capacity is {scalars['capacity']} in the checkpoint, {self.capacity} in this config"
        saved, here = scalars["fields"], self.field_specs()
        for name in sorted(set(saved) | set(here)):
            if saved.get(name) != here.get(name):
                return (
                    f"replay field {name} is {saved.get(name, 'absent')} in the checkpoint, "
                    f"{here.get(name, 'absent')} in this config"
                )
        return None

    def load_state_dict(self, arrays: dict, scalars: dict) -> None:
        """Continues from a `state_dict` (raises ValueError if it does not fit)."""
        mismatch = self.describe_mismatch(scalars)
        if mismatch:
            raise ValueError(mismatch)
        n = int(scalars["size"])
        with self._lock:
            for name, values in zip(self.fields, arrays["data"]):
                self._data[name][:n] = values
            priority = np.asarray(arrays["priority"], np.float64)
            self._priority[:] = 0.0
            self._priority[:n] = priority
            self._serial[:] = -1
            self._serial[:n] = arrays["serial"]
            self._tree = SumTree(self.capacity)
            if n:
                # The sum tree holds p ** alpha: rebuilt with this config's alpha.
                self._tree.set(np.arange(n), priority**self.alpha)
            self.size, self._next = n, int(scalars["next"])
            self.inserted, self.sampled = int(scalars["inserted"]), int(scalars["sampled"])
            self.max_priority = float(scalars["max_priority"])
            self._rng.bit_generator.state = scalars["rng"]

    def priority_stats(self) -> tuple[float, float]:
        """(mean, max) of the priorities p_i (before the exponent) of the stored sequences."""
        if self.size == 0:
            return 0.0, 0.0
        stored = self._priority[: self.size]
        return float(stored.mean()), float(stored.max())


class PrioritizedBatches:
    """`BatchSource` for replay-based agents: UnrollQueue -> replay -> batches.
    It implements every hook of `seedq.agents.base.BatchSource` itself (no
    subclass: seedq.agents imports seedq.replay, not the other way round).

    Replay-ratio control (`replay_ratio` = r > 0, sequences sampled per
    sequence inserted, i.e. how often each sequence is trained on, on
    average), counted from the moment the replay first holds `min_size`
    sequences, with a tolerance of `slack` samples either way:

      * a batch is sampled only while sampled + B <= r * inserted + slack;
        otherwise the learner waits for the server to finish more sequences;
      * sequences are moved from the queue into replay only while
        r * inserted <= sampled + slack; otherwise they stay in the bounded
        queue, which, once full, makes the inference server wait
        (backpressure): acting slows down to the learner's pace.

    With slack >= B/2 one of the two is always possible, so neither side can
    deadlock. r = 0 disables the control: every finished sequence is inserted
    and the learner samples as fast as it can.
    """

    def __init__(
        self,
        queue,
        replay: PrioritizedReplay,
        *,
        batch_size: int,
        min_size: int,
        replay_ratio: float = 0.0,
        slack: float | None = None,
        priority_key: str = "priorities",
    ):
        if min_size > replay.capacity:
            raise ValueError(f"replay min size {min_size} > capacity {replay.capacity}")
        self.queue = queue
        self.replay = replay
        self.batch_size = int(batch_size)
        self.min_size = max(int(min_size), 1)
        self.replay_ratio = float(replay_ratio)
        self.slack = float(2 * batch_size if slack is None else slack)
        if self.replay_ratio > 0 and self.slack < batch_size / 2:
            raise ValueError(f"slack {self.slack} < batch_size/2 could deadlock")
        self.priority_key = priority_key
        self._pending: collections.deque[tuple[np.ndarray, np.ndarray]] = collections.deque()
        self._inserted_at_fill: int | None = None  # replay.inserted when min_size was reached
        self._sampled_at_fill = 0
        self.wait_seconds = 0.0  # learner waiting for data
        self.last_weights = np.ones(1, np.float32)
        self.priority_updates = 0
        self.stale_priority_updates = 0

    # --- rate control ---

    def _credit(self) -> float:
        """r * inserted - sampled since min fill (how far sampling may run ahead)."""
        if self._inserted_at_fill is None:
            return 0.0
        inserted = self.replay.inserted - self._inserted_at_fill
        sampled = self.replay.sampled - self._sampled_at_fill
        return self.replay_ratio * inserted - sampled

    def _may_insert(self) -> bool:
        if self.replay_ratio <= 0 or self._inserted_at_fill is None:
            return True
        return self._credit() <= self.slack

    def _may_sample(self) -> bool:
        if self._inserted_at_fill is None:
            return False
        if self.replay_ratio <= 0:
            return True
        return self.batch_size <= self._credit() + self.slack

    def _insert(self, sequences: dict[str, np.ndarray]) -> None:
        self.replay.add(sequences)
        if self._inserted_at_fill is None and self.replay.size >= self.min_size:
            self._inserted_at_fill = self.replay.inserted
            self._sampled_at_fill = self.replay.sampled

    def _drain(self) -> None:
        """Moves what the queue holds into replay, while the ratio allows (non-blocking)."""
        while len(self.queue) and self._may_insert():
            chunk = self.queue.get(min(len(self.queue), self.batch_size), timeout=0)
            if chunk is None:
                return
            self._insert(chunk)

    # --- BatchSource ---

    def next_batch(self, stop):
        while not stop.is_set():
            self._drain()
            if self._may_sample():
                batch, serials = self.replay.sample(self.batch_size)
                self._pending.append((batch["indices"], serials))
                self.last_weights = batch["weights"]
                return batch
            waited = time.perf_counter()
            chunk = self.queue.get(1, timeout=0.2)  # the learner is ahead: wait for data
            self.wait_seconds += time.perf_counter() - waited
            if chunk is not None:
                self._insert(chunk)
        return None

    def after_update(self, batch, metrics) -> None:
        """Writes the update's new priorities (metrics[priority_key], [B]) back.

        The entry is removed from `metrics`, which then holds only scalars.
        Batches are fed back in the order they were sampled.
        """
        priorities = metrics.pop(self.priority_key, None)
        if not self._pending:
            return
        rows, serials = self._pending.popleft()
        if priorities is None:
            return
        priorities = np.asarray(priorities, np.float64)
        done = self.replay.update_priorities(rows, priorities, serials)
        self.priority_updates += done
        self.stale_priority_updates += len(rows) - done

    # --- checkpoints ---

    def checkpoint_state(self) -> tuple[dict, dict]:
        """(arrays, scalars) for a checkpoint: the replay plus the rate control's marks."""
        arrays, scalars = self.replay.state_dict()
        scalars["source"] = {
            "inserted_at_fill": self._inserted_at_fill,
            "sampled_at_fill": self._sampled_at_fill,
            "priority_updates": self.priority_updates,
            "stale_priority_updates": self.stale_priority_updates,
        }
        return arrays, scalars

    def restore_checkpoint_state(self, arrays: dict, scalars: dict) -> None:
        """Continues from `checkpoint_state()` (before training starts)."""
        self.replay.load_state_dict(arrays, scalars)
        source = scalars.get("source", {})
        self._inserted_at_fill = source.get("inserted_at_fill")
        self._sampled_at_fill = int(source.get("sampled_at_fill", 0))
        self.priority_updates = int(source.get("priority_updates", 0))
        self.stale_priority_updates = int(source.get("stale_priority_updates", 0))

    def example_batch(self) -> dict[str, np.ndarray]:
        """A zero batch shaped like the real ones (compiles the update ahead of time)."""
        batch = {
            name: np.zeros((self.batch_size, *spec.shape), spec.dtype)
            for name, spec in self.replay.fields.items()
        }
        batch["weights"] = np.ones(self.batch_size, np.float32)
        batch["indices"] = np.zeros(self.batch_size, np.int32)
        return batch

    def stats(self) -> dict[str, Any]:
        """Replay and sampling statistics for TensorBoard (plain floats)."""
        replay = self.replay
        mean_p, max_p = replay.priority_stats()
        return {
            "replay/size": replay.size,
            "replay/fill": replay.size / replay.capacity,
            "replay/inserted": replay.inserted,
            "replay/sampled": replay.sampled,
            # Achieved samples per inserted sequence, over the whole run.
            "replay/ratio": replay.sampled / replay.inserted if replay.inserted else 0.0,
            "replay/priority_mean": mean_p,
            "replay/priority_max": max_p,
            "replay/max_priority_seen": replay.max_priority,
            "replay/is_weight_mean": float(np.mean(self.last_weights)),
            "replay/is_weight_min": float(np.min(self.last_weights)),
            "replay/learner_wait_seconds": self.wait_seconds,
            "replay/stale_priority_updates": self.stale_priority_updates,
        }
