"""`seedq train | learner | actor | eval | certs | bench` command line.

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
import importlib.util
import json
import os
import signal
import sys

from seedq import config as config_lib
from seedq.config import TrainConfig
from seedq.flags import add_config_flags, config_from_args, env_defaults


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


def subcommands(parser: argparse.ArgumentParser, prefix: str):
    """(command line, parser) for every (nested) subcommand, depth first."""
    for action in parser._actions:  # argparse has no public walk over subparsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                line = f"{prefix} {name}"
                yield line, sub
                yield from subcommands(sub, line)


def _unknown_arguments_message(parser: argparse.ArgumentParser, args, extras: list[str]) -> str:
    """One line: the unknown arguments, close matches, and the valid options."""
    import difflib

    prog, target = parser.prog, parser
    for line, sub in subcommands(parser, parser.prog):
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


def _default_config(env: str | None) -> TrainConfig:
    return env_defaults(env or TrainConfig.env)


def _saved_config(run_dir: str, flag: str) -> TrainConfig:
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


def run_config(args: argparse.Namespace) -> tuple[TrainConfig, str | None]:
    """The config of `seedq train|learner` and the run directory to resume (None: a fresh run).

    Layers, later ones winning: the defaults for the env (or, resuming, the
    run's saved config.json), the `--config` file, the flags given. `--resume
    auto` resumes the run directory (`--logdir`, or the file's `logdir`) when it
    holds a checkpoint and starts a fresh run in it otherwise.
    """
    import os

    data = config_lib.read_json(args.config) if getattr(args, "config", None) else {}

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

        resume = run_dir if checkpoint.has_checkpoint(run_dir) else None
        if resume is None:
            args.logdir = run_dir  # a fresh run, in that directory
    if resume is None:
        base = with_file(_default_config(args.env or data.get("env")))
        config = config_from_args(args, base=base)
        if config.distributed.explicit and not config.logdir:
            # (A default run directory is named by time and pid: one per process.)
            raise ValueError("--distributed.coordinator needs --logdir: the learner group shares one run directory")
        return config.resolved(), None
    if args.logdir is not None and os.path.abspath(args.logdir) != os.path.abspath(resume):
        raise ValueError("--logdir cannot be combined with --resume: the run continues in its own directory")
    base = with_file(_saved_config(resume, "--resume"))
    return dataclasses.replace(config_from_args(args, base=base), logdir=resume), resume


def _add_run_command(sub, name: str, *, summary: str, description: str, resume_note: str = ""):
    """A command that runs a learner: every config flag plus --resume."""
    parser = sub.add_parser(name, help=summary, description=description, formatter_class=_HelpFormatter)
    add_config_flags(parser)
    parser.add_argument(
        "--config", metavar="RUN.json", default=None,
        help="start from this run config (a run's config.json, or a JSON object of some fields "
        "written by hand; unknown fields are errors); flags given here override it",
    )
    parser.add_argument(
        "--resume", metavar="RUN_DIR|auto", default=None,
        help="continue the run in RUN_DIR from its newest checkpoint, with its saved config "
        "(flags given here override it)" + resume_note + "; `auto`: resume the --logdir run if it "
        "has a checkpoint, else start a fresh run there (restarted pods and VMs)",
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
    actor.add_argument("--seed", type=int, default=0, help="base seed of the env vector's episodes")
    actor.add_argument(
        "--seed-from-actor-id", action="store_true",
        help="combine --seed with a hash of --actor-id, so replicas started with one command line "
        "(a Deployment's pods, a VM template's units) step different episodes",
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
    actor.add_argument("--verbose", action="store_true")
    actor.add_argument("--print-config", action="store_true",
                       help="print the resolved arguments as JSON and exit (starts nothing)")
    # TLS, token and keepalive of the channel to the learner (docs/security.md).
    add_config_flags(actor, config_lib.ActorChannelConfig)
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
    train.add_argument(
        "--parent-pid", type=int, default=0,
        help="stop cleanly (checkpoint and exit) when this process dies, even by SIGKILL: "
        "for tools that start training runs, as `seedq bench suite` and `seedq compare` do; Linux only",
    )

    learner = _add_run_command(
        sub, "learner",
        summary="run only the learner; actors started elsewhere (`seedq actor`) connect to --address",
        description="Run only the learner; actors started elsewhere (`seedq actor`) connect to "
        "--address. With --min-actors N training waits for N actors.",
        resume_note="; running actors reconnect by themselves",
    )
    learner.add_argument("--quiet", action="store_true", help="no progress lines")
    learner.add_argument("--print-config", action="store_true",
                         help="print the resolved config as JSON and exit (starts nothing)")

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

    certs = sub.add_parser(
        "certs",
        help="make a CA plus learner (server) and actor (client) certificates and a token for a cluster",
        description="Writes OUT/ca.pem, ca-key.pem, server.pem, server-key.pem, client.pem, "
        "client-key.pem and token (keys and token mode 0600). The learner takes --tls.cert "
        "server.pem --tls.key server-key.pem [--tls.client-ca ca.pem] --auth.token-file token; "
        "actors take --tls.ca ca.pem [--tls.cert client.pem --tls.key client-key.pem] "
        "--auth.token-file token. See docs/security.md.",
        formatter_class=_HelpFormatter,
    )
    certs.add_argument("--out", required=True, help="output directory")
    certs.add_argument("--hosts", type=_csv(str), default=",".join(("localhost", "127.0.0.1", "::1")),
                       help="names and IP addresses actors dial the learner by (the server "
                       "certificate's subject alternative names)")
    certs.add_argument("--days", type=int, default=365, help="validity of the certificates")

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

    _add_launch_commands(sub)

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
    add_config_flags(tp, config_lib.DevicesConfig, "devices.")
    add_config_flags(tp, config_lib.ServerConfig, "server.")
    stuck = bench_sub.add_parser(
        "stuck",
        help="a healthy actor's round trip with and without stuck (and slow) actors, in one run",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    stuck.add_argument("--env", default="CartPole-v1")
    stuck.add_argument("--actors", type=int, default=1, help="healthy actor processes")
    stuck.add_argument("--envs-per-actor", type=int, default=32)
    stuck.add_argument("--stuck-actors", type=int, default=1,
                       help="streams that send one step and then hold their stream silently")
    stuck.add_argument("--slow-actors", type=int, default=0,
                       help="streams that send one step a second (a third phase when > 0)")
    stuck.add_argument("--seconds", type=float, default=10.0, help="measurement window per phase")
    stuck.add_argument("--warmup-seconds", type=float, default=2.0)
    stuck.add_argument("--rounds", type=int, default=2, help="alternating rounds of the phases")
    stuck.add_argument("--no-train", action="store_true", help="serve inference only (no learner updates)")
    stuck.add_argument("--json", action="store_true", help="print one JSON object")
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
    soak.add_argument("--env", default="CartPole-v1")
    soak.add_argument("--agent", choices=config_lib.AGENTS, default="vtrace")
    soak.add_argument("--seconds", type=float, default=300.0, help="soak duration after the first train step")
    soak.add_argument("--kill-every", type=float, default=3.0,
                      help="SIGKILL a random connected actor every this many seconds (0: never)")
    soak.add_argument("--actors", type=int, default=2)
    soak.add_argument("--envs-per-actor", type=int, default=32)
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
        "A rerun skips finished runs and continues unfinished ones from their checkpoint (same config only).",
        formatter_class=_HelpFormatter,
    )
    add_config_flags(suite)
    suite.add_argument("--envs", type=_csv(str), default=None,
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
    inf = bench_sub.add_parser(
        "inference",
        help="jitted policy inference in fp32/bf16/int8 side by side: throughput and error vs fp32",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    inf.add_argument("--net", type=_csv(str), default="mlp,nature_cnn,impala_cnn",
                     help="networks, each its agent's own: mlp, nature_cnn, impala_cnn (V-trace), "
                          "r2d2_mlp, r2d2_nature_cnn (R2D2's recurrent Q-network)")
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
        help="also report bf16/int8 greedy-action agreement for the trained V-trace or R2D2 policy in "
             "this run directory (states from rolling it out); with --net '' only that",
    )
    inf.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _add_launch_commands(sub) -> None:
    """`seedq launch k8s | tpu-vm | gpu-vm`: every training flag plus the launcher's own."""
    from seedq.launch.options import K8sOptions, VmOptions

    launch = sub.add_parser("launch", help="run on Kubernetes or on cloud TPU/GPU VMs (launch/README.md)")
    launch_sub = launch.add_subparsers(dest="launch", required=True)
    k8s = launch_sub.add_parser(
        "k8s", help="print Kubernetes manifests for a run (learner Indexed Job, actor Deployments, ...)",
        description="Print Kubernetes manifests (multi-document YAML) for a run: the run config as a "
        "ConfigMap, the learner as an Indexed Job with a headless Service, the actors as "
        "Deployments, the run directory on a PersistentVolumeClaim; Secrets are referenced by name.",
        formatter_class=_HelpFormatter,
    )
    add_config_flags(k8s, K8sOptions)
    vms = []
    for kind, what in (("tpu-vm", "a Cloud TPU VM (queued resource)"), ("gpu-vm", "a GPU VM")):
        vm = launch_sub.add_parser(
            kind, help=f"the gcloud commands that run the learner on {what} and actors on a managed "
            "instance group (--dry-run prints them)",
            description=f"Create {what}, install seedq, start the learner, create a managed instance "
            "group of CPU actor VMs; --down deletes it all. Without --dry-run the commands run, "
            "stopping at the first failure.",
            formatter_class=_HelpFormatter,
        )
        add_config_flags(vm, VmOptions)
        vm.add_argument("--dry-run", action="store_true", help="print the commands (a shell script) instead")
        vm.add_argument("--down", action="store_true", help="the teardown commands instead")
        vms.append(vm)
    for parser in (k8s, *vms):
        add_config_flags(parser)
        parser.add_argument("--config", metavar="RUN.json", default=None,
                            help="start from this run config; flags given here override it")


def _launch_config(args: argparse.Namespace) -> TrainConfig:
    """The run config of a launch: env defaults, then --config, then the flags (no timestamped logdir)."""
    data = config_lib.read_json(args.config) if args.config else {}
    try:
        base = config_lib.updated(_default_config(args.env or data.get("env")), data)
    except ValueError as e:
        raise ValueError(f"--config {args.config}: {e}") from None
    return config_from_args(args, base=base)


def _launch(args: argparse.Namespace) -> int:
    from seedq.launch.options import K8sOptions, VmOptions

    prog = f"seedq launch {args.launch}"
    try:
        config = _launch_config(args)
        if args.launch == "k8s":
            from seedq.launch import k8s

            given = [name for name in k8s.RENDER_OWNED if getattr(args, name, None) is not None]
            if given:
                raise ValueError(
                    f"--{given[0].replace('_', '-')} is set by the render (the learner serves "
                    "0.0.0.0:--port; credentials come from the Secrets named by --tls-mode, "
                    "--learner-tls-secret, --actor-tls-secret, --token-secret)"
                )
            sys.stdout.write(k8s.render(config, config_from_args(args, K8sOptions)))
            return 0
        from seedq.launch import gcloud

        opts = config_from_args(args, VmOptions)
        kind = "tpu" if args.launch == "tpu-vm" else "gpu"
        if args.down:
            steps = gcloud.teardown_plan(config, opts, kind)
        else:
            steps = (gcloud.tpu_vm_plan if kind == "tpu" else gcloud.gpu_vm_plan)(config, opts)
    except (ValueError, OSError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        sys.stdout.write(gcloud.to_shell(steps))
        return 0
    code = gcloud.run_plan(steps, log=lambda line: print(f"{prog}: {line}", file=sys.stderr, flush=True))
    return code


def _print_actor_config(args: argparse.Namespace) -> int:
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


def _bench_soak(args) -> int:
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


def _bench_suite(args: argparse.Namespace) -> int:
    from seedq.bench import compare, references, suite

    try:
        if args.env is not None:
            raise ValueError("--env: the suite takes --envs (a comma-separated list)")
        if args.frames_scale <= 0 or args.random_episodes <= 0:
            raise ValueError("--frames-scale and --random-episodes must be > 0")

        def base_for(env_id: str) -> TrainConfig:
            return config_from_args(args, base=env_defaults(env_id))

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


def _compare(args: argparse.Namespace) -> int:
    from seedq.bench import compare

    try:
        if args.plot_only:
            result = compare.report(args.out)
        else:
            if args.seeds <= 0:
                raise ValueError(f"--seeds {args.seeds}: must be > 0")
            base = config_from_args(args, base=_default_config(args.env))
            base.validate()
            result = compare.run(
                base, compare.parse_configs(args.configs), args.seeds, args.out,
                watts_per_core=args.watts_per_core, grams_co2_per_kwh=args.grams_co2_per_kwh,
                log=lambda line: print(line, flush=True),
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        print(_unknown_arguments_message(parser, args, extras), file=sys.stderr)
        return 2
    if args.command in ("actor", "impala-actor") and args.print_config:
        return _print_actor_config(args)
    if args.command == "launch":
        return _launch(args)
    if args.command in ("actor", "impala-actor"):
        from seedq import grpc_setup

        grpc_setup.quiet_core_logs()  # before the actor modules import grpc
    if args.command == "actor":
        from seedq.actor import seed_actor

        return seed_actor.main(args)
    if args.command == "impala-actor":
        from seedq.impala import actor as impala_actor

        return impala_actor.main(args)

    if args.command == "eval":
        return _eval(args)

    if args.command in ("train", "learner"):
        try:
            config, resume = run_config(args)
            config.validate()
        except (FileNotFoundError, OSError) as e:
            print(f"seedq {args.command}: {e.args[0] if isinstance(e, FileNotFoundError) else e}",
                  file=sys.stderr)
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
        from seedq import distributed

        if getattr(args, "parent_pid", 0) and not distributed.is_supervised_child():
            # The process `--parent-pid` started: a supervisor passes the SIGTERM on to its child.
            from seedq import lifetime

            lifetime.die_with_parent(args.parent_pid, signal.SIGTERM)
        if distributed.needs_supervisor(config.distributed):
            # A group's learner runs as a child: its lost-peer abort becomes one line.
            group = config.distributed
            address = config.address
            return distributed.supervise(
                list(sys.argv[1:] if argv is None else argv),
                group.process_id if group.explicit else None, group.num_processes or None,
                socket_path=address[5:] if address.startswith("unix:") else "",
            )
        distributed.die_with_supervisor()
        from seedq import local

        try:
            summary = local.train(
                config, quiet=args.quiet, started=COMMAND_STARTED,
                with_actors=args.command == "train", resume=resume,
            )
        except (ValueError, OSError) as e:
            print(f"seedq {args.command}: {e}", file=sys.stderr)
            return 1
        except distributed.PeerLost as e:  # a group member stopped answering
            print(f"seedq {args.command}: {e}", file=sys.stderr)
            return distributed.DEAD_PEER_EXIT_CODE
        # SIGTERM (stop_reason "terminated") is a clean stop: checkpointed, exit 0.
        return {"actors_exited": 1, "interrupted": 130}.get(summary["stop_reason"], 0)

    if args.command == "certs":
        from seedq import certs as certs_lib

        try:
            paths = certs_lib.make(args.out, args.hosts, args.days)
        except (ValueError, OSError) as e:
            print(f"seedq certs: {e}", file=sys.stderr)
            return 1
        print(f"wrote {', '.join(sorted(paths))} to {args.out}")
        return 0

    if args.command == "compare":
        return _compare(args)

    if args.command == "bench":
        if args.bench == "inference":
            return _bench_inference(args)
        if args.bench == "soak":
            return _bench_soak(args)
        if args.bench == "suite":
            return _bench_suite(args)
        if args.bench == "stuck":
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
        else:
            from seedq.bench import throughput

            try:
                result = throughput.run(
                    env_id=args.env,
                    num_actors=args.actors,
                    envs_per_actor=args.envs_per_actor,
                    seconds=args.seconds,
                    warmup_seconds=args.warmup_seconds,
                    train=not args.no_train,
                    devices=config_from_args(args, config_lib.DevicesConfig, "devices."),
                    server=config_from_args(args, config_lib.ServerConfig, "server."),
                )
            except (ValueError, RuntimeError) as e:
                print(f"seedq bench throughput: {e}", file=sys.stderr)
                return 1
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
