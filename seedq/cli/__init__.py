"""`seedq train | learner | actor | eval | certs | bench` command line.

Config flags are derived from the dataclasses in `seedq.config`: every field
of `TrainConfig` is `--field-name`, nested sections are `--section.field-name`
(e.g. `--vtrace.learning-rate 5e-4`). One module per subcommand, each with
`add_parsers(sub)` and `run(args)`. Heavy imports (JAX) happen inside the
commands that need them, so `seedq actor` starts fast.
"""

from __future__ import annotations

import time

# The process's command start, before the heavy imports: a run started from the
# command line reports seconds-to-target from here (see `main`).
COMMAND_STARTED = time.monotonic()

import argparse
import sys

from seedq.cli import actor, bench, certs, compare, evaluate, export, launch, plot, run
from seedq.cli.common import Parser, subcommands, unknown_arguments_message
from seedq.cli.run import run_config

__all__ = ["COMMAND_STARTED", "build_parser", "main", "run_config", "subcommands"]


class VersionAction(argparse.Action):
    """`--version`: the installed distribution's version, looked up only when asked
    (importlib.metadata is not free, and `seedq actor` starts often)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib import metadata

        try:
            version = metadata.version("seedq")
        except metadata.PackageNotFoundError:  # run from a source tree that is not installed
            version = "unknown (not installed)"
        parser._print_message(f"seedq {version}\n", sys.stdout)
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    # argparse, not tyro or jsonargparse: the flags are generated from the config
    # dataclasses (seedq.flags) with names, `none` values, bare booleans and grouped
    # help that scripts and docs already use, and `seedq actor` must start fast.
    parser = Parser(prog="seedq", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=VersionAction, help="print seedq's version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (run, actor, evaluate, export, plot, certs, compare, launch, bench):
        command.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one command: the process's own (argv None: `seedq ...`, `python -m seedq`)
    or one called in process with its arguments (tests, scripts)."""
    # A called command starts now: this module may have been imported long before
    # (a test session), and a run's --max-seconds and seconds-to-target count from here.
    started = COMMAND_STARTED if argv is None else time.monotonic()
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        print(unknown_arguments_message(parser, args, extras), file=sys.stderr)
        return 2
    if args.command in ("train", "learner"):
        return run.run(args, argv, started)
    handlers = {
        "actor": actor.run, "impala-actor": actor.run, "eval": evaluate.run, "certs": certs.run,
        "compare": compare.run, "launch": launch.run, "bench": bench.run, "export": export.run,
        "plot": plot.run,
    }
    return handlers[args.command](args)


