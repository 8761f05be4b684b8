"""Learning parity for `seedq compare`: kept checkpoints, their evaluation, normalised scores.

A comparison run keeps a checkpoint every `every_frames` env frames (the
learner's step trigger, at the train steps that many new frames take; none
pruned). After the run, those checkpoints and the final one are evaluated over many greedy
episodes, at the precision the run's actors acted at (int8 configurations
with int8 inference), into `<run>/evaluations.json`. The final checkpoint's
score is set against the best one's, both normalised as
(return - random) / (reference - random), so negative returns (Pong) compare too.

`python -m seedq.bench.parity RUN_DIR --episodes N --seed S` evaluates the
checkpoints of RUN_DIR not yet in its evaluations.json (the comparison runs
it as a job of its own, so a stop reaches it like a training run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

from seedq import run_dirs
from seedq.bench.references import SUITE, normalised
from seedq.bench.throughput import read_json
from seedq.config import TrainConfig

EVALUATIONS = run_dirs.EVALUATIONS
RANDOM_SEED = 10_000  # env seeds of the random-policy episodes (apart from eval_seed's)


@dataclasses.dataclass(frozen=True)
class Scale:
    """What a normalised score of 0 and of 1 mean on an env."""

    random: float | None  # the random policy's return; None: measured here (OUT/random.json)
    reference: float


SCALES = {
    # Random: the random agent of Mnih et al. 2015 (Nature DQN); reference: the
    # game's maximum, which IMPALA and SEED RL's Pong agents reach.
    "ALE/Pong-v5": Scale(-20.7, 21.0),
}


def scale_for(env_id: str) -> Scale | None:
    """The env's scale: its own entry, else the learning suite's reference with
    a measured random policy; None where neither knows the env."""
    if env_id in SCALES:
        return SCALES[env_id]
    if env_id in SUITE:
        ref = SUITE[env_id]
        return Scale(None, ref.reference)  # seedq's uniform random policy, measured (random.json)
    return None


def random_return(env_id: str, episodes: int, options) -> float:
    """Mean return of uniformly random actions over `episodes` episodes."""
    from seedq.envs import env_spec
    from seedq.evaluation import RandomPolicy, evaluate

    return evaluate(RandomPolicy(env_spec(env_id, options)), env_id, episodes, RANDOM_SEED, options).mean


def random_returns(envs: list[str], out: str, episodes: int, options_for, log) -> dict[str, float]:
    """{env: random-policy mean return}, measured once per env and kept in OUT/random.json."""
    path = os.path.join(out, "random.json")
    known = read_json(path) or {}
    for env_id in envs:
        if env_id not in known:
            started = time.monotonic()
            known[env_id] = {"mean": random_return(env_id, episodes, options_for(env_id)), "episodes": episodes}
            log(f"random policy on {env_id}: mean return {known[env_id]['mean']:.2f} over {episodes} "
                f"episodes ({time.monotonic() - started:.1f}s)")
            with open(path, "w") as f:
                json.dump(known, f, indent=2, sort_keys=True)
                f.write("\n")
    return {env_id: known[env_id]["mean"] for env_id in envs}


def checkpoint_overrides(config: TrainConfig, every_frames: int) -> dict:
    """TrainConfig fields that keep a checkpoint every `every_frames` env frames:
    the step trigger at that many frames' train steps, no time trigger (it
    would restart the step interval), and none pruned (room for the final save
    and one per stop of a resumed run). A run stopped by SIGTERM still saves."""

    steps = max(1, round(every_frames / config.new_frames_per_train_step))
    marks = math.ceil(config.max_frames / every_frames) if config.max_frames else 50
    return {"checkpoint_every_steps": steps, "checkpoint_every_seconds": 0.0, "checkpoints_to_keep": marks + 10}


def acting_precision(config: TrainConfig) -> str:
    """The precision the run's actors acted at: IMPALA actors' own, SEED's server's."""
    return config.actor_precision if config.architecture == "impala" else config.precision


def read_evaluations(run_dir: str) -> dict[str, dict]:
    """{step directory name: evaluation} of a run (empty before any)."""
    return read_json(os.path.join(run_dir, EVALUATIONS)) or {}


def scheduled_checkpoints(step_dirs: list[str], every_steps: int) -> list[str]:
    """The checkpoints of a finished run worth evaluating (`step_dirs` oldest
    first, named step_<train steps>): each one the step trigger took (the first
    at or past a multiple of `every_steps`, as `RunControl.checkpoint_due`
    decides) and the final one. A stop's checkpoint between two marks (SIGTERM)
    is left out: it only let the run continue, and evaluating 500 Pong episodes
    costs ~10 minutes. With no step trigger (`every_steps` 0) every checkpoint counts."""
    if not every_steps:
        return list(step_dirs)
    chosen, previous = [], 0
    for i, step_dir in enumerate(step_dirs):
        step = int(os.path.basename(step_dir).split("_")[-1])
        if step // every_steps > previous // every_steps or i == len(step_dirs) - 1:
            chosen.append(step_dir)
        previous = step
    return chosen


def run_checkpoints(run_dir: str, every_steps: int) -> list[str]:
    """`scheduled_checkpoints` of the run in `run_dir` (`every_steps`: its
    config's checkpoint_every_steps, which the callers have loaded already)."""
    from seedq import checkpoint

    return scheduled_checkpoints(checkpoint.step_dirs(run_dir), every_steps)


def is_evaluated(done: dict[str, dict], step_dir: str, episodes: int) -> bool:
    """Whether `done` (a run's evaluations.json) holds the checkpoint at
    `step_dir` evaluated over at least `episodes` episodes."""
    entry = done.get(os.path.basename(step_dir))
    return entry is not None and entry["episodes"] >= episodes


def evaluate_checkpoints(run_dir: str, episodes: int, seed: int, log=print,
                         progress_seconds: float = 60.0) -> dict[str, dict]:
    """Evaluates each `run_checkpoints` of `run_dir` missing from its evaluations.json
    (greedy, `episodes` episodes from env seed `seed`, at the acting precision),
    saving after each; returns them all. Logs how far each has got every
    `progress_seconds` (500 Pong episodes take many minutes)."""
    from seedq.process.affinity import usable_cores
    from seedq.config import load as load_config
    from seedq.evaluation import EVAL_ENVS, MAX_EPISODE_STEPS, evaluate, load_policy

    done = read_evaluations(run_dir)
    config = load_config(os.path.join(run_dir, "config.json"))
    precision = acting_precision(config)
    for step_dir in run_checkpoints(run_dir, config.checkpoint_every_steps):
        if is_evaluated(done, step_dir, episodes):
            continue
        name = os.path.basename(step_dir)
        loaded = load_policy(step_dir, precision=precision)
        result = evaluate(loaded.policy, loaded.config.env, episodes, seed, loaded.config.env_options,
                          env_threads=usable_cores(), on_episode=_every(progress_seconds, lambda ended, mean: log(
                              f"{name} ({loaded.counters.get('frames'):,} frames): {ended} of {episodes} "
                              f"episodes ended, mean so far {mean:.2f}")))
        returns, truncated = result.returns, result.truncated
        if result.unplayed:
            log(f"{run_dir}: {name}: {result.unplayed} of {episodes} episodes not played: every env was stuck "
                f"in an episode cut at {MAX_EPISODE_STEPS:,} steps")
        done[name] = {
            "frames": loaded.counters.get("frames"), "train_steps": loaded.counters.get("train_steps"),
            "episodes": episodes, "seed": seed, "precision": precision, "max_steps": MAX_EPISODE_STEPS,
            "envs": min(episodes, EVAL_ENVS), "unplayed": result.unplayed,
            "truncated": truncated, "mean": sum(returns) / len(returns), "returns": returns,
        }
        log(f"{run_dir}: {name} ({done[name]['frames']:,} frames): mean {done[name]['mean']:.2f} "
            f"over {episodes} episodes")
        _write_json(os.path.join(run_dir, EVALUATIONS), done)
    return done


def _every(seconds: float, call):
    """`call`, passed on at most once every `seconds` (the first time after `seconds`)."""
    last = time.monotonic()

    def throttled(*args) -> None:
        nonlocal last
        if time.monotonic() - last >= seconds:
            last = time.monotonic()
            call(*args)

    return throttled


def _write_json(path: str, value: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)


def parity_columns(evaluations: dict[str, dict], random: float | None, reference: float | None) -> dict:
    """The results.csv columns of a run's checkpoint evaluations: the final
    (newest) and the best checkpoint's mean return, both normalised, and
    final / best (None where the best is not above the random policy)."""
    if not evaluations:
        return dict.fromkeys(("checkpoints_evaluated", "eval_episodes", "eval_truncated", "final_eval_return",
                              "best_eval_return", "best_eval_frames", "final_normalized", "best_normalized",
                              "final_over_best"))
    ordered = sorted(evaluations.items())  # step_<zero-padded>: oldest first
    final = ordered[-1][1]
    best = max((e for _, e in ordered), key=lambda e: e["mean"])

    def score(value):
        return None if reference is None else normalised(value, random, reference)

    final_n, best_n = score(final["mean"]), score(best["mean"])
    return {
        "checkpoints_evaluated": len(ordered),
        "eval_episodes": min(e["episodes"] for _, e in ordered),
        "eval_truncated": sum(e.get("truncated", 0) for _, e in ordered),  # episodes cut at max_steps
        "final_eval_return": final["mean"],
        "best_eval_return": best["mean"],
        "best_eval_frames": best["frames"],
        "final_normalized": final_n,
        "best_normalized": best_n,
        "final_over_best": final_n / best_n if final_n is not None and best_n and best_n > 0 else None,
    }


def evaluation_points(evaluations: dict[str, dict], random: float | None, reference: float | None) -> list[dict]:
    """One point per evaluated checkpoint, oldest first: frames, mean return, normalised."""
    return [
        {"checkpoint": name, "frames": e["frames"], "episodes": e["episodes"], "mean": e["mean"],
         "normalized": None if reference is None else normalised(e["mean"], random, reference)}
        for name, e in sorted(evaluations.items())
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seedq.bench.parity",
                                     description="evaluate a run's kept checkpoints into its evaluations.json")
    parser.add_argument("run_dir")
    parser.add_argument("--episodes", type=int, required=True, help="greedy episodes per checkpoint")
    parser.add_argument("--seed", type=int, default=1000, help="env i of the evaluation is reset with SEED+i")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        print(f"--episodes {args.episodes}: must be >= 1", file=sys.stderr)
        return 2
    try:
        evaluate_checkpoints(args.run_dir, args.episodes, args.seed, log=lambda line: print(line, flush=True))
    except (ValueError, OSError) as e:
        print(f"{args.run_dir}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
