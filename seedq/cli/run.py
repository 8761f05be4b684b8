"""`seedq train` and `seedq learner`: resolve the run's config once and run the learner."""

from __future__ import annotations

import argparse
import json
import signal
import sys

from seedq import config as config_lib
from seedq import run_dirs
from seedq.process import exit_codes
from seedq.cli.common import HelpFormatter, add_section_help
from seedq.config.resolve import file_layer
from seedq.flags import add_config_flags, flag_layer


def run_config(args: argparse.Namespace):
    """The run of `seedq train|learner` (a `seedq.run_setup.PreparedRun`: the
    config resolved and validated, the env spec built) and the run directory to
    resume (None: a fresh run): the `--config` file and the flags given, as
    layers over the env's defaults or the resumed run's config
    (seedq.run_setup.plan, which `seedq.train` calls too)."""
    from seedq import run_setup

    layers = [file_layer(args.config)] if getattr(args, "config", None) else []
    layers.append(flag_layer(args))
    return run_setup.plan(layers, resume=args.resume, overwrite=bool(getattr(args, "overwrite", False)),
                          starts=not getattr(args, "print_config", False))


def add_run_command(sub, name: str, *, summary: str, description: str, resume_note: str = ""):
    """A command that runs a learner: every config flag plus --resume."""
    parser = sub.add_parser(name, help=summary, description=description, formatter_class=HelpFormatter,
                            add_help=False, usage=f"seedq {name} [--env ENV] [--agent {{vtrace,r2d2}}] [FLAG ...]")
    add_config_flags(parser)
    common = parser.help_sections["common"]
    add_section_help(parser)
    common.add_argument(
        "--config", metavar="FILE", default=None,
        help="start from this run config: a YAML or JSON file of some fields (sections as mappings; "
        "unknown fields are errors), or a run's config.json; flags given here override it",
    )
    common.add_argument(
        "--resume", metavar="RUN_DIR|auto", default=None,
        help="continue the run in RUN_DIR from its newest checkpoint, with its saved config "
        "(flags given here override it)" + resume_note + "; `auto`: resume the --logdir run if it "
        "has a checkpoint, else start a fresh run there (restarted pods and VMs)",
    )
    common.add_argument(
        "--overwrite", action="store_true",
        help="start a fresh run in --logdir even when it holds a run: the old run's files (only those "
        "seedq writes) are deleted; a directory that holds anything else, or a symlink, is refused",
    )
    return parser


def add_parsers(sub) -> None:
    train = add_run_command(
        sub, "train",
        summary="train locally: learner + actor processes on this host",
        description="Train locally: the learner plus `--num-actors` actor processes on this host.",
    )
    common = train.help_sections["common"]
    common.add_argument("--print-config", action="store_true",
                        help="print the resolved config as JSON and exit (starts nothing)")
    common.add_argument("--quiet", action="store_true", help="no progress lines")
    # Internal (hidden from help): stop cleanly (checkpoint and exit) when this
    # process dies, even by SIGKILL; `seedq bench suite` and `seedq compare`
    # start their runs with it. Linux only.
    train.add_argument("--parent-pid", type=int, default=0, help=argparse.SUPPRESS)

    learner = add_run_command(
        sub, "learner",
        summary="run only the learner; actors started elsewhere (`seedq actor`) connect to --address",
        description="Run only the learner; actors started elsewhere (`seedq actor`) connect to "
        "--address. With --min-actors N training waits for N actors.",
        resume_note="; running actors reconnect by themselves",
    )
    common = learner.help_sections["common"]
    common.add_argument("--print-config", action="store_true",
                        help="print the resolved config as JSON and exit (starts nothing)")
    common.add_argument("--quiet", action="store_true", help="no progress lines")


def run(args: argparse.Namespace, argv: list[str] | None, started: float) -> int:
    """`seedq train|learner`; `started` (time.monotonic()) is when the command started."""
    try:
        prepared, resume = run_config(args)
    except (FileNotFoundError, OSError) as e:
        print(f"seedq {args.command}: {e.args[0] if isinstance(e, FileNotFoundError) else e}",
              file=sys.stderr)
        return exit_codes.RUNTIME_FAILURE
    except (ValueError, TypeError) as e:
        print(f"seedq {args.command}: {e}", file=sys.stderr)
        return exit_codes.USAGE
    config = prepared.config
    if resume is not None and not getattr(args, "print_config", False):
        hint = run_dirs.finished_hint(run_dirs.read_summary(resume), max_frames=config.max_frames,
                                      max_seconds=config.max_seconds, target_return=config.target_return)
        if hint:  # resuming would stop at once
            print(f"seedq {args.command}: {hint}", file=sys.stderr)
            return exit_codes.FINISHED
    if args.command == "learner" and not config.address:
        print("seedq learner: --address is required (e.g. 0.0.0.0:50051 or unix:/tmp/seedq.sock)",
              file=sys.stderr)
        return 2
    if getattr(args, "print_config", False):
        print(json.dumps(config_lib.to_dict(config), indent=2, sort_keys=True))
        return 0
    from seedq import distributed

    if getattr(args, "parent_pid", 0) and not distributed.is_supervised_child():
        # The process `--parent-pid` started: a supervisor passes the SIGTERM on to its child.
        from seedq.process import lifetime

        lifetime.die_with_parent(args.parent_pid, signal.SIGTERM)
    if distributed.needs_supervisor(config.distributed):
        # A group's learner runs as a child: its lost-peer abort becomes one line.
        group = config.distributed
        address = config.address
        held = False
        from seedq.run_setup import locks_before_start

        if locks_before_start(group):  # (an explicit group's process 0 here)
            try:  # the supervisor holds the run's lock for its child (process 0)
                run_dirs.hold(config.logdir, wait=args.resume == "auto")
            except exit_codes.UsageError as e:
                print(f"seedq {args.command}: {e}", file=sys.stderr)
                return exit_codes.USAGE
            held = True
        return distributed.supervise(
            list(sys.argv[1:] if argv is None else argv),
            group.process_id if group.explicit else None, group.num_processes or None,
            socket_path=address[5:] if address.startswith("unix:") else "",
            env={run_dirs.LOCK_HELD_ENV: "1"} if held else None,
        )
    distributed.die_with_supervisor()
    from seedq import local

    try:
        summary = local.train(
            prepared, quiet=args.quiet, started=started,
            with_actors=args.command == "train", resume=resume,
            overwrite=bool(getattr(args, "overwrite", False)), wait_for_lock=args.resume == "auto",
        )
    except exit_codes.UsageError as e:  # refused before starting (credentials, ...)
        print(f"seedq {args.command}: {e}", file=sys.stderr)
        return exit_codes.USAGE
    except (ValueError, OSError) as e:
        print(f"seedq {args.command}: {e}", file=sys.stderr)
        return exit_codes.RUNTIME_FAILURE
    except distributed.PeerLost as e:  # a group member stopped answering
        print(f"seedq {args.command}: {e}", file=sys.stderr)
        return exit_codes.PEER_LOST
    # SIGTERM before the stop condition exits 143 (checkpointed), so that a
    # supervisor (a Kubernetes Job) starts the run again; see seedq.process.exit_codes.
    return exit_codes.for_stop_reason(summary["stop_reason"])
