"""Run directories that never mix: a fresh run refuses a directory that holds
one, and resuming a run that already met its stop condition says which flag
extends it.

Standard library only: `seedq train` checks before anything heavy is imported.
"""

from __future__ import annotations

import json
import os
import shutil

# What makes a directory a run's: its config and its checkpoints.
RUN_MARKERS = ("config.json", "checkpoints")

# summary.json's stop reasons that a larger budget extends: the flag to raise.
_EXTENDING_FLAGS = {
    "max_frames": ("--max-frames", "frames"),
    "max_seconds": ("--max-seconds", "wall_seconds"),
    "target_return": ("--target-return", None),
}


def holds_run(logdir: str) -> bool:
    """Whether `logdir` already holds a run (its config.json or checkpoints/)."""
    return any(os.path.exists(os.path.join(logdir, marker)) for marker in RUN_MARKERS)


def refusal(logdir: str) -> str:
    """The one-line refusal of a fresh run in a directory that holds one."""
    return (
        f"--logdir {logdir} already holds a run: continue it with --resume {logdir}, "
        "or replace it with --overwrite"
    )


def clear(logdir: str) -> None:
    """Removes the run in `logdir` (--overwrite); other files stay."""
    for name in os.listdir(logdir) if os.path.isdir(logdir) else ():
        path = os.path.join(logdir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def read_summary(run_dir: str) -> dict:
    """The run's summary.json ({} when it has none or it cannot be read)."""
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
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
