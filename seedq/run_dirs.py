"""Run directories: what seedq writes into one, the marker that makes a folder
a run, the lock held by the process that writes it, and the only removal
seedq ever makes there (`--overwrite`).

A fresh run refuses a directory that holds one, resuming a run that already
met its stop condition says which flag extends it, and `--overwrite` removes
only the entries on `RUN_ENTRIES` from a directory that is a run: a folder
that holds anything else (a project with a config.json of its own) is never
emptied.

Standard library only: `seedq train` checks before anything heavy is imported.
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import json
import os
import shutil
import socket
import sys
import threading
import time

from seedq.process import exit_codes

# --- what a run directory holds ---
# Every entry seedq writes into a run directory. A writer takes its name from
# here, so this list is complete by construction; `--overwrite` removes these
# and nothing else.
MARKER = ".seedq-run"  # written when seedq creates the run
LOCK = ".seedq-lock"  # the writer's advisory lock (RunLock)
CONFIG = "config.json"
SUMMARY = "summary.json"
STATS = "stats.json"
CURVES_CSV = "curves.csv"
CURVES_PNG = "curves.png"
CHECKPOINTS = "checkpoints"
ACTORS = "actors"  # the local actors' time splits
TENSORBOARD = "events.out.tfevents.*"
WANDB = "wandb"  # W&B's own files (wandb.init(dir=logdir))
WANDB_RUN_ID = "wandb-run-id"
COMPARE = "compare.json"  # seedq compare's measurements per segment
EVALUATIONS = "evaluations.json"  # seedq compare's checkpoint evaluations
RUN_ENTRIES = (MARKER, LOCK, CONFIG, SUMMARY, STATS, CURVES_CSV, CURVES_PNG, CHECKPOINTS, ACTORS,
               TENSORBOARD, WANDB, WANDB_RUN_ID, COMPARE, EVALUATIONS)

# summary.json's stop reasons that a larger budget extends: the flag to raise.
_EXTENDING_FLAGS = {
    "max_frames": ("--max-frames", "frames"),
    "max_seconds": ("--max-seconds", "wall_seconds"),
    "target_return": ("--target-return", None),
}


def is_run_entry(name: str) -> bool:
    """Whether `name` is an entry seedq writes in a run directory, or the
    temporary file of an atomic write of one that a kill left behind."""
    return any(
        fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".tmp")
        or fnmatch.fnmatchcase(name, pattern + ".*.tmp")
        for pattern in RUN_ENTRIES
    )


def holds_run(logdir: str) -> bool:
    """Whether `logdir` holds a run: its marker, or (a run written before the
    marker existed) its config.json or checkpoints/."""
    return any(os.path.lexists(os.path.join(logdir, name)) for name in (MARKER, CONFIG, CHECKPOINTS))


def foreign_entries(logdir: str) -> list[str]:
    """The names in `logdir` that seedq does not write, sorted."""
    try:
        names = os.listdir(logdir)
    except FileNotFoundError:
        return []
    return sorted(name for name in names if not is_run_entry(name))


def refusal(logdir: str) -> str:
    """The one-line refusal of a fresh run in a directory that holds one."""
    return (
        f"--logdir {logdir} already holds a run: continue it with --resume {logdir}, "
        "or replace it with --overwrite"
    )


def overwrite_refusal(logdir: str) -> str | None:
    """Why `--overwrite` may not clear `logdir` (one line), or None when it may:
    the directory is a run (marked, or an older run whose entries are all
    seedq's) that holds nothing else, and is not itself a symlink."""
    if os.path.islink(logdir):
        return (f"--overwrite: --logdir {logdir} is a symlink; seedq clears only a run directory itself "
                "(name the directory it points to, or remove its files by hand)")
    if not os.path.isdir(logdir):
        return f"--overwrite: --logdir {logdir} is not a directory"
    foreign = foreign_entries(logdir)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        return (f"--overwrite: --logdir {logdir} holds files seedq did not write ({shown}); nothing was "
                "removed: choose another --logdir, or move those files out")
    return None


def clear(logdir: str) -> None:
    """Removes the run in `logdir` (`--overwrite`): the entries seedq writes,
    never through a symlink (a link is removed, not what it points to); the
    lock file stays (its holder is the caller). ValueError (one line, nothing
    removed) when `overwrite_refusal` refuses."""
    why = overwrite_refusal(logdir)
    if why:
        raise exit_codes.UsageError(why)
    for name in os.listdir(logdir):
        if name == LOCK or not is_run_entry(name):
            continue
        path = os.path.join(logdir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)  # (rmtree removes links inside as links)
        else:
            os.remove(path)


def write_marker(logdir: str) -> None:
    """Marks `logdir` as a run directory seedq created (kept when it exists)."""
    path = os.path.join(logdir, MARKER)
    if not os.path.exists(path):
        from seedq import __version__

        with open(path, "w") as f:
            json.dump({"seedq": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, f)
            f.write("\n")


def read_summary(run_dir: str) -> dict:
    """The run's summary.json ({} when it has none or it cannot be read)."""
    try:
        with open(os.path.join(run_dir, SUMMARY)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def finished_hint(summary: dict, *, max_frames: int, max_seconds: float,
                  target_return: float | None) -> str | None:
    """One line naming the flag that extends a run whose summary says it met a
    stop condition that the resumed config still meets; None when the resumed
    run has something left to do."""
    reason = summary.get("stop_reason")
    if reason not in _EXTENDING_FLAGS:
        return None
    flag, key = _EXTENDING_FLAGS[reason]
    if reason == "target_return":
        if target_return is None:
            return None
        return (f"the run already reached its target return {target_return:g}; "
                f"{flag} none (or a higher one) trains it further")
    done = summary.get(key)
    limit = max_frames if reason == "max_frames" else max_seconds
    if not isinstance(done, (int, float)) or not limit or done < limit:
        return None
    return f"the run already met {reason}={limit:g}; a larger {flag} (above {done:g}) trains it further"


# --- the writer's lock ---
# The holder rewrites its lock file this often, so that a process on another
# host (which an advisory lock on a network disk may not reach) can tell a live
# holder from a dead one.
HEARTBEAT_SECONDS = 10.0
# A lock file from another host whose heartbeat is older than this is stale:
# several missed heartbeats, not one slow disk write.
STALE_AFTER_SECONDS = 60.0
# While waiting for a held lock (`--resume auto`), a line this often.
WAIT_LINE_SECONDS = 5.0
# Set in a child's environment by a supervisor that holds its run's lock.
LOCK_HELD_ENV = "SEEDQ_RUN_LOCK_HELD"


class RunDirInUse(exit_codes.UsageError):
    """Another live process writes the run directory (the message names it)."""


def _holder_line(logdir: str, holder: dict) -> str:
    pid, host = holder.get("pid", "?"), holder.get("host", "?")
    return f"run directory {logdir} is in use by seedq pid {pid} on host {host}"


def _read_holder(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = json.loads(os.read(fd, 4096).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _fresh_elsewhere(holder: dict, now: float) -> bool:
    """Whether the lock file names a process on another host whose heartbeat is
    recent: it may be alive, and this host's lock cannot see it."""
    heartbeat = holder.get("heartbeat")
    return (bool(holder.get("pid")) and holder.get("host") not in (None, socket.gethostname())
            and isinstance(heartbeat, (int, float)) and now - heartbeat < STALE_AFTER_SECONDS)


class RunLock:
    """The lock of the process that writes a run directory: an advisory
    `flock` on `<logdir>/.seedq-lock` (the kernel drops it when its holder
    dies, so a killed run on this host never blocks the next), and in the file
    the holder's pid, host and a heartbeat for processes on other hosts.
    Use `hold`."""

    def __init__(self, logdir: str, fd: int):
        self.logdir = logdir
        self._fd = fd
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._beat, name="seedq-run-lock", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "heartbeat": time.time()})
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, text.encode() + b"\n", 0)
        except OSError:
            pass  # a full disk: the lock itself still holds on this host

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            self._write()

    def release(self) -> None:
        if self._fd < 0:
            return
        self._stop.set()
        self._thread.join(timeout=2)
        try:
            os.ftruncate(self._fd, 0)  # no holder (the file stays: removing it races a waiter)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = -1
            _held.pop(os.path.realpath(self.logdir), None)


_held: dict[str, RunLock] = {}  # this process's locks, by the directory's real path


def _try_lock(logdir: str) -> tuple[RunLock | None, dict]:
    """(the lock, {}) or (None, the holder's file content)."""
    fd = os.open(os.path.join(logdir, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = _read_holder(fd)
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None, holder or {"pid": "?", "host": "?"}
        raise
    holder = _read_holder(fd)
    if _fresh_elsewhere(holder, time.time()):
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        return None, holder
    return RunLock(logdir, fd), {}


def hold(logdir: str, *, wait: bool = False, log=None) -> RunLock:
    """Locks `logdir` (created if missing) for this process and returns the
    lock (the same one when this process holds it already). Held by a live
    process: RunDirInUse naming its pid and host, or with `wait` (a restarted
    pod whose predecessor is still stopping) a line to `log` (default: stderr)
    every few seconds until it is free."""
    os.makedirs(logdir, exist_ok=True)
    key = os.path.realpath(logdir)
    if key in _held:
        return _held[key]
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    next_line = 0.0
    while True:
        lock, holder = _try_lock(logdir)
        if lock is not None:
            _held[key] = lock
            return lock
        line = _holder_line(logdir, holder)
        if not wait:
            raise RunDirInUse(f"{line}; wait for it to stop, or stop it first")
        now = time.monotonic()
        if now >= next_line:
            log(f"{line}; waiting for it to stop")
            next_line = now + WAIT_LINE_SECONDS
        time.sleep(0.5)


def holds_lock_already() -> bool:
    """Whether a supervisor started this process holding its run's lock."""
    return bool(os.environ.get(LOCK_HELD_ENV))
