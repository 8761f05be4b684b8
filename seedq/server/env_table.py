"""Which actor owns which env slots on the learner, and the run's episode log.

Each connected actor owns a contiguous block of *slots*; slot = block start +
env index, so a request's envs map to slots with one vectorised add and every
per-env array of the acting core (`seedq.rollout.core`: episode book-keeping,
recurrent state, the unroll under construction) is indexed by slot. A new run
id from a known actor means it restarted: its previous block is released
(partial unrolls dropped) and a fresh one is handed out.

Everything here runs on the server's event-loop thread, except
`EpisodeLog`, which the progress/metrics thread also reads (hence its lock).
"""

from __future__ import annotations

import collections
import dataclasses
import threading

import numpy as np

from seedq.process.host_memory import memory_bytes
from seedq.wire.codec import SLOT_BUDGET_MARKER
from seedq.wire.groups import actor_of


@dataclasses.dataclass(eq=False)
class ActorEntry:
    actor_id: str
    run_id: str
    num_envs: int
    first_slot: int
    closed: bool = False
    # Inference batches that waited for this stream's next request until the
    # batch timeout (the batcher stops awaiting it after each such miss).
    timed_out_waits: int = 0

    @property
    def slots(self) -> np.ndarray:
        return np.arange(self.first_slot, self.first_slot + self.num_envs)


class EpisodeLog:
    """Completed episodes (return, length), bounded; thread-safe."""

    def __init__(self, window: int = 100, history: int = 100_000):
        self._window = window
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self._lengths: collections.deque[int] = collections.deque(maxlen=window)
        # Full history of (frames_at_end, return) for curves; bounded.
        self.history: collections.deque[tuple[int, float]] = collections.deque(maxlen=history)
        self.count = 0
        self._lock = threading.Lock()

    def add(self, returns: np.ndarray, lengths: np.ndarray, frames: int) -> None:
        with self._lock:
            for r, n in zip(returns.tolist(), lengths.tolist()):
                self._recent.append(r)
                self._lengths.append(n)
                self.history.append((frames, r))
            self.count += len(returns)

    def window(self) -> tuple[list[float], list[int]]:
        """(returns, lengths) of the episodes in the current window, oldest first."""
        with self._lock:
            return list(self._recent), list(self._lengths)

    def restore(self, count: int, returns: list[float], lengths: list[int]) -> None:
        """Continues a resumed run: its episode count and its recent window."""
        with self._lock:
            self.count = int(count)
            self._recent.clear()
            self._lengths.clear()
            self._recent.extend(float(r) for r in returns)
            self._lengths.extend(int(n) for n in lengths)

    def snapshot(self) -> tuple[int, float | None, float | None, bool]:
        """(episodes, mean return, mean length over the window, window full)."""
        with self._lock:
            if not self._recent:
                return self.count, None, None, False
            return (
                self.count,
                float(np.mean(self._recent)),
                float(np.mean(self._lengths)),
                len(self._recent) == self._window,
            )


# The automatic budget (server.max_envs 0): this share of the learner's memory
# for the per-slot unroll buffers, within these bounds.
AUTO_MEMORY_SHARE = 0.25
AUTO_MIN_ENVS, AUTO_MAX_ENVS = 1024, 1 << 16


def auto_max_envs(bytes_per_slot: int, memory: int | None = None) -> int:
    """The env-slot budget that keeps the unroll buffers ([slots, length,
    ...] per field, which grow by doubling) within AUTO_MEMORY_SHARE of
    memory: 1024 to 65536 slots."""
    memory = memory_bytes() if memory is None else memory
    fits = int(AUTO_MEMORY_SHARE * memory / (2 * max(1, bytes_per_slot)))
    return max(AUTO_MIN_ENVS, min(AUTO_MAX_ENVS, fits))


def slot_budget(max_envs: int, agent, spec) -> int:
    """server.max_envs, or for 0 the automatic budget of this agent's
    sequences (`auto_max_envs` of the bytes one slot's unroll takes)."""
    if max_envs:
        return max_envs
    from seedq.schema import sequence_bytes

    return auto_max_envs(sequence_bytes(agent, spec))


class SlotBudgetExhausted(Exception):
    """A handshake would take the learner past its total env-slot budget."""


