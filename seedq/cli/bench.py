"""`seedq bench throughput | ingress | stuck | soak | suite | inference | learner | device`: the benchmarks."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

from seedq import config as config_lib
from seedq.cli.common import HelpFormatter, csv_of, default_config
from seedq.config import TrainConfig
from seedq.flags import add_config_flags, config_from_args


def add_parsers(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    _add_throughput(bench_sub)
    _add_ingress(bench_sub)
    _add_stuck(bench_sub)
    _add_soak(bench_sub)
    _add_suite(bench_sub)
    _add_inference(bench_sub)
    _add_learner(bench_sub)
    _add_device(bench_sub)


def _add_throughput(bench_sub) -> None:
    tp = bench_sub.add_parser(
        "throughput",
        help="env frames/s of the full SEED loop vs raw env stepping, measured in one run",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    tp.add_argument("--env", default="CartPole-v1", help="the env the actors step")
    tp.add_argument("--actors", type=int, default=2, help="actor processes")
    tp.add_argument("--envs-per-actor", type=int, default=32, help="envs each actor steps")
    tp.add_argument("--seconds", type=float, default=10.0, help="measurement window per phase")
    tp.add_argument("--warmup-seconds", type=float, default=3.0, help="seconds run before measuring")
    tp.add_argument("--no-train", action="store_true", help="serve inference only (no learner updates)")
    tp.add_argument("--rtt-ms", type=float, default=None,
                    help="run the actors over loopback TCP through a proxy that adds this round trip "
                    "(0: the same path, no delay; default: a unix socket, as seedq train)")
    tp.add_argument("--actor-groups", type=int, default=None,
                    help="env groups per actor (default: the actors choose; actor_groups)")
    tp.add_argument("--json", action="store_true", help="print one JSON object")
    _add_learner_flags(tp)


def _add_learner_flags(parser) -> None:
    """The learner's sections a serving bench takes: devices, server and the
    agent's (these pass through on top of the env's defaults, as `seedq train`)."""
    add_config_flags(parser, config_lib.DevicesConfig, "devices.")
    add_config_flags(parser, config_lib.ServerConfig, "server.")
    parser.add_argument("--agent", choices=config_lib.AGENTS, default=None, help="the agent that trains")
    add_config_flags(parser, config_lib.VTraceConfig, "vtrace.")
    add_config_flags(parser, config_lib.R2D2Config, "r2d2.")


def _add_ingress(bench_sub) -> None:
    ingress = bench_sub.add_parser(
        "ingress",
        help="what one learner takes in: load-generator streams replaying recorded env steps to a real "
        "learner; frames and messages/s, round trips, fairness, the learner's CPU per frame (network "
        "compute vs the rest) and memory per env slot",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ingress.add_argument("--env", default="CartPole-v1", help="the env whose recorded steps are replayed")
    ingress.add_argument("--streams", type=int, default=16, help="actor streams (one connection each)")
    ingress.add_argument("--envs-per-stream", type=int, default=16, help="envs each stream carries")
    ingress.add_argument("--seconds", type=float, default=10.0, help="measurement window")
    ingress.add_argument("--warmup-seconds", type=float, default=3.0,
                         help="seconds served after every stream connected, before measuring")
    ingress.add_argument("--no-train", action="store_true", help="serve inference only (no learner updates)")
    ingress.add_argument("--rtt-ms", type=float, default=0.0,
                         help="round trip added by a delaying TCP proxy between generators and learner")
    ingress.add_argument("--generators", type=int, default=2, help="load-generator processes sharing the streams")
    ingress.add_argument("--frames-per-second", type=float, default=0.0,
                         help="offered load over all streams, each stream sending at its share (one message in "
                         "flight); 0: as fast as the learner answers")
    ingress.add_argument("--transport", choices=("tcp", "unix"), default="tcp",
                         help="tcp: 127.0.0.1 loopback; unix: a unix socket")
    ingress.add_argument("--json", action="store_true", help="print one JSON object")
    _add_learner_flags(ingress)


def _add_learner(bench_sub) -> None:
    learner = bench_sub.add_parser(
        "learner",
        help="what the learner alone can train on (train steps/s, env frames/s, MACs per frame) and "
        "what its inference can answer, for an env and agent config resolved as `seedq train` does",
        formatter_class=HelpFormatter,
    )
    add_config_flags(learner)
    learner.add_argument("--seconds", type=float, default=5.0, help="timing budget of each measurement")
    learner.add_argument("--json", action="store_true", help="print one JSON object")


def _add_device(bench_sub) -> None:
    device = bench_sub.add_parser(
        "device",
        help="a bounded check of this machine for Atari: JAX's devices, the inference bench, bench "
        "learner, Pong throughput with actors on every CPU core, Pong training for the time left",
        description="Runs each stage as a seedq subprocess within its share of --minutes (the whole "
        "command's bound) and writes OUT/device.json and OUT/summary.md. Installs nothing "
        "(docs/devices.md gives the install line for a GPU or TPU VM).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    device.add_argument("--minutes", type=float, default=20.0, help="bound on the whole command")
    device.add_argument("--out", required=True, help="output directory")


def _add_stuck(bench_sub) -> None:
    stuck = bench_sub.add_parser(
        "stuck",
        help="a healthy actor's round trip with and without stuck (and slow) actors, in one run",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    stuck.add_argument("--env", default="CartPole-v1", help="the env the actors step")
    stuck.add_argument("--actors", type=int, default=1, help="healthy actor processes")
    stuck.add_argument("--envs-per-actor", type=int, default=32, help="envs each actor steps")
    stuck.add_argument("--stuck-actors", type=int, default=1,
                       help="streams that send one step and then hold their stream silently")
    stuck.add_argument("--slow-actors", type=int, default=0,
                       help="streams that send one step a second (a third phase when > 0)")
    stuck.add_argument("--seconds", type=float, default=10.0, help="measurement window per phase")
    stuck.add_argument("--warmup-seconds", type=float, default=2.0, help="seconds run before measuring")
    stuck.add_argument("--rounds", type=int, default=2, help="alternating rounds of the phases")
    stuck.add_argument("--no-train", action="store_true", help="serve inference only (no learner updates)")
    stuck.add_argument("--json", action="store_true", help="print one JSON object")


def _add_soak(bench_sub) -> None:
    soak = bench_sub.add_parser(
        "soak",
        help="train under a stream of faults (actor SIGKILLs, one learner SIGKILL + resume) "
        "with real learner and actor processes; reports stalls, memory, orphans, lost frames",
        description="Runs a real `seedq learner` and --actors `seedq actor` processes for --seconds "
        "(counted from the first train step; no stop at the target) while SIGKILLing a random "
        "connected actor every --kill-every seconds (a new actor process replaces it) and, with "
        "--kill-learner-at, the learner once (restarted with --resume; the actors reconnect by "
        "themselves). Prints actor_kills, max_stall_seconds, rss_growth_fraction, "
        "orphan_env_entries, frames_dropped, reached_target, counters_monotonic, ... "
        "(docs/reliability.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    soak.add_argument("--env", default="CartPole-v1", help="the env the run trains on")
    soak.add_argument("--agent", choices=config_lib.AGENTS, default="vtrace", help="the agent that trains")
    soak.add_argument("--seconds", type=float, default=300.0, help="soak duration after the first train step")
    soak.add_argument("--kill-every", type=float, default=3.0,
                      help="SIGKILL a random connected actor every this many seconds (0: never)")
    soak.add_argument("--actors", type=int, default=2, help="actor processes")
    soak.add_argument("--envs-per-actor", type=int, default=32, help="envs each actor steps")
    soak.add_argument("--kill-learner-at", type=float, default=None,
                      help="SIGKILL the learner once this many seconds into the soak (once it has a "
                      "checkpoint) and resume it (default: never)")
    soak.add_argument("--checkpoint-every-seconds", type=float, default=30.0,
                      help="the learner's checkpoint interval")
    soak.add_argument("--target-return", type=float, default=475.0,
                      help="reached_target: the 100-episode mean reached this at some time")
    soak.add_argument("--transport", choices=("tcp", "unix"), default="tcp",
                      help="tcp: 127.0.0.1 loopback; unix: a socket in the work directory")
    soak.add_argument("--seed", type=int, default=0, help="the learner's seed and the chaos loop's choices")
    soak.add_argument("--learner-args", default="",
                      help="more `seedq learner` flags, one string (e.g. '--r2d2.checkpoint-replay false')")
    soak.add_argument("--workdir", default="",
                      help="keep the run directory and every process log here (default: a temporary "
                      "directory, removed unless the soak fails)")
    soak.add_argument("--json", action="store_true", help="print one JSON object")


def _add_suite(bench_sub) -> None:
    suite = bench_sub.add_parser(
        "suite",
        help="the defaults trained on a list of envs x seeds (fresh processes, frame budgets, no "
        "target) and scored against published returns: results.csv, curves.csv, summary.md, plots",
        description="Trains every env x seed in a fresh `seedq train` process given only the env id, "
        "its frame budget (the suite's table in seedq/bench/references.py), the seed, no target and "
        "no time limit; every other config flag given here (e.g. --precision int8, --architecture "
        "impala) passes through to every run. Measures the random policy's return per env and writes "
        "OUT/results.csv, OUT/curves.csv, OUT/summary.md (against the references, normalised "
        "(return - random) / (reference - random)) and one PNG per env, updated as each run finishes. "
        "A rerun skips finished runs and continues unfinished ones from their checkpoint; a larger "
        "--max-frames extends them; any other change is refused (use a new --out). "
        "Each running run prints a progress line a minute (frames, mean return, frames/s, time left).",
        formatter_class=HelpFormatter,
    )
    add_config_flags(suite)
    suite.add_argument("--envs", type=csv_of(str), default=None,
                       help="comma-separated env ids (default: the suite's table but Pong, and "
                            "LunarLander unless Box2D is installed)")
    suite.add_argument("--seeds", type=int, default=3, help="runs per env (seeds SEED, SEED+1, ...)")
    suite.add_argument("--out", required=True, help="output directory")
    suite.add_argument("--frames-scale", type=float, default=1.0,
                       help="multiplies every env's frame budget (--max-frames replaces them)")
    suite.add_argument("--jobs", type=int, default=1,
                       help="runs trained at once, each a fresh process with its own actors (default 1: one "
                            "after another; on a machine with spare cores, several)")
    suite.add_argument("--random-episodes", type=int, default=100,
                       help="episodes of the random policy measured per env")


def _add_inference(bench_sub) -> None:
    inf = bench_sub.add_parser(
        "inference",
        help="jitted policy inference in fp32/bf16/int8 side by side: throughput and error vs fp32",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    inf.add_argument("--net", type=csv_of(str), default="mlp,nature_cnn,impala_cnn",
                     help="networks, each its agent's own: mlp, nature_cnn, impala_cnn (V-trace), "
                          "r2d2_mlp, r2d2_nature_cnn (R2D2's recurrent Q-network)")
    inf.add_argument("--precision", type=csv_of(str), default="fp32,bf16,int8",
                     help="inference precisions timed side by side (fp32 is always included: the reference)")
    inf.add_argument("--batch", type=csv_of(int), default="1,16,64,256", help="batch sizes (states per call)")
    inf.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds per case")
    inf.add_argument("--seconds-per-case", type=float, default=1.5,
                     help="timing budget per (net, batch), shared by the precisions")
    inf.add_argument("--frames", choices=("atari", "random"), default="atari",
                     help="CNN inputs: real Atari frames (ALE Pong, random play) or uniform noise")
    inf.add_argument("--eval-states", type=int, default=512, help="states for the error metrics")
    inf.add_argument("--mlp-hidden", type=csv_of(int), default="256,256,256", help="hidden sizes of the mlp net")
    inf.add_argument("--mlp-input", type=int, default=64, help="observation size of the mlp net")
    inf.add_argument("--num-actions", type=int, default=6, help="policy head size")
    inf.add_argument("--seed", type=int, default=0, help="parameter initialisation and data seed")
    inf.add_argument("--quant.force-int8", dest="force_int8", action="store_true",
                     help="int8 in every quantizable layer instead of the measured per-layer plan")
    inf.add_argument("--profile", action="store_true", help="add per-layer timings (fp32 vs int8 per layer)")
    inf.add_argument("--profile-batch", type=csv_of(int), default="64", help="batch sizes of the per-layer profile")
    inf.add_argument(
        "--policy-run", default="",
        help="also report bf16/int8 greedy-action agreement for the trained V-trace or R2D2 policy in "
             "this run directory (states from rolling it out); with --net '' only that",
    )
    inf.add_argument("--json", action="store_true", help="print one JSON object")


def _inference(args) -> int:
    from seedq.process import jax_setup
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


def _soak(args) -> int:
    import shlex

    from seedq.bench import soak

    config = soak.SoakConfig(
        env=args.env, agent=args.agent, seconds=args.seconds, kill_every=args.kill_every,
        actors=args.actors, envs_per_actor=args.envs_per_actor, kill_learner_at=args.kill_learner_at,
        checkpoint_every_seconds=args.checkpoint_every_seconds, target_return=args.target_return,
        transport=args.transport, seed=args.seed, learner_args=tuple(shlex.split(args.learner_args)),
    )
    log = None if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        result = soak.run(config, workdir=args.workdir or None, log=log)
    except (ValueError, soak.SoakError) as e:
        print(f"seedq bench soak: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>36}: {value}")
    return 0


def _suite(args: argparse.Namespace) -> int:
    from seedq.bench import compare, references, suite

    try:
        if args.env is not None:
            raise ValueError("--env: the suite takes --envs (a comma-separated list)")
        if args.frames_scale <= 0 or args.random_episodes <= 0:
            raise ValueError("--frames-scale and --random-episodes must be > 0")

        def base_for(env_id: str) -> TrainConfig:
            return config_from_args(args, base=default_config(env_id))

        envs = args.envs
        if not envs:
            box2d = importlib.util.find_spec("Box2D") is not None
            envs = references.default_envs(box2d)
            if not box2d:
                print("seedq bench suite: LunarLander-v3 left out (Box2D is not installed: "
                      "pip install 'seedq[box2d]')", flush=True)
        result = suite.run(
            base_for, list(envs), args.seeds, args.out,
            max_frames=args.max_frames or 0, frames_scale=args.frames_scale,
            random_episodes=args.random_episodes, jobs=args.jobs, log=lambda line: print(line, flush=True),
        )
    except compare.Stopped as e:
        results = os.path.join(args.out, "results.csv")
        finished = f"the runs finished before it are in {results} and " if os.path.exists(results) else ""
        print(f"seedq bench suite: {e}; {finished}the same command resumes the suite", file=sys.stderr)
        return 128 + e.signum
    except (ValueError, RuntimeError, OSError) as e:
        print(f"seedq bench suite: {e}", file=sys.stderr)
        return 1
    print(result["table"])
    print("plots: " + ", ".join(result["plots"]))
    return 0


def _stuck(args: argparse.Namespace) -> int:
    from seedq.bench import stuck

    try:
        result = stuck.run(
            env_id=args.env, num_actors=args.actors, envs_per_actor=args.envs_per_actor,
            stuck_actors=args.stuck_actors, slow_actors=args.slow_actors, seconds=args.seconds,
            warmup_seconds=args.warmup_seconds, rounds=args.rounds, train=not args.no_train,
        )
    except (ValueError, RuntimeError) as e:
        print(f"seedq bench stuck: {e}", file=sys.stderr)
        return 1
    return _print_result(result, args.json)


def _throughput(args: argparse.Namespace) -> int:
    from seedq.bench import throughput

    try:
        base = _agent_config(args)
        result = throughput.run(
            env_id=args.env,
            num_actors=args.actors,
            envs_per_actor=args.envs_per_actor,
            seconds=args.seconds,
            warmup_seconds=args.warmup_seconds,
            train=not args.no_train,
            devices=config_from_args(args, config_lib.DevicesConfig, "devices.", base.devices),
            server=config_from_args(args, config_lib.ServerConfig, "server.", base.server),
            base=base,
            rtt_ms=args.rtt_ms,
            actor_groups=args.actor_groups,
        )
    except (ValueError, RuntimeError) as e:
        print(f"seedq bench throughput: {e}", file=sys.stderr)
        return 1
    return _print_result(result, args.json)


def _ingress(args: argparse.Namespace) -> int:
    from seedq.bench import ingress

    try:
        base = _agent_config(args)
        load = ingress.IngressLoad(
            env_id=args.env, streams=args.streams, envs_per_stream=args.envs_per_stream,
            seconds=args.seconds, warmup_seconds=args.warmup_seconds, train=not args.no_train,
            rtt_ms=args.rtt_ms, generators=args.generators, transport=args.transport,
            frames_per_second=args.frames_per_second,
        )
        load.validate()
        result = ingress.run(
            load, base=base,
            server=config_from_args(args, config_lib.ServerConfig, "server.", base.server),
            devices=config_from_args(args, config_lib.DevicesConfig, "devices.", base.devices),
        )
    except ValueError as e:
        print(f"seedq bench ingress: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"seedq bench ingress: {e}", file=sys.stderr)
        return 1
    return _print_result(result, args.json)


def _agent_config(args) -> TrainConfig:
    """The env's defaults with the --agent, --vtrace.* and --r2d2.* flags given applied."""
    import dataclasses

    base = default_config(args.env)
    return dataclasses.replace(
        base, agent=args.agent or base.agent,
        vtrace=config_from_args(args, config_lib.VTraceConfig, "vtrace.", base.vtrace),
        r2d2=config_from_args(args, config_lib.R2D2Config, "r2d2.", base.r2d2),
    )


def _learner(args) -> int:
    from seedq.bench import learner

    try:
        config = config_from_args(args, base=default_config(args.env or TrainConfig.env))
        config.validate()
        result = learner.run(config, seconds=args.seconds)
    except ValueError as e:
        print(f"seedq bench learner: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result) if args.json else learner.format_table(result))
    return 0


def _device(args) -> int:
    from seedq.bench import device

    try:
        report = device.run(args.minutes, args.out)
    except (ValueError, OSError) as e:
        print(f"seedq bench device: {e}", file=sys.stderr)
        return 1
    print(device.summary_markdown(report), end="")
    return 0


def _print_result(result: dict, as_json: bool) -> int:
    if as_json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>32}: {value}")
    return 0


_RUNS = {
    "inference": _inference, "soak": _soak, "suite": _suite, "stuck": _stuck, "throughput": _throughput,
    "ingress": _ingress,
    "learner": _learner, "device": _device,
}


def run(args: argparse.Namespace) -> int:
    return _RUNS[args.bench](args)
