"""`seedq train` runs as jobs: run one after another (or a few at once) in
processes of their own, stopped together, and continued where they stopped.

`run_jobs` runs commands with the stop protocol of the benchmarks that train
(`seedq compare`, `seedq bench suite`); `resume_args` decides, for one planned
run, whether it is finished (skipped), continues an unfinished earlier
attempt from its checkpoint (`seedq train --resume`), or starts afresh.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import typing

from seedq import config as config_lib
from seedq import run_dirs
from seedq.process import exit_codes
from seedq.bench.throughput import read_json
from seedq.config import TrainConfig, to_dict


class Stopped(Exception):
    """SIGTERM or SIGINT (Ctrl-C) reached a benchmark while a run trained; the
    run was passed the signal, checkpointed and exited. `signum`: the signal."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


@contextlib.contextmanager
def _first_stop_passed_on(pass_on):
    """While inside, the first SIGTERM or SIGINT this process gets calls
    `pass_on(signum)` (once; later ones are ignored, so a terminal's Ctrl-C
    reaching the children too is not doubled). Yields the list the signal
    number is appended to. Handlers can only be set in the main thread;
    elsewhere the signals keep their handlers."""
    received: list[int] = []

    def handler(signum, frame):
        if not received:
            received.append(signum)
            pass_on(signum)

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)} if in_main_thread else {}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# A job past its time limit gets SIGTERM (it checkpoints and exits); one still
# running this long after that is killed.
KILL_AFTER_SECONDS = 60.0

# How often a running training job reports its progress: often enough to see an
# hours-long comparison move, rare enough that its output stays readable.
PROGRESS_EVERY_SECONDS = 60.0


@dataclasses.dataclass
class Job:
    """One command for `run_jobs`: its output goes to `log_path`."""

    cmd: list[str]
    log_path: str
    what: str  # names the job in errors
    payload: object = None  # the caller's, handed back to on_start / on_finish
    # A job still running after this many seconds is stopped with SIGTERM and
    # counts as failed (a safety net for a run that hangs; None: no limit).
    timeout_seconds: float | None = None


def run_jobs(jobs: list[Job], max_running: int, *, on_start, on_finish, poll_seconds: float = 0.2,
             on_progress=None, progress_seconds: float = PROGRESS_EVERY_SECONDS) -> None:
    """Runs `jobs` as child processes, at most `max_running` at once, in order.

    Each child runs in a process group of its own with its output in its
    `log_path`. The first SIGTERM or SIGINT this process gets is passed on once
    to every running child, no job starts after it, and Stopped is raised when
    they have all exited. A job that fails (exit status not 0) stops the rest
    the same way, with SIGTERM (a stopped training run saves a checkpoint, so a
    rerun continues it), and RuntimeError names it with the end of its output;
    so does a job past its `timeout_seconds`. `on_start(job)` and
    `on_finish(job)` (exit 0, or after a stop the exit status of a stopped
    `seedq train`: 143 for SIGTERM, 130 for SIGINT, with stop_reason
    "terminated") are called in this thread, and so is `on_progress(job, pid)`
    for every running job each `progress_seconds`.
    (A process pool of the standard library would run Python callables, not
    commands with their own process groups and this stop protocol.)
    """
    # child -> (its job, its open log file, when it started)
    running: dict[subprocess.Popen, tuple[Job, typing.IO, float]] = {}
    signalled: set[subprocess.Popen] = set()
    failed: list[tuple[Job, str]] = []  # (job, why)
    pending = list(jobs)

    def stop_all(signum: int) -> None:
        for proc in list(running):
            if proc not in signalled and proc.poll() is None:
                signalled.add(proc)
                proc.send_signal(signum)

    def start(job: Job) -> None:
        on_start(job)
        os.makedirs(os.path.dirname(job.log_path) or ".", exist_ok=True)
        log_file = open(job.log_path, "w")
        proc = subprocess.Popen(job.cmd, stdout=log_file, stderr=subprocess.STDOUT, process_group=0)
        running[proc] = (job, log_file, time.monotonic())

    def reap(proc: subprocess.Popen) -> None:
        job, log_file, _ = running.pop(proc)
        log_file.close()
        stopped = (received or proc in signalled) and proc.returncode in (
            exit_codes.TERMINATED, exit_codes.INTERRUPTED)
        if proc.returncode == 0 or stopped:  # (a run we stopped checkpointed and exited 143)
            on_finish(job)
        elif not received and proc not in signalled:
            failed.append((job, f"failed (exit {proc.returncode})"))
            stop_all(signal.SIGTERM)

    def stop_overdue(now: float) -> None:
        for proc, (job, _, started) in list(running.items()):
            late = now - started - (job.timeout_seconds or float("inf"))
            if late > 0 and not any(j is job for j, _ in failed):
                failed.append((job, f"ran past its limit of {job.timeout_seconds:.0f}s and was stopped"))
                stop_all(signal.SIGTERM)
            elif late > KILL_AFTER_SECONDS:  # hung too hard to stop cleanly
                proc.kill()

    def may_start() -> bool:
        return bool(pending) and not received and not failed

    next_progress = time.monotonic() + progress_seconds
    with _first_stop_passed_on(stop_all) as received:  # `received` is read by reap and may_start
        try:
            while running or may_start():
                while may_start() and len(running) < max_running:
                    start(pending.pop(0))
                    if received:  # the stop came while it started
                        stop_all(received[0])
                time.sleep(poll_seconds)
                for proc in [p for p in running if p.poll() is not None]:
                    reap(proc)
                now = time.monotonic()
                stop_overdue(now)
                if on_progress is not None and now >= next_progress and not received:
                    next_progress = now + progress_seconds
                    for proc, (job, _, _) in list(running.items()):
                        on_progress(job, proc.pid)
        except BaseException:
            stop_all(signal.SIGTERM)  # no child is left training on its own
            raise
    if received:
        name = signal.Signals(received[0]).name
        raise Stopped(f"stopped by {name}, passed on to every running job, which exited", received[0])
    if failed:
        job, why = failed[0]
        with open(job.log_path) as f:
            tail = f.read()[-2000:].strip()
        raise RuntimeError(f"{job.what} {why}: {tail}")


