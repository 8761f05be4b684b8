"""`seedq compare`: IMPALA vs SEED and int8 vs fp32 actors, one change at a time.

Every configuration is one `seedq train` run in a fresh process, one after
another on this machine (same cores, same actors and envs), with identical
hyperparameters; the configurations differ only in these fields:

  seed-fp32    architecture=seed    precision=fp32  (central inference)
  seed-int8    architecture=seed    precision=int8  (central int8 inference)
  impala-fp32  architecture=impala  actor_precision=fp32  (local policy copies)
  impala-int8  architecture=impala  actor_precision=int8  (ActorQ: int8 pulls and inference)

Outputs in --out: `results.csv` (one tidy row per configuration and seed),
`curves.csv` (return over frames and seconds, from the runs' TensorBoard
files), the runs themselves under `runs/` (each with its own output beside
it, `runs/<config>-seed<seed>.log`), and PNG plots.

Energy and carbon are ESTIMATES, not measurements: the CPU seconds the run's
processes used (learner + actors, from os.times() of the finished child
processes) times an assumed power per busy core, times an assumed grid carbon
intensity; both assumptions are flags and are written into every row.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import glob
import os
import signal
import subprocess
import sys
import threading
import time
import typing

import numpy as np

from seedq import exit_codes, extras
from seedq.bench.throughput import read_json
from seedq.config import TrainConfig

extras.require("bench", "matplotlib")  # the plots

CONFIGS = {
    "seed-fp32": {"architecture": "seed", "precision": "fp32", "actor_precision": "fp32"},
    "seed-int8": {"architecture": "seed", "precision": "int8", "actor_precision": "fp32"},
    "impala-fp32": {"architecture": "impala", "precision": "fp32", "actor_precision": "fp32"},
    "impala-int8": {"architecture": "impala", "precision": "fp32", "actor_precision": "int8"},
}
# Energy model defaults (see docs/benchmarks.md): ~10 W per fully busy core
# (a 65 W desktop CPU over 6-8 cores, or a server core with its share of
# uncore power), and 475 gCO2e/kWh (IEA world-average grid intensity, 2019).
WATTS_PER_CORE = 10.0
GRAMS_CO2_PER_KWH = 475.0
SPLIT = ("env", "inference", "communication", "pull", "load")


def parse_configs(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in CONFIGS]
    if bad or not names:
        raise ValueError(f"--configs {text!r}: unknown {', '.join(bad) or '(none given)'}; "
                         f"choose from {', '.join(CONFIGS)}")
    return names


def run_config(base: TrainConfig, name: str, seed: int, logdir: str) -> TrainConfig:
    """`base` with the one field set that configuration `name` changes."""
    return dataclasses.replace(base, seed=seed, logdir=logdir, **CONFIGS[name])


def actor_totals(actor_stats: list[dict]) -> dict:
    """Sums over actors of their steady-state counters (whole run where missing)."""
    keys = ("frames", "seconds", "cpu_seconds", "bytes_sent", "bytes_received") + tuple(
        f"{k}_seconds" for k in SPLIT
    )
    totals = dict.fromkeys(keys, 0.0)
    for stats in actor_stats:
        source = stats.get("steady") or stats
        for k in keys:
            totals[k] += float(source.get(k, 0.0))
    totals["pulls"] = sum(int(s.get("pulls", 0)) for s in actor_stats)
    return totals


def tidy_row(name: str, config: TrainConfig, summary: dict, actors: list[dict], curves: list[dict],
             cpu_seconds_total: float, *, watts_per_core: float, grams_co2_per_kwh: float,
             load_avg: float) -> dict:
    """One results.csv row: what the run reached, how fast, and where actor time went."""
    t = actor_totals(actors)
    frames = max(t["frames"], 1.0)
    # Learner-side throughput between the first and last progress tick (no start-up).
    steady_fps = None
    if len(curves) >= 2 and curves[-1]["seconds"] > curves[0]["seconds"]:
        steady_fps = (curves[-1]["frames"] - curves[0]["frames"]) / (curves[-1]["seconds"] - curves[0]["seconds"])
    timed = sum(t[f"{k}_seconds"] for k in SPLIT)
    energy_wh = cpu_seconds_total * watts_per_core / 3600.0
    evaluation = summary.get("eval") or {}
    row = {
        "config": name,
        "architecture": config.architecture,
        "precision": config.precision,
        "actor_precision": config.actor_precision,
        "seed": config.seed,
        "env": config.env,
        "wall_seconds": summary["wall_seconds"],
        "frames": summary["frames"],
        "return": summary["mean_return_last100"],
        "eval_return": evaluation.get("mean"),
        "reached_target": summary["reached_target"],
        "seconds_to_target": summary["seconds_to_target"],
        "frames_to_target": summary["frames_to_target"],
        "frames_per_second": summary["frames"] / summary["wall_seconds"] if summary["wall_seconds"] else None,
        "steady_frames_per_second": steady_fps,
        "actor_cpu_seconds": t["cpu_seconds"],
        "frames_per_actor_cpu_second": t["frames"] / t["cpu_seconds"] if t["cpu_seconds"] else None,
        "bytes_sent_per_frame": t["bytes_sent"] / frames,
        "bytes_received_per_frame": t["bytes_received"] / frames,
        "policy_lag_mean": summary.get("policy_lag_mean"),
        "param_pulls": t["pulls"],
        **{f"{k}_us_per_frame": 1e6 * t[f"{k}_seconds"] / frames for k in SPLIT},
        # Actor wall time outside the five timed parts (bookkeeping, unroll assembly).
        "other_us_per_frame": 1e6 * max(t["seconds"] - timed, 0.0) / frames,
        "cpu_seconds_total": cpu_seconds_total,
        "energy_wh_estimate": energy_wh,
        "co2_g_estimate": energy_wh / 1000.0 * grams_co2_per_kwh,
        "watts_per_core_assumed": watts_per_core,
        "grams_co2_per_kwh_assumed": grams_co2_per_kwh,
        "load_avg_1m_at_start": load_avg,
        "logdir": config.logdir,
    }
    return row


def read_curve(logdir: str) -> list[dict]:
    """[{frames, seconds, return, episodes}] at every progress tick of a run
    (`return`: the mean over the last return_window episodes, fewer before
    `episodes` reaches it)."""
    from seedq.learner.events import read_scalars

    scalars = read_scalars(logdir)
    seconds = dict(scalars.get("time/elapsed_seconds", []))
    episodes = dict(scalars.get("episode/count", []))
    return [
        {"frames": step, "seconds": seconds[step], "return": value, "episodes": episodes.get(step)}
        for step, value in scalars.get("episode/return_mean", [])
        if step in seconds
    ]


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


def run_jobs(jobs: list[Job], max_running: int, *, on_start, on_finish, poll_seconds: float = 0.2) -> None:
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
    "terminated") are called in this thread.
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
                stop_overdue(time.monotonic())
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


def write_csv(path: str, rows: list[dict]) -> None:
    """Writes `rows` atomically. A `logdir` column is written relative to the
    CSV's folder, so committed results name no path of the machine that ran them."""
    if not rows:
        return
    folder = os.path.dirname(os.path.abspath(path))
    rows = [{**row, "logdir": os.path.relpath(os.path.abspath(row["logdir"]), folder)} if row.get("logdir") else row
            for row in rows]
    with open(path + ".tmp", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    os.replace(path + ".tmp", path)


def read_csv(path: str) -> list[dict]:
    """Rows with numbers parsed back (empty cells -> None)."""
    def parse(v: str):
        if v == "":
            return None
        if v in ("True", "False"):
            return v == "True"
        try:
            return float(v) if any(c in v for c in ".eE") or not v.lstrip("-").isdigit() else int(v)
        except ValueError:
            return v

    with open(path, newline="") as f:
        return [{k: parse(v) for k, v in row.items()} for row in csv.DictReader(f)]


def summarize(rows: list[dict]) -> list[dict]:
    """Per configuration: medians over seeds of the headline columns, and how many reached the target."""
    out = []
    for name in dict.fromkeys(r["config"] for r in rows):
        group = [r for r in rows if r["config"] == name]

        def median(key):
            values = [r[key] for r in group if r[key] is not None]
            return float(np.median(values)) if values else None

        out.append({
            "config": name,
            "seeds": len(group),
            "reached_target": sum(bool(r["reached_target"]) for r in group),
            **{k: median(k) for k in (
                "seconds_to_target", "frames_to_target", "return", "frames_per_second",
                "steady_frames_per_second", "frames_per_actor_cpu_second", "bytes_sent_per_frame",
                "bytes_received_per_frame", "policy_lag_mean", "energy_wh_estimate", "co2_g_estimate",
            )},
        })
    return out


def return_at(curves: list[dict], config: str, frames: float) -> float | None:
    """Median over seeds of the mean return (last 100 episodes) at `frames`,
    linearly interpolated between progress ticks; None where a run ended earlier."""
    values = []
    for seed in dict.fromkeys(c["seed"] for c in curves if c["config"] == config):
        points = [(c["frames"], c["return"]) for c in curves if c["config"] == config and c["seed"] == seed]
        xs, ys = zip(*points) if points else ((), ())
        if xs and xs[0] <= frames <= xs[-1]:
            values.append(float(np.interp(frames, xs, ys)))
    return float(np.median(values)) if values else None


def format_table(summary: list[dict]) -> str:
    """Markdown table of `summarize` (medians over seeds)."""
    def fmt(v, spec):
        return "–" if v is None else format(v, spec)

    lines = [
        "| config | reached / seeds | s to target | frames to target | frames/s (steady) | frames per actor CPU-s | "
        "bytes/frame sent / recv | policy lag | energy Wh (est.) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        lines.append(
            f"| {s['config']} | {s['reached_target']}/{s['seeds']} | {fmt(s['seconds_to_target'], '.1f')} | "
            f"{fmt(s['frames_to_target'], ',.0f')} | {fmt(s['steady_frames_per_second'], ',.0f')} | "
            f"{fmt(s['frames_per_actor_cpu_second'], ',.0f')} | {fmt(s['bytes_sent_per_frame'], '.1f')} / "
            f"{fmt(s['bytes_received_per_frame'], '.1f')} | {fmt(s['policy_lag_mean'], '.2f')} | "
            f"{fmt(s['energy_wh_estimate'], '.3f')} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], curves: list[dict], out: str) -> list[str]:
    """Writes the four PNGs into `out`; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["config"] for r in rows))
    colors = {n: f"C{i}" for i, n in enumerate(names)}
    paths = []

    for x, label, filename in (("frames", "env frames", "return_vs_frames.png"),
                               ("seconds", "wall seconds", "return_vs_time.png")):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for name in names:
            for i, seed in enumerate(dict.fromkeys(c["seed"] for c in curves if c["config"] == name)):
                points = [c for c in curves if c["config"] == name and c["seed"] == seed]
                ax.plot([p[x] for p in points], [p["return"] for p in points], color=colors[name],
                        alpha=0.8, label=name if i == 0 else None)
        ax.set_xlabel(label)
        ax.set_ylabel("mean return (last 100 episodes)")
        ax.legend(loc="lower right")
        fig.tight_layout()
        paths.append(os.path.join(out, filename))
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, name in enumerate(names):
        values = [r["steady_frames_per_second"] or r["frames_per_second"] or 0.0 for r in rows if r["config"] == name]
        ax.bar(i, np.median(values), color=colors[name])
        ax.plot([i] * len(values), values, "k.", alpha=0.6)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("env frames/s (learner, steady state)")
    fig.tight_layout()
    paths.append(os.path.join(out, "frames_per_second.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7.5, 4))
    bottom = np.zeros(len(names))
    for j, part in enumerate(SPLIT + ("other",)):
        values = np.array([
            np.median([r[f"{part}_us_per_frame"] for r in rows if r["config"] == name]) for name in names
        ])
        ax.bar(range(len(names)), values, bottom=bottom, label=part, color=f"C{j}")
        bottom += values
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("actor time per env frame (µs)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    paths.append(os.path.join(out, "time_split.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def run(base: TrainConfig, configs: list[str], seeds: int, out: str, *,
        watts_per_core: float = WATTS_PER_CORE, grams_co2_per_kwh: float = GRAMS_CO2_PER_KWH,
        timeout: float | None = None, log=print) -> dict:
    """Runs every configuration for `seeds` seeds (seed base.seed + i), one at a
    time, each in a fresh `seedq train` process (its output in
    runs/<config>-seed<seed>.log), and writes CSVs and plots."""
    os.makedirs(out, exist_ok=True)
    timeout = timeout or (base.max_seconds + 180 if base.max_seconds else None)
    jobs = []
    # Seeds outermost: a drifting machine load affects every configuration alike.
    for i in range(seeds):
        for name in configs:
            seed = base.seed + i
            config = run_config(base, name, seed, os.path.join(out, "runs", f"{name}-seed{seed}"))
            jobs.append(Job(train_command(config), config.logdir + ".log", f"{name} seed {seed}",
                            payload=(name, config), timeout_seconds=timeout))
    rows, curves = [], []
    at_start: dict[str, tuple[float, os.times_result, float]] = {}

    def started(job: Job) -> None:
        at_start[job.what] = (os.getloadavg()[0], os.times(), time.monotonic())

    def ended(job: Job) -> None:
        name, config = job.payload
        load_avg, before, started_at = at_start.pop(job.what)
        summary = read_json(os.path.join(config.logdir, "summary.json"))
        if summary is None or summary.get("stop_reason") in ("terminated", "interrupted"):
            return  # stopped with the benchmark: not a result
        after = os.times()
        # The finished children's CPU since the start: with one run at a time, this
        # run's learner and, through it, its actor processes (all waited for).
        cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        actors = [s for s in (read_json(p) for p in sorted(glob.glob(os.path.join(config.logdir, "actors", "*.json")))) if s]
        curve = read_curve(config.logdir)
        row = tidy_row(name, config, summary, actors, curve, cpu, watts_per_core=watts_per_core,
                       grams_co2_per_kwh=grams_co2_per_kwh, load_avg=load_avg)
        log(f"{job.what}: {row['frames']:,} frames in {row['wall_seconds']:.1f}s, return "
            f"{row['return'] if row['return'] is None else round(row['return'], 1)}, "
            f"target {'at %.1fs' % row['seconds_to_target'] if row['reached_target'] else 'not reached'} "
            f"(command {time.monotonic() - started_at:.1f}s, load {load_avg:.1f})")
        rows.append(row)
        curves.extend({"config": name, "seed": config.seed, **p} for p in curve)
        write_csv(os.path.join(out, "results.csv"), rows)  # partial results survive a crash
        write_csv(os.path.join(out, "curves.csv"), curves)

    run_jobs(jobs, 1, on_start=started, on_finish=ended)
    return report(out)


def report(out: str) -> dict:
    """Reads results.csv / curves.csv in `out`, (re)draws the plots, returns the summary."""
    rows = read_csv(os.path.join(out, "results.csv"))
    curves = read_csv(os.path.join(out, "curves.csv"))
    summary = summarize(rows)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(format_table(summary) + "\n")
    return {"summary": summary, "plots": plot(rows, curves, out), "table": format_table(summary)}
