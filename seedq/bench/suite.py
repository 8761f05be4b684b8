"""`seedq bench suite`: the defaults trained on a list of envs x seeds, scored
against published returns.

Every env x seed is one fresh `seedq train` process given only the env id,
its frame budget (seedq.bench.references.SUITE, scaled by `frames_scale` or
replaced by `max_frames`), the seed, no target and no time limit, plus the
training flags passed through to every run (`--precision int8`,
`--architecture impala`, ...). Written into OUT:

* `runs/<env>-seed<k>/`: the runs themselves;
* `random.json`: the random policy's mean return per env, measured here
  (uniform actions, `random_episodes` episodes), for normalised scores
  (return - random) / (reference - random);
* `results.csv`: one row per run: final and best 100-episode mean, frames and
  seconds until the 100-episode mean first reached the reference, the greedy
  evaluation at the end, and each of them normalised;
* `curves.csv`: frames, seconds and the 100-episode mean at every progress tick;
* `summary.md`: per env, medians over seeds beside the reference and its source;
* `<env>.png`: the curves of every seed with the reference and random lines.

With `jobs` > 1 that many runs train at once (each still a fresh process;
their output is in `runs/<env>-seed<k>.log`). A rerun skips the runs that
finished (their summary.json says max_frames), continues an unfinished one
from its last checkpoint when it ran with the same config (`seedq train
--resume`), and starts the others afresh.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable

import numpy as np

from seedq.bench import compare
from seedq.bench import jobs as jobs_lib
# The resume mechanism, under the names the suite has always had.
from seedq.bench.jobs import changed_settings, finished, other_settings  # noqa: F401
from seedq.bench.parity import random_returns
from seedq.bench.references import SUITE, normalised
from seedq.bench.throughput import read_json
from seedq.config import TrainConfig


def safe_name(env_id: str) -> str:
    return env_id.replace("/", "_").replace(":", "_")


def budget(env_id: str, *, max_frames: int = 0, frames_scale: float = 1.0) -> int:
    """The frame budget of `env_id`: `max_frames`, else the suite's scaled by `frames_scale`."""
    if max_frames:
        return int(max_frames)
    if env_id not in SUITE:
        raise ValueError(
            f"--envs {env_id}: not in the suite's table (known: {', '.join(SUITE)}); give --max-frames"
        )
    return max(int(SUITE[env_id].frames * frames_scale), 1)


def run_config(base: TrainConfig, env_id: str, seed: int, frames: int, out: str) -> TrainConfig:
    """`base` (the env's defaults with the passed-through flags) as one suite run."""
    return dataclasses.replace(
        base, env=env_id, seed=seed, max_frames=frames, target_return=None, max_seconds=0.0,
        logdir=os.path.join(out, "runs", f"{safe_name(env_id)}-seed{seed}"),
    )


def first_reaching(curve: list[dict], threshold: float, window: int) -> dict | None:
    """The first progress tick whose full-window mean return is >= threshold."""
    return next((p for p in curve if (p["episodes"] or 0) >= window and p["return"] >= threshold), None)


def result_row(config: TrainConfig, summary: dict, curve: list[dict], random: float) -> dict:
    """One results.csv row from a finished run's summary.json and curve."""
    reference = SUITE[config.env].reference if config.env in SUITE else None
    full = [p["return"] for p in curve if (p["episodes"] or 0) >= config.return_window]
    best = max(full) if full else None
    reached = first_reaching(curve, reference, config.return_window) if reference is not None else None
    evaluation = (summary.get("eval") or {}).get("mean")
    final = summary["mean_return_last100"]

    def score(value):
        return None if reference is None else normalised(value, random, reference)

    return {
        "env": config.env, "agent": config.agent, "architecture": config.architecture,
        "precision": config.precision, "seed": config.seed, "frames": summary["frames"],
        "wall_seconds": summary["wall_seconds"], "reference": reference, "random_return": random,
        "final_return": final, "best_return": best, "eval_return": evaluation,
        "final_normalised": score(final), "best_normalised": score(best), "eval_normalised": score(evaluation),
        "frames_to_reference": None if reached is None else reached["frames"],
        "seconds_to_reference": None if reached is None else reached["seconds"],
        "logdir": config.logdir,
    }


