"""The reporter of a training run: polls `Learner.stats()`, lets the
controller decide (seedq.reporting.run_control) and carries the decisions out
(checkpoints, evaluations, stopping), and feeds the sinks
(seedq.reporting.sinks: console, TensorBoard, stats.json, summary.json).

It reads the learner only through `stats()`, plus the calls its actions
need: `checkpoint_snapshot()` for checkpoints, `metrics()` for the training
metrics, and the agent and current parameters for evaluations.

A resumed run continues its counters: elapsed seconds add up over segments,
TensorBoard steps are env frames (restored from the checkpoint, so curves
continue; points a killed segment logged after its last checkpoint are purged),
and stop conditions (`max_seconds`, `max_frames`) apply to the whole run.

stats.json has its own thread, rewriting it every `stats_every_seconds`: it
stays current while the reporter's thread is busy (a checkpoint being handed
to orbax, an evaluation starting).

In a multi-host learner (a `ProcessGroup` of several) every process runs a
reporter, and each poll is a round of the group's exchange: every process
reports its counters, process 0 decides from the group's totals (frames and
episodes summed, the return window pooled) whether to stop, log or
checkpoint, and every process acts on that one decision. Process 0 alone
writes TensorBoard, stats.json and summary.json and evaluates; checkpoints
are written by all together (orbax coordinates), of the step the group
pinned in band with the update, so every process saves the same parameters.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time

from seedq.config import TrainConfig
from seedq import checkpoint, run_dirs
from seedq.distributed import SOLO, ProcessGroup
from seedq.reporting.run_control import (
    RunClock, RunController, TargetRecord, group_totals, pooled_window, process_report, resumed_target,
    with_totals,
)
from seedq.reporting.sinks import (
    ConsoleSink, RunInfo, TensorBoardSink, Tick, stats_json, summary_json, write_json_atomically,
)
from seedq.reporting.records import run_records
from seedq.reporting.stats import LearnerStats

POLL_SECONDS = 0.05
# A group's reporters meet this often (one round of the exchange each).
GROUP_POLL_SECONDS = 0.25
# How long a group process waits for its training thread to reach the step
# the group stops or checkpoints at (a few steps; more means a host is stuck).
GROUP_STEP_WAIT_SECONDS = 60.0


class RunReporter:
    def __init__(
        self, config: TrainConfig, learner, started: float, *, quiet: bool = False,
        resumed: "checkpoint.Snapshot | None" = None, resumed_from: str | None = None,
        console=None, group: ProcessGroup = SOLO, stop_requested=lambda: None,
    ):
        self.config = config
        self.learner = learner
        self.group = group
        # A group: this process's signal-made stop request ("terminated" / "interrupted"), or None.
        self._stop_requested = stop_requested
        self._group_stopped = False
        # The group's totals (frames, episodes, return window) of the latest
        # round, and process 0's copy of every process's report; None alone.
        self._totals: dict | None = None
        self._reports: list[dict] | None = None
        self.started = started  # time.monotonic() at command start
        counters = resumed.counters if resumed is not None else {}
        self.clock = RunClock(started, float(counters.get("elapsed_seconds", 0.0)))
        self.segment = int(counters.get("segments", 0)) + 1
        self.resumed_from = resumed_from
        if group.multi:  # the first round: every process is serving
            self._exchange(learner.stats(), actors_exited=False, decide=lambda reports, totals: {})
        stats = self._view(learner.stats())
        self.controller = RunController(
            config, self.clock, time.monotonic(),
            target=resumed_target(config, resumed.target, resumed.config) if resumed is not None
            else TargetRecord(),
            last_checkpoint_step=stats.train_steps if resumed is not None else None,
        )
        # Process 0 alone writes the run directory.
        self.tensorboard = run_records(config, TensorBoardSink(
            config, stats.frames, purge_step=stats.frames if resumed is not None else None,
            devices=stats.devices,
        ), resumed_frames=stats.frames if resumed is not None else None) if group.is_leader else NoTensorBoard()
        self.console = ConsoleSink(config, quiet=quiet, console=console)
        # The first interval counts from the command's start.
        self._last_tick: tuple[LearnerStats, float] = (stats, started)
        self._checkpoints: checkpoint.CheckpointWriter | None = None
        self.last_checkpoint: str | None = resumed_from
        self._checkpoint_times: collections.deque[float] = collections.deque(maxlen=100)
        self._final_checkpoint = True  # a group writes it only if every process stopped at one step
        self.error: str | None = None  # the failure that stopped the run (stop_reason learner_error)
        self._eval_thread: threading.Thread | None = None
        self._eval_policy = None
        # (Started by `run_until_done`, stopped by `finish`.)
        self._stats_stop = threading.Event()
        self._stats_thread: threading.Thread | None = None

    @property
    def target(self) -> TargetRecord:
        return self.controller.target

    def elapsed(self) -> float:
        """Seconds of this run so far, over all its segments (resumes)."""
        return self.clock.elapsed(time.monotonic())

    def run_until_done(self, actors) -> str:
        """Polls until a stop condition holds; returns its name."""
        if self.group.multi:
            return self._run_group_until_done(actors)
        self._start_stats_thread()
        next_log = time.monotonic() + self.config.log_every_seconds
        while True:
            time.sleep(POLL_SECONDS)
            stats = self.learner.stats()
            # A signal's stop request (SIGTERM, Ctrl-C) is taken here, between
            # two polls, never inside a save or a TensorBoard write.
            reason = self._stop_requested() or self.controller.stop_reason(
                stats, actors_exited=all_exited(actors), frames_settled=self._frames_settled())
            if reason == "learner_error":
                # Training or inference failed: the run ends now, visibly
                # (summary.json names the error, exit 1), not idling on.
                self.error = f"{type(stats.error).__name__}: {stats.error}"
                print(f"learner failed: {self.error}", file=sys.stderr, flush=True)
                return reason
            if reason in ("actors_exited", "terminated", "interrupted"):
                return reason
            if reason:
                self.tick()
                say_no_actors(reason, self.config)
                return reason
            now = stats.time
            if now >= next_log:
                next_log += self.config.log_every_seconds
                self.tick()
            if self.controller.checkpoint_due(stats):
                self.checkpoint()
            elif self._checkpoints is not None:
                self._checkpoints.prune_replays()  # the newest replay is complete: drop older ones
            if self.controller.eval_due(now):
                self._start_periodic_eval()

    def _start_stats_thread(self) -> None:
        """stats.json every stats_every_seconds, written by process 0 alone."""
        if self.config.stats_every_seconds and self._stats_thread is None and self.group.is_leader:
            self._stats_thread = threading.Thread(target=self._stats_loop, name="seedq-stats", daemon=True)
            self._stats_thread.start()

    # --- a group's rounds ---

    def _view(self, stats: LearnerStats) -> LearnerStats:
        """`stats` as the run sees them: with the group's totals in a group."""
        return with_totals(stats, self._totals)

    def _exchange(self, stats: LearnerStats, *, actors_exited: bool, decide, **extra) -> dict:
        """One round: this process's report (plus `extra`) out, process 0's
        decision back; `decide(reports, totals)` runs on process 0 only."""
        returns, lengths = self.learner.episodes.window()
        report = {**process_report(stats, returns, lengths, actors_exited=actors_exited), **extra}

        def leader(reports):
            self._reports = reports
            totals = group_totals(reports, self.config.return_window)
            return {"totals": totals, **decide(reports, totals)}

        decision = self.group.exchange(report, leader)
        self._totals = decision["totals"]
        return decision

    def _decide(self, stats: LearnerStats, next_log: float):
        """Process 0's decision of one round, from the group's reports."""
        def decide(reports, totals):
            errors = [f"learner process {p}: {r['error']}" for p, r in enumerate(reports) if r["error"]]
            if errors:
                return {"stop": "learner_error", "error": "; ".join(errors)}
            view = with_totals(stats, totals)
            actors_exited = all(r["actors_exited"] for r in reports)
            requested = [r["stop_request"] for r in reports if r.get("stop_request")]
            reason = requested[0] if requested else self.controller.stop_reason(view, actors_exited=actors_exited)
            return {
                "stop": reason,
                "tick": stats.time >= next_log,
                "checkpoint": reason is None and self.controller.checkpoint_due(view),
            }

        return decide

    def _run_group_until_done(self, actors) -> str:
        """`run_until_done` of a group: one exchange round per poll, process 0 deciding."""
        self._start_stats_thread()
        next_log = time.monotonic() + self.config.log_every_seconds
        while True:
            time.sleep(GROUP_POLL_SECONDS)
            stats = self.learner.stats()
            decision = self._exchange(stats, actors_exited=all_exited(actors), decide=self._decide(stats, next_log),
                                      stop_request=self._stop_requested())
            reason = decision.get("stop")
            if reason == "learner_error":
                raise RuntimeError(f"the learner group failed ({decision['error']})") from stats.error
            if reason:
                self._stop_group()
                if reason != "actors_exited":
                    self.tick()
                if self.group.is_leader:
                    say_no_actors(reason, self.config)
                return reason
            if decision.get("tick"):
                next_log = max(next_log + self.config.log_every_seconds, time.monotonic())
                self.tick()
            if decision.get("checkpoint"):
                self.checkpoint()
            elif self._checkpoints is not None and self.group.is_leader:
                self._checkpoints.prune_replays()
            if self.group.is_leader and self.controller.eval_due(time.monotonic()):
                self._start_periodic_eval()

    def _stop_group(self) -> None:
        """Every process stops training after the same step; then one more
        round tells whether all did (else no final checkpoint is written)."""
        self._group_stopped = True
        self.learner.request_group_stop()
        stopped = self.learner.wait_training_stopped(GROUP_STEP_WAIT_SECONDS)

        def decide(reports, totals):
            return {"final_checkpoint": all(r["stopped"] and r["error"] is None for r in reports)
                    and len({r["train_steps"] for r in reports}) == 1}

        decision = self._exchange(self.learner.stats(), actors_exited=False, decide=decide, stopped=stopped)
        self._final_checkpoint = decision["final_checkpoint"]
        if not self._final_checkpoint:
            print(f"{self.group.describe()}: the group did not stop at one train step; "
                  "no final checkpoint (the last periodic one stays)", file=sys.stderr, flush=True)

    def tick(self) -> None:
        """One progress line and one set of TensorBoard scalars."""
        previous, previous_time = self._last_tick
        stats = self._view(self.learner.stats(since=previous))
        tick = Tick.after(previous, previous_time, stats, self.learner.metrics(), self.clock.elapsed(stats.time))
        self._last_tick = (stats, stats.time)
        self.tensorboard.tick(tick)
        self.console.tick(tick)
        self._write_lockstep_points()

    def _frames_settled(self) -> bool:
        """Whether max_frames may stop the run now: a deterministic run's
        training must first catch up with its last frame."""
        return not self.config.deterministic or getattr(self.learner, "lockstep_done", True)

    def _write_lockstep_points(self) -> None:
        """A deterministic run's curves.csv rows: the points the learner took at
        fixed frame counts (time-based ticks would differ between two runs)."""
        points = getattr(self.learner, "lockstep_points", None)
        if not points:
            return
        taken = points[:len(points)]
        del points[:len(taken)]
        for stats, metrics in taken:
            self.tensorboard.curve_point(Tick(stats, metrics, self.clock.elapsed(stats.time), 0.0, 0.0))

    # --- stats.json ---

    def _run_info(self) -> RunInfo:
        return RunInfo(self.clock, self.segment, self.resumed_from, self.last_checkpoint,
                       tuple(self._checkpoint_times))

    def stats(self) -> dict:
        """The live state of this learner process (stats.json; a group's totals in a group)."""
        return stats_json(self._view(self.learner.stats()), self._run_info(), pid=os.getpid(),
                          wall_time=time.time())

    def write_stats(self) -> None:
        # Live status, rewritten every report: whole, but not worth an fsync each time.
        write_json_atomically(os.path.join(self.config.logdir, run_dirs.STATS), self.stats(), durable=False)

    def _stats_loop(self) -> None:
        while not self._stats_stop.is_set():
            try:
                self.write_stats()
            except OSError as e:  # a full disk must not end training
                print(f"could not write stats.json: {e}", file=sys.stderr, flush=True)
            self._stats_stop.wait(self.config.stats_every_seconds)

    # --- checkpoints ---

    def snapshot(self, pinned: tuple | None = None) -> checkpoint.Snapshot:
        """Everything needed to continue this run, as host arrays. In a group:
        the group's counters, and each process's own under "processes"
        (`checkpoint.process_share` gives each its part back on resume)."""
        snapshot = self.learner.checkpoint_snapshot(
            counters={"elapsed_seconds": self.elapsed(), "segments": self.segment},
            target=self.target.to_dict(), pinned=pinned,
        )
        if self.group.multi and self._reports:
            totals = group_totals(self._reports, self.config.return_window)
            snapshot.counters.update(
                frames=totals["frames"], episodes=totals["episodes"],
                processes=[{"frames": r["frames"], "episodes": r["episodes"],
                            "episode_window": {"returns": r["returns"], "lengths": r["lengths"]}}
                           for r in self._reports],
            )
            returns, lengths = pooled_window(self._reports, self.config.return_window)
            snapshot.episode_window = {"returns": returns, "lengths": lengths}
        return snapshot

    def checkpoint(self, *, final: bool = False) -> str:
        """Saves a checkpoint now; returns its directory. Periodic ones are
        written in the background; the `final` one is complete on return and
        replaces a periodic one of the same train step (newer counters)."""
        if not self.group.multi or final:
            return self._save(final=final)
        # A group: the step the group pinned (the same on every process), saved
        # while every training thread waits at it (orbax's collectives).
        pinned = self.learner.pinned_snapshot(self.learner.request_checkpoint(), GROUP_STEP_WAIT_SECONDS)
        try:
            if pinned is None:
                print(f"{self.group.describe()}: training ended before the checkpoint's step; not saved",
                      file=sys.stderr, flush=True)
                return self.last_checkpoint
            return self._save(pinned=pinned)
        finally:
            self.learner.resume_training()

    def _save(self, *, final: bool = False, pinned: tuple | None = None) -> str:
        if self._checkpoints is None:
            # A group saves synchronously: no orbax thread left running collectives after the save.
            self._checkpoints = checkpoint.CheckpointWriter(
                self.config.logdir, self.config.checkpoints_to_keep, asynchronous=not self.group.multi,
            )
        self._checkpoint_times.append(self.elapsed())
        snapshot = self.snapshot(pinned)
        # Scalars logged so far survive a crash too: a resumed run continues
        # its curves from the checkpoint's frame count.
        self.tensorboard.flush()
        self.last_checkpoint = self._checkpoints.save(snapshot, wait=final or self.group.multi, replace=final)
        self.controller.checkpoint_taken(snapshot.step, time.monotonic())
        return self.last_checkpoint

    # --- evaluation ---

    def evaluate_now(self):
        """Evaluates the current policy (greedy, `eval_episodes` from `eval_seed`)."""
        from seedq.evaluation import Policy, evaluate

        learner = self.learner
        params = learner.published_params(learner.snapshot()[0])  # at the server's precision
        if self._eval_policy is None:  # one policy object: its jitted step compiles once
            self._eval_policy = Policy(learner.precision, params, greedy=True)
        self._eval_policy.params = params
        return evaluate(
            self._eval_policy, self.config.env, self.config.eval_episodes, self.config.eval_seed,
            self.config.env_options,
        )

    def _start_periodic_eval(self) -> None:
        if self._eval_thread and self._eval_thread.is_alive():
            return

        def run():
            step = self.learner.stats().frames
            try:
                self.tensorboard.evaluation(self.evaluate_now().to_dict(), step)
            except Exception as e:  # noqa: BLE001 - evaluation must not end training
                print(f"evaluation failed: {e}", file=sys.stderr, flush=True)

        self._eval_thread = threading.Thread(target=run, name="seedq-eval", daemon=True)
        self._eval_thread.start()

    # --- the end ---

    def close_display(self) -> None:
        """Leaves the in-place progress line as the last line on screen."""
        self.console.close()

    def close(self) -> None:
        """Closes the checkpoint writer (waiting for its saves) and TensorBoard, without a summary."""
        if self._checkpoints is not None:
            self._checkpoints.close()
        self.tensorboard.close()

    def finish(self, stop_reason: str) -> dict:
        """Final checkpoint and summary.json; returns the summary.

        The checkpoint comes first: under SIGTERM the grace period is short,
        so a periodic evaluation still running is not waited for, and no
        final evaluation runs. After a learner failure no final checkpoint is
        written (the failed state is not trusted; the last periodic one stays)."""
        self.close_display()
        stopping_on_signal = stop_reason in ("terminated", "interrupted")
        wall = self.elapsed()
        if stop_reason == "learner_error" or (
                self.group.multi and not (self._group_stopped and self._final_checkpoint)):
            ckpt_dir = self.last_checkpoint  # the group cannot save one step together
        else:
            ckpt_dir = self.checkpoint(final=True)
        self._write_lockstep_points()
        if self._eval_thread is not None and not stopping_on_signal:
            self._eval_thread.join()
        if self._checkpoints is not None:
            self._checkpoints.close()
        if self._stats_thread is not None:
            self._stats_stop.set()
            self._stats_thread.join()
            self.write_stats()
        stats = self._view(self.learner.stats())
        if not self.group.is_leader:  # process 0 evaluates and writes the summary
            self.tensorboard.close()
            return {"stop_reason": stop_reason, "frames": stats.frames, "checkpoint": ckpt_dir,
                    "process": self.group.index}
        evaluation = None
        if self.config.eval_episodes and not stopping_on_signal and stop_reason not in ("learner_error", "no_actors"):
            evaluation = self.evaluate_now().to_dict()
            evaluation["checkpoint"] = ckpt_dir
            self.tensorboard.evaluation(evaluation, stats.frames)
        summary = summary_json(
            self.config, stats, self.target, self._run_info(), stop_reason=stop_reason,
            wall_seconds=wall, segment_seconds=time.monotonic() - self.started, checkpoint=ckpt_dir,
            evaluation=evaluation, error=self.error,
        )
        write_json_atomically(os.path.join(self.config.logdir, run_dirs.SUMMARY), summary, indent=2)
        self.tensorboard.close()
        self.console.finish(summary)
        return summary



class NoTensorBoard:
    """The TensorBoard sink of a group's processes other than 0 (which alone writes)."""

    def tick(self, tick) -> None:
        pass

    def curve_point(self, tick) -> None:
        pass

    def evaluation(self, result: dict, step: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def say_no_actors(reason: str, config: TrainConfig) -> None:
    """The one line of a run that spent its time budget without an actor frame."""
    if reason == "no_actors":
        print(f"no actor frames in {config.max_seconds:g}s (stop_reason no_actors): no actor reached this "
              "learner; check the actors' --server address, credentials and --env", file=sys.stderr, flush=True)


def all_exited(actors) -> bool:
    """Whether the run had actor processes and every one of them has exited."""
    return bool(actors) and all(p.poll() is not None for p in actors)
