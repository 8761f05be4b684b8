"""Where a run's figures go: the console progress line, TensorBoard, stats.json
and summary.json. Each sink is fed `LearnerStats` snapshots (through `Tick`)
and never reads the learner itself.

The progress display is one line: redrawn in place (rich) when stdout is a
terminal, printed as plain log lines otherwise. TensorBoard steps are env
frames; a resumed segment purges the points a killed one logged after its
last checkpoint (`purge_step`), so curves continue.

`<logdir>/stats.json` is the run's live state for programs that watch it
(`seedq bench soak`, probes, `watch cat`), rewritten atomically. One small
file replaced in place is the cheapest thing a watcher can read at any
moment (TensorBoard events are flushed every few seconds and need a parser).
"""

from __future__ import annotations

import dataclasses
import json
import sys

from tensorboardX import SummaryWriter

from seedq.process import atomic_files
from seedq.config import TrainConfig
from seedq.reporting.bottleneck import run_bottleneck
from seedq.reporting.run_control import RunClock, TargetRecord
from seedq.reporting.stats import LearnerStats


@dataclasses.dataclass(frozen=True)
class Tick:
    """One progress interval: a snapshot taken with `since` = the previous tick's,
    the latest training metrics, and the rates over the interval."""

    stats: LearnerStats
    metrics: dict
    elapsed_seconds: float
    frames_per_second: float
    steps_per_second: float
    # Which capacity set the interval's rate (seedq.reporting.bottleneck); None: unknown.
    bottleneck: str | None = None

    @classmethod
    def after(cls, previous: LearnerStats, previous_time: float, stats: LearnerStats,
              metrics: dict, elapsed_seconds: float) -> "Tick":
        """The interval from `previous` (taken at `previous_time`, a time.monotonic()) to `stats`."""
        dt = max(stats.time - previous_time, 1e-9)
        return cls(
            stats, metrics, elapsed_seconds,
            frames_per_second=(stats.frames - previous.frames) / dt,
            steps_per_second=(stats.train_steps - previous.train_steps) / dt,
            bottleneck=bottleneck_between(previous, stats, stats.time - previous_time),
        )


