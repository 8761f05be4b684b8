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
import threading
import time
import uuid

from seedq import distributed, run_dirs
from seedq.transport import channel
from seedq import config as config_lib
from seedq.flags import config_flags
from seedq.config import TrainConfig
from seedq.process.exit_codes import UsageError
from seedq import checkpoint
from seedq.run_setup import PreparedRun, prepare
from seedq.agents import make_agent
from seedq.learner.learner import Learner
from seedq.reporting.reporter import RunReporter
from seedq.reporting.run_control import run_is_over
from seedq.learner.server_thread import RUN_END_RECONNECT_SECONDS

log = logging.getLogger("seedq.local")

COMPILING_LINE = ("compiling the policy and its update (from seconds to minutes for a large network); "
                  "progress lines follow")
# How long a local actor retries once its learner process is gone, where the
# OS does not stop it at once (PR_SET_PDEATHSIG is Linux only).
LOCAL_ACTOR_RETRY_SECONDS = 30.0


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
        # (at once where the OS tells them, else LOCAL_ACTOR_RETRY_SECONDS after
        # it is gone); while it lives they wait for it to listen, however long
        # its start-up takes. A resumed local run starts actors of its own.
        "--retry-max-seconds", str(LOCAL_ACTOR_RETRY_SECONDS),
        "--parent-pid", str(os.getpid()),
    ]
    # Preprocessing runs in the actor and must match the learner's spec: pass
    # every --atari.* / --dmc.* option that differs from the defaults.
    cmd += config_flags(config.env_options, config_lib.EnvOptions)
    # The learner's token and keepalive settings (TLS is refused in local mode: see train()).
    cmd += config_flags(local_channel_config(config), config_lib.ActorChannelConfig)
    if config.architecture != "impala":
        # A deterministic run has one stream per actor: one order of batches.
        cmd += ["--groups", "1" if config.deterministic else str(config.actor_groups)]
    if stats_file:
        cmd += ["--stats-file", stats_file, "--stats-skip-seconds", str(stats_skip_seconds)]
    if config.actor_cores:
        cmd += ["--cores", config.actor_cores]
    return cmd


def local_channel_config(config: TrainConfig) -> config_lib.ActorChannelConfig:
    """How the local actors dial this learner: its token and keepalive settings."""
    return config_lib.ActorChannelConfig(
        auth=config.auth, keepalive_seconds=config.server.keepalive_seconds,
        peer_timeout_seconds=config.server.peer_timeout_seconds,
    )


class _GroupStopRequest:
    """SIGTERM / SIGINT: remembered ("terminated" / "interrupted", the first
    one) for the reporter, which stops between two polls (a group: asks the
    group to stop). Nothing is raised into whatever the main thread is doing
    (a checkpoint, a TensorBoard write); a second Ctrl-C does raise, for a
    learner still starting up."""

    def __init__(self, action: str = "asking the learner group to stop"):
        self._reason: str | None = None
        self._action = action

    def handler(self, signum, frame) -> None:
        if self._reason is None:
            self._reason = "terminated" if signum == signal.SIGTERM else "interrupted"
            print(f"\n{self._reason}: {self._action}", flush=True)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt

    def reason(self) -> str | None:
        return self._reason

    def request(self, reason: str) -> None:
        """A stop asked for other than by a signal to this thread (see stop_at_interpreter_exit)."""
        if self._reason is None:
            self._reason = reason
            print(f"\n{reason}: {self._action}", flush=True)


def stop_at_interpreter_exit(stop: _GroupStopRequest, finished: threading.Event) -> None:
    """For a run on a thread other than the main one (no signal handler can be
    installed there): when the interpreter exits, it waits for the run here,
    and a Ctrl-C that ended the main thread first stops the run, which then
    writes its checkpoint and summary. Registered with threading's own exit
    hooks (no public API does this), which run before the non-daemon threads
    are joined and before concurrent.futures refuses new work, which the
    checkpoint writer still needs."""

    def at_exit() -> None:
        ended_by = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)  # the uncaught exception
        if isinstance(ended_by, KeyboardInterrupt) and not finished.is_set():
            stop.request("interrupted")
        finished.wait()

    # Hooks run last-registered first: concurrent.futures' own (which makes
    # executors refuse work) must be registered before this one.
    import concurrent.futures.thread  # noqa: F401

    threading._register_atexit(at_exit)


