"""Progress output, TensorBoard scalars, stop conditions and summary.json."""

from __future__ import annotations

import json
import os
import sys
import time

from tensorboardX import SummaryWriter

from seedq.config import TrainConfig
from seedq.learner import checkpoint


class RunReporter:
    def __init__(self, config: TrainConfig, learner, started: float, *, quiet: bool = False):
        self.config = config
        self.learner = learner
        self.started = started  # time.monotonic() at command start
        self.quiet = quiet
        self.writer = SummaryWriter(config.logdir, flush_secs=5)
        self.seconds_to_target: float | None = None
        self.frames_to_target: int | None = None
        self._last_tick = (started, 0)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def stop_reason(self) -> str | None:
        cfg = self.config
        if self.frames_to_target is not None:
            return "target_return"
        if cfg.max_seconds and self.elapsed() >= cfg.max_seconds:
            return "max_seconds"
        if cfg.max_frames and self.learner.table.frames >= cfg.max_frames:
            return "max_frames"
        return None

    def _check_target(self) -> None:
        if self.frames_to_target is not None or not self.config.target_return:
            return
        _, mean_return, _, window_full = self.learner.episodes.snapshot()
        if window_full and mean_return >= self.config.target_return:
            self.seconds_to_target = self.elapsed()
            self.frames_to_target = self.learner.table.frames

    def run_until_done(self, actors) -> str:
        """Polls until a stop condition holds; returns its name."""
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
            if time.monotonic() >= next_log:
                next_log += self.config.log_every_seconds
                self.tick()

    def tick(self) -> None:
        """One progress line and one set of TensorBoard scalars."""
        learner = self.learner
        now = time.monotonic()
        frames = learner.table.frames
        last_time, last_frames = self._last_tick
        fps = (frames - last_frames) / max(now - last_time, 1e-9)
        self._last_tick = (now, frames)
        episodes, mean_return, mean_length, _ = learner.episodes.snapshot()
        stats = learner.inference.stats
        metrics = learner.metrics()
        step = frames
        scalars = {
            "episode/return_mean": mean_return,
            "episode/length_mean": mean_length,
            "throughput/frames_per_second": fps,
            "inference/batch_size_mean": stats.mean_batch_size(),
            "inference/compiles": stats.compiles,
            "queue/depth_unrolls": len(learner.queue),
            "learner/train_steps": learner.train_steps,
            "learner/policy_version": learner.version,
            **metrics,
        }
        for name, value in scalars.items():
            if value is not None:
                self.writer.add_scalar(name, value, step)
        if self.quiet:
            return
        ret = "-" if mean_return is None else f"{mean_return:7.1f}"
        loss = metrics.get("loss/total")
        print(
            f"[{self.elapsed():7.1f}s] frames {frames:>10,} ({fps / 1e3:5.1f}k/s) "
            f"| episodes {episodes:>6,} | return({self.config.return_window}) {ret} "
            f"| train steps {learner.train_steps:>6,} | infer batch {stats.mean_batch_size():5.1f} "
            f"| queue {len(learner.queue):>4}/{learner.queue.capacity} "
            f"| {self.config.precision}"
            + ("" if loss is None else f" | loss {loss:8.4f}"),
            file=sys.stdout,
            flush=True,
        )

    def finish(self, stop_reason: str) -> dict:
        """Final checkpoint and summary.json; returns the summary."""
        learner = self.learner
        wall = self.elapsed()
        episodes, mean_return, _, _ = learner.episodes.snapshot()
        ckpt_dir = checkpoint.save(self.config.logdir, learner)
        summary = {
            "agent": self.config.agent,
            "env": self.config.env,
            "architecture": self.config.architecture,
            "precision": self.config.precision,
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
            "stop_reason": stop_reason,
            "actor_runs": learner.table.runs_started,
            "mean_inference_batch": learner.inference.stats.mean_batch_size(),
            "checkpoint": ckpt_dir,
        }
        path = os.path.join(self.config.logdir, "summary.json")
        with open(path + ".tmp", "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
        os.replace(path + ".tmp", path)
        self.writer.close()
        if not self.quiet:
            target = (
                f"target {self.config.target_return:g} reached after {self.seconds_to_target:.1f}s, "
                f"{self.frames_to_target:,} frames"
                if self.frames_to_target is not None
                else f"target {self.config.target_return:g} not reached"
            )
            print(
                f"done ({stop_reason}): {learner.table.frames:,} frames in {wall:.1f}s; {target}; "
                f"run directory {self.config.logdir}",
                flush=True,
            )
        return summary
