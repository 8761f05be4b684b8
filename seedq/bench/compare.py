"""`seedq compare`: IMPALA vs SEED and int8 vs fp32 actors, one change at a time.

Every configuration is one `seedq train` run in a fresh process, one after
another on this machine (the same actor processes and envs per process,
pinned to the same cores with --actor-cores), with identical
hyperparameters; the configurations differ only in these fields:

  seed-fp32    architecture=seed    precision=fp32  (central inference)
  seed-int8    architecture=seed    precision=int8  (central int8 inference)
  impala-fp32  architecture=impala  actor_precision=fp32  (local policy copies)
  impala-int8  architecture=impala  actor_precision=int8  (ActorQ: int8 pulls and inference)

Outputs in --out: `results.csv` (one tidy row per configuration and seed,
seedq.bench.compare_rows), `curves.csv` (return over frames and seconds,
from the runs' TensorBoard files), `summary.md` (a table per env), PNG
plots, and the runs themselves under `runs/` (each with its own output
beside it, `runs/<config>-seed<seed>.log`). Paths in the CSVs are relative.

Each run keeps a checkpoint every `checkpoint_frames` env frames; after it
those checkpoints and the final one are evaluated (seedq.bench.parity) and the row sets the
final one's normalised score against the best's.

Energy: RAPL counters where the kernel exposes them, else codecarbon's
estimate, else CPU seconds x an assumed power per core (seedq.bench.energy);
every row says which (`energy_source`). Carbon is the energy times an
assumed grid intensity (a flag, written into every row).

A rerun with the same flags skips the finished runs, continues unfinished
ones from their last checkpoint and evaluates what is not evaluated yet; a
larger budget extends every run (seedq.bench.jobs.resume_args, as `seedq
bench suite` does).
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import json
import os
import sys
import time

from seedq import extras, run_dirs
from seedq.bench import compare_rows, parity
from seedq.bench.energy import POWERCAP_ROOT, EnergyMeter
# The job runner, under the names it had here (seedq.bench.suite and the tests use them).
from seedq.bench.jobs import (  # noqa: F401
    Job, Stopped, finished, resume_args, run_jobs, train_command, job_progress,
)
from seedq.bench.throughput import read_json
from seedq.config import TrainConfig

extras.require("bench", "matplotlib")  # the plots

CONFIGS = {
    "seed-fp32": {"architecture": "seed", "precision": "fp32", "actor_precision": "fp32"},
    "seed-int8": {"architecture": "seed", "precision": "int8", "actor_precision": "fp32"},
    "impala-fp32": {"architecture": "impala", "precision": "fp32", "actor_precision": "fp32"},
    "impala-int8": {"architecture": "impala", "precision": "fp32", "actor_precision": "int8"},
}
# Energy model defaults (where neither RAPL nor codecarbon is there): ~10 W per
# fully busy core (a 65 W desktop CPU over 6-8 cores, or a server core with its
# share of uncore power); 475 gCO2e/kWh (IEA world-average grid intensity, 2019).
WATTS_PER_CORE = 10.0
GRAMS_CO2_PER_KWH = 475.0
CHECKPOINT_FRAMES = 1_000_000
EVAL_EPISODES = 500
MEASUREMENTS = run_dirs.COMPARE  # in each run directory: the comparison's measurements per segment


def parse_configs(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in CONFIGS]
    if bad or not names:
        raise ValueError(f"--configs {text!r}: unknown {', '.join(bad) or '(none given)'}; "
                         f"choose from {', '.join(CONFIGS)}")
    return names


def run_config(base: TrainConfig, name: str, seed: int, logdir: str,
               checkpoint_frames: int = CHECKPOINT_FRAMES) -> TrainConfig:
    """`base` with the fields set that configuration `name` changes, its seed and
    directory, a checkpoint kept every `checkpoint_frames` frames, and no
    evaluation of its own (the comparison evaluates the kept checkpoints)."""
    config = dataclasses.replace(base, seed=seed, logdir=logdir, eval_episodes=0, **CONFIGS[name])
    return dataclasses.replace(config, **parity.checkpoint_overrides(config, checkpoint_frames))


def plan(base: TrainConfig, configs: list[str], seeds: int, out: str,
         checkpoint_frames: int = CHECKPOINT_FRAMES) -> list[tuple[str, TrainConfig]]:
    """(config name, run config) of every run; seeds outermost, so a drifting
    machine load affects every configuration alike."""
    return [
        (name, run_config(base, name, base.seed + i, os.path.join(out, "runs", f"{name}-seed{base.seed + i}"),
                          checkpoint_frames))
        for i in range(seeds) for name in configs
    ]


def read_measurements(logdir: str) -> list[dict]:
    """The comparison's measurements of each segment of the run in `logdir`."""
    return (read_json(os.path.join(logdir, MEASUREMENTS)) or {}).get("segments", [])