def _still_saving(signum, frame) -> None:
    print("\nstill saving the final checkpoint and summary.json (kill -9 abandons them)", flush=True)


def spawn_actors(
    address: str, config: TrainConfig, stats_dir: str | None = None, stats_skip_seconds: float = 0.0,
    own_session: bool = False,
) -> list[subprocess.Popen]:
    """Starts `config.num_actors` actor processes; with `stats_dir`, each writes actor-<i>.json.
    `own_session`: out of the terminal's process group, so that its Ctrl-C
    reaches only this process, which stops them (they die with it regardless)."""
    procs = []
    for i in range(config.num_actors):
        stats = os.path.join(stats_dir, f"actor-{i}.json") if stats_dir else None
        procs.append(subprocess.Popen(actor_command(address, config, i, stats, stats_skip_seconds),
                                      start_new_session=own_session))
    return procs


def stop_processes(procs: list[subprocess.Popen], timeout: float = 5.0) -> None:
    """SIGTERM to every process still running, then waits up to `timeout`
    seconds in all; any left after that is killed."""
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
    run: TrainConfig | PreparedRun, *, quiet: bool = False, started: float | None = None, with_actors: bool = True,
    resume: str | None = None, overwrite: bool = False, wait_for_lock: bool = False,
) -> dict:
    """Runs a training run; returns the summary written to summary.json.

    `run`: a config, resolved and validated here, or one `seedq.run_setup.prepare`
    already resolved and validated (with its env spec).

    With `with_actors`, `config.num_actors` actor processes are started on
    this host (local mode); without, the learner serves whichever actors
    connect to `config.address` (`seedq learner`, the multi-machine path).
    `started` (time.monotonic()) is when the command started; seconds-to-target
    and wall time count from it. `resume` (a run directory, a checkpoint) continues
    from that checkpoint; `config.logdir` should then be the run's directory.
    `overwrite`: a fresh run replaces the run in `config.logdir` (only seedq's
    own entries, after every check that can refuse; seedq.run_dirs.clear).
    The process that writes the run directory holds its lock for the run
    (seedq.run_dirs.hold; `wait_for_lock`: wait while another process holds it).

    With `config.distributed` naming a group (or one detected on Cloud TPU),
    this process joins it first, before any other JAX use; process 0 alone
    writes the run directory (docs/devices.md "Multi-host").
    """
    started = time.monotonic() if started is None else started
    run = run if isinstance(run, PreparedRun) else prepare(run)
    config, spec = run.config, run.spec
    group = distributed.initialize(config.distributed)
    config = _for_group(config, group)
    address = config.address or default_address()
    _check_channel(config, address, with_actors)
    # A bad env id, an observation or action space the agent cannot take, fail
    # here (one line), before any process starts.
    agent = make_agent(config, spec)
    agent.check_host_memory()  # R2D2's replay: refused before actors start
    if resume is not None:
        _check_resumable(resume, agent, config.env)
    if group.multi:
        _check_one_resume(group, resume)
    run_lock = _claim_run_dir(config.logdir, group, fresh=resume is None, overwrite=overwrite,
                              wait=wait_for_lock)
    try:
        return _serve(config, spec, agent, group, address, started=started, quiet=quiet,
                      with_actors=with_actors, resume=resume)
    finally:
        if run_lock is not None:
            run_lock.release()


