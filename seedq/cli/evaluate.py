"""`seedq eval`: the policy in a checkpoint, evaluated in this process."""

from __future__ import annotations

import argparse
import json
import sys

from seedq import config as config_lib
from seedq.process.affinity import usable_cores
from seedq.cli.common import HelpFormatter


def add_parsers(sub) -> None:
    ev = sub.add_parser(
        "eval",
        help="evaluate a checkpointed policy: mean/std/min/max return over N episodes",
        description="Evaluate the policy in a checkpoint (a run directory: its newest checkpoint) "
        "in this process: N episodes, greedy actions unless --sample; prints the mean, std, min "
        "and max return. The defaults (--episodes, --seed from the run's eval_episodes / "
        "eval_seed) reproduce the evaluation the training run recorded in summary.json.",
        formatter_class=HelpFormatter,
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
                    help="inference precision (default: the run's precision, the learner's, as its own "
                         "evaluation used; an IMPALA run's actors acted at its actor_precision: pass that "
                         "to evaluate as they acted)")
    ev.add_argument("--video", default="", metavar="OUT.mp4|OUT.gif",
                    help="also render one episode (seed SEED) with rgb_array and write it here")
    ev.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from seedq import evaluation

    try:
        loaded = evaluation.load_policy(
            args.path, env=args.env, precision=args.precision, greedy=not args.sample
        )
        config = loaded.config
        episodes = args.episodes if args.episodes is not None else (config.eval_episodes or 10)
        seed = args.seed if args.seed is not None else config.eval_seed
        result = evaluation.evaluate(loaded.policy, config.env, episodes, seed, config.env_options,
                                     env_threads=usable_cores())  # alone on the machine
        video = evaluation.record_video(loaded.policy, config.env, args.video, seed, config.env_options) if args.video else None
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