def progress_line(what: str, stats: dict, max_frames: int, frames_per_second: float | None) -> str:
    """One line on a running `seedq train` job from its stats.json: frames (of
    `max_frames` where set), the mean return of its last episodes, and frames/s
    since the previous line with the time left at that rate."""
    frames = int(stats.get("frames") or 0)
    parts = [f"{frames:,} of {max_frames:,} frames" if max_frames else f"{frames:,} frames"]
    if stats.get("mean_return") is not None:
        parts.append(f"mean return {stats['mean_return']:.2f}")
    if frames_per_second:
        parts.append(f"{frames_per_second:,.0f} frames/s")
        if max_frames and frames < max_frames:
            parts.append(f"about {(max_frames - frames) / frames_per_second / 60:.0f} min left")
    return f"{what}: " + ", ".join(parts)


def job_progress(log) -> typing.Callable[[Job, int], None]:
    """An `on_progress` for `run_jobs`: logs `progress_line` for each job whose
    payload is a TrainConfig, from the stats.json its process (`pid`) wrote
    (one left by an earlier attempt of a resumed run is not read as news);
    for any other job, the last line of its log when it is a new one."""
    seen: dict[str, tuple[float, int]] = {}  # job -> (when, frames) of its previous line
    last_lines: dict[str, str] = {}

    def report(job: Job, pid: int) -> None:
        config = job.payload
        if not isinstance(config, TrainConfig):
            line = last_line(job.log_path)
            if line and line != last_lines.get(job.what):
                last_lines[job.what] = line
                log(f"{job.what}: {line}")
            return
        stats = read_json(os.path.join(config.logdir, "stats.json"))
        if not stats or stats.get("pid") != pid:
            return
        now, frames = time.monotonic(), int(stats.get("frames") or 0)
        rate = None
        if job.what in seen:
            then, frames_then = seen[job.what]
            rate = (frames - frames_then) / (now - then) if now > then and frames > frames_then else None
        seen[job.what] = (now, frames)
        log(progress_line(job.what, stats, config.max_frames, rate))

    return report


