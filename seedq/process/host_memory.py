"""How much memory this process may use: the machine's, or its container's
(cgroup v2 `memory.max`) where that is lower. Standard library only: the
server's env-slot budget and R2D2's replay check both read it."""

from __future__ import annotations

import os

CGROUP_LIMIT = "/sys/fs/cgroup/memory.max"


def _cgroup_limit() -> int | None:
    try:
        with open(CGROUP_LIMIT) as f:
            limit = f.read().strip()
    except OSError:
        return None
    return int(limit) if limit.isdigit() else None


def memory_bytes() -> int:
    """This process's memory: the machine's, or its cgroup's limit when lower (a container)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_limit()
    return total if limit is None else min(total, limit)


def memory_available_bytes() -> int | None:
    """Memory a new allocation can use without swapping: the kernel's
    MemAvailable (Linux), capped by the container's limit (inside a
    container MemAvailable counts the host's memory); None where unknown."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    limit = _cgroup_limit()
    if available is None:
        return limit
    return available if limit is None else min(available, limit)
