"""Local single-host mode: `seedq train` = this learner + N actor processes.

The actors are separate OS processes (as on a real cluster) talking to the
learner over a unix-domain socket. They are started first, so their Python
start-up overlaps the learner's JAX start-up; they retry until it listens.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

from seedq import config as config_lib
from seedq.cli import config_flags
from seedq.config import TrainConfig
from seedq.envs import env_spec
from seedq.learner import checkpoint
from seedq.learner.learner import Learner, make_agent
from seedq.learner.reporting import RunReporter

log = logging.getLogger("seedq.local")


def actor_command(
    address: str, config: TrainConfig, index: int, stats_file: str | None = None,
    stats_skip_seconds: float = 0.0,
) -> list[str]:
    # IMPALA mode runs actors with a local policy copy; SEED actors hold no model.
    command = "impala-actor" if config.architecture == "impala" else "actor"
    cmd = [
        sys.executable, "-m", "seedq.cli", command,
        "--server", address,
        "--env", config.env,
        "--num-envs", str(config.envs_per_actor),
        "--actor-id", f"local-{index}",
        "--seed", str(config.seed * 1000 + index),
        # Local actors die with their learner rather than waiting for a new one
        # (at once where the OS tells them, else after 30 s without it); a
        # resumed local run starts actors of its own.
        "--retry-max-seconds", "30",
        "--parent-pid", str(os.getpid()),
    ]
    # Preprocessing runs in the actor and must match the learner's spec: pass
    # every --atari.* / --dmc.* option that differs from the defaults.
    cmd += config_flags(config.env_options, config_lib.EnvOptions)
    if stats_file:
        cmd += ["--stats-file", stats_file, "--stats-skip-seconds", str(stats_skip_seconds)]
    return cmd


def spawn_actors(
    address: str, config: TrainConfig, stats_dir: str | None = None, stats_skip_seconds: float = 0.0
) -> list[subprocess.Popen]:
    """Starts `config.num_actors` actor processes; with `stats_dir`, each writes actor-<i>.json."""
    procs = []
    for i in range(config.num_actors):
        stats = os.path.join(stats_dir, f"actor-{i}.json") if stats_dir else None
        procs.append(subprocess.Popen(actor_command(address, config, i, stats, stats_skip_seconds)))
    return procs


def stop_actors(procs: list[subprocess.Popen], timeout: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def default_address() -> str:
    # Unix socket paths are limited to ~108 bytes, so not inside the run dir.
    return f"unix:{tempfile.gettempdir()}/seedq-{os.getpid()}-{uuid.uuid4().hex[:8]}.sock"


def train(
    config: TrainConfig, *, quiet: bool = False, started: float | None = None, with_actors: bool = True,
    resume: str | None = None,
) -> dict:
    """Runs a training run; returns the summary written to summary.json.

    With `with_actors`, `config.num_actors` actor processes are started on
    this host (local mode); without, the learner serves whichever actors
    connect to `config.address` (`seedq learner`, the multi-machine path).
    `started` (time.monotonic()) is when the command started; seconds-to-target
    and wall time count from it. `resume` (a run directory, a checkpoint) continues
    from that checkpoint; `config.logdir` should then be the run's directory.
    """
    started = time.monotonic() if started is None else started
    config = config.resolved()
    config.validate()
    # A bad env id, an observation or action space the agent cannot take, fail
    # here (one line), before any process starts.
    agent = make_agent(config, env_spec(config.env, config.env_options))
    if resume is not None:
        # A missing or incompatible checkpoint fails here, before any process starts.
        import jax

        checkpoint.check_compatible(
            resume,
            jax.eval_shape(agent.init, jax.ShapeDtypeStruct((2,), jax.numpy.uint32)),
            jax.eval_shape(lambda: jax.random.PRNGKey(0)),
            env=config.env,
        )
    os.makedirs(config.logdir, exist_ok=True)
    address = config.address or default_address()

    # Each local actor writes its time split and byte counts to <logdir>/actors/ at exit.
    stats_dir = os.path.join(config.logdir, "actors")
    if with_actors:
        os.makedirs(stats_dir, exist_ok=True)
    actors = spawn_actors(address, config, stats_dir) if with_actors else []
    learner = None
    reporter = None
    stop_reason = "error"
    try:
        learner = Learner(config, address)
        resumed = resumed_from = None
        if resume is not None:
            resumed, resumed_from = checkpoint.restore(
                resume, learner.state, learner.inference.rng, env=config.env
            )
            learner.restore(resumed)
            if not quiet:
                c = resumed.counters
                print(
                    f"resuming from {resumed_from}: train step {c['train_steps']:,}, "
                    f"{c['frames']:,} frames, {c['episodes']:,} episodes, "
                    f"{c['elapsed_seconds']:.1f}s so far",
                    flush=True,
                )
        # Saved once the config is known to fit (a bad --resume override leaves it alone).
        config_lib.save(config, os.path.join(config.logdir, "config.json"))
        address = learner.start()
        if not with_actors and not quiet:
            print(f"learner listening on {address}", flush=True)
        reporter = RunReporter(
            config, learner, started, quiet=quiet, resumed=resumed, resumed_from=resumed_from
        )
        stop_reason = reporter.run_until_done(actors)
    except KeyboardInterrupt:
        stop_reason = "interrupted"
        if not quiet:
            print("\ninterrupted: stopping actors and saving what was collected", flush=True)
    finally:
        if reporter is not None and stop_reason == "error":
            reporter.close_display()
        stop_actors(actors)
        if learner is not None:
            learner.stop()
        if address.startswith("unix:") and os.path.exists(address[5:]):
            os.unlink(address[5:])
    summary = reporter.finish(stop_reason) if reporter is not None else None
    if summary is None:
        raise RuntimeError("the learner failed to start; see the log above")
    return summary


def read_summary(logdir: str) -> dict:
    with open(os.path.join(logdir, "summary.json")) as f:
        return json.load(f)
