"""When a run stops, checkpoints and evaluates: decisions made from `LearnerStats`.

Pure book-keeping (no threads, no I/O, no clock reads of its own: every
decision takes the time from the snapshot it is given), so each rule can be
tested with hand-made snapshots. `seedq.reporting.reporter` carries the
decisions out.

A resumed run continues its clock (`RunClock.prior_seconds`) and, when the
target is still the same, the record of when it was reached.
"""

from __future__ import annotations

import dataclasses

from seedq.config import TrainConfig
from seedq.reporting.stats import LearnerStats

INF = float("inf")


@dataclasses.dataclass(frozen=True)
class RunClock:
    """The run's elapsed seconds over all its segments (resumes)."""

    started: float  # time.monotonic() when this segment's command started
    prior_seconds: float = 0.0  # elapsed seconds of the earlier segments

    def elapsed(self, now: float) -> float:
        """`now` (a time.monotonic()) in seconds of this run so far."""
        return self.prior_seconds + now - self.started


@dataclasses.dataclass(frozen=True)
class TargetRecord:
    """When the target return was reached (all None: not yet)."""

    seconds_to_target: float | None = None
    frames_to_target: int | None = None
    # The window mean that met the target (the final one can differ: episodes
    # that actors finish after the check still enter the window).
    mean_return_at_target: float | None = None

    @property
    def reached(self) -> bool:
        return self.frames_to_target is not None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def resumed_target(config: TrainConfig, saved_target: dict, saved_config: dict) -> TargetRecord:
    """The checkpoint's target record, if its target is still this run's
    (a resume that changes --target-return starts the record afresh)."""
    if saved_config.get("target_return") != config.target_return:
        return TargetRecord()
    return TargetRecord(**{f.name: saved_target.get(f.name) for f in dataclasses.fields(TargetRecord)})


class RunController:
    """Stop conditions (target return, max seconds, max frames, a failed
    learner, every actor gone), the checkpoint schedule (seconds and train
    steps) and the periodic evaluation schedule."""

    def __init__(
        self, config: TrainConfig, clock: RunClock, now: float, *,
        target: TargetRecord = TargetRecord(), last_checkpoint_step: int | None = None,
    ):
        self.config = config
        self.clock = clock
        self.target = target
        self._last_checkpoint_step = last_checkpoint_step
        self._next_checkpoint_time = now + (config.checkpoint_every_seconds or INF)
        self._next_eval_time = now + (config.eval_every_seconds or INF)

    def observe(self, stats: LearnerStats) -> None:
        """Records the moment the return window (full) first meets the target."""
        target = self.config.target_return
        if self.target.reached or target is None:
            return
        if stats.return_window_full and stats.mean_return is not None and stats.mean_return >= target:
            self.target = TargetRecord(self.clock.elapsed(stats.time), stats.frames, float(stats.mean_return))

    def stop_reason(self, stats: LearnerStats, *, actors_exited: bool = False,
                    frames_settled: bool = True) -> str | None:
        """Why the run stops now (None: it goes on); checks the target first.
        `frames_settled` False: max_frames is not checked yet (a deterministic
        run stops there once training has caught up with the last frame)."""
        self.observe(stats)
        cfg = self.config
        if cfg.target_return is not None and self.target.reached:
            return "target_return"
        if cfg.max_seconds and self.clock.elapsed(stats.time) >= cfg.max_seconds:
            # A budget spent without a single actor frame is no finished run:
            # the actors never reached this learner (address, credentials, env).
            return "no_actors" if stats.frames == 0 else "max_seconds"
        if cfg.max_frames and stats.frames >= cfg.max_frames and frames_settled:
            return "max_frames"
        if stats.error is not None:
            return "learner_error"
        if actors_exited:
            return "actors_exited"
        return None

    def checkpoint_due(self, stats: LearnerStats) -> bool:
        if stats.time >= self._next_checkpoint_time:
            return True
        # Step checkpoints fall on multiples of the interval, so a run resumed
        # from a checkpoint taken between them (SIGTERM, the time trigger) keeps the spacing.
        every = self.config.checkpoint_every_steps
        return bool(every and stats.train_steps // every > (self._last_checkpoint_step or 0) // every)

    def checkpoint_taken(self, train_step: int, now: float) -> None:
        """Restarts both checkpoint intervals (`now`: a time.monotonic())."""
        self._last_checkpoint_step = train_step
        self._next_checkpoint_time = now + (self.config.checkpoint_every_seconds or INF)

    def eval_due(self, now: float) -> bool:
        """Whether a periodic evaluation should start now; a True restarts the interval."""
        if not self.config.eval_episodes or now < self._next_eval_time:
            return False
        self._next_eval_time = now + self.config.eval_every_seconds
        return True


# Stop reasons after which the run is over for good: the actors are told so
# (docs/wire.md "The end of a run") and stop. After the others (SIGTERM, a
# learner failure) a supervisor restarts the learner, and actors wait for it.
RUN_OVER_REASONS = ("target_return", "max_seconds", "max_frames", "no_actors", "actors_exited", "interrupted")


def run_is_over(stop_reason: str) -> bool:
    return stop_reason in RUN_OVER_REASONS


def process_report(stats: LearnerStats, returns, lengths, *, actors_exited: bool) -> dict:
    """What one learner process of a group tells process 0 each round (JSON):
    its own counters and its latest episodes (`returns` / `lengths`, oldest first)."""
    return {
        "frames": int(stats.frames),
        "episodes": int(stats.episodes),
        "train_steps": int(stats.train_steps),
        "returns": [float(r) for r in returns],
        "lengths": [float(n) for n in lengths],
        "actors_exited": bool(actors_exited),
        "error": None if stats.error is None else f"{type(stats.error).__name__}: {stats.error}",
    }


def pooled_window(reports: list[dict], window: int) -> tuple[list[float], list[float]]:
    """The group's return window: each process's latest ceil(window / processes)
    episodes (returns, lengths), process by process."""
    share = -(-window // len(reports))
    return ([r for rep in reports for r in rep["returns"][-share:]],
            [n for rep in reports for n in rep["lengths"][-share:]])


def group_totals(reports: list[dict], window: int) -> dict:
    """The group's counters from every process's report: frames and episodes
    summed, and the return window pooled (`pooled_window`; full once it
    holds `window` episodes)."""
    returns, lengths = pooled_window(reports, window)
    return {
        "frames": sum(rep["frames"] for rep in reports),
        "episodes": sum(rep["episodes"] for rep in reports),
        "mean_return": sum(returns) / len(returns) if returns else None,
        "mean_length": sum(lengths) / len(lengths) if lengths else None,
        "return_window_full": len(returns) >= window,
    }


def with_totals(stats: LearnerStats, totals: dict | None) -> LearnerStats:
    """`stats` with the group's counters in place of this process's own."""
    if not totals:
        return stats
    return dataclasses.replace(
        stats, frames=totals["frames"], episodes=totals["episodes"], mean_return=totals["mean_return"],
        mean_length=totals["mean_length"], return_window_full=totals["return_window_full"],
    )
