"""`seedq compare`: IMPALA vs SEED and int8 vs fp32 actors, one change at a time."""

from __future__ import annotations

import argparse
import sys

from seedq.cli.common import HelpFormatter, default_config
from seedq.flags import add_config_flags, config_from_args


def add_parsers(sub) -> None:
    compare = sub.add_parser(
        "compare",
        help="IMPALA vs SEED and int8 vs fp32 actors: runs each configuration with identical "
        "hyperparameters, writes results.csv, curves.csv and PNG plots",
        description="Runs `seedq train` once per configuration and seed, one after another on this "
        "machine, changing only the architecture / precision; every config flag applies to all "
        "runs (--actor-cores pins every run's actors to the same cores). Each run keeps a checkpoint "
        "every --checkpoint-frames frames; each of them and the final one is then evaluated over --eval-episodes "
        "greedy episodes and the final one's normalised score set against the best's. Writes "
        "OUT/results.csv (one row per run; energy from RAPL counters where readable, else "
        "codecarbon's estimate, else a CPU-seconds model: the energy_source column says which), "
        "OUT/curves.csv, OUT/summary.md and PNG plots. A rerun with the same flags skips finished "
        "runs and continues unfinished ones from their last checkpoint; a larger --max-frames extends "
        "every run from its checkpoint; any other change is refused (use a new --out). The running run prints a "
        "progress line a minute (frames, mean return, frames/s, time left; while evaluating, the "
        "episodes ended so far).",
        formatter_class=HelpFormatter,
    )
    add_config_flags(compare)
    compare.add_argument("--configs", default="seed-fp32,seed-int8,impala-fp32,impala-int8",
                         help="comma-separated: seed-fp32, seed-int8, impala-fp32, impala-int8")
    compare.add_argument("--seeds", type=int, default=3, help="runs per configuration (seeds SEED, SEED+1, ...)")
    compare.add_argument("--out", required=True, help="output directory")
    compare.add_argument("--watts-per-core", type=float, default=10.0,
                         help="energy model where neither RAPL counters nor codecarbon are available: "
                         "assumed power of one fully busy core")
    compare.add_argument("--checkpoint-frames", type=int, default=1_000_000,
                         help="keep a checkpoint every this many env frames (all are evaluated after the run)")
    compare.add_argument("--random-episodes", type=int, default=300,
                         help="episodes of the random policy measured for normalised scores, on envs "
                         "without a published random-policy return")
    compare.add_argument("--grams-co2-per-kwh", type=float, default=475.0,
                         help="carbon estimate: assumed grid intensity")
    compare.add_argument("--plot-only", action="store_true",
                         help="only redraw plots and summary.md from OUT/results.csv and OUT/curves.csv")


def run(args: argparse.Namespace) -> int:
    from seedq.bench import compare

    try:
        if args.plot_only:
            result = compare.report(args.out)
        else:
            for flag, value in (("--seeds", args.seeds), ("--checkpoint-frames", args.checkpoint_frames),
                                ("--random-episodes", args.random_episodes)):
                if value <= 0:
                    raise ValueError(f"{flag} {value}: must be > 0")
            # --eval-episodes: episodes per kept checkpoint here (the runs evaluate nothing themselves).
            eval_episodes = compare.EVAL_EPISODES if args.eval_episodes is None else args.eval_episodes
            base = config_from_args(args, base=default_config(args.env))
            base.validate()
            result = compare.run(
                base, compare.parse_configs(args.configs), args.seeds, args.out,
                watts_per_core=args.watts_per_core, grams_co2_per_kwh=args.grams_co2_per_kwh,
                checkpoint_frames=args.checkpoint_frames, eval_episodes=eval_episodes,
                random_episodes=args.random_episodes, log=lambda line: print(line, flush=True),
            )
    except compare.Stopped as e:
        print(f"seedq compare: {e}; the runs finished before it are in {args.out}/results.csv", file=sys.stderr)
        return 128 + e.signum
    except (ValueError, RuntimeError, OSError) as e:
        print(f"seedq compare: {e}", file=sys.stderr)
        return 1
    print(result["table"])
    print("plots: " + ", ".join(result["plots"]))
    return 0
