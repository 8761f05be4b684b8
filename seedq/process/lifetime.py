"""Child processes that stop with the process that started them.

seedq starts processes of its own (local actors under `seedq train`, the
training runs of `seedq bench suite` and `seedq compare`, the supervised
member of a learner group). When that parent dies without passing a signal on
(SIGKILL, the OOM killer), a child left running keeps writing into a run
directory that a rerun of the parent would resume or clear under it.
"""

from __future__ import annotations

import os
import signal

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def is_parent(pid: int) -> bool:
    """Whether `pid` (0: none) is still this process's parent; once a parent
    dies its children are re-parented, so a changed parent pid means it died."""
    return bool(pid) and os.getppid() == pid


def die_with_parent(parent_pid: int, sig: signal.Signals) -> bool:
    """Linux: have the kernel send us `sig` when `parent_pid`, the process
    that started us, dies, even by SIGKILL; SIGTERM asks seedq's commands to
    stop cleanly (checkpoint and exit), SIGKILL ends at once. Returns False
    where the OS offers no such request (elsewhere the caller falls back on
    checking `is_parent`).

    By hand through ctypes: the standard library's subprocess has no
    parent-death signal before Python 3.14, and the request has to come from
    the child itself (or a preexec_fn, which is unsafe with threads)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):  # not Linux: no prctl in the C library
        return False
    if not is_parent(parent_pid):  # it died before we asked
        os.kill(os.getpid(), sig)
    return True
