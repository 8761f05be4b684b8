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


class EnvTable:
    def __init__(self, episode_log: EpisodeLog):
        self.episodes = episode_log
        self._actors: dict[str, ActorEntry] = {}
        self._free: list[tuple[int, int]] = []  # (first_slot, size) blocks
        self._next_slot = 0
        self.runs_started = 0
        self.runs_dropped = 0
        self.frames = 0

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
        if old is not None and not old.closed:
            self.release(old)
        entry = ActorEntry(actor_id, run_id, num_envs, self._allocate(num_envs))
        self._actors[actor_id] = entry
        self.runs_started += 1
        return entry, old

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

    def _allocate(self, size: int) -> int:
        for i, (start, block) in enumerate(self._free):
            if block >= size:
                if block == size:
                    self._free.pop(i)
                else:
                    self._free[i] = (start + size, block - size)
                return start
        start = self._next_slot
        self._next_slot = start + size
        return start

    def book_episodes(self, frames: int, returns: np.ndarray, lengths: np.ndarray) -> None:
        """Books env steps (acted here, or by an IMPALA actor on its own) and the
        episodes they ended."""
        self.frames += int(frames)
        if len(returns):
            self.episodes.add(np.asarray(returns, np.float64), np.asarray(lengths, np.int64), self.frames)
