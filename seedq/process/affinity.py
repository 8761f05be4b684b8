"""Pinning a process to CPU cores (`actor_cores`): equal actor resources
across the configurations a comparison runs one after another."""

from __future__ import annotations

import os


def parse_cores(text: str, name: str = "actor_cores") -> set[int]:
    """Core ids from "0", "0-1", "0,2-3"; ValueError naming `name` and what is wrong."""
    cores: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"{name}={text!r}: {part!r} is not a core id or a range like 0-1") from None
        if first < 0 or last < first:
            raise ValueError(f"{name}={text!r}: {part!r} is not a range of core ids >= 0")
        cores.update(range(first, last + 1))
    return cores


def usable_cores() -> int:
    """How many CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def why_not_pinnable(text: str) -> str | None:
    """None where this process could pin itself to the cores in `text`; else
    why not (another OS, a core it may not use)."""
    cores = parse_cores(text)
    if not hasattr(os, "sched_setaffinity"):
        return f"actor_cores={text!r}: this OS has no CPU affinity call; actors run unpinned"
    allowed = os.sched_getaffinity(0)
    if not cores <= allowed:
        return (f"actor_cores={text!r}: cores {sorted(cores - allowed)} are not available to this process "
                f"(it may use {sorted(allowed)}); actors run unpinned")
    return None


def pin_process(text: str) -> str | None:
    """Pins every thread of this process (and so the threads it starts later)
    to the cores in `text`; returns None, or why it could not, for the caller to print."""
    why_not = why_not_pinnable(text)
    if why_not:
        return why_not
    cores = parse_cores(text)
    # Linux sets the affinity per thread: every thread already running, then
    # new ones inherit it from the thread that starts them.
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:
            pass  # a thread that ended meanwhile
    return None
