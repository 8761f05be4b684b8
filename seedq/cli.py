"""`seedq train | actor | bench` command line.

Config flags are derived from the dataclasses in `seedq.config`: every field
of `TrainConfig` is `--field-name`, nested sections are `--section.field-name`
(e.g. `--vtrace.learning-rate 5e-4`). Heavy imports (JAX) happen inside the
commands that need them, so `seedq actor` starts fast.
"""

from __future__ import annotations

import time

# Command start, before the heavy imports: runs report seconds-to-target from here.
COMMAND_STARTED = time.monotonic()

import argparse
import dataclasses
import json
import sys
import typing

from seedq import config as config_lib
from seedq.config import TrainConfig


def _flag(prefix: str, name: str) -> str:
    return "--" + prefix + name.replace("_", "-").rstrip("-")


def _parser_for(hint):
    if typing.get_origin(hint) is tuple:
        (inner, _) = typing.get_args(hint)

        def parse_tuple(text: str):
            try:
                return tuple(inner(x) for x in text.split(",") if x.strip())
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"expected comma-separated {inner.__name__}s, got {text!r}"
                ) from None

        return parse_tuple
    if hint is bool:
        return lambda text: {"true": True, "1": True, "false": False, "0": False}[text.lower()]
    return hint


def add_config_flags(parser: argparse.ArgumentParser, cls=TrainConfig, prefix: str = "") -> None:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            add_config_flags(parser, hint, prefix + field.name + ".")
            continue
        parser.add_argument(
            _flag(prefix, field.name),
            dest=prefix + field.name,
            type=_parser_for(hint),
            default=None,
            metavar=hint.__name__.upper() if isinstance(hint, type) else "LIST",
            help=f"(default: {field.default!r})",
        )


def config_from_args(args: argparse.Namespace, cls=TrainConfig, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    overrides = {}
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            overrides[field.name] = config_from_args(args, hint, prefix + field.name + ".")
            continue
        value = getattr(args, prefix + field.name, None)
        if value is not None:
            overrides[field.name] = value
    return dataclasses.replace(cls(), **overrides)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seedq", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train",
        help="train locally: learner + actor processes on this host",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_config_flags(train)
    train.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    train.add_argument("--quiet", action="store_true", help="no progress lines")

    learner = sub.add_parser(
        "learner",
        help="run only the learner; actors started elsewhere (`seedq actor`) connect to --address",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_config_flags(learner)
    learner.add_argument("--quiet", action="store_true", help="no progress lines")

    actor = sub.add_parser("actor", help="run one SEED actor process against a learner")
    actor.add_argument("--server", required=True, help="learner address: unix:/path.sock or host:port")
    actor.add_argument("--env", required=True, help="gymnasium environment id")
    actor.add_argument("--num-envs", type=int, default=32, help="envs stepped as one vector")
    actor.add_argument("--actor-id", default="", help="stable actor name (default: host-pid)")
    actor.add_argument("--seed", type=int, default=0)
    actor.add_argument("--max-seconds", type=float, default=0.0, help="stop after this long (0: never)")
    actor.add_argument(
        "--retry-max-seconds", type=float, default=0.0,
        help="give up after this long without a learner (0: retry forever)",
    )
    actor.add_argument("--stats-file", default="", help="write actor statistics (JSON) here at exit")
    actor.add_argument(
        "--stats-skip-seconds", type=float, default=0.0,
        help="leave the first seconds after connecting out of the latency statistics (warm-up)",
    )
    actor.add_argument("--verbose", action="store_true")

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    tp = bench_sub.add_parser(
        "throughput",
        help="env frames/s of the full SEED loop vs raw env stepping, measured in one run",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    tp.add_argument("--env", default="CartPole-v1")
    tp.add_argument("--actors", type=int, default=2)
    tp.add_argument("--envs-per-actor", type=int, default=32)
    tp.add_argument("--seconds", type=float, default=10.0, help="measurement window per phase")
    tp.add_argument("--warmup-seconds", type=float, default=3.0)
    tp.add_argument("--no-train", action="store_true", help="serve inference only (no learner updates)")
    tp.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "actor":
        from seedq.actor import seed_actor

        return seed_actor.main(args)

    if args.command in ("train", "learner"):
        try:
            config = config_from_args(args).resolved()
            config.validate()
        except (ValueError, TypeError) as e:
            print(f"seedq {args.command}: {e}", file=sys.stderr)
            return 2
        if args.command == "learner" and not config.address:
            print("seedq learner: --address is required (e.g. 0.0.0.0:50051 or unix:/tmp/seedq.sock)",
                  file=sys.stderr)
            return 2
        if getattr(args, "print_config", False):
            print(json.dumps(config_lib.to_dict(config), indent=2, sort_keys=True))
            return 0
        from seedq import local

        try:
            summary = local.train(
                config, quiet=args.quiet, started=COMMAND_STARTED,
                with_actors=args.command == "train",
            )
        except (ValueError, OSError) as e:
            print(f"seedq {args.command}: {e}", file=sys.stderr)
            return 1
        return {"actors_exited": 1, "interrupted": 130}.get(summary["stop_reason"], 0)

    if args.command == "bench":
        from seedq.bench import throughput

        result = throughput.run(
            env_id=args.env,
            num_actors=args.actors,
            envs_per_actor=args.envs_per_actor,
            seconds=args.seconds,
            warmup_seconds=args.warmup_seconds,
            train=not args.no_train,
        )
        if args.json:
            print(json.dumps(result))
        else:
            for key, value in result.items():
                print(f"{key:>32}: {value}")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
