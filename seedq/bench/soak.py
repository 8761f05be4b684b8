"""`seedq bench soak`: training under a stream of faults, measured.

Real processes only: one `seedq learner` (TCP loopback or a unix socket in a
work directory) and `actors` `seedq actor` processes, exactly as on a cluster.
While the run trains for the whole duration (no stop at the target), a chaos
loop SIGKILLs a random connected actor every `kill_every` seconds and starts a
replacement (a new process: new actor id, new run id, as a replaced pod), and
optionally SIGKILLs the learner once and restarts it with `--resume`; the
surviving actors reconnect to it by themselves (their retry with backoff).

What it measures comes from the learner's `<run>/stats.json` (rewritten every
`STATS_EVERY_SECONDS`; see seedq.reporting.sinks), the checkpoints' own
counters, and the OS (the learner's resident memory through psutil; which
actor processes are alive):

  * max_stall_seconds: the longest gap between two train steps of one learner
    process (the learner times every step itself), or since its last step at
    the end; the gap across a learner restart is reported apart;
  * orphan_env_entries: env-table entries at the end whose actor process is
    dead (the entry outlived its stream);
  * counters_monotonic: train steps, frames, episodes, trained frames and the
    policy version never go backwards within a learner process, and a resumed
    one never starts below the checkpoint it resumed from;
  * rss_*: the learner's RSS `rss_start_seconds` (60 s) into the soak and at
    the end (re-based after a learner restart).

The soak clock starts at the learner's first train step, so start-up
(imports, compiling) is outside every figure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from seedq import extras

extras.require("bench", "psutil")

STATS_EVERY_SECONDS = 0.25
COUNTERS = ("train_steps", "trained_frames", "policy_version", "frames", "episodes")
# A killed actor's stream must be released within this long for its entry not
# to count as an orphan at the end (the OS closes a dead process's sockets at once).
SETTLE_SECONDS = 2.0
RETURN_WINDOW = 100  # the learner's default return_window: "the 100-episode mean"


def _has_checkpoint(run_dir: str) -> bool:
    from seedq import checkpoint  # (jax: imported only once a soak runs)

    return checkpoint.has_checkpoint(run_dir)


class SoakError(RuntimeError):
    """The soak could not run (a process failed); one line, logs named."""


@dataclasses.dataclass(frozen=True)
class SoakConfig:
    env: str = "CartPole-v1"
    agent: str = "vtrace"
    seconds: float = 300.0
    kill_every: float = 3.0  # 0: no actor kills
    actors: int = 2
    envs_per_actor: int = 32
    kill_learner_at: float | None = None  # soak seconds; None: never
    checkpoint_every_seconds: float = 30.0
    target_return: float = 475.0
    transport: str = "tcp"  # tcp (127.0.0.1) or unix
    seed: int = 0
    # More `seedq learner` flags (e.g. ("--r2d2.checkpoint-replay", "false")).
    learner_args: tuple[str, ...] = ()
    rss_start_seconds: float = 60.0
    startup_timeout: float = 300.0

    def validate(self) -> None:
        if self.seconds <= 0:
            raise ValueError(f"--seconds {self.seconds:g}: must be > 0")
        if self.kill_every < 0:
            raise ValueError(f"--kill-every {self.kill_every:g}: must be >= 0 (0: no actor kills)")
        if self.actors < 1 or self.envs_per_actor < 1:
            raise ValueError("--actors and --envs-per-actor must be >= 1")
        if self.kill_every and self.actors < 2:
            raise ValueError("--kill-every needs --actors >= 2 (the last connected actor is never killed)")
        if self.kill_learner_at is not None and not 0 < self.kill_learner_at < self.seconds:
            raise ValueError(f"--kill-learner-at {self.kill_learner_at:g}: must be in (0, --seconds)")
        if self.checkpoint_every_seconds <= 0:
            raise ValueError("--checkpoint-every-seconds must be > 0")
        if self.transport not in ("tcp", "unix"):
            raise ValueError(f"--transport {self.transport!r}: choose tcp or unix")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_stats(path: str) -> dict | None:
    """stats.json, or None while it does not exist yet (it is replaced atomically)."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _tail(path: str, lines: int = 5) -> str:
    try:
        with open(path, errors="replace") as f:
            return " | ".join(line.strip() for line in f.readlines()[-lines:])
    except OSError:
        return ""