def run(base_for: Callable[[str], TrainConfig], envs: list[str], seeds: int, out: str, *,
        max_frames: int = 0, frames_scale: float = 1.0, random_episodes: int = 100, jobs: int = 1,
        log=print) -> dict:
    """Trains every env x seed (seeds base.seed, base.seed + 1, ...) not yet finished, `jobs`
    runs at a time, and writes results.csv, curves.csv, summary.md and the plots of the
    finished runs after each run ends and at the end.
    `base_for(env)` is the env's default config with the passed-through flags applied."""
    if seeds <= 0:
        raise ValueError(f"--seeds {seeds}: must be > 0")
    if jobs <= 0:
        raise ValueError(f"--jobs {jobs}: must be > 0")
    os.makedirs(out, exist_ok=True)
    plan = [
        run_config(base_for(env_id), env_id, base_for(env_id).seed + i,
                   budget(env_id, max_frames=max_frames, frames_scale=frames_scale), out)
        for env_id in envs for i in range(seeds)
    ]
    randoms = random_returns(envs, out, random_episodes, lambda e: base_for(e).env_options, log)
    suite_started = time.monotonic()
    todo = []
    resumed: set[str] = set()
    for n, config in enumerate(plan, 1):
        what = f"[{n}/{len(plan)}] {config.env} seed {config.seed}"
        extra_args = jobs_lib.resume_args(config, what, log)
        if extra_args is None:
            continue
        if extra_args:
            resumed.add(what)
        # The run's own output (seedq train --quiet: warnings, errors, its last lines) beside its directory.
        todo.append(compare.Job(compare.train_command(config, extra_args), config.logdir + ".log", what,
                                payload=config))
    started_at: dict[str, float] = {}

    def started(job: compare.Job) -> None:
        started_at[job.what] = time.monotonic()
        verb = "training on to" if job.what in resumed else "training"  # the budget, not what is left
        log(f"{job.what}: {verb} {job.payload.max_frames:,} frames "
            f"({time.monotonic() - suite_started:.0f}s into the suite)")

    def ended(job: compare.Job) -> None:
        config = job.payload
        if not finished(config):  # stopped with the others (a failed run or a signal): resumable
            log(f"{job.what}: stopped before its budget; a rerun continues it")
            return
        summary = read_json(os.path.join(config.logdir, "summary.json"))
        row = result_row(config, summary, compare.read_curve(config.logdir), randoms[config.env])
        log(f"{job.what}: final {_fmt(row['final_return'], '.1f')}, best {_fmt(row['best_return'], '.1f')}, "
            f"eval {_fmt(row['eval_return'], '.1f')}, normalised best {_fmt(row['best_normalised'], '.2f')} "
            f"({time.monotonic() - started_at[job.what]:.0f}s)")
        # Kept current run by run: a suite stopped or failed later still leaves the finished runs' table.
        report(plan, randoms, out)

    compare.run_jobs(todo, jobs, on_start=started, on_finish=ended, on_progress=jobs_lib.job_progress(log))
    return report(plan, randoms, out)


def report(plan: list[TrainConfig], randoms: dict[str, float], out: str) -> dict:
    """Rows and curves of the finished runs in `plan` -> CSVs, summary.md, plots."""
    rows, curves = [], []
    for config in plan:
        if not finished(config):
            continue
        curve = compare.read_curve(config.logdir)
        rows.append(result_row(config, read_json(os.path.join(config.logdir, "summary.json")), curve,
                               randoms[config.env]))
        curves += [{"env": config.env, "seed": config.seed, **p} for p in curve]
    compare.write_csv(os.path.join(out, "results.csv"), rows)
    compare.write_csv(os.path.join(out, "curves.csv"), curves)
    table = format_summary(rows)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(table + "\n")
    return {"rows": rows, "table": table, "plots": plot(rows, curves, randoms, out)}


def _fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def format_summary(rows: list[dict]) -> str:
    """Markdown: per env, medians over seeds against the reference."""
    lines = [
        "| env | seeds | reference (source) | random | final (median) | best (median) | best normalised per seed "
        "| seeds >= 0.9 | frames to reference (median, reached) | s to reference | greedy eval (median) "
        "| final / best normalised (min over seeds that learned) |",
        "|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for env_id in dict.fromkeys(r["env"] for r in rows):
        group = [r for r in rows if r["env"] == env_id]
        ref = SUITE.get(env_id)
        reached = [r for r in group if r["frames_to_reference"] is not None]
        per_seed = ", ".join(_fmt(r["best_normalised"], ".2f") for r in group)
        good = sum(1 for r in group if (r["best_normalised"] or 0) >= 0.9)
        # Kept share of the best (acceptance 2: >= 0.9), for runs that learned something.
        keeps = [
            r["final_normalised"] / r["best_normalised"]
            for r in group if r["final_normalised"] is not None and (r["best_normalised"] or 0) >= 0.1
        ]
        lines.append(
            f"| {env_id} | {len(group)} | "
            + (f"{ref.reference:g} {ref.spread} ({ref.source})" if ref else "–")
            + f" | {_fmt(group[0]['random_return'], '.1f')} | {_fmt(_median(r['final_return'] for r in group), '.1f')} "
            f"| {_fmt(_median(r['best_return'] for r in group), '.1f')} | {per_seed} | {good}/{len(group)} "
            f"| {_fmt(_median(r['frames_to_reference'] for r in reached), ',.0f')} ({len(reached)}/{len(group)}) "
            f"| {_fmt(_median(r['seconds_to_reference'] for r in reached), '.0f')} "
            f"| {_fmt(_median(r['eval_return'] for r in group), '.1f')} | {_fmt(min(keeps) if keeps else None, '.2f')} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], curves: list[dict], randoms: dict[str, float], out: str) -> list[str]:
    """One PNG per env: the 100-episode mean of every seed vs frames, reference and random lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for env_id in dict.fromkeys(r["env"] for r in rows):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for i, seed in enumerate(dict.fromkeys(c["seed"] for c in curves if c["env"] == env_id)):
            points = [c for c in curves if c["env"] == env_id and c["seed"] == seed]
            ax.plot([p["frames"] for p in points], [p["return"] for p in points], color=f"C{i}",
                    label=f"seed {seed}")
        if env_id in SUITE:
            ax.axhline(SUITE[env_id].reference, linestyle="--", color="gray", label="reference")
        ax.axhline(randoms[env_id], linestyle=":", color="gray", label="random policy")
        ax.set_xlabel("env frames")
        ax.set_ylabel("mean return (last 100 episodes)")
        ax.set_title(env_id)
        ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        paths.append(os.path.join(out, f"{safe_name(env_id)}.png"))
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths
