"""`seedq train | learner | actor | eval | bench` command line.

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
        def parse_bool(text: str) -> bool:
            value = {"true": True, "1": True, "false": False, "0": False}.get(text.lower())
            if value is None:
                raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
            return value

        return parse_bool
    return hint


class _Parser(argparse.ArgumentParser):
    """Argument errors are one line on stderr (no usage block), exit status 2.

    Abbreviated flags are not accepted: a typo in an override must fail, not
    silently match a longer flag."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except where the help text already states one."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _unknown_arguments_message(parser: argparse.ArgumentParser, args, extras: list[str]) -> str:
    """One line: the unknown arguments, close matches, and the valid options."""
    import difflib

    from seedq.docs import _subcommands

    prog, target = parser.prog, parser
    for line, sub in _subcommands(parser, parser.prog):
        words = line.split()[1:]
        if [getattr(args, d, None) for d in ("command", "bench")][: len(words)] == words:
            prog, target = line, sub
    valid = sorted(o for a in target._actions for o in a.option_strings if o.startswith("--"))
    hints = []
    for extra in extras:
        if extra.startswith("-"):
            close = difflib.get_close_matches(extra.split("=", 1)[0], valid, n=2, cutoff=0.6)
            if close:
                hints.append(f"{extra}: did you mean {' or '.join(close)}?")
    return (
        f"{prog}: unrecognized arguments: {' '.join(extras)}"
        + (f" ({'; '.join(hints)})" if hints else "")
        + f"; valid options: {', '.join(valid)}"
    )


def add_config_flags(parser: argparse.ArgumentParser, cls=TrainConfig, prefix: str = "") -> None:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            add_config_flags(parser, hint, prefix + field.name + ".")
            continue
        from seedq.docs import field_comments, format_default

        comment = field_comments(cls).get(field.name, "")
        action = parser.add_argument(
            _flag(prefix, field.name),
            dest=prefix + field.name,
            type=_parser_for(hint),
            default=None,
            metavar=hint.__name__.upper() if isinstance(hint, type) else "LIST",
            help=(f"{comment} " if comment else "").replace("%", "%%")
            + f"(default: {format_default(field.default)})",
        )
        action.doc_default = field.default  # for the generated CLI reference


def config_from_args(args: argparse.Namespace, cls=TrainConfig, prefix: str = "", base=None):
    """The config `base` (default: `cls()`) with the flags given in `args` applied."""
    base = cls() if base is None else base
    hints = typing.get_type_hints(cls)
    overrides = {}
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            overrides[field.name] = config_from_args(
                args, hint, prefix + field.name + ".", getattr(base, field.name)
            )
            continue
        value = getattr(args, prefix + field.name, None)
        if value is not None:
            overrides[field.name] = value
    return dataclasses.replace(base, **overrides)


def config_flags(config, cls=TrainConfig, prefix: str = "") -> list[str]:
    """The flags that turn the default config into `config` (inverse of `config_from_args`)."""
    flags = []
    for field in dataclasses.fields(cls):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            flags += config_flags(value, type(value), prefix + field.name + ".")
        elif value != field.default:
            if isinstance(value, tuple):
                text = ",".join(str(v) for v in value)
            elif isinstance(value, bool):
                text = str(value).lower()
            else:
                text = str(value)
            flags += [_flag(prefix, field.name), text]
    return flags


def _default_config(args: argparse.Namespace) -> TrainConfig:
    """The defaults the flags apply to: they depend on whether the env's actions
    are Discrete or Box (config.defaults_for). An env id that cannot be built
    falls back to the plain defaults; the run then reports the env error."""
    from seedq.envs import env_spec

    env = getattr(args, "env", None) or TrainConfig.env
    try:
        continuous = not env_spec(env).discrete
    except ValueError:
        return TrainConfig()
    return config_lib.defaults_for(continuous)


def _resumed_config(args: argparse.Namespace) -> TrainConfig:
    """The saved config of the run in `--resume RUN_DIR` with the given flags applied."""
    import os

    run_dir = args.resume
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"--resume {run_dir}: no such run directory")
    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"--resume {run_dir}: not a seedq run directory (no config.json)")
    if args.logdir is not None and os.path.abspath(args.logdir) != os.path.abspath(run_dir):
        raise ValueError("--logdir cannot be combined with --resume: the run continues in its own directory")
    try:
        saved = config_lib.load(path)
    except (ValueError, TypeError, KeyError) as e:
        raise FileNotFoundError(f"--resume {run_dir}: config.json cannot be read ({e})") from None
    return dataclasses.replace(config_from_args(args, base=saved), logdir=run_dir)


def _add_run_command(sub, name: str, *, summary: str, description: str, resume_note: str = ""):
    """A command that runs a learner: every config flag plus --resume."""
    parser = sub.add_parser(name, help=summary, description=description, formatter_class=_HelpFormatter)
    add_config_flags(parser)
    parser.add_argument(
        "--resume", metavar="RUN_DIR", default=None,
        help="continue the run in RUN_DIR from its newest checkpoint, with its saved config "
        "(flags given here override it)" + resume_note,
    )
    return parser


def _add_actor_flags(actor: argparse.ArgumentParser) -> None:
    """Flags shared by `seedq actor` and `seedq impala-actor`."""
    actor.add_argument("--server", required=True, help="learner address: unix:/path.sock or host:port")
    actor.add_argument(
        "--env", required=True,
        help="environment id: a gymnasium id (module:Env-v0 imports module first), ALE/<Game>-v5, "
        "dmc:<domain>-<task>, or factory:<module>:<function>",
    )
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
    actor.add_argument(
        "--parent-pid", type=int, default=0,
        help="exit when this process (the local learner that started us) dies; Linux only",
    )
    actor.add_argument("--verbose", action="store_true")
    # Env preprocessing happens in the actor: the same --atari.* / --dmc.* flags as the learner's.
    add_config_flags(actor, config_lib.EnvOptions)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="seedq", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = _add_run_command(
        sub, "train",
        summary="train locally: learner + actor processes on this host",
        description="Train locally: the learner plus `--num-actors` actor processes on this host.",
    )
    train.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    train.add_argument("--quiet", action="store_true", help="no progress lines")

    learner = _add_run_command(
        sub, "learner",
        summary="run only the learner; actors started elsewhere (`seedq actor`) connect to --address",
        description="Run only the learner; actors started elsewhere (`seedq actor`) connect to "
        "--address. With --min-actors N training waits for N actors.",
        resume_note="; running actors reconnect by themselves",
    )
    learner.add_argument("--quiet", action="store_true", help="no progress lines")

    actor = sub.add_parser("actor", help="run one SEED actor process against a learner")
    _add_actor_flags(actor)
    impala = sub.add_parser(
        "impala-actor",
        help="run one IMPALA actor (local policy copy, pulls parameters, pushes unrolls) "
        "against a learner started with --architecture impala",
        description="Run one IMPALA actor: JAX on the CPU, a local copy of the policy pulled from "
        "the learner every param_pull_every unrolls (fp32 or int8, the learner's actor_precision), "
        "whole unrolls pushed to the learner. Hyperparameters come from the learner.",
    )
    _add_actor_flags(impala)

    ev = sub.add_parser(
        "eval",
        help="evaluate a checkpointed policy: mean/std/min/max return over N episodes",
        description="Evaluate the policy in a checkpoint (a run directory: its newest checkpoint) "
        "in this process: N episodes, greedy actions unless --sample; prints the mean, std, min "
        "and max return. The defaults (--episodes, --seed from the run's eval_episodes / "
        "eval_seed) reproduce the evaluation the training run recorded in summary.json.",
        formatter_class=_HelpFormatter,
    )
    ev.add_argument("path", metavar="RUN_DIR_OR_CHECKPOINT",
                    help="a run directory (its newest checkpoint) or a checkpoints/step_* directory")
    ev.add_argument("--env", default=None, help="gymnasium environment id (default: the run's env)")
    ev.add_argument("--episodes", type=int, default=None,
                    help="episodes to play (default: the run's eval_episodes, or 10)")
    ev.add_argument("--seed", type=int, default=None,
                    help="env i is reset with SEED+i (default: the run's eval_seed)")
    ev.add_argument("--sample", action="store_true",
                    help="sample actions from the policy instead of taking the greedy (argmax) action")
    ev.add_argument("--precision", choices=config_lib.PRECISIONS, default=None,
                    help="inference precision (default: the run's)")
    ev.add_argument("--video", default="", metavar="OUT.mp4|OUT.gif",
                    help="also render one episode (seed SEED) with rgb_array and write it here")
    ev.add_argument("--json", action="store_true", help="print one JSON object")

    compare = sub.add_parser(
        "compare",
        help="IMPALA vs SEED and int8 vs fp32 actors: runs each configuration with identical "
        "hyperparameters, writes results.csv, curves.csv and PNG plots",
        description="Runs `seedq train` once per configuration and seed, one after another on this "
        "machine, changing only the architecture / precision; every config flag applies to all "
        "runs. Writes OUT/results.csv (one row per run; energy and CO2 columns are estimates from "
        "CPU seconds), OUT/curves.csv, OUT/summary.md and PNG plots.",
        formatter_class=_HelpFormatter,
    )
    add_config_flags(compare)
    compare.add_argument("--configs", default="seed-fp32,seed-int8,impala-fp32,impala-int8",
                         help="comma-separated: seed-fp32, seed-int8, impala-fp32, impala-int8")
    compare.add_argument("--seeds", type=int, default=3, help="runs per configuration (seeds SEED, SEED+1, ...)")
    compare.add_argument("--out", required=True, help="output directory")
    compare.add_argument("--watts-per-core", type=float, default=10.0,
                         help="energy estimate: assumed power of one fully busy core")
    compare.add_argument("--grams-co2-per-kwh", type=float, default=475.0,
                         help="carbon estimate: assumed grid intensity")
    compare.add_argument("--plot-only", action="store_true",
                         help="only redraw plots and summary.md from OUT/results.csv and OUT/curves.csv")

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
    inf = bench_sub.add_parser(
        "inference",
        help="jitted policy inference in fp32/bf16/int8 side by side: throughput and error vs fp32",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    inf.add_argument("--net", type=_csv(str), default="mlp,nature_cnn,impala_cnn",
                     help="networks: mlp, nature_cnn, impala_cnn")
    inf.add_argument("--precision", type=_csv(str), default="fp32,bf16,int8",
                     help="inference precisions timed side by side (fp32 is always included: the reference)")
    inf.add_argument("--batch", type=_csv(int), default="1,16,64,256", help="batch sizes (states per call)")
    inf.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds per case")
    inf.add_argument("--seconds-per-case", type=float, default=1.5,
                     help="timing budget per (net, batch), shared by the precisions")
    inf.add_argument("--frames", choices=("atari", "random"), default="atari",
                     help="CNN inputs: real Atari frames (ALE Pong, random play) or uniform noise")
    inf.add_argument("--eval-states", type=int, default=512, help="states for the error metrics")
    inf.add_argument("--mlp-hidden", type=_csv(int), default="256,256,256", help="hidden sizes of the mlp net")
    inf.add_argument("--mlp-input", type=int, default=64, help="observation size of the mlp net")
    inf.add_argument("--num-actions", type=int, default=6, help="policy head size")
    inf.add_argument("--seed", type=int, default=0, help="parameter initialisation and data seed")
    inf.add_argument("--quant.force-int8", dest="force_int8", action="store_true",
                     help="int8 in every quantizable layer instead of the measured per-layer plan")
    inf.add_argument("--profile", action="store_true", help="add per-layer timings (fp32 vs int8 per layer)")
    inf.add_argument("--profile-batch", type=_csv(int), default="64", help="batch sizes of the per-layer profile")
    inf.add_argument(
        "--policy-run", default="",
        help="also report bf16/int8 greedy-action agreement for the trained V-trace policy in this "
             "run directory (states from rolling it out); with --net '' only that",
    )
    inf.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _csv(kind):
    def parse(text: str):
        try:
            return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None

    return parse


def _bench_inference(args) -> int:
    from seedq import jax_setup
    from seedq.bench import inference

    jax_setup.configure()
    log = None if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        result = {}
        if args.policy_run:
            result["trained_policy"] = inference.trained_policy_agreement(args.policy_run, seed=args.seed)
            if not args.net:
                print(json.dumps(result, indent=None if args.json else 2))
                return 0
        result.update(inference.run(
            nets=args.net,
            precisions=args.precision,
            batches=args.batch,
            num_actions=args.num_actions,
            seed=args.seed,
            rounds=args.rounds,
            budget_s=args.seconds_per_case,
            frames=args.frames,
            eval_states=args.eval_states,
            mlp_hidden=args.mlp_hidden,
            mlp_input=args.mlp_input,
            profile=args.profile,
            profile_batches=args.profile_batch,
            force_int8=args.force_int8,
            log=log,
        ))
    except ValueError as e:
        print(f"seedq bench inference: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else inference.format_table(result))
    return 0


def _eval(args: argparse.Namespace) -> int:
    from seedq import evaluate

    try:
        loaded = evaluate.load_policy(
            args.path, env=args.env, precision=args.precision, greedy=not args.sample
        )
        config = loaded.config
        episodes = args.episodes if args.episodes is not None else (config.eval_episodes or 10)
        seed = args.seed if args.seed is not None else config.eval_seed
        result = evaluate.evaluate(loaded.policy, config.env, episodes, seed, config.env_options)
        video = evaluate.record_video(loaded.policy, config.env, args.video, seed, config.env_options) if args.video else None
    except (ValueError, OSError, RuntimeError) as e:
        print(f"seedq eval: {e}", file=sys.stderr)
        return 1
    counters = loaded.counters
    if args.json:
        out = {**result.to_dict(), "checkpoint": loaded.checkpoint, "precision": config.precision,
               "train_steps": counters.get("train_steps"), "frames": counters.get("frames"),
               "video": video}
        print(json.dumps(out))
        return 0
    policy = "greedy (most likely action)" if not args.sample else f"sampled from the policy (seed {seed})"
    print(
        f"checkpoint {loaded.checkpoint} (train step {counters.get('train_steps', 0):,}, "
        f"{counters.get('frames', 0):,} frames); policy: {policy}, {config.precision}"
    )
    print(result.line())
    if video:
        print(f"video: {video['path']} ({video['frames']} frames at {video['fps']:g} fps, "
              f"episode return {video['return']:g})")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from seedq.bench import compare

    try:
        if args.plot_only:
            result = compare.report(args.out)
        else:
            if args.seeds <= 0:
                raise ValueError(f"--seeds {args.seeds}: must be > 0")
            base = config_from_args(args, base=_default_config(args))
            base.validate()
            result = compare.run(
                base, compare.parse_configs(args.configs), args.seeds, args.out,
                watts_per_core=args.watts_per_core, grams_co2_per_kwh=args.grams_co2_per_kwh,
                log=lambda line: print(line, flush=True),
            )
    except (ValueError, RuntimeError, OSError) as e:
        print(f"seedq compare: {e}", file=sys.stderr)
        return 1
    print(result["table"])
    print("plots: " + ", ".join(result["plots"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        print(_unknown_arguments_message(parser, args, extras), file=sys.stderr)
        return 2
    if args.command == "actor":
        from seedq.actor import seed_actor

        return seed_actor.main(args)
    if args.command == "impala-actor":
        from seedq.actor import impala_actor

        return impala_actor.main(args)

    if args.command == "eval":
        return _eval(args)

    if args.command in ("train", "learner"):
        try:
            if args.resume:
                config = _resumed_config(args)
            else:
                config = config_from_args(args, base=_default_config(args)).resolved()
            config.validate()
        except FileNotFoundError as e:
            print(f"seedq {args.command}: {e.args[0]}", file=sys.stderr)
            return 1
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
                with_actors=args.command == "train", resume=args.resume,
            )
        except (ValueError, OSError) as e:
            print(f"seedq {args.command}: {e}", file=sys.stderr)
            return 1
        return {"actors_exited": 1, "interrupted": 130}.get(summary["stop_reason"], 0)

    if args.command == "compare":
        return _compare(args)

    if args.command == "bench":
        if args.bench == "inference":
            return _bench_inference(args)
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
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C while still importing (e.g. a local actor starting up)
        sys.exit(130)
