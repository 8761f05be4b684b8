"""The reporter of a training run: polls `Learner.stats()`, lets the
controller decide (seedq.learner.run_control) and carries the decisions out
(checkpoints, evaluations, stopping), and feeds the sinks
(seedq.learner.sinks: console, TensorBoard, stats.json, summary.json).

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
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time

from seedq.config import TrainConfig
from seedq import checkpoint
from seedq.learner.run_control import RunClock, RunController, TargetRecord, resumed_target
from seedq.learner.sinks import (
    ConsoleSink, RunInfo, TensorBoardSink, Tick, stats_json, summary_json, write_json_atomically,
)
from seedq.learner.stats import LearnerStats

POLL_SECONDS = 0.05


class RunReporter:
    def __init__(
        self, config: TrainConfig, learner, started: float, *, quiet: bool = False,
        resumed: "checkpoint.Snapshot | None" = None, resumed_from: str | None = None,
        console=None,
    ):
        self.config = config
        self.learner = learner
        self.started = started  # time.monotonic() at command start
        counters = resumed.counters if resumed is not None else {}
        self.clock = RunClock(started, float(counters.get("elapsed_seconds", 0.0)))
        self.segment = int(counters.get("segments", 0)) + 1
        self.resumed_from = resumed_from
        stats = learner.stats()
        self.controller = RunController(
            config, self.clock, time.monotonic(),
            target=resumed_target(config, resumed.target, resumed.config) if resumed is not None
            else TargetRecord(),
            last_checkpoint_step=stats.train_steps if resumed is not None else None,
        )
        self.tensorboard = TensorBoardSink(
            config, stats.frames, purge_step=stats.frames if resumed is not None else None,
            devices=stats.devices,
        )
        self.console = ConsoleSink(config, quiet=quiet, console=console)
        # The first interval counts from the command's start.
        self._last_tick: tuple[LearnerStats, float] = (stats, started)
        self._checkpoints: checkpoint.CheckpointWriter | None = None
        self.last_checkpoint: str | None = resumed_from
        self._checkpoint_times: collections.deque[float] = collections.deque(maxlen=100)
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
        if self.config.stats_every_seconds and self._stats_thread is None:
            self._stats_thread = threading.Thread(target=self._stats_loop, name="seedq-stats", daemon=True)
            self._stats_thread.start()
        next_log = time.monotonic() + self.config.log_every_seconds
        while True:
            time.sleep(POLL_SECONDS)
            stats = self.learner.stats()
            actors_exited = bool(actors) and all(p.poll() is not None for p in actors)
            reason = self.controller.stop_reason(stats, actors_exited=actors_exited)
            if reason == "learner_error":
                raise RuntimeError("training thread failed") from stats.error
            if reason == "actors_exited":
                return reason
            if reason:
                self.tick()
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

    def tick(self) -> None:
        """One progress line and one set of TensorBoard scalars."""
        previous, previous_time = self._last_tick
        stats = self.learner.stats(since=previous)
        tick = Tick.after(previous, previous_time, stats, self.learner.metrics(), self.clock.elapsed(stats.time))
        self._last_tick = (stats, stats.time)
        self.tensorboard.tick(tick)
        self.console.tick(tick)

    # --- stats.json ---

    def _run_info(self) -> RunInfo:
        return RunInfo(self.clock, self.segment, self.resumed_from, self.last_checkpoint,
                       tuple(self._checkpoint_times))

    def stats(self) -> dict:
        """The live state of this learner process (stats.json)."""
        return stats_json(self.learner.stats(), self._run_info(), pid=os.getpid(), wall_time=time.time())

    def write_stats(self) -> None:
        write_json_atomically(os.path.join(self.config.logdir, "stats.json"), self.stats())

    def _stats_loop(self) -> None:
        while not self._stats_stop.is_set():
            try:
                self.write_stats()
            except OSError as e:  # a full disk must not end training
                print(f"could not write stats.json: {e}", file=sys.stderr, flush=True)
            self._stats_stop.wait(self.config.stats_every_seconds)

    # --- checkpoints ---

    def snapshot(self) -> checkpoint.Snapshot:
        """Everything needed to continue this run, as host arrays."""
        return self.learner.checkpoint_snapshot(
            counters={"elapsed_seconds": self.elapsed(), "segments": self.segment},
            target=self.target.to_dict(),
        )

    def checkpoint(self, *, final: bool = False) -> str:
        """Saves a checkpoint now; returns its directory. Periodic ones are
        written in the background; the `final` one is complete on return and
        replaces a periodic one of the same train step (newer counters)."""
        if self._checkpoints is None:
            self._checkpoints = checkpoint.CheckpointWriter(self.config.logdir, self.config.checkpoints_to_keep)
        self._checkpoint_times.append(self.elapsed())
        snapshot = self.snapshot()
        # Scalars logged so far survive a crash too: a resumed run continues
        # its curves from the checkpoint's frame count.
        self.tensorboard.flush()
        self.last_checkpoint = self._checkpoints.save(snapshot, wait=final, replace=final)
        self.controller.checkpoint_taken(snapshot.step, time.monotonic())
        return self.last_checkpoint

    # --- evaluation ---

    def evaluate_now(self):
        """Evaluates the current policy (greedy, `eval_episodes` from `eval_seed`)."""
        from seedq.evaluate import Policy, evaluate

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
        """Final checkpoint and summary.json; returns the summary."""
        self.close_display()
        if self._eval_thread is not None:
            self._eval_thread.join()
        wall = self.elapsed()
        ckpt_dir = self.checkpoint(final=True)
        self._checkpoints.close()
        if self._stats_thread is not None:
            self._stats_stop.set()
            self._stats_thread.join()
            self.write_stats()
        stats = self.learner.stats()
        evaluation = None
        if self.config.eval_episodes:
            evaluation = self.evaluate_now().to_dict()
            evaluation["checkpoint"] = ckpt_dir
            self.tensorboard.evaluation(evaluation, stats.frames)
        summary = summary_json(
            self.config, stats, self.target, self._run_info(), stop_reason=stop_reason,
            wall_seconds=wall, segment_seconds=time.monotonic() - self.started, checkpoint=ckpt_dir,
            evaluation=evaluation,
        )
        write_json_atomically(os.path.join(self.config.logdir, "summary.json"), summary, indent=2)
        self.tensorboard.close()
        self.console.finish(summary)
        return summary

