"""Progress output, TensorBoard scalars, stop conditions, checkpoints, stats.json and summary.json.

The progress display is one line: redrawn in place (rich) when stdout is a
terminal, printed as plain log lines every `log_every_seconds` otherwise.

A resumed run continues its counters: elapsed seconds add up over segments,
TensorBoard steps are env frames (restored from the checkpoint, so curves
continue; points a killed segment logged after its last checkpoint are purged),
and stop conditions (`max_seconds`, `max_frames`) apply to the whole run.

`<logdir>/stats.json` is the run's live state for programs that watch it
(`seedq bench soak`, probes, `watch cat`): counters, train-step timing,
dropped frames and the connected actors, rewritten atomically every
`stats_every_seconds`. One small file replaced in place is the cheapest thing
a watcher can read at any moment (TensorBoard events are flushed every few
seconds and need a parser).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time

import jax
import numpy as np
from tensorboardX import SummaryWriter

from seedq import config as config_lib
from seedq.config import TrainConfig
from seedq import checkpoint


def _source_stats(learner) -> dict:
    """Scalars the learner's batch source reports (replay size, priorities, ...), if any."""
    stats = getattr(getattr(learner, "batches", None), "stats", None)
    return stats() if stats is not None else {}


class RunReporter:
    def __init__(
        self, config: TrainConfig, learner, started: float, *, quiet: bool = False,
        resumed: "checkpoint.Snapshot | None" = None, resumed_from: str | None = None,
        console=None,
    ):
        self.config = config
        self.learner = learner
        self.started = started  # time.monotonic() at command start
        self.quiet = quiet
        counters = resumed.counters if resumed is not None else {}
        # When the target was reached, and still is the target (not overridden on resume).
        target = (
            resumed.target
            if resumed is not None and resumed.config.get("target_return") == config.target_return
            else {}
        )
        self.prior_seconds = float(counters.get("elapsed_seconds", 0.0))
        self.segment = int(counters.get("segments", 0)) + 1
        self.resumed_from = resumed_from
        self.writer = SummaryWriter(
            config.logdir, flush_secs=5,
            purge_step=learner.table.frames if resumed is not None else None,
        )
        # The inference precision is part of every run's record, next to its curves.
        self.writer.add_text("run/precision", config.precision, learner.table.frames)
        self.seconds_to_target: float | None = target.get("seconds_to_target")
        self.frames_to_target: int | None = target.get("frames_to_target")
        # The window mean that met the target (the final one can differ: episodes
        # that actors finish after the check still enter the window).
        self.mean_return_at_target: float | None = target.get("mean_return_at_target")
        self._last_tick = (started, learner.table.frames, learner.train_steps)
        self._latency_mark = learner.inference.stats.latency_count
        self._publish_mark = (learner.publish_seconds_total, learner.publishes)
        self._checkpoints: checkpoint.CheckpointWriter | None = None
        self.last_checkpoint: str | None = resumed_from
        self._last_checkpoint_step = learner.train_steps if resumed is not None else None
        self._next_checkpoint_time = time.monotonic() + (config.checkpoint_every_seconds or float("inf"))
        self._eval_thread: threading.Thread | None = None
        self._eval_policy = None
        self._next_eval_time = time.monotonic() + (config.eval_every_seconds or float("inf"))
        # stats.json has its own thread: it stays current while this one is
        # busy (a checkpoint being handed to orbax, an evaluation starting).
        # (Started by `run_until_done`, stopped by `finish`.)
        self._stats_stop = threading.Event()
        self._checkpoint_times: collections.deque[float] = collections.deque(maxlen=100)
        self._stats_thread: threading.Thread | None = None
        self._live = None
        if not quiet:
            from rich.console import Console

            console = console or Console(highlight=False)
            if console.is_terminal:
                from rich.live import Live

                self._live = Live(console=console, auto_refresh=False, transient=False)
                self._live.start()

    def elapsed(self) -> float:
        """Seconds of this run so far, over all its segments (resumes)."""
        return self.prior_seconds + time.monotonic() - self.started

    def stop_reason(self) -> str | None:
        cfg = self.config
        if cfg.target_return is not None and self.frames_to_target is not None:
            return "target_return"
        if cfg.max_seconds and self.elapsed() >= cfg.max_seconds:
            return "max_seconds"
        if cfg.max_frames and self.learner.table.frames >= cfg.max_frames:
            return "max_frames"
        return None

    def _check_target(self) -> None:
        if self.frames_to_target is not None or self.config.target_return is None:
            return
        _, mean_return, _, window_full = self.learner.episodes.snapshot()
        if window_full and mean_return >= self.config.target_return:
            self.seconds_to_target = self.elapsed()
            self.frames_to_target = self.learner.table.frames
            self.mean_return_at_target = float(mean_return)

    def run_until_done(self, actors) -> str:
        """Polls until a stop condition holds; returns its name."""
        if self.config.stats_every_seconds and self._stats_thread is None:
            self._stats_thread = threading.Thread(target=self._stats_loop, name="seedq-stats", daemon=True)
            self._stats_thread.start()
        next_log = time.monotonic() + self.config.log_every_seconds
        while True:
            time.sleep(0.05)
            self._check_target()
            reason = self.stop_reason()
            if reason:
                self.tick()
                return reason
            if self.learner.error is not None:
                raise RuntimeError("training thread failed") from self.learner.error
            if actors and all(p.poll() is not None for p in actors):
                return "actors_exited"
            now = time.monotonic()
            if now >= next_log:
                next_log += self.config.log_every_seconds
                self.tick()
            if self._checkpoint_due(now):
                self.checkpoint()
            elif self._checkpoints is not None:
                self._checkpoints.prune_replays()  # the newest replay is complete: drop older ones
            if now >= self._next_eval_time:
                self._next_eval_time = now + self.config.eval_every_seconds
                self._start_periodic_eval()

    # --- stats.json ---

    def stats(self) -> dict:
        """The live state of this learner process (stats.json)."""
        learner = self.learner
        _, train_steps, trained_frames, version = learner.snapshot()
        episodes, mean_return, _, window_full = learner.episodes.snapshot()
        last_step = learner.last_train_step_at
        gap_ended = learner.max_train_step_gap_ended_at
        table = learner.table
        return {
            "time": time.time(),
            "pid": os.getpid(),
            "learner_run": learner.learner_run,
            "segment": self.segment,
            "resumed_from": self.resumed_from,
            "elapsed_seconds": self.elapsed(),
            "train_steps": int(train_steps),
            "trained_frames": int(trained_frames),
            "policy_version": int(version),
            "frames": int(table.frames),
            "episodes": int(episodes),
            "mean_return": mean_return,
            "return_window_full": window_full,
            # Train-step timing of this process (None before its first step).
            "seconds_since_train_step": None if last_step is None else time.monotonic() - last_step,
            "max_train_step_gap_seconds": learner.max_train_step_gap,
            # When that longest gap ended, in this run's elapsed seconds (correlate with checkpoints).
            "max_train_step_gap_ended_at": None if gap_ended is None else self._run_seconds(gap_ended),
            # The latest gaps over 0.5 s: [seconds, ended at (run seconds)], and when the
            # latest checkpoints were taken (run seconds), to tell what a stall coincided with.
            "long_train_step_gaps": [
                [gap, self._run_seconds(ended)] for gap, ended in list(learner.long_train_step_gaps)
            ],
            "checkpoints_taken_at": list(self._checkpoint_times),
            # Env steps of partial unrolls dropped with an actor's stream (lost to training).
            "frames_dropped": int(learner.inference.store.dropped_steps),
            "actor_runs_started": table.runs_started,
            "actor_runs_ended": table.runs_dropped,
            "actors": [
                {"actor_id": e.actor_id, "run_id": e.run_id, "num_envs": e.num_envs}
                for e in table.entries()
            ],
            "last_checkpoint": self.last_checkpoint,
            # The batch source's own numbers (R2D2: replay size, inserted, sampled, ...).
            "batch_source": _source_stats(learner),
        }

    def _run_seconds(self, monotonic_time: float) -> float:
        """A time.monotonic() of this process on the run's elapsed-seconds clock."""
        return self.elapsed() - (time.monotonic() - monotonic_time)

    def _stats_loop(self) -> None:
        while not self._stats_stop.is_set():
            try:
                self.write_stats()
            except OSError as e:  # a full disk must not end training
                print(f"could not write stats.json: {e}", file=sys.stderr, flush=True)
            self._stats_stop.wait(self.config.stats_every_seconds)

    def write_stats(self) -> None:
        path = os.path.join(self.config.logdir, "stats.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.stats(), f)
        os.replace(path + ".tmp", path)

    # --- checkpoints ---

    def _checkpoint_due(self, now: float) -> bool:
        cfg = self.config
        if now >= self._next_checkpoint_time:
            return True
        steps = self.learner.train_steps
        return bool(
            cfg.checkpoint_every_steps
            and steps - (self._last_checkpoint_step or 0) >= cfg.checkpoint_every_steps
        )

    def snapshot(self) -> checkpoint.Snapshot:
        """Everything needed to continue this run, as host arrays."""
        learner = self.learner
        state, train_steps, trained_frames, version = learner.snapshot()
        episodes, _, _, _ = learner.episodes.snapshot()
        returns, lengths = learner.episodes.window()
        return checkpoint.Snapshot(
            state=jax.device_get(state),
            rng=np.asarray(jax.device_get(learner.inference.rng)),
            counters={
                "train_steps": int(train_steps),
                "trained_frames": int(trained_frames),
                "policy_version": int(version),
                "frames": int(learner.table.frames),
                "episodes": int(episodes),
                "elapsed_seconds": self.elapsed(),
                "segments": self.segment,
            },
            episode_window={"returns": returns, "lengths": lengths},
            target={"seconds_to_target": self.seconds_to_target, "frames_to_target": self.frames_to_target,
                    "mean_return_at_target": self.mean_return_at_target},
            config=config_lib.to_dict(self.config),
            replay=learner.replay_checkpoint() if hasattr(learner, "replay_checkpoint") else None,
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
        self.writer.flush()
        self.last_checkpoint = self._checkpoints.save(snapshot, wait=final, replace=final)
        self._last_checkpoint_step = snapshot.step
        self._next_checkpoint_time = time.monotonic() + (self.config.checkpoint_every_seconds or float("inf"))
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

    def _write_eval(self, d: dict, step: int) -> None:
        for key in ("mean", "std", "min", "max"):
            self.writer.add_scalar(f"eval/return_{key}", d[key], step)
        self.writer.add_scalar("eval/length_mean", d["mean_length"], step)

    def _start_periodic_eval(self) -> None:
        if not self.config.eval_episodes or (self._eval_thread and self._eval_thread.is_alive()):
            return

        def run():
            step = self.learner.table.frames
            try:
                self._write_eval(self.evaluate_now().to_dict(), step)
            except Exception as e:  # noqa: BLE001 - evaluation must not end training
                print(f"evaluation failed: {e}", file=sys.stderr, flush=True)

        self._eval_thread = threading.Thread(target=run, name="seedq-eval", daemon=True)
        self._eval_thread.start()

    def tick(self) -> None:
        """One progress line and one set of TensorBoard scalars."""
        learner = self.learner
        now = time.monotonic()
        frames = learner.table.frames
        train_steps = learner.train_steps
        last_time, last_frames, last_steps = self._last_tick
        dt = max(now - last_time, 1e-9)
        fps = (frames - last_frames) / dt
        steps_per_second = (train_steps - last_steps) / dt
        self._last_tick = (now, frames, train_steps)
        episodes, mean_return, mean_length, _ = learner.episodes.snapshot()
        stats = learner.inference.stats
        latency = stats.latency_percentiles(self._latency_mark)
        self._latency_mark = stats.latency_count
        lag_mean, lag_max = learner.take_lag_stats()
        publish_total, publishes = learner.publish_seconds_total, learner.publishes
        publish_ms = (
            1e3 * (publish_total - self._publish_mark[0]) / (publishes - self._publish_mark[1])
            if publishes > self._publish_mark[1] else None
        )
        self._publish_mark = (publish_total, publishes)
        metrics = learner.metrics()
        step = frames
        scalars = {
            "episode/return_mean": mean_return,
            "episode/length_mean": mean_length,
            "episode/count": episodes,
            "throughput/frames_per_second": fps,
            "learner/steps_per_second": steps_per_second,
            "inference/batch_size_mean": stats.mean_batch_size(),
            "inference/latency_ms_p50": None if latency is None else 1e3 * latency[0],
            "inference/latency_ms_p99": None if latency is None else 1e3 * latency[1],
            "inference/compiles": stats.compiles,
            "queue/depth_unrolls": len(learner.queue),
            "actors/connected": learner.table.num_connected,
            "learner/train_steps": train_steps,
            "learner/policy_version": learner.version,
            "learner/policy_lag_mean": lag_mean,
            "learner/policy_lag_max": lag_max,
            "learner/publish_ms": publish_ms,
            "time/elapsed_seconds": self.elapsed(),
            **metrics,
            # Batch sources may report their own statistics (replay size, priorities, ...).
            **_source_stats(learner),
        }
        for name, value in scalars.items():
            if value is not None:
                self.writer.add_scalar(name, value, step)
        if self.quiet:
            return
        ret = "-" if mean_return is None else f"{mean_return:7.1f}"
        loss = metrics.get("loss/total")
        entropy = metrics.get("policy/entropy")
        p99 = "-" if latency is None else f"{1e3 * latency[1]:.1f}ms"
        waiting = (
            f" | waiting for actors {learner.table.num_connected}/{self.config.min_actors}"
            if learner.waiting_for_actors else ""
        )
        line = (
            f"[{self.elapsed():7.1f}s] frames {frames:>10,} ({fps / 1e3:5.1f}k/s) "
            f"| episodes {episodes:>6,} | return({self.config.return_window}) {ret} "
            f"| train steps {train_steps:>6,} ({steps_per_second:4.0f}/s) "
            f"| infer batch {stats.mean_batch_size():5.1f} p99 {p99} "
            f"| queue {len(learner.queue):>4}/{learner.queue.capacity} "
            f"| actors {learner.table.num_connected} "
            f"| {self.config.precision}{_int8_share_text(learner)}"
            + ("" if loss is None else f" | loss {loss:8.4f}")
            # A policy collapsing to one action shows here first (learning health).
            + ("" if entropy is None else f" | entropy {entropy:5.3f}")
            + waiting
        )
        if self._live is not None:
            from rich.text import Text

            self._live.update(Text(line, no_wrap=True, overflow="ellipsis"), refresh=True)
        else:
            print(line, file=sys.stdout, flush=True)

    def close_display(self) -> None:
        """Leaves the in-place progress line as the last line on screen."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    def finish(self, stop_reason: str) -> dict:
        """Final checkpoint and summary.json; returns the summary."""
        learner = self.learner
        self.close_display()
        if self._eval_thread is not None:
            self._eval_thread.join()
        wall = self.elapsed()
        episodes, mean_return, _, _ = learner.episodes.snapshot()
        ckpt_dir = self.checkpoint(final=True)
        self._checkpoints.close()
        if self._stats_thread is not None:
            self._stats_stop.set()
            self._stats_thread.join()
            self.write_stats()
        evaluation = None
        if self.config.eval_episodes:
            evaluation = self.evaluate_now().to_dict()
            evaluation["checkpoint"] = ckpt_dir
            self._write_eval(evaluation, learner.table.frames)
        summary = {
            "agent": self.config.agent,
            "env": self.config.env,
            "architecture": self.config.architecture,
            "precision": self.config.precision,
            # int8: the measured per-layer plan (share of MACs in int8 per padded batch size).
            "int8_plan": _int8_plan(learner),
            "frames": learner.table.frames,
            "trained_frames": learner.trained_frames,
            "train_steps": learner.train_steps,
            "wall_seconds": wall,
            "episodes": episodes,
            "mean_return_last100": mean_return,
            "return_window": self.config.return_window,
            "target_return": self.config.target_return,
            "reached_target": self.frames_to_target is not None,
            "seconds_to_target": self.seconds_to_target,
            "frames_to_target": self.frames_to_target,
            "mean_return_at_target": self.mean_return_at_target,
            "stop_reason": stop_reason,
            "actor_runs": learner.table.runs_started,
            "mean_inference_batch": learner.inference.stats.mean_batch_size(),
            "checkpoint": ckpt_dir,
            "policy_version": learner.version,
            # Learner version minus behaviour version, per trained step (None: no training yet).
            "policy_lag_mean": learner.policy_lag_mean() if hasattr(learner, "policy_lag_mean") else None,
            "segments": self.segment,
            "segment_seconds": time.monotonic() - self.started,
            "resumed_from": self.resumed_from,
            "eval": evaluation,
        }
        path = os.path.join(self.config.logdir, "summary.json")
        with open(path + ".tmp", "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
        os.replace(path + ".tmp", path)
        self.writer.close()
        if not self.quiet:
            if self.config.target_return is None:
                target = "no target"
            elif self.frames_to_target is not None:
                target = (
                    f"target {self.config.target_return:g} reached after {self.seconds_to_target:.1f}s, "
                    f"{self.frames_to_target:,} frames"
                )
            else:
                target = f"target {self.config.target_return:g} not reached"
            print(
                f"done ({stop_reason}): {learner.table.frames:,} frames in {wall:.1f}s; {target}; "
                f"run directory {self.config.logdir}",
                flush=True,
            )
            if evaluation is not None:
                print(
                    f"eval: {evaluation['episodes']} {evaluation['policy']} episodes (seed "
                    f"{evaluation['seed']}): mean return {evaluation['mean']:.1f}, std "
                    f"{evaluation['std']:.1f}, min {evaluation['min']:g}, max {evaluation['max']:g}",
                    flush=True,
                )
        return summary


def _int8_plan(learner) -> dict | None:
    plan = getattr(learner, "int8_plan", None)
    return None if plan is None else plan.to_dict()


def _int8_share_text(learner) -> str:
    """' MACs 12-96%': the range over batch sizes of the share of the network's
    multiply-accumulates run in int8 (empty unless an int8 plan is in use)."""
    plan = getattr(learner, "int8_plan", None)
    if plan is None:
        return ""
    shares = [round(100 * s) for s in plan.mac_shares().values()]
    lo, hi = min(shares), max(shares)
    return f" MACs {lo}%" if lo == hi else f" MACs {lo}-{hi}%"
