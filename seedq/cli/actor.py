"""`seedq actor` and `seedq impala-actor`: one actor process against a learner.

Nothing here imports JAX: a SEED actor starts fast (JAX loads only in
`seedq impala-actor`, which holds a local policy copy)."""

from __future__ import annotations

import argparse
import json
import sys

from seedq import config as config_lib
from seedq.flags import add_config_flags, config_from_args


def add_actor_flags(actor: argparse.ArgumentParser) -> None:
    """Flags shared by `seedq actor` and `seedq impala-actor`."""
    actor.add_argument("--server", required=True, help="learner address: unix:/path.sock or host:port")
    actor.add_argument(
        "--env", required=True,
        help="environment id: a gymnasium id (module:Env-v0 imports module first), ALE/<Game>-v5, "
        "dmc:<domain>-<task>, or factory:<module>:<function>",
    )
    actor.add_argument("--num-envs", type=int, default=32, help="envs stepped as one vector")
    actor.add_argument("--actor-id", default="", help="stable actor name (default: host-pid)")
    actor.add_argument("--seed", type=int, default=0, help="base seed of the env vector's episodes")
    actor.add_argument(
        "--seed-from-actor-id", action="store_true",
        help="combine --seed with a hash of --actor-id, so replicas started with one command line "
        "(an actor Job's pods, a VM template's units) step different episodes",
    )
    actor.add_argument("--max-seconds", type=float, default=0.0, help="stop after this long (0: never)")
    actor.add_argument(
        "--retry-max-seconds", type=float, default=0.0,
        help="give up after this long without a learner (0: retry forever); with --parent-pid, "
        "only once that process is gone",
    )
    actor.add_argument("--stats-file", default="", help="write actor statistics (JSON) here at exit")
    actor.add_argument(
        "--stats-skip-seconds", type=float, default=0.0,
        help="leave the first seconds after connecting out of the latency statistics (warm-up)",
    )
    actor.add_argument(
        "--parent-pid", type=int, default=0,
        help="exit when this process (the local learner that started us) dies; Linux only",
    )
    actor.add_argument(
        "--cores", default="",
        help='pin this process to these CPU cores ("0", "0-1", "0,2"; Linux), e.g. to give every '
        "configuration of a comparison the same actor cores",
    )
    actor.add_argument("--verbose", action="store_true", help="log each retry and connection (INFO logging)")
    actor.add_argument("--print-config", action="store_true",
                       help="print the resolved arguments as JSON and exit (starts nothing)")
    # TLS, token and keepalive of the channel to the learner (docs/security.md).
    add_config_flags(actor, config_lib.ActorChannelConfig)
    # Env preprocessing happens in the actor: the same --atari.* / --dmc.* flags as the learner's.
    add_config_flags(actor, config_lib.EnvOptions)


def add_parsers(sub) -> None:
    actor = sub.add_parser("actor", help="run one SEED actor process against a learner")
    add_actor_flags(actor)
    actor.add_argument(
        "--groups", type=int, default=0,
        help="env groups, one stream each, that take turns so that envs step while other groups' "
        "actions travel (docs/wire.md); 0: 1 on a unix socket or below a 2 ms round trip, else "
        "chosen from what a request waits (the round trip of health-service pings, then the learner's "
        "serve time too) and the env step time",
    )
    impala = sub.add_parser(
        "impala-actor",
        help="run one IMPALA actor (local policy copy, pulls parameters, pushes unrolls) "
        "against a learner started with --architecture impala",
        description="Run one IMPALA actor: JAX on the CPU, a local copy of the policy pulled from "
        "the learner every param_pull_every unrolls (fp32 or int8, the learner's actor_precision), "
        "whole unrolls pushed to the learner. Hyperparameters come from the learner.",
    )
    add_actor_flags(impala)


def print_actor_config(args: argparse.Namespace) -> int:
    """`seedq actor|impala-actor --print-config`: the arguments as the actor would use them."""
    import os

    channel = config_from_args(args, config_lib.ActorChannelConfig)
    try:
        channel.validate()
        for flag, path in (("--tls.ca", channel.tls.ca), ("--tls.cert", channel.tls.cert),
                           ("--tls.key", channel.tls.key), ("--auth.token-file", channel.auth.token_file)):
            if path and not os.path.isfile(path):
                raise ValueError(f"{flag} {path}: no such file")
    except ValueError as e:
        print(f"seedq {args.command}: {e}", file=sys.stderr)
        return 2
    plain = {k: v for k, v in vars(args).items() if "." not in k and k not in ("command", "print_config")}
    from seedq.actor.seed_actor import env_seed

    out = {
        "command": args.command, **plain,
        "env_seed": env_seed(args),
        "channel": config_lib.to_dict(channel),
        "env_options": config_lib.to_dict(config_from_args(args, config_lib.EnvOptions)),
    }
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.print_config:
        return print_actor_config(args)
    if args.cores:  # first, so that every thread started later inherits it
        from seedq.process.affinity import parse_cores, pin_process

        try:
            parse_cores(args.cores, "--cores")
        except ValueError as e:
            print(f"seedq {args.command}: {e}", file=sys.stderr)
            return 2
        why_not = pin_process(args.cores)
        if why_not:
            print(f"seedq {args.command}: {why_not}", file=sys.stderr, flush=True)
    from seedq.process import grpc_setup

    grpc_setup.quiet_core_logs()  # before the actor modules import grpc
    if args.command == "actor":
        from seedq.actor import seed_actor

        return seed_actor.main(args)
    from seedq.impala import actor as impala_actor

    return impala_actor.main(args)