def last_line(path: str, tail_bytes: int = 4096) -> str:
    """The last complete line of the text file at `path` ("" if none yet)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = text.split("\n")[:-1]  # the text after the last newline is still being written
    return lines[-1].strip() if lines else ""


def train_command(config: TrainConfig, extra_args: tuple[str, ...] = ()) -> list[str]:
    """The `seedq train` command line of `config` (only the flags that differ
    from the env's defaults, then `extra_args`, e.g. --resume; else --overwrite). The run stops
    (checkpointed, so resumable) when this process dies: in its own process
    group, it would otherwise outlive a SIGKILLed suite and keep writing
    into a directory that the suite's rerun resumes or clears."""
    from seedq.flags import config_flags

    config.validate()
    # A fresh run replaces what an earlier invocation left in its directory (a rerun of the comparison).
    fresh = () if "--resume" in extra_args else ("--overwrite",)
    return [sys.executable, "-m", "seedq.cli", "train", *config_flags(config), *extra_args, *fresh, "--quiet",
            "--parent-pid", str(os.getpid())]


def finished(config: TrainConfig) -> bool:
    """Whether the run in config.logdir stopped at one of its budgets: max_frames
    (all of them), max_seconds or the target return (where the config has them)."""
    summary = read_json(os.path.join(config.logdir, "summary.json"))
    if not summary:
        return False
    reason = summary.get("stop_reason")
    return bool(
        (reason == "max_frames" and config.max_frames and summary["frames"] >= config.max_frames)
        or (reason == "max_seconds" and config.max_seconds)
        or (reason == "target_return" and config.target_return is not None)
    )


# The settings a rerun of a comparison or suite may change to extend its runs
# from their checkpoints (the schedules' -1 horizons follow the new budget),
# and the count of kept checkpoints, which a comparison derives from the budget.
BUDGETS = ("max_frames", "max_seconds", "checkpoints_to_keep")
# The stop reasons of a run that met its budget (a larger one extends it).
BUDGET_STOPS = ("max_frames", "max_seconds", "target_return")


def other_settings(config: TrainConfig) -> list[str]:
    """'key: saved -> current' for each setting, budgets aside, in which the run
    in config.logdir (its config.json, as this code reads it) differs from
    `config`; ["(its config.json cannot be read: ...)"] when it cannot be compared."""
    saved = read_json(os.path.join(config.logdir, run_dirs.CONFIG))
    if saved is None:
        return ["(it has no readable config.json)"]
    try:
        # As this code reads it (seedq.config.layout): a field the run's seedq
        # did not have yet counts at its default.
        saved = json.loads(json.dumps(to_dict(config_lib.from_saved(saved))))
    except (ValueError, TypeError) as e:
        return [f"(its config.json cannot be read: {e})"]
    current = json.loads(json.dumps(to_dict(config)))  # JSON has no tuples
    for key in BUDGETS:
        saved.pop(key, None)
        current.pop(key, None)
    return changed_settings(saved, current)


def changed_settings(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """'key: saved -> current' for every dotted key whose value differs (or is in one only)."""
    changes = []
    for key in sorted(set(saved) | set(current)):
        name = f"{prefix}{key}"
        old, new = saved.get(key, "(absent)"), current.get(key, "(absent)")
        if isinstance(old, dict) and isinstance(new, dict):
            changes += changed_settings(old, new, f"{name}.")
        elif old != new:
            changes.append(f"{name}: {old} -> {new}")
    return changes


def resume_args(config: TrainConfig, what: str, log) -> tuple[str, ...] | None:
    """For a planned run: None when it finished before (skipped); else the extra
    `seedq train` arguments: ("--resume", logdir) to continue a run with a
    checkpoint (an unfinished earlier attempt, or a finished run that a larger
    budget extends), () to start afresh. A run with a checkpoint is never
    removed: one made with other settings (budgets aside) is a ValueError
    naming them. Says which in `log`."""
    from seedq import checkpoint

    has_checkpoint = checkpoint.has_checkpoint(config.logdir)
    if has_checkpoint:  # (a finished run too: its results were made with the settings it has)
        changed = other_settings(config)
        if changed:
            shown = "; ".join(changed[:3]) + (f"; {len(changed) - 3} more" if len(changed) > 3 else "")
            raise ValueError(f"{what}: {config.logdir} holds a run made with other settings ({shown}); "
                             "only --max-frames and --max-seconds extend a run: give a new --out")
    if finished(config):
        log(f"{what}: finished before, skipped")
        return None
    if has_checkpoint:
        stats = read_json(os.path.join(config.logdir, run_dirs.STATS)) or {}
        so_far = f" (about {stats['frames']:,} frames in)" if isinstance(stats.get("frames"), int) else ""
        if (read_json(os.path.join(config.logdir, run_dirs.SUMMARY)) or {}).get("stop_reason") in BUDGET_STOPS:
            log(f"{what}: extending the finished run from its checkpoint to the new budget{so_far}")
        else:
            log(f"{what}: continuing an unfinished earlier attempt from its checkpoint{so_far}")
        return ("--resume", config.logdir)
    if run_dirs.holds_run(config.logdir):
        # (train_command's --overwrite replaces it: seedq's own files only)
        log(f"{what}: an earlier attempt left no checkpoint; starting afresh")
    return ()