def _serve(config: TrainConfig, spec, agent, group, address: str, *, started: float, quiet: bool,
           with_actors: bool, resume: str | None) -> dict:
    """`train` once the run directory is claimed: actors, learner, the run, its summary."""
    # Each local actor writes its time split and byte counts to <logdir>/actors/ at exit.
    stats_dir = os.path.join(config.logdir, run_dirs.ACTORS) if group.is_leader else None
    if with_actors and stats_dir:
        os.makedirs(stats_dir, exist_ok=True)
    on_main_thread = threading.current_thread() is threading.main_thread()
    # Off the main thread, a Ctrl-C is seen only when it ends the main thread
    # (stop_at_interpreter_exit): until then the actors must not stop on it.
    actors = spawn_actors(address, config, stats_dir, own_session=not on_main_thread) if with_actors else []
    learner = None
    reporter = None
    stop_reason = "error"
    previous_sigterm = previous_sigint = None
    # A group stops together: SIGTERM and Ctrl-C on one process are a stop
    # request the group decides on (every process then checkpoints the same
    # step), not an exception that would leave this one saving alone.
    group_stop = _GroupStopRequest() if group.multi else _GroupStopRequest(
        "stopping actors and saving what was collected")
    finished = threading.Event()
    if on_main_thread:
        previous_sigterm = signal.signal(signal.SIGTERM, group_stop.handler)
        previous_sigint = signal.signal(signal.SIGINT, group_stop.handler)
    else:
        stop_at_interpreter_exit(group_stop, finished)
    try:
        try:
            learner = Learner(config, address, group, spec=spec, agent=agent)
            resumed = resumed_from = None
            if resume is not None:
                resumed, resumed_from = _restore(learner, resume, group, quiet)
            # Saved once the config is known to fit (a bad --resume override leaves it alone).
            if group.is_leader:
                config_lib.save(config, os.path.join(config.logdir, run_dirs.CONFIG))
            address = learner.start()
            if not with_actors and not quiet:
                member = f" ({group.describe()})" if group.multi else ""
                print(f"learner listening on {address}{member}", flush=True)
            if not quiet and group.is_leader:
                # Nothing else prints until the first progress line, which can be a
                # minute away (a CNN's first compile on a CPU): say what is going on.
                print(COMPILING_LINE, flush=True)
            reporter = RunReporter(
                config, learner, started, quiet=quiet, resumed=resumed, resumed_from=resumed_from,
                group=group, stop_requested=group_stop.reason,
            )
            stop_reason = reporter.run_until_done(actors)
        except KeyboardInterrupt:  # a second Ctrl-C (the first is a stop request)
            stop_reason = group_stop.reason() or "interrupted"
            if not quiet:
                print(f"\n{stop_reason}: stopping actors and saving what was collected", flush=True)
        finally:
            if previous_sigterm is not None:
                # Until the final checkpoint and summary.json are written: a
                # second Ctrl-C or SIGTERM there would leave a run without its
                # summary (SIGKILL still ends it at once).
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                signal.signal(signal.SIGINT, _still_saving)
            if reporter is not None and stop_reason == "error":
                reporter.close_display()
            stop_processes(actors)
            if learner is not None:
                # Remote actors may be between reconnects: serve the notice a while (local ones are stopped).
                learner.stop(run_ended=stop_reason if run_is_over(stop_reason) else None,
                             notice_least_seconds=0.0 if with_actors else RUN_END_RECONNECT_SECONDS)
        summary = reporter.finish(stop_reason) if reporter is not None else None
    finally:
        finished.set()  # (stop_at_interpreter_exit waits for this)
    if previous_sigterm is not None:
        signal.signal(signal.SIGTERM, previous_sigterm)
    if previous_sigint is not None:
        signal.signal(signal.SIGINT, previous_sigint)
    if summary is None and stop_reason == "terminated":
        return {"stop_reason": stop_reason}  # stopped before serving: nothing to checkpoint
    if summary is None:
        raise RuntimeError("the learner failed to start; see the log above")
    return summary