def _actor_id(slot: int, generation: int) -> str:
    """One id per actor process: its slot, and how many processes held that slot before."""
    return f"soak-{slot}-{generation}"


@dataclasses.dataclass
class _Actor:
    slot: int
    generation: int
    proc: subprocess.Popen
    started_before_learner_kill: bool = False

    @property
    def actor_id(self) -> str:
        return _actor_id(self.slot, self.generation)


class MonotonicCheck:
    """Counters never go backwards within a learner process; a resumed process
    starts at or above the counters of the checkpoint it resumed from."""

    def __init__(self):
        self.ok = True
        self.violations: list[str] = []
        self._last: dict | None = None

    def resumed(self, checkpoint_counters: dict) -> None:
        self._last = {"pid": None, **{k: checkpoint_counters[k] for k in COUNTERS}}

    def add(self, stats: dict) -> None:
        last = self._last
        if last is not None and (last["pid"] in (None, stats["pid"])):
            for key in COUNTERS:
                if stats[key] < last[key]:
                    self.ok = False
                    self.violations.append(f"{key} {last[key]} -> {stats[key]} (pid {stats['pid']})")
        self._last = {"pid": stats["pid"], **{k: stats[k] for k in COUNTERS}}


class Soak:
    def __init__(self, config: SoakConfig, workdir: str, log=None):
        self.config = config
        self.workdir = workdir
        self.run_dir = os.path.join(workdir, "run")
        self.stats_path = os.path.join(self.run_dir, "stats.json")
        self.log = log or (lambda line: None)
        if config.transport == "tcp":
            self.address = f"127.0.0.1:{_free_port()}"
        else:
            self.address = f"unix:{os.path.join(workdir, 'learner.sock')}"
        self.rng = random.Random(config.seed)
        self.actors: list[_Actor] = []
        self.learner: subprocess.Popen | None = None
        self.learner_generation = 0
        self.t0: float | None = None  # monotonic time of the first train step
        # Results.
        self.actor_kills = 0
        self.kills_deferred = 0
        self.learner_kills = 0
        self.monotonic = MonotonicCheck()
        self.max_gap_by_pid: dict[int, float] = {}
        self.gap_at_by_pid: dict[int, float | None] = {}
        self.last_by_pid: dict[int, dict] = {}
        self.rss_start: int | None = None
        self.rss_start_at: float | None = None
        self.reached_target_at: tuple[float, int] | None = None  # (soak seconds, frames)
        self.reached_after_resume_at: tuple[float, int] | None = None
        self.resume: dict | None = None

    # --- processes ---

    def _learner_command(self, resume: bool) -> list[str]:
        cmd = [sys.executable, "-m", "seedq.cli", "learner", "--log-every-seconds", "10"]
        if resume:
            return cmd + ["--resume", self.run_dir]
        c = self.config
        return cmd + [
            "--address", self.address, "--logdir", self.run_dir, "--agent", c.agent, "--env", c.env,
            "--num-actors", str(c.actors), "--envs-per-actor", str(c.envs_per_actor),
            "--seed", str(c.seed),
            # Trains for the whole soak: the soak watches the target itself.
            "--target-return", "none", "--max-seconds", "0", "--max-frames", "0",
            "--checkpoint-every-seconds", str(c.checkpoint_every_seconds),
            "--stats-every-seconds", str(STATS_EVERY_SECONDS), "--eval-episodes", "0",
            *c.learner_args,
        ]

    @property
    def _learner_log(self) -> str:
        """The log file of the learner process started last."""
        return os.path.join(self.workdir, f"learner-{self.learner_generation}.log")

    def _start_learner(self, resume: bool = False) -> None:
        self.learner_generation += 1
        with open(self._learner_log, "w") as out:
            self.learner = subprocess.Popen(
                self._learner_command(resume), stdout=out, stderr=subprocess.STDOUT
            )

    def _start_actor(self, slot: int, generation: int) -> _Actor:
        c = self.config
        with open(os.path.join(self.workdir, f"actor-{slot}.log"), "a") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "seedq.cli", "actor", "--server", self.address,
                 "--env", c.env, "--num-envs", str(c.envs_per_actor),
                 "--actor-id", _actor_id(slot, generation),
                 "--seed", str(c.seed * 1000 + 97 * slot + generation),
                 # Dies with the soak, however the soak ends.
                 "--parent-pid", str(os.getpid())],
                stdout=out, stderr=subprocess.STDOUT,
            )
        return _Actor(slot, generation, proc)

    def _stop_all(self) -> None:
        procs = [a.proc for a in self.actors] + ([self.learner] if self.learner else [])
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def _check_learner_alive(self) -> None:
        if self.learner.poll() is not None:
            raise SoakError(
                f"the learner exited with code {self.learner.returncode} "
                f"(log {self._learner_log}: {_tail(self._learner_log)})"
            )

    # --- measurements ---

    def soak_seconds(self) -> float:
        return 0.0 if self.t0 is None else time.monotonic() - self.t0

    def _sample(self) -> dict | None:
        stats = read_stats(self.stats_path)
        if stats is None or stats["pid"] != self.learner.pid:
            return None  # not written yet by this learner process
        pid = stats["pid"]
        self.last_by_pid[pid] = stats
        self.max_gap_by_pid[pid] = stats["max_train_step_gap_seconds"]
        self.gap_at_by_pid[pid] = stats["max_train_step_gap_ended_at"]
        self.monotonic.add(stats)
        if self.t0 is not None and self._at_target(stats):
            reached = (self.soak_seconds(), stats["frames"])
            if self.reached_target_at is None:
                self.reached_target_at = reached
            if self.resume is not None and self.reached_after_resume_at is None:
                # After a resume only a window made entirely of new episodes counts.
                if stats["episodes"] - self.resume["checkpoint"]["episodes"] >= RETURN_WINDOW:
                    self.reached_after_resume_at = reached
        return stats

    def _at_target(self, stats: dict) -> bool:
        target = self.config.target_return
        return bool(
            target and stats["return_window_full"] and stats["mean_return"] is not None
            and stats["mean_return"] >= target
        )

    def _rss(self) -> int:
        import psutil

        return int(psutil.Process(self.learner.pid).memory_info().rss)

    def _connected_actors(self, stats: dict) -> list[_Actor]:
        from seedq.wire.groups import actor_of

        ids = {actor_of(e["actor_id"]) for e in stats["actors"]}  # (an actor's group streams: one actor)
        return [a for a in self.actors if a.actor_id in ids and a.proc.poll() is None]

    # --- faults ---

    def _kill_an_actor(self, stats: dict) -> bool:
        """SIGKILLs a random connected actor, never the last one; starts its replacement."""
        connected = self._connected_actors(stats)
        if len(connected) < 2:
            return False
        victim = self.rng.choice(connected)
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        self.actors[self.actors.index(victim)] = self._start_actor(victim.slot, victim.generation + 1)
        self.actor_kills += 1
        return True

    def _kill_learner(self, stats: dict) -> bool:
        """SIGKILLs the learner and resumes it from its checkpoint; False (it
        runs on, to be tried on its next stats.json write) while its last write
        counts no frames beyond that checkpoint, so that what the kill loses
        can be measured."""
        from seedq import checkpoint

        killed_pid = self.learner.pid
        # Frozen first: the stats.json and the checkpoint read below are then
        # the ones it dies with (a checkpoint written between reading them and
        # the kill made the frames lost come out negative).
        self.learner.send_signal(signal.SIGSTOP)
        try:
            last = self.last_by_pid.get(killed_pid, stats)
            on_disk = read_stats(self.stats_path)  # its very last write, if newer than our last read
            newer = on_disk is not None and on_disk["pid"] == killed_pid and on_disk["time"] > last["time"]
            if newer:
                last = on_disk
            meta, step_dir = checkpoint.read_meta(self.run_dir)
            if last["frames"] <= meta["counters"]["frames"]:  # its last report predates that checkpoint
                self.learner.send_signal(signal.SIGCONT)
                return False
        except BaseException:
            self.learner.send_signal(signal.SIGCONT)
            raise
        self.learner.send_signal(signal.SIGKILL)
        self.learner.wait()
        killed_at = self.soak_seconds()
        self.learner_kills += 1
        if newer:
            self.last_by_pid[killed_pid] = on_disk
            self.max_gap_by_pid[killed_pid] = on_disk["max_train_step_gap_seconds"]
        for actor in self.actors:
            actor.started_before_learner_kill = True
        self.log(f"[{killed_at:6.1f}s] SIGKILLed the learner (pid {killed_pid}); resuming from {step_dir}")
        self._start_learner(resume=True)
        self.monotonic.resumed(meta["counters"])
        self.resume = {
            "pid": self.learner.pid, "killed_pid": killed_pid, "killed_at": killed_at,
            "checkpoint": meta["counters"], "checkpoint_dir": step_dir, "frames_at_kill": last["frames"],
            "first_step_at": None, "actors_reconnected": None,
        }
        if self.rss_start is not None:  # re-based: measured on the resumed process
            self.rss_start = self.rss_start_at = None
        return True

    # --- the run ---

    def _wait_for_training(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout
        while True:
            self._check_learner_alive()
            stats = self._sample()
            if stats is not None and stats["seconds_since_train_step"] is not None:
                self.t0 = time.monotonic() - stats["seconds_since_train_step"]
                return
            if time.monotonic() > deadline:
                raise SoakError(f"no train step within {self.config.startup_timeout:.0f}s of starting")
            time.sleep(0.1)

    def run(self) -> dict:
        c = self.config
        os.makedirs(self.run_dir, exist_ok=True)
        self.actors = [self._start_actor(i, 0) for i in range(c.actors)]
        self._start_learner()
        try:
            self._wait_for_training()
            self.log(f"training started; soaking for {c.seconds:g}s")
            next_kill = c.kill_every or float("inf")
            learner_kill_pending = c.kill_learner_at is not None
            last_refused_report = None  # stats.json "time" of a report the learner kill waited past
            rss_at = min(c.rss_start_seconds, c.seconds / 2)
            stats = None
            while self.soak_seconds() < c.seconds or self._resumed_learner_starting():
                time.sleep(0.05)
                self._check_learner_alive()
                stats = self._sample() or stats
                now = self.soak_seconds()
                if stats is None or stats["pid"] != self.learner.pid:
                    continue
                self._track_resume(stats, now)
                if self.rss_start is None and self._rss_due(now, rss_at):
                    self.rss_start, self.rss_start_at = self._rss(), now
                # Tried again only on a newer report: nothing else can put one past the checkpoint.
                if (learner_kill_pending and now >= c.kill_learner_at and stats["time"] != last_refused_report
                        and _has_checkpoint(self.run_dir)):
                    if self._kill_learner(stats):
                        learner_kill_pending = False
                        stats = None
                        continue
                    last_refused_report = stats["time"]
                if now >= next_kill and now < c.seconds - SETTLE_SECONDS:
                    if self._kill_an_actor(stats):
                        # No catching up after a deferral (e.g. a learner restart).
                        next_kill = max(next_kill + c.kill_every, now + c.kill_every / 2)
                    else:
                        self.kills_deferred += 1
                        next_kill = now + 0.2  # retry when another actor is connected
            # No kills in the last SETTLE_SECONDS: a killed actor's entry must be gone by now.
            final = self._sample() or stats
            if final is None or (self.resume is not None and self.resume["first_step_at"] is None):
                raise SoakError(
                    f"the resumed learner trained no step within {c.startup_timeout:.0f}s of its restart "
                    f"(its log: {self._learner_log})"
                )
            rss_end = self._rss()
            return self._result(final, rss_end)
        finally:
            self._stop_all()

    def _resumed_learner_starting(self) -> bool:
        """Whether a restarted learner is still starting up (imports, compiling;
        up to startup_timeout after its kill). The soak does not end then: like
        the first start-up, which is outside the soak clock, a restart late in
        a short soak on a busy machine would otherwise leave nothing measured
        of the resumed learner."""
        r = self.resume
        return (r is not None and r["first_step_at"] is None
                and self.soak_seconds() - r["killed_at"] < self.config.startup_timeout)

    def _rss_due(self, now: float, rss_at: float) -> bool:
        if self.resume is None:
            return now >= rss_at
        first = self.resume["first_step_at"]
        return first is not None and now >= max(rss_at, first + rss_at)

    def _track_resume(self, stats: dict, now: float) -> None:
        r = self.resume
        if r is None or stats["pid"] != r["pid"]:
            return
        if "replay_size_at_resume" not in r:  # its first write, written as it starts serving
            r["replay_size_at_resume"] = stats["batch_source"].get("replay/size")
        if r["first_step_at"] is None and stats["seconds_since_train_step"] is not None:
            r["first_step_at"] = now - stats["seconds_since_train_step"]
        if r["actors_reconnected"] is None or len(r["actors_reconnected"]) < self.config.actors:
            r["actors_reconnected"] = sorted(
                a.actor_id for a in self._connected_actors(stats) if a.started_before_learner_kill
            )

    def _result(self, final: dict, rss_end: int) -> dict:
        c = self.config
        from seedq.wire.groups import actor_of

        live_ids = {a.actor_id for a in self.actors if a.proc.poll() is None}
        orphans = [e for e in final["actors"] if actor_of(e["actor_id"]) not in live_ids]
        final_gap = final["seconds_since_train_step"] or 0.0
        gaps = dict(self.max_gap_by_pid)
        gaps[final["pid"]] = max(gaps.get(final["pid"], 0.0), final_gap)
        frames_dropped = sum(s["frames_dropped"] for s in self.last_by_pid.values())
        r = self.resume
        reached = self.reached_target_at
        out = {
            "env": c.env,
            "agent": c.agent,
            "learner_args": list(c.learner_args),
            "transport": c.transport,
            "seconds": c.seconds,
            "actors": c.actors,
            "envs_per_actor": c.envs_per_actor,
            "kill_every": c.kill_every,
            "actor_kills": self.actor_kills,
            "actor_kills_deferred": self.kills_deferred,
            "learner_kills": self.learner_kills,
            "max_stall_seconds": max(gaps.values(), default=None),
            # When the longest stall ended, on the learner's run clock (stats.json elapsed_seconds).
            "max_stall_ended_at_run_seconds": self.gap_at_by_pid.get(max(gaps, key=gaps.get)) if gaps else None,
            "rss_start_bytes": self.rss_start,
            "rss_start_at_seconds": self.rss_start_at,
            "rss_end_bytes": rss_end,
            "rss_growth_fraction": (rss_end - self.rss_start) / self.rss_start if self.rss_start else None,
            "orphan_env_entries": len(orphans),
            "orphans": orphans,
            "actors_connected_at_end": len(final["actors"]),
            "frames": final["frames"],
            "train_steps": final["train_steps"],
            "frames_per_second": final["frames"] / c.seconds,
            "frames_dropped": frames_dropped,
            "frames_lost_to_learner_restart": (
                r["frames_at_kill"] - r["checkpoint"]["frames"] if r is not None else 0
            ),
            "target_return": c.target_return,
            "reached_target": reached is not None,
            "seconds_to_target": None if reached is None else reached[0],
            "frames_to_target": None if reached is None else reached[1],
            "mean_return_last100_at_end": final["mean_return"],
            # Diagnostics of the final learner process: its latest train-step gaps over
            # 0.5 s [seconds, ended at run seconds] and its latest checkpoint times.
            "long_stalls": final["long_train_step_gaps"],
            "checkpoints_taken_at": final["checkpoints_taken_at"],
            "counters_monotonic": self.monotonic.ok,
            "counter_violations": self.monotonic.violations[:10],
        }
        if r is not None:
            first = r["first_step_at"]
            out.update({
                "learner_killed_at_seconds": r["killed_at"],
                "resumed_from": r["checkpoint_dir"],
                "resumed_from_train_step": r["checkpoint"]["train_steps"],
                # Kill to the resumed learner's first train step (its start-up and compile).
                "learner_restart_seconds": None if first is None else first - r["killed_at"],
                "actors_reconnected_by_themselves": r["actors_reconnected"],
                # Replay agents: sequences the resumed learner started with (restored).
                "replay_size_at_resume": r.get("replay_size_at_resume"),
                # A 100-episode window of post-resume episodes reached the target.
                "reached_target_after_resume": self.reached_after_resume_at is not None,
                "seconds_to_target_after_resume": (
                    None if self.reached_after_resume_at is None else self.reached_after_resume_at[0]
                ),
                "frames_to_target_after_resume": (
                    None if self.reached_after_resume_at is None else self.reached_after_resume_at[1]
                ),
            })
        out["uptime_load_average"] = list(os.getloadavg())
        return out


def run(config: SoakConfig, workdir: str | None = None, log=None) -> dict:
    """Runs the soak; returns its result. `workdir` (kept) holds the run
    directory and every process's log; by default a temporary one, removed
    unless the soak fails."""
    config.validate()
    keep = workdir is not None
    workdir = workdir or tempfile.mkdtemp(prefix="seedq-soak-")
    os.makedirs(workdir, exist_ok=True)
    ok = False
    try:
        result = Soak(config, workdir, log).run()
        ok = True
    except SoakError as e:
        raise SoakError(f"{e} (work directory kept: {workdir})") from None
    finally:
        if ok and not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    result["workdir"] = workdir if keep else None
    return result
