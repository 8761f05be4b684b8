"""`seedq plot`: the learning curves of runs overlaid in one figure (seedq.reporting.curves)."""

from __future__ import annotations

import argparse
import sys

from seedq.process import exit_codes
from seedq.cli.common import HelpFormatter


def add_parsers(sub) -> None:
    plot = sub.add_parser(
        "plot",
        help="overlay the learning curves (curves.csv) of runs: return against frames and against time",
        description="Draws the mean episode return of each run against env frames and against elapsed "
        "seconds, from each run directory's curves.csv, into one figure.",
        formatter_class=HelpFormatter,
    )
    plot.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories")
    plot.add_argument("--out", required=True, metavar="FILE", help="the figure to write (.png, .pdf or .svg)")
    plot.add_argument("--title", default="", help="a title above the figure")


def run(args: argparse.Namespace) -> int:
    from seedq.reporting.curves import plot_runs

    try:
        out = plot_runs(args.runs, args.out, title=args.title)
    except (ValueError, OSError) as e:
        print(f"seedq plot: {e}", file=sys.stderr)
        return exit_codes.USAGE if isinstance(e, ValueError) else exit_codes.RUNTIME_FAILURE
    print(f"wrote {out}")
    return exit_codes.FINISHED
