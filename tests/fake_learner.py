"""A stand-in for `Learner` as the reporter sees it: `stats()` returns
`LearnerStats` values (the only thing the reporter reads), `metrics()` the
training metrics."""

from __future__ import annotations

import dataclasses

from seedq.reporting.stats import LagTotals, LearnerStats


def learner_stats(**overrides) -> LearnerStats:
    """A snapshot of a learner that has done nothing yet, with `overrides`."""
    fields = dict(
        time=0.0, learner_run="fake", frames=0, frames_dropped=0, episodes=0, mean_return=None,
        mean_length=None, return_window_full=False, train_steps=0, trained_frames=0, policy_version=0,
        last_train_step_at=None, max_train_step_gap=0.0, max_train_step_gap_ended_at=None,
        long_train_step_gaps=(), publishes=0, publish_seconds_total=0.0, waiting_for_actors=False,
        error=None, lag=LagTotals(), inference_batches=0, mean_inference_batch=0.0, inference_compiles=0,
        latency_count=0, batching="wait", greedy_batches=0, queue_depth=0, queue_capacity=256, actors=(),
        actor_runs_started=0, actor_runs_ended=0, batch_source={}, int8_plan=None,
        devices={"inference": [0], "training": [0]},
    )
    return LearnerStats(**{**fields, **overrides})


class ScriptedLearner:
    """A run that advances one second, 5000 frames and 20 train steps per
    `advance()`; every interval has the same latency, lag and publish figures."""

    INTERVAL = dict(latency_p50_seconds=0.0025, latency_p99_seconds=0.03889, policy_lag_mean=1.5,
                    policy_lag_max=3, publish_ms=1.0)

    def __init__(self, started: float, **overrides):
        self.current = learner_stats(time=started, **overrides)

    def advance(self, **changes) -> None:
        s = self.current
        self.current = dataclasses.replace(
            s, time=s.time + 1.0, frames=s.frames + 5000, train_steps=s.train_steps + 20,
            policy_version=s.policy_version + 20, **changes,
        )

    def stats(self, since: LearnerStats | None = None) -> LearnerStats:
        return self.current if since is None else dataclasses.replace(self.current, **self.INTERVAL)

    def metrics(self) -> dict:
        return {"loss/total": 0.5, "grad_norm": 1.25}
