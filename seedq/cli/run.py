"""`seedq train` and `seedq learner`: resolve the run's config once and run the learner."""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys

from seedq import config as config_lib
from seedq import exit_codes, run_dirs
from seedq.cli.common import HelpFormatter, add_section_help
from seedq.config import TrainConfig
from seedq.flags import add_config_flags, config_from_args


def saved_config(run_dir: str, flag: str) -> TrainConfig:
    """The config.json of the run in `run_dir` (FileNotFoundError naming `flag` otherwise)."""
    import os

    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"{flag} {run_dir}: no such run directory")
    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{flag} {run_dir}: not a seedq run directory (no config.json)")
    try:
        return config_lib.load(path)
    except (ValueError, TypeError, KeyError) as e:
        raise FileNotFoundError(f"{flag} {run_dir}: config.json cannot be read ({e})") from None


def run_config(args: argparse.Namespace):
    """The run of `seedq train|learner` (a `seedq.run_setup.PreparedRun`: the
    config resolved and validated, the env spec built) and the run directory to
    resume (None: a fresh run).

    Layers, later ones winning: the defaults for the env (or, resuming, the
    run's saved config.json), the `--config` file, the flags given. `--resume
    auto` resumes the run directory (`--logdir`, or the file's `logdir`) when it
    holds a checkpoint and starts a fresh run in it otherwise.
    """
    from seedq import run_setup

    import os

    data = config_lib.read_json(args.config) if getattr(args, "config", None) else {}
    if data.get("logdir") and _in_run_dir(args.config):
        # Another run's config.json: start from its settings, never in its directory.
        data = {k: v for k, v in data.items() if k != "logdir"}

    def with_file(base: TrainConfig) -> TrainConfig:
        try:
            return config_lib.updated(base, data)
        except ValueError as e:
            raise ValueError(f"--config {args.config}: {e}") from None

    resume = args.resume
    if resume == "auto":
        run_dir = args.logdir or data.get("logdir") or ""
        if not run_dir:
            raise ValueError("--resume auto needs the run directory: give --logdir DIR (or logdir in --config)")
        from seedq import checkpoint

        if not getattr(args, "print_config", False) and _locks_before_start(args, data):
            # A restarted pod can start while the old one is still stopping:
            # wait for it, then decide from what it left.
            run_dirs.hold(run_dir, wait=True)
        resume = run_dir if checkpoint.has_checkpoint(run_dir) else None
        if resume is None:
            args.logdir = run_dir  # a fresh run, in that directory
    if resume is None:
        # The env and its options come from the file and the flags alone; the
        # other defaults depend on the env's spec, built here once for the run.
        given = config_from_args(args, base=with_file(TrainConfig()))
        spec = run_setup.build_env_spec(given)
        config = config_from_args(args, base=with_file(run_setup.defaults_for_env(spec, given.env)))
        if config.deterministic and args.num_actors is None and "num_actors" not in data:
            config = dataclasses.replace(config, num_actors=1)  # one order of batches
        if config.distributed.explicit and not config.logdir:
            # (A default run directory is named by time and pid: one per process.)
            raise ValueError("--distributed.coordinator needs --logdir: the learner group shares one run directory")
        prepared = run_setup.prepare(config, spec)
        # (--resume auto resumes or starts fresh in the directory it is given;
        # --print-config starts nothing.)
        if args.resume != "auto" and not getattr(args, "print_config", False):
            check_run_dir(prepared.config, overwrite=getattr(args, "overwrite", False))
        return prepared, None
    if getattr(args, "overwrite", False):
        raise ValueError("--overwrite starts a fresh run: it cannot be combined with --resume")
    if args.logdir is not None and os.path.abspath(args.logdir) != os.path.abspath(resume):
        raise ValueError("--logdir cannot be combined with --resume: the run continues in its own directory")
    base = with_file(saved_config(resume, "--resume"))
    prepared = run_setup.prepare(dataclasses.replace(config_from_args(args, base=base), logdir=resume))
    if args.resume != "auto" and not getattr(args, "print_config", False) and _locks_before_start(args, data):
        run_dirs.hold(resume)  # a second writer is refused here, before anything is restored
    return prepared, resume


def _in_run_dir(path: str) -> bool:
    """Whether the file at `path` sits in a run directory (a run's config.json)."""
    import os

    return run_dirs.holds_run(os.path.dirname(os.path.abspath(path)))


def _locks_before_start(args: argparse.Namespace, data: dict) -> bool:
    """Whether this process takes its run directory's lock before the learner
    starts: not when its supervisor holds it for it, not in a group's process
    other than 0, and not in a group JAX detects (its process 0 is known only
    once the group forms; seedq.local takes the lock then)."""
    from seedq import distributed

    group = config_from_args(args, base=config_lib.updated(TrainConfig(), data)).distributed
    if run_dirs.holds_lock_already() or group.process_id > 0:
        return False
    return group.explicit or not distributed.needs_supervisor(group)


def check_run_dir(config: TrainConfig, *, overwrite: bool) -> None:
    """A fresh run's directory must not hold another run (two runs' files would
    mix): ValueError naming --resume and --overwrite; with `overwrite`, one
    line when seedq may not clear it (seedq.run_dirs.overwrite_refusal). The
    old run is removed later, after every other check (seedq.local). In a
    learner group only process 0 checks, before the group forms (the others
    find the directory process 0 has started)."""
    from seedq import distributed

    if config.distributed.process_id > 0 or distributed.is_supervised_child():
        return
    if not run_dirs.holds_run(config.logdir):
        return
    if not overwrite:
        raise ValueError(run_dirs.refusal(config.logdir))
    why_not = run_dirs.overwrite_refusal(config.logdir)
    if why_not:
        raise ValueError(why_not)


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
        from seedq import run_dirs

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
        from seedq import lifetime

        lifetime.die_with_parent(args.parent_pid, signal.SIGTERM)
    if distributed.needs_supervisor(config.distributed):
        # A group's learner runs as a child: its lost-peer abort becomes one line.
        group = config.distributed
        address = config.address
        held = False
        if not getattr(args, "print_config", False) and _locks_before_start(args, {}) and group.explicit:
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
    # supervisor (a Kubernetes Job) starts the run again; see seedq.exit_codes.
    return exit_codes.for_stop_reason(summary["stop_reason"])