def _claim_run_dir(logdir: str, group, *, fresh: bool, overwrite: bool, wait: bool):
    """Process 0 takes the run directory's lock (unless its supervisor holds
    it), clears the old run for `overwrite` and marks the directory as a run;
    returns the lock it took (None: another process holds it for this one).
    Called after every check that can refuse the command, so a refused command
    has removed nothing."""
    if not group.is_leader:
        return None
    run_lock = None if run_dirs.holds_lock_already() else run_dirs.hold(logdir, wait=wait)
    try:
        if fresh and overwrite and run_dirs.holds_run(logdir):
            run_dirs.clear(logdir)
        run_dirs.write_marker(logdir)
    except BaseException:
        if run_lock is not None:
            run_lock.release()
        raise
    return run_lock


def _for_group(config: TrainConfig, group) -> TrainConfig:
    """The config as a learner group runs it (ValueError where a group cannot)."""
    if group.multi and config.architecture == "impala":
        raise ValueError("a learner group (jax.distributed) needs architecture='seed': "
                         "the multi-host learner serves SEED actors")
    if group.multi and config.checkpoints_replay:
        config = config.without_replay_checkpoints()
    return config


def _check_channel(config: TrainConfig, address: str, with_actors: bool) -> None:
    """Exposure, credential files and TLS fail here, in one line, before JAX starts."""
    channel.check_exposure(config, address)
    config.server.check_address(address)
    if with_actors and not address.startswith("unix:") and address.rsplit(":", 1)[-1] == "0":
        # Local actors are started with the address before the learner binds
        # it (they import while it compiles), so they cannot be told a free port.
        raise UsageError(f"--address {address}: `seedq train`'s local actors need the port they dial, "
                         "and port 0 is chosen when the learner starts; name a port, or run `seedq learner "
                         f"--address {address}`, which prints the address it listens on")
    channel.server_credentials(config.tls)
    channel.server_interceptors(config.auth)
    if with_actors and config.tls.enabled:
        raise ValueError(
            "tls.* is for `seedq learner` with actors given the CA (`seedq actor --tls.ca`); "
            "`seedq train`'s local actors dial without TLS (use --auth.token-file on a TCP address)"
        )


def _check_resumable(resume: str, agent, env: str) -> None:
    """A missing or incompatible checkpoint fails here, before any process starts."""
    import jax

    checkpoint.check_compatible(
        resume,
        jax.eval_shape(agent.init, jax.ShapeDtypeStruct((2,), jax.numpy.uint32)),
        jax.eval_shape(lambda: jax.random.PRNGKey(0)),
        env=env,
    )


def _restore(learner: Learner, resume: str, group, quiet: bool):
    """Restores `learner` from the checkpoint `resume` names; returns (snapshot, its path)."""
    resumed, resumed_from = checkpoint.restore(
        resume, learner.state, learner.inference.rng, env=learner.config.env,
        with_replay=learner.checkpoints_replay,
    )
    learner.restore(checkpoint.process_share(resumed, group.index, group.size))
    if not quiet:
        c = resumed.counters
        replay = (
            f", {learner.batches.replay.size:,} replay sequences"
            if resumed.replay is not None and learner.checkpoints_replay else ""
        )
        print(
            f"resuming from {resumed_from}: train step {c['train_steps']:,}, "
            f"{c['frames']:,} frames, {c['episodes']:,} episodes, "
            f"{c['elapsed_seconds']:.1f}s so far{replay}",
            flush=True,
        )
    return resumed, resumed_from


def _check_one_resume(group, resume: str | None) -> None:
    """A group starts from one state: every process resumes the same checkpoint
    step, or none does (processes that do not see one run directory would
    otherwise train from different parameters)."""
    step = checkpoint.locate(resume)[1] if resume is not None else None
    decision = group.exchange(
        {"resume_step": step},
        lambda reports: {"steps": [r["resume_step"] for r in reports]},
    )
    steps = decision["steps"]
    if len(set(steps)) > 1:
        seen = ", ".join(f"process {i}: {'step ' + str(s) if s is not None else 'none'}" for i, s in enumerate(steps))
        raise ValueError(
            f"the learner group does not resume from one checkpoint ({seen}); its processes need one "
            "run directory that all of them see"
        )


def read_summary(logdir: str) -> dict:
    with open(os.path.join(logdir, "summary.json")) as f:
        return json.load(f)