def record_segment(logdir: str, segment: dict) -> None:
    """Appends one segment's measurements to the run's compare.json."""
    path = os.path.join(logdir, MEASUREMENTS)
    segments = read_measurements(logdir) + [segment]
    with open(path + ".tmp", "w") as f:
        json.dump({"segments": segments}, f, indent=1)
    os.replace(path + ".tmp", path)


def actor_stats(logdir: str) -> list[dict]:
    """The statistics each local actor of the run's latest segment wrote at exit."""
    return [s for s in (read_json(p) for p in sorted(glob.glob(os.path.join(logdir, "actors", "*.json")))) if s]


def read_curve(logdir: str) -> list[dict]:
    """[{frames, seconds, return, episodes}] at every progress tick of a run
    (`return`: the mean over the last return_window episodes, fewer before
    `episodes` reaches it)."""
    from seedq.reporting.events import read_scalars

    scalars = read_scalars(logdir)
    seconds = dict(scalars.get("time/elapsed_seconds", []))
    episodes = dict(scalars.get("episode/count", []))
    return [
        {"frames": step, "seconds": seconds[step], "return": value, "episodes": episodes.get(step)}
        for step, value in scalars.get("episode/return_mean", [])
        if step in seconds
    ]


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


def run(base: TrainConfig, configs: list[str], seeds: int, out: str, *,
        grams_co2_per_kwh: float = GRAMS_CO2_PER_KWH, watts_per_core: float = WATTS_PER_CORE,
        checkpoint_frames: int = CHECKPOINT_FRAMES, eval_episodes: int = EVAL_EPISODES,
        random_episodes: int = 300, rapl_root: str = POWERCAP_ROOT, timeout: float | None = None,
        log=print) -> dict:
    """Runs every configuration for `seeds` seeds (seed base.seed + i), one at a
    time, each in a fresh `seedq train` process (its output in
    runs/<config>-seed<seed>.log), then evaluates its kept checkpoints
    (`eval_episodes` each; 0: none), and writes CSVs and plots. Finished runs
    are skipped and unfinished ones continued (seedq.bench.jobs.resume_args)."""
    os.makedirs(out, exist_ok=True)
    if base.actor_cores:
        from seedq.process.affinity import why_not_pinnable

        why_not = why_not_pinnable(base.actor_cores)
        if why_not:  # the rows say the actors ran unpinned
            log(why_not)
            base = dataclasses.replace(base, actor_cores="")
    timeout = timeout or (base.max_seconds + 180 if base.max_seconds else None)
    runs = plan(base, configs, seeds, out, checkpoint_frames)
    random_for_env(base, out, random_episodes, log)
    jobs = []
    for n, (name, config) in enumerate(runs, 1):
        what = f"[{n}/{len(runs)}] {name} seed {config.seed}"
        extra_args = resume_args(config, what, log)
        if extra_args is not None:
            jobs.append(Job(train_command(config, extra_args), config.logdir + ".log", what,
                            payload=config, timeout_seconds=timeout))
        if eval_episodes and (extra_args is not None or not evaluated(config, eval_episodes)):
            command = [sys.executable, "-m", "seedq.bench.parity", config.logdir,
                       "--episodes", str(eval_episodes), "--seed", str(base.eval_seed)]
            jobs.append(Job(command, config.logdir + ".eval.log", f"{what} evaluation", payload=None))
    at_start: dict[str, tuple[float, os.times_result, EnergyMeter, float]] = {}

    def started(job: Job) -> None:
        if job.payload is None:
            log(f"{job.what}: {eval_episodes} episodes per kept checkpoint")
            return
        log(f"{job.what}: training to {job.payload.max_frames:,} frames" if job.payload.max_frames
            else f"{job.what}: training")
        meter = EnergyMeter(watts_per_core=watts_per_core, rapl_root=rapl_root).start()
        at_start[job.what] = (os.getloadavg()[0], os.times(), meter, time.monotonic())

    def ended(job: Job) -> None:
        config = job.payload
        if config is None:
            report(out, runs, grams_co2_per_kwh)
            return
        load_avg, before, meter, started_at = at_start.pop(job.what)
        after = os.times()
        # The finished children's CPU since the start: with one job at a time, this
        # run's learner and, through it, its actor processes (all waited for).
        cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        energy = meter.stop(cpu)
        record_segment(config.logdir, {
            "cpu_seconds_total": cpu, "energy_joules": energy.joules, "energy_cpu_joules": energy.cpu_joules,
            "energy_source": energy.source, "energy_detail": energy.detail, "load_avg_1m": load_avg,
            "command_seconds": time.monotonic() - started_at, "actors": actor_stats(config.logdir),
        })
        summary = read_json(os.path.join(config.logdir, "summary.json")) or {}
        log(f"{job.what}: {summary.get('frames', 0):,} frames in {summary.get('wall_seconds', 0):.1f}s, "
            f"stop: {summary.get('stop_reason')}, energy {energy.joules / 3600:.3f} Wh ({energy.source}), "
            f"load {load_avg:.1f}")
        report(out, runs, grams_co2_per_kwh)  # partial results survive a crash

    run_jobs(jobs, 1, on_start=started, on_finish=ended, on_progress=job_progress(log))
    return report(out, runs, grams_co2_per_kwh)


