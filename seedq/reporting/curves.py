"""A run's learning curve as files: `<logdir>/curves.csv` and `curves.png`.

curves.csv has one row per progress interval, keyed by env frames: the
window's mean return and length, episodes, train steps, the latest loss and
policy entropy, and the run's elapsed seconds in a column of its own (the
only column that depends on the machine's speed). A resumed run keeps the
rows up to its checkpoint's frames and continues the file, as its
TensorBoard curves continue.

curves.png draws the return against frames and against elapsed time; it is
redrawn when the run ends (left out, with one line, where matplotlib is not
installed). `plot_runs` overlays several runs (`seedq plot`).
"""

from __future__ import annotations

import csv
import io
import os

from seedq import extras, run_dirs
from seedq.process import atomic_files

COLUMNS = ("frames", "episodes", "train_steps", "return", "length", "loss", "entropy", "wall_seconds")
CSV_FILE = run_dirs.CURVES_CSV
PNG_FILE = run_dirs.CURVES_PNG


def curve_row(tick) -> dict:
    """One curves.csv row from a progress `Tick` (seedq.reporting.sinks); None is an empty cell."""
    s, metrics = tick.stats, tick.metrics
    return {
        "frames": s.frames,
        "episodes": s.episodes,
        "train_steps": s.train_steps,
        "return": s.mean_return,
        "length": s.mean_length,
        "loss": _number(metrics.get("loss/total")),
        "entropy": _number(metrics.get("policy/entropy")),
        "wall_seconds": round(tick.elapsed_seconds, 3),
    }


def _number(value):
    return None if value is None else float(value)


def read_rows(path: str) -> list[dict]:
    """curves.csv rows as dicts of floats (None for empty cells); [] if there is no file."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return [{k: (float(v) if v not in ("", None) else None) for k, v in row.items()} for row in csv.DictReader(f)]


class CurvesSink:
    """Appends a row to curves.csv per progress tick; draws curves.png at close."""

    def __init__(self, logdir: str, *, resumed_frames: int | None = None, from_ticks: bool = True):
        """`from_ticks` False (a deterministic run): rows come from `point`
        alone, at the frame counts the learner fixes, not per progress tick."""
        self.logdir = logdir
        self.from_ticks = from_ticks
        self.path = os.path.join(logdir, CSV_FILE)
        kept = [r for r in read_rows(self.path) if resumed_frames is not None and r["frames"] <= resumed_frames]
        # A fresh run starts the file anew; a resumed one drops what its killed
        # segment logged after the checkpoint. Either way the new start replaces
        # the file in one rename, so a kill now leaves the old rows or the new
        # ones, never a truncated file; rows are appended from there.
        start = io.StringIO(newline="")
        writer = csv.DictWriter(start, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in kept:
            writer.writerow({k: _cell(row.get(k)) for k in COLUMNS})
        atomic_files.write_text_atomically(self.path, start.getvalue())
        self._file = open(self.path, "a", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=COLUMNS, extrasaction="ignore")

    def tick(self, tick) -> None:
        if self.from_ticks:
            self.point(tick)

    def point(self, tick) -> None:
        self._writer.writerow({k: _cell(v) for k, v in curve_row(tick).items()})
        self._file.flush()

    def evaluation(self, result: dict, step: int) -> None:
        pass  # evaluations go to TensorBoard and summary.json

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if self._file.closed:
            return
        self._file.close()
        if extras.missing("matplotlib"):  # the plot is optional: the 'bench' extra
            print(f"{PNG_FILE} left out: matplotlib is not installed (pip install 'seedq[bench]')", flush=True)
            return
        try:
            plot_runs([self.logdir], os.path.join(self.logdir, PNG_FILE), title=os.path.basename(self.logdir))
        except (OSError, ValueError) as e:
            print(f"could not draw {PNG_FILE}: {e}", flush=True)


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def plot_runs(run_dirs: list[str], out: str, *, labels: list[str] | None = None, title: str = "") -> str:
    """Draws the return of each run against frames and against elapsed time
    into `out` (png, pdf or svg by its extension); returns `out`. ValueError
    naming a run without curves.csv."""
    curves_figure(run_dirs, labels=labels, title=title).savefig(out, dpi=100)
    return out


# Elapsed time is drawn in the largest of these units that the run spans twice.
_TIME_UNITS = (("hours", 3600.0), ("minutes", 60.0), ("seconds", 1.0))


def time_unit(longest_seconds: float) -> tuple[str, float]:
    """(name, seconds) of the unit a time axis up to `longest_seconds` is labelled in."""
    return next(((name, size) for name, size in _TIME_UNITS if longest_seconds >= 2 * size), _TIME_UNITS[-1])


def curves_figure(run_dirs: list[str], *, labels: list[str] | None = None, title: str = ""):
    """The figure `plot_runs` writes: ticks that stay readable on long runs
    (frames as 50M, time in hours or minutes, at most 6 ticks; no 1e8 offset)."""
    # A Figure of its own, not pyplot: no backend is chosen or switched (a
    # notebook keeps its inline plots) and no global state is shared with the
    # caller's threads (seedq.train may run on any thread).
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter, MaxNLocator

    labels = labels or [os.path.basename(os.path.normpath(d)) or d for d in run_dirs]
    curves = []
    for run_dir in run_dirs:
        path = os.path.join(run_dir, CSV_FILE)
        if not os.path.exists(path):
            raise ValueError(f"{run_dir}: no {CSV_FILE} (not a seedq run directory, or one from before curves)")
        curves.append([r for r in read_rows(path) if r["return"] is not None])
    fig = Figure(figsize=(11, 4))
    by_frames, by_time = fig.subplots(1, 2)
    unit, seconds = time_unit(max((r["wall_seconds"] or 0.0 for rows in curves for r in rows), default=0.0))
    for rows, label in zip(curves, labels):
        returns = [r["return"] for r in rows]
        by_frames.plot([r["frames"] for r in rows], returns, label=label)
        by_time.plot([r["wall_seconds"] / seconds for r in rows], returns, label=label)
    by_frames.set_xlabel("env frames")
    by_frames.xaxis.set_major_formatter(EngFormatter(sep=""))
    by_time.set_xlabel(f"elapsed {unit}")
    for ax in (by_frames, by_time):
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
        ax.set_ylabel("mean episode return")
        ax.grid(alpha=0.3)
    if len(run_dirs) > 1:
        by_frames.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