def bottleneck_between(earlier: LearnerStats, later: LearnerStats, seconds: float) -> str | None:
    """The verdict over the `seconds` from `earlier` to `later` (None before any inference batch)."""
    if later.inference_batches == earlier.inference_batches and not later.inference_batches:
        return None  # no batch yet (or an IMPALA learner, which runs no inference)

    def cpu(s: LearnerStats):
        return s.server_thread_cpu_seconds

    return run_bottleneck(
        seconds,
        busy_seconds=later.inference_busy_seconds - earlier.inference_busy_seconds,
        held_seconds=later.queue_held_seconds - earlier.queue_held_seconds,
        thread_cpu_seconds=None if cpu(later) is None or cpu(earlier) is None else cpu(later) - cpu(earlier),
        frames=later.queue_put_unrolls - earlier.queue_put_unrolls,
        dropped_frames=later.queue_dropped_unrolls - earlier.queue_dropped_unrolls,
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1e3 * seconds


def int8_share_text(int8_plan: dict | None) -> str:
    """' MACs 12-96%': the range over batch sizes of the share of the network's
    multiply-accumulates run in int8 (empty unless an int8 plan is in use)."""
    if int8_plan is None:
        return ""
    shares = [round(100 * s) for s in int8_plan["mac_share"].values()]
    lo, hi = min(shares), max(shares)
    return f" MACs {lo}%" if lo == hi else f" MACs {lo}-{hi}%"


def devices_text(devices: dict) -> str:
    """' | devices 2+4' (inference + training) when they are split; empty on one
    shared device."""
    inference, training = devices.get("inference", []), devices.get("training", [])
    return "" if inference == training else f" | devices {len(inference)}+{len(training)}"


def short_count(n: int) -> str:
    """A counter in at most 7 characters: 94,112; 150k; 12.3M; 1.23G."""
    if n < 100_000:
        return f"{n:,}"
    if n < 1_000_000:
        return f"{n / 1e3:.0f}k"
    if n < 1_000_000_000:
        return f"{n / 1e6:.1f}M"
    return f"{n / 1e9:.2f}G"


def short_duration(seconds: float) -> str:
    """Seconds below 1,000 (`734s`), whole minutes above (`120m`)."""
    return f"{seconds:.0f}s" if seconds < 999.5 else f"{seconds / 60:.0f}m"


# The progress line fits a terminal this wide; optional parts that would pass it are left out.
PROGRESS_COLUMNS = 120


def time_left(config: TrainConfig, tick: Tick) -> float | None:
    """Seconds until the time or frame budget stops the run, whichever comes
    first (frames at the interval's rate); None without a budget, or with only
    a frame budget and no frames yet."""
    left = []
    if config.max_seconds:
        left.append(max(0.0, config.max_seconds - tick.elapsed_seconds))
    if config.max_frames and tick.frames_per_second > 0:
        left.append(max(0, config.max_frames - tick.stats.frames) / tick.frames_per_second)
    return min(left) if left else None


def actors_text(s: LearnerStats) -> str:
    """"3 actors", or with env groups (docs/wire.md) "3 actors x4 groups"."""
    if s.actor_groups <= 1:
        return f"{s.num_connected} actors"
    return f"{s.num_actor_processes} actors x{s.actor_groups} groups"


def progress_line(config: TrainConfig, tick: Tick) -> str:
    """One line of at most PROGRESS_COLUMNS characters: time (and the time left
    with a budget: `time_left`), frames and their
    rate, the mean return (over return_window episodes), train steps and their
    rate, connected actors and a split of devices (fixed for the run), then
    (as they fit, most telling first) a wait for actors, loss, entropy (a
    collapsing policy shows here first) and a Box policy's std, the interval's
    bottleneck (seedq.reporting.bottleneck), inference batch size and rule, the
    unroll queue, the precision when not fp32 and inference latency p99.
    TensorBoard and stats.json keep every figure."""
    s, metrics = tick.stats, tick.metrics
    ret = "-" if s.mean_return is None else f"{s.mean_return:.1f}"
    # The batcher's rule (seedq.server.batching); IMPALA learners run no inference.
    batching = f" {s.batching}" if s.inference_batches else ""
    left = time_left(config, tick)
    clock = short_duration(tick.elapsed_seconds) + ("" if left is None else f", {short_duration(left)} left")
    line = (
        f"[{clock}] {short_count(s.frames)} fr {tick.frames_per_second / 1e3:.1f}k/s "
        f"| return {ret} | {short_count(s.train_steps)} steps {tick.steps_per_second:.0f}/s "
        f"| {actors_text(s)}{devices_text(s.devices)}"
    )[:PROGRESS_COLUMNS]  # (only counters past any real run's reach make it longer)
    loss, entropy = metrics.get("loss/total"), metrics.get("policy/entropy")
    std = metrics.get("policy/std")  # Box actions
    optional = [
        f" | waiting for actors {s.num_connected}/{config.min_actors}" if s.waiting_for_actors else "",
        "" if loss is None else f" | loss {loss:.3g}",
        "" if entropy is None else f" | entropy {entropy:.3f}" + ("" if std is None else f" std {std:.3f}"),
        "" if tick.bottleneck is None else f" | bottleneck {tick.bottleneck}",
        f" | batch {s.mean_inference_batch:.1f}{batching}",
        f" | queue {s.queue_depth}/{s.queue_capacity}",
        "" if config.precision == "fp32" else f" | {config.precision}{int8_share_text(s.int8_plan)}",
        "" if s.latency_p99_seconds is None else f" | p99 {1e3 * s.latency_p99_seconds:.1f}ms",
    ]
    for part in optional:
        if part and len(line) + len(part) <= PROGRESS_COLUMNS:
            line += part
    return line


class ConsoleSink:
    """The progress line, and the closing lines of a run."""

    def __init__(self, config: TrainConfig, *, quiet: bool = False, console=None):
        self.config = config
        self.quiet = quiet
        self._live = None
        if not quiet:
            from rich.console import Console

            console = console or Console(highlight=False)
            if console.is_terminal:
                from rich.live import Live

                self._live = Live(console=console, auto_refresh=False, transient=False)
                self._live.start()

    def tick(self, tick: Tick) -> None:
        if self.quiet:
            return
        line = progress_line(self.config, tick)
        if self._live is not None:
            from rich.text import Text

            self._live.update(Text(line, no_wrap=True, overflow="ellipsis"), refresh=True)
        else:
            print(line, file=sys.stdout, flush=True)

    def close(self) -> None:
        """Leaves the in-place progress line as the last line on screen."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    def finish(self, summary: dict) -> None:
        """The result line (with --quiet too: how the run ended and where it is), then the evaluation's."""
        cfg, frames_to_target = self.config, summary["frames_to_target"]
        if cfg.target_return is None:
            target = "no target"
        elif frames_to_target is not None:
            target = (
                f"target {cfg.target_return:g} reached after {summary['seconds_to_target']:.1f}s, "
                f"{frames_to_target:,} frames"
            )
        else:
            target = f"target {cfg.target_return:g} not reached"
        print(
            f"done ({summary['stop_reason']}): {summary['frames']:,} frames in "
            f"{summary['wall_seconds']:.1f}s; {target}; run directory {cfg.logdir}",
            flush=True,
        )
        evaluation = summary["eval"]
        if evaluation is not None and not self.quiet:
            print(
                f"eval: {evaluation['episodes']} {evaluation['policy']} episodes (seed "
                f"{evaluation['seed']}): mean return {evaluation['mean']:.1f}, std "
                f"{evaluation['std']:.1f}, min {evaluation['min']:g}, max {evaluation['max']:g}",
                flush=True,
            )


def tensorboard_scalars(tick: Tick) -> dict[str, float | None]:
    s = tick.stats
    return {
        "episode/return_mean": s.mean_return,
        "episode/length_mean": s.mean_length,
        "episode/count": s.episodes,
        "throughput/frames_per_second": tick.frames_per_second,
        "learner/steps_per_second": tick.steps_per_second,
        "inference/batch_size_mean": s.mean_inference_batch,
        # 1 while the batcher runs greedy batches, 0 while it waits for the streams.
        "inference/greedy_batching": float(s.batching == "greedy"),
        "inference/latency_ms_p50": _ms(s.latency_p50_seconds),
        "inference/latency_ms_p99": _ms(s.latency_p99_seconds),
        "inference/compiles": s.inference_compiles,
        "queue/depth_unrolls": s.queue_depth,
        "actors/connected": s.num_connected,
        "learner/train_steps": s.train_steps,
        "learner/policy_version": s.policy_version,
        "learner/policy_lag_mean": s.policy_lag_mean,
        "learner/policy_lag_max": s.policy_lag_max,
        "learner/publish_ms": s.publish_ms,
        "time/elapsed_seconds": tick.elapsed_seconds,
        **tick.metrics,
        # Batch sources may report their own statistics (replay size, priorities, ...).
        **s.batch_source,
    }


class TensorBoardSink:
    """Scalars at env-frame steps; the run's precision and device split as text."""

    def __init__(self, config: TrainConfig, frames: int, *, purge_step: int | None = None,
                 devices: dict | None = None):
        self.writer = SummaryWriter(config.logdir, flush_secs=5, purge_step=purge_step)
        # The inference precision is part of every run's record, next to its curves.
        self.writer.add_text("run/precision", config.precision, frames)
        if devices:
            self.writer.add_text("run/devices", json.dumps(devices), frames)

    def tick(self, tick: Tick) -> None:
        for name, value in tensorboard_scalars(tick).items():
            if value is not None:
                self.writer.add_scalar(name, value, tick.stats.frames)

    def evaluation(self, result: dict, step: int) -> None:
        for key in ("mean", "std", "min", "max"):
            self.writer.add_scalar(f"eval/return_{key}", result[key], step)
        self.writer.add_scalar("eval/length_mean", result["mean_length"], step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What the reporter adds to the learner's counters: this segment and its checkpoints."""

    clock: RunClock
    segment: int
    resumed_from: str | None
    last_checkpoint: str | None
    checkpoints_taken_at: tuple[float, ...]  # run seconds


def stats_json(stats: LearnerStats, run: RunInfo, *, pid: int, wall_time: float) -> dict:
    """The live state of this learner process (stats.json)."""
    clock, now = run.clock, stats.time

    def run_seconds(monotonic_time: float) -> float:  # on the run's elapsed-seconds clock
        return clock.elapsed(monotonic_time)

    last_step, gap_ended = stats.last_train_step_at, stats.max_train_step_gap_ended_at
    return {
        "time": wall_time,
        "pid": pid,
        "learner_run": stats.learner_run,
        "segment": run.segment,
        "resumed_from": run.resumed_from,
        "elapsed_seconds": clock.elapsed(now),
        "train_steps": stats.train_steps,
        "trained_frames": stats.trained_frames,
        "policy_version": stats.policy_version,
        "frames": stats.frames,
        "episodes": stats.episodes,
        "mean_return": stats.mean_return,
        "return_window_full": stats.return_window_full,
        # Train-step timing of this process (None before its first step).
        "seconds_since_train_step": None if last_step is None else now - last_step,
        "max_train_step_gap_seconds": stats.max_train_step_gap,
        # When that longest gap ended, in this run's elapsed seconds (correlate with checkpoints).
        "max_train_step_gap_ended_at": None if gap_ended is None else run_seconds(gap_ended),
        # The latest gaps over 0.5 s: [seconds, ended at (run seconds)], and when the
        # latest checkpoints were taken (run seconds), to tell what a stall coincided with.
        "long_train_step_gaps": [[gap, run_seconds(ended)] for gap, ended in stats.long_train_step_gaps],
        "checkpoints_taken_at": list(run.checkpoints_taken_at),
        # Env steps of partial unrolls dropped with an actor's stream (lost to training).
        "frames_dropped": stats.frames_dropped,
        "actor_runs_started": stats.actor_runs_started,
        "actor_runs_ended": stats.actor_runs_ended,
        "actors": [
            {"actor_id": a.actor_id, "run_id": a.run_id, "num_envs": a.num_envs} for a in stats.actors
        ],
        "last_checkpoint": run.last_checkpoint,
        # The batch source's own numbers (R2D2: replay size, inserted, sampled, ...).
        "batch_source": stats.batch_source,
    }


def summary_json(
    config: TrainConfig, stats: LearnerStats, target: TargetRecord, run: RunInfo, *,
    stop_reason: str, wall_seconds: float, segment_seconds: float, checkpoint: str,
    evaluation: dict | None, error: str | None = None,
) -> dict:
    """The run's result (summary.json), from the learner's final snapshot."""
    return {
        "agent": config.agent,
        "env": config.env,
        "architecture": config.architecture,
        "precision": config.precision,
        # int8: the measured per-layer plan (share of MACs in int8 per padded batch size).
        "int8_plan": stats.int8_plan,
        # Which devices ran inference and which trained (the same one on a single device).
        "devices": stats.devices,
        "frames": stats.frames,
        "trained_frames": stats.trained_frames,
        "train_steps": stats.train_steps,
        "wall_seconds": wall_seconds,
        "episodes": stats.episodes,
        "mean_return_last100": stats.mean_return,
        "return_window": config.return_window,
        "target_return": config.target_return,
        "reached_target": target.reached,
        "seconds_to_target": target.seconds_to_target,
        "frames_to_target": target.frames_to_target,
        "mean_return_at_target": target.mean_return_at_target,
        "stop_reason": stop_reason,
        # What failed, for stop_reason learner_error (None otherwise).
        "error": error,
        "actor_runs": stats.actor_runs_started,
        # The most env groups (streams) one actor had open at once (docs/wire.md "Actor groups").
        "actor_groups": stats.actor_groups,
        "mean_inference_batch": stats.mean_inference_batch,
        # Which capacity set this segment's rate: env, inference, training or
        # transport (seedq.reporting.bottleneck; as `seedq bench throughput --json`).
        "bottleneck": run_bottleneck(
            segment_seconds, busy_seconds=stats.inference_busy_seconds, held_seconds=stats.queue_held_seconds,
            thread_cpu_seconds=stats.server_thread_cpu_seconds, frames=stats.queue_put_unrolls,
            dropped_frames=stats.queue_dropped_unrolls,
        ) if stats.inference_batches else None,
        # The batcher's rule: as configured, in force at the end, and the share of batches run greedily.
        "batching": {
            "rule": config.server.batching,
            "in_force": stats.batching,
            "greedy_batch_share": (
                stats.greedy_batches / stats.inference_batches if stats.inference_batches else 0.0
            ),
        },
        "checkpoint": checkpoint,
        "policy_version": stats.policy_version,
        # Learner version minus behaviour version, per trained step (None: no training yet).
        "policy_lag_mean": stats.lag.mean,
        "segments": run.segment,
        "segment_seconds": segment_seconds,
        "resumed_from": run.resumed_from,
        "eval": evaluation,
    }


def write_json_atomically(path: str, value: dict, *, indent: int | None = None, durable: bool = True) -> None:
    """Readers see the old file or the new one, never a part; `durable`: on
    disk (fsynced) when this returns."""
    atomic_files.write_json_atomically(path, value, indent=indent, durable=durable)
