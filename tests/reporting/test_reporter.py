"""The reporter and its parts: the reporter carrying out the run controller's
decisions, the stats.json and summary.json sinks, the policy-lag log, and
`Learner.stats()` of a real (not started) learner (the decisions themselves:
test_run_control.py)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

pytestmark = pytest.mark.unit
from tests.fake_learner import ScriptedLearner, learner_stats

from seedq.config import TrainConfig
from seedq.reporting.run_control import RunClock, TargetRecord
from seedq.reporting.sinks import RunInfo, stats_json, summary_json
from seedq.reporting.stats import ActorStats, LagTotals, PolicyLagLog


# --- the reporter drives them ---


def test_reporter_stops_on_max_frames_and_on_a_failed_learner(tmp_path):
    from seedq.reporting.reporter import RunReporter

    config = TrainConfig(logdir=str(tmp_path), max_frames=10_000, stats_every_seconds=0,
                         checkpoint_every_seconds=0)
    learner = ScriptedLearner(time.monotonic())
    learner.advance()
    learner.advance()  # 10,000 frames
    reporter = RunReporter(config, learner, time.monotonic(), quiet=True)
    assert reporter.run_until_done([]) == "max_frames"
    reporter.close()

    learner.advance(error=ValueError("nan loss"))
    config = TrainConfig(logdir=str(tmp_path), stats_every_seconds=0, checkpoint_every_seconds=0)
    reporter = RunReporter(config, learner, time.monotonic(), quiet=True)
    assert reporter.run_until_done([]) == "learner_error"  # a stop, not a traceback
    assert reporter.error == "ValueError: nan loss"
    reporter.close()


def test_a_signal_stop_request_ends_the_poll_loop(tmp_path):
    """SIGTERM/Ctrl-C only leave a request that the loop takes between polls
    (never an exception raised inside a save)."""
    from seedq.reporting.reporter import RunReporter

    config = TrainConfig(logdir=str(tmp_path), stats_every_seconds=0, checkpoint_every_seconds=0)
    learner = ScriptedLearner(time.monotonic())
    learner.advance()
    reporter = RunReporter(config, learner, time.monotonic(), quiet=True, stop_requested=lambda: "terminated")
    assert reporter.run_until_done([]) == "terminated"
    reporter.close()


# --- stats.json and summary.json ---


def test_stats_json_puts_train_step_times_on_the_run_clock():
    run = RunInfo(RunClock(started=100.0, prior_seconds=50.0), segment=2, resumed_from="/ckpt",
                  last_checkpoint="/ckpt2", checkpoints_taken_at=(55.0, 60.0))
    stats = learner_stats(
        time=130.0, last_train_step_at=128.0, max_train_step_gap=3.0, max_train_step_gap_ended_at=120.0,
        long_train_step_gaps=((3.0, 120.0), (0.7, 125.0)), actors=(ActorStats("a", "r1", 8, 2),),
        batch_source={"replay/size": 40}, frames=123,
    )
    d = json.loads(json.dumps(stats_json(stats, run, pid=7, wall_time=1.5)))
    assert d["elapsed_seconds"] == 80.0 and d["seconds_since_train_step"] == 2.0
    assert d["max_train_step_gap_ended_at"] == 70.0
    assert d["long_train_step_gaps"] == [[3.0, 70.0], [0.7, 75.0]]
    assert d["actors"] == [{"actor_id": "a", "run_id": "r1", "num_envs": 8}]
    assert d["segment"] == 2 and d["checkpoints_taken_at"] == [55.0, 60.0] and d["frames"] == 123
    assert d["batch_source"] == {"replay/size": 40} and d["pid"] == 7
    fresh = stats_json(learner_stats(), run, pid=7, wall_time=1.5)
    assert fresh["seconds_since_train_step"] is None and fresh["max_train_step_gap_ended_at"] is None


def test_summary_json_from_the_final_snapshot():
    config = TrainConfig(target_return=475)
    run = RunInfo(RunClock(0.0), segment=1, resumed_from=None, last_checkpoint=None, checkpoints_taken_at=())
    stats = learner_stats(frames=5000, train_steps=20, lag=LagTotals(batches=2, steps=10, total=15.0),
                          actor_runs_started=3, episodes=40, mean_return=480.0,
                          inference_batches=400, greedy_batches=100, batching="greedy")
    target = TargetRecord(9.5, 4000, 476.0)
    d = summary_json(config, stats, target, run, stop_reason="target_return", wall_seconds=10.0,
                     segment_seconds=10.0, checkpoint="/c", evaluation=None)
    assert d["policy_lag_mean"] == 1.5 and d["actor_runs"] == 3 and d["frames"] == 5000
    assert d["reached_target"] and d["frames_to_target"] == 4000 and d["mean_return_at_target"] == 476.0
    assert d["mean_return_last100"] == 480.0 and d["int8_plan"] is None
    assert d["batching"] == {"rule": "auto", "in_force": "greedy", "greedy_batch_share": 0.25}
    assert summary_json(config, learner_stats(), TargetRecord(), run, stop_reason="max_frames",
                        wall_seconds=1.0, segment_seconds=1.0, checkpoint="/c",
                        evaluation=None)["policy_lag_mean"] is None  # no training yet


# --- the policy-lag log ---


def test_policy_lag_since_any_earlier_mark():
    log = PolicyLagLog()
    start = log.totals()
    log.record(np.array([1, 2, 3]))
    middle = log.totals()
    log.record(np.array([5, 0]))
    now, mean, worst = log.since(middle)
    assert (mean, worst) == (2.5, 5)
    assert log.since(start)[1:] == (pytest.approx(11 / 5), 5)  # a second reader, its own interval
    assert now.mean == pytest.approx(11 / 5) and now.batches == 2
    assert log.since(now)[1:] == (None, None)  # nothing since


# --- Learner.stats() of a real learner ---


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    from seedq.learner.learner import Learner

    config = TrainConfig(logdir=str(tmp_path_factory.mktemp("run")), eval_episodes=0)
    return Learner(config, "unix:unused")


def test_learner_stats_before_any_actor(learner):
    s = learner.stats()
    assert (s.frames, s.train_steps, s.episodes, s.num_connected) == (0, 0, 0, 0)
    assert s.queue_depth == 0 and s.queue_capacity == learner.config.server.queue_capacity_unrolls
    assert s.int8_plan is None and s.error is None and s.mean_return is None
    assert s.latency_p99_seconds is None and s.publish_ms is None  # no interval without `since`


def test_learner_stats_interval_figures_cover_only_what_came_after_the_mark(learner):
    timings = learner.inference.stats
    for _ in range(100):
        timings.latencies.record(0.5)  # before the mark: left out
    mark = learner.stats()
    for ms in (1, 2, 3, 40):
        timings.latencies.record(ms / 1e3)
    learner.episodes.add(np.array([10.0, 20.0]), np.array([10, 30]), 30)
    s = learner.stats(since=mark)
    assert s.latency_p50_seconds == pytest.approx(0.0025) and s.latency_p99_seconds == pytest.approx(0.03889)
    assert s.episodes == mark.episodes + 2 and s.mean_length == pytest.approx(20.0)
    assert learner.stats(since=s).latency_p99_seconds is None


def test_checkpoint_snapshot_carries_the_learner_counters_and_the_run_ones(learner):
    snapshot = learner.checkpoint_snapshot(counters={"elapsed_seconds": 12.0, "segments": 2},
                                           target=TargetRecord().to_dict())
    s = learner.stats()
    assert snapshot.counters == {"train_steps": 0, "trained_frames": 0, "policy_version": 0,
                                 "frames": s.frames, "episodes": s.episodes,
                                 "elapsed_seconds": 12.0, "segments": 2}
    returns, _ = learner.episodes.window()
    assert snapshot.episode_window["returns"] == returns and snapshot.replay is None


def test_int8_learner_stats_carry_its_plan(tmp_path):
    from seedq.learner.learner import Learner

    int8 = Learner(TrainConfig(logdir=str(tmp_path), eval_episodes=0, precision="int8"), "unix:unused")
    plan = int8.stats().int8_plan
    assert plan == int8.int8_plan.to_dict() and set(plan["mac_share"]) >= {"8", "256"}


def test_progress_lines_give_the_time_left_of_a_time_or_frame_budget():
    from seedq.reporting.sinks import Tick, progress_line, time_left

    def tick(frames, seconds, fps):
        return Tick(learner_stats(frames=frames), {}, seconds, fps, 1.0)

    at_60s = tick(30_000, 60.0, 500.0)
    assert time_left(TrainConfig(max_seconds=300, max_frames=0), at_60s) == 240.0
    assert time_left(TrainConfig(max_seconds=0, max_frames=60_000), at_60s) == 60.0  # 30k frames at 500/s
    assert time_left(TrainConfig(max_seconds=300, max_frames=60_000), at_60s) == 60.0  # whichever comes first
    assert time_left(TrainConfig(max_seconds=0, max_frames=0), at_60s) is None
    assert time_left(TrainConfig(max_seconds=0, max_frames=60_000), tick(0, 5.0, 0.0)) is None  # no rate yet
    assert progress_line(TrainConfig(max_seconds=300), at_60s).startswith("[60s, 240s left] ")
    assert progress_line(TrainConfig(max_seconds=0), at_60s).startswith("[60s] ")


def test_quiet_still_prints_the_one_line_result_and_the_run_directory(tmp_path, capsys):
    from seedq.reporting.sinks import ConsoleSink

    config = TrainConfig(logdir=str(tmp_path / "run"), target_return=475)
    summary = {"stop_reason": "max_frames", "frames": 20000, "wall_seconds": 12.5, "frames_to_target": None,
               "seconds_to_target": None, "eval": {"episodes": 10, "policy": "greedy", "seed": 1, "mean": 9.0,
                                                   "std": 1.0, "min": 8, "max": 10}}
    ConsoleSink(config, quiet=True).finish(summary)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("done (max_frames): 20,000 frames") and str(tmp_path / "run") in out[0]