def random_for_env(base: TrainConfig, out: str, episodes: int, log) -> None:
    """Measures the random policy on base.env into OUT/random.json where its
    scale has no published figure (once; later calls read it)."""
    scale = parity.scale_for(base.env)
    if scale is not None and scale.random is None:
        parity.random_returns([base.env], out, episodes, lambda _: base.env_options, log)


def env_scale(env_id: str, out: str) -> tuple[float | None, float | None]:
    """(random, reference) of the normalised scores of `env_id` (None where unknown)."""
    scale = parity.scale_for(env_id)
    if scale is None:
        return None, None
    if scale.random is not None:
        return scale.random, scale.reference
    measured = (read_json(os.path.join(out, "random.json")) or {}).get(env_id) or {}
    return measured.get("mean"), scale.reference


def evaluated(config: TrainConfig, episodes: int) -> bool:
    """Whether each checkpoint of a finished run that counts (`parity.run_checkpoints`)
    is evaluated with `episodes` episodes."""
    done = parity.read_evaluations(config.logdir)
    return all(parity.is_evaluated(done, d, episodes)
               for d in parity.run_checkpoints(config.logdir, config.checkpoint_every_steps))


def rows_of(runs: list[tuple[str, TrainConfig]], out: str, grams_co2_per_kwh: float) -> tuple[list, list, list]:
    """results.csv rows, curves.csv points and evaluations.csv points (one per
    evaluated checkpoint) of the finished runs in `runs`."""
    rows, curves, evaluations = [], [], []
    for name, config in runs:
        if not finished(config):
            continue
        random, reference = env_scale(config.env, out)
        curve = read_curve(config.logdir)
        evaluated_checkpoints = parity.read_evaluations(config.logdir)
        rows.append(compare_rows.tidy_row(
            name, config, read_json(os.path.join(config.logdir, "summary.json")),
            read_measurements(config.logdir), curve, evaluated_checkpoints,
            random=random, reference=reference, grams_co2_per_kwh=grams_co2_per_kwh,
        ))
        curves.extend({"config": name, "seed": config.seed, **p} for p in curve)
        evaluations.extend({"config": name, "seed": config.seed, **p}
                           for p in parity.evaluation_points(evaluated_checkpoints, random, reference))
    return rows, curves, evaluations


def report(out: str, runs: list[tuple[str, TrainConfig]] | None = None,
           grams_co2_per_kwh: float = GRAMS_CO2_PER_KWH) -> dict:
    """With `runs`: rewrites results.csv and curves.csv from the finished ones.
    Then reads them back from `out`, (re)draws the plots and summary.md, and
    returns the summary, the table and the plot paths."""
    if runs is not None:
        for name, rows in zip(("results.csv", "curves.csv", "evaluations.csv"), rows_of(runs, out, grams_co2_per_kwh)):
            write_csv(os.path.join(out, name), rows)
    if not os.path.exists(os.path.join(out, "results.csv")):
        return {"summary": [], "plots": [], "table": "(no finished run yet)"}

    def read_if_there(name: str) -> list[dict]:
        return read_csv(os.path.join(out, name)) if os.path.exists(os.path.join(out, name)) else []

    rows = read_csv(os.path.join(out, "results.csv"))
    summary = compare_rows.summarize(rows)
    table = compare_rows.format_table(summary)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(table + "\n")
    plots = compare_rows.plot(rows, read_if_there("curves.csv"), out, read_if_there("evaluations.csv"))
    return {"summary": summary, "plots": plots, "table": table}