class EnvTable:
    """`max_envs`: the total env slots of all actors together (None: no
    bound). Every per-slot array of the learner grows with the highest slot
    handed out, so the bound holds for slots, not just for envs in use: a
    block is handed out below `max_envs` or not at all."""

    def __init__(self, episode_log: EpisodeLog, max_envs: int | None = None):
        self.episodes = episode_log
        self.max_envs = max_envs
        self._actors: dict[str, ActorEntry] = {}
        self._free: list[tuple[int, int]] = []  # (first_slot, size) blocks
        self._next_slot = 0
        self.runs_started = 0
        self.runs_dropped = 0
        self.frames = 0
        # The most env groups (streams, docs/wire.md) one actor has had open at once in this run.
        self.max_groups = 0

    @property
    def num_slots(self) -> int:
        return self._next_slot

    @property
    def num_connected(self) -> int:
        """Actors with an open stream (released entries leave `_actors`)."""
        return len(self._actors)

    def entries(self) -> list[ActorEntry]:
        """The open entries (one per connected actor). Other threads may call
        this: copying the dict's values is one step under the GIL."""
        return list(self._actors.values())

    def connect(self, actor_id: str, run_id: str, num_envs: int) -> tuple[ActorEntry, ActorEntry | None]:
        """Registers a (re)started actor; returns (entry, the superseded entry or None)."""
        old = self._actors.get(actor_id)
        if old is not None and not old.closed and old.run_id == run_id:
            raise ValueError(f"actor {actor_id!r} run {run_id!r} is already connected")
        in_use = self.envs_in_use() - (old.num_envs if old is not None and not old.closed else 0)
        if self.max_envs is not None and in_use + num_envs > self.max_envs:
            raise SlotBudgetExhausted(
                f"{SLOT_BUDGET_MARKER}: {in_use} of this learner's {self.max_envs} env slots are in use and "
                f"actor {actor_id!r} asks for {num_envs} (server.max_envs); retry once other actors leave")
        if old is not None and not old.closed:
            self.release(old)
        first_slot = self._allocate(num_envs)
        if first_slot is None:
            raise SlotBudgetExhausted(
                f"{SLOT_BUDGET_MARKER}: no free block of {num_envs} slots below this learner's "
                f"{self.max_envs} (server.max_envs; freed blocks are scattered); retry once other actors leave")
        entry = ActorEntry(actor_id, run_id, num_envs, first_slot)
        self._actors[actor_id] = entry
        self.runs_started += 1
        self.max_groups = max(self.max_groups, self._open_groups(actor_of(actor_id)))
        return entry, old

    def _open_groups(self, actor: str) -> int:
        """Open streams of `actor`'s groups (a restart or connect is rare: a scan is cheap)."""
        return sum(1 for stream_id in self._actors if actor_of(stream_id) == actor)

    def release(self, entry: ActorEntry) -> np.ndarray | None:
        """Marks the entry closed and frees its slots; returns them (None if already closed)."""
        if entry.closed:
            return None
        entry.closed = True
        self.runs_dropped += 1
        self._free_block(entry.first_slot, entry.num_envs)
        if self._actors.get(entry.actor_id) is entry:
            del self._actors[entry.actor_id]
        return entry.slots

    def _free_block(self, start: int, size: int) -> None:
        """Returns a block to the free list, merging it with adjacent free blocks."""
        blocks = sorted(self._free + [(start, size)])
        merged = [blocks[0]]
        for block_start, block_size in blocks[1:]:
            last_start, last_size = merged[-1]
            if last_start + last_size == block_start:
                merged[-1] = (last_start, last_size + block_size)
            else:
                merged.append((block_start, block_size))
        self._free = merged

    def envs_in_use(self) -> int:
        return sum(entry.num_envs for entry in self._actors.values())

    def _allocate(self, size: int) -> int | None:
        """The first slot of a free block of `size`, or None when every place
        for it would reach past `max_envs`."""
        for i, (start, block) in enumerate(self._free):
            if block >= size:
                if block == size:
                    self._free.pop(i)
                else:
                    self._free[i] = (start + size, block - size)
                return start
        start = self._next_slot
        if self._free and self._free[-1][0] + self._free[-1][1] == start:
            start = self._free.pop()[0]  # the free block at the top extends upwards
        if self.max_envs is not None and start + size > self.max_envs:
            if start != self._next_slot:
                self._free_block(start, self._next_slot - start)
            return None
        self._next_slot = max(self._next_slot, start + size)
        return start

    def book_episodes(self, frames: int, returns: np.ndarray, lengths: np.ndarray) -> None:
        """Books env steps (acted here, or by an IMPALA actor on its own) and the
        episodes they ended."""
        self.frames += int(frames)
        if len(returns):
            self.episodes.add(np.asarray(returns, np.float64), np.asarray(lengths, np.int64), self.frames)
