"""The run controller's decisions from a LearnerStats snapshot: stop conditions,
checkpoint and evaluation schedules."""

from __future__ import annotations

import pytest

from seedq.config import TrainConfig
from seedq.process import exit_codes
from seedq.reporting.run_control import RunClock, RunController, TargetRecord, resumed_target
from tests.fake_learner import learner_stats

pytestmark = pytest.mark.unit


def controller(now: float = 100.0, prior_seconds: float = 0.0, **config) -> RunController:
    cfg = TrainConfig(**{"target_return": None, "max_seconds": 0, "checkpoint_every_seconds": 0, **config})
    return RunController(cfg, RunClock(started=now, prior_seconds=prior_seconds), now)


# --- stop conditions ---


def test_target_needs_a_full_window_and_is_kept_once_reached():
    c = controller(target_return=475, prior_seconds=50.0)
    above = dict(mean_return=480.0, frames=9000)
    assert c.stop_reason(learner_stats(time=110.0, return_window_full=False, **above)) is None
    assert c.stop_reason(learner_stats(time=111.0, return_window_full=True, mean_return=474.9)) is None
    assert not c.target.reached
    assert c.stop_reason(learner_stats(time=112.0, return_window_full=True, **above)) == "target_return"
    # Run seconds include the earlier segments' 50 s.
    assert c.target == TargetRecord(seconds_to_target=62.0, frames_to_target=9000, mean_return_at_target=480.0)
    # The record is of the first time: a later dip, or a later better mean, does not change it.
    later = learner_stats(time=130.0, return_window_full=True, mean_return=400.0, frames=20000)
    assert c.stop_reason(later) == "target_return" and c.target.frames_to_target == 9000


def test_no_target_never_stops_on_returns():
    c = controller(target_return=None)
    assert c.stop_reason(learner_stats(return_window_full=True, mean_return=1e9)) is None
    assert not c.target.reached


def test_max_seconds_counts_the_earlier_segments():
    c = controller(now=100.0, prior_seconds=50.0, max_seconds=60)
    assert c.stop_reason(learner_stats(time=109.9, frames=1)) is None
    assert c.stop_reason(learner_stats(time=110.0, frames=1)) == "max_seconds"
    assert controller(max_seconds=0).stop_reason(learner_stats(time=1e9)) is None  # 0: no limit


def test_a_time_budget_spent_without_an_actor_frame_is_no_actors():
    c = controller(now=0.0, max_seconds=20)
    assert c.stop_reason(learner_stats(time=19.0, frames=0)) is None
    assert c.stop_reason(learner_stats(time=20.0, frames=0)) == "no_actors"
    assert exit_codes.for_stop_reason("no_actors") == exit_codes.RUNTIME_FAILURE


def test_max_frames():
    c = controller(max_frames=1000)
    assert c.stop_reason(learner_stats(frames=999)) is None
    assert c.stop_reason(learner_stats(frames=1000)) == "max_frames"


def test_stop_reasons_in_order_target_limits_error_actors():
    failed = RuntimeError("boom")
    c = controller(target_return=10, max_frames=100)
    assert c.stop_reason(learner_stats(error=failed), actors_exited=True) == "learner_error"
    assert c.stop_reason(learner_stats(), actors_exited=True) == "actors_exited"
    assert c.stop_reason(learner_stats(frames=100, error=failed), actors_exited=True) == "max_frames"
    done = learner_stats(frames=100, return_window_full=True, mean_return=10.0, error=failed)
    assert c.stop_reason(done) == "target_return"


def test_resumed_target_is_kept_only_for_the_same_target():
    saved = {"seconds_to_target": 12.5, "frames_to_target": 700, "mean_return_at_target": 480.0}
    cfg = TrainConfig(target_return=475)
    assert resumed_target(cfg, saved, {"target_return": 475}) == TargetRecord(12.5, 700, 480.0)
    assert resumed_target(cfg, saved, {"target_return": 200}) == TargetRecord()
    c = RunController(cfg, RunClock(0.0), 0.0, target=resumed_target(cfg, saved, {"target_return": 475}))
    assert c.stop_reason(learner_stats()) == "target_return"  # reached in an earlier segment


# --- checkpoint and eval schedules ---


def test_checkpoint_due_every_seconds_counted_from_the_last_one():
    c = controller(now=100.0, checkpoint_every_seconds=30)
    assert not c.checkpoint_due(learner_stats(time=129.9))
    assert c.checkpoint_due(learner_stats(time=130.0))
    c.checkpoint_taken(train_step=5, now=131.0)
    assert not c.checkpoint_due(learner_stats(time=160.9))
    assert c.checkpoint_due(learner_stats(time=161.0))
    assert not controller(checkpoint_every_seconds=0).checkpoint_due(learner_stats(time=1e9))


def test_step_checkpoints_fall_on_multiples_of_the_interval_whatever_came_between():
    c = controller(checkpoint_every_steps=100)
    assert not c.checkpoint_due(learner_stats(train_steps=99))
    assert c.checkpoint_due(learner_stats(train_steps=100))
    c.checkpoint_taken(train_step=150, now=100.0)  # e.g. the time trigger's, between two multiples
    assert not c.checkpoint_due(learner_stats(train_steps=199))
    assert c.checkpoint_due(learner_stats(train_steps=200))
    # A run resumed from a checkpoint between two multiples keeps the spacing.
    cfg = TrainConfig(checkpoint_every_steps=100, checkpoint_every_seconds=0)
    resumed = RunController(cfg, RunClock(0.0), 0.0, last_checkpoint_step=1050)
    assert not resumed.checkpoint_due(learner_stats(train_steps=1099))
    assert resumed.checkpoint_due(learner_stats(train_steps=1100))


def test_eval_due_every_seconds_only_with_eval_episodes():
    c = controller(now=100.0, eval_every_seconds=10, eval_episodes=5)
    assert not c.eval_due(109.9)
    assert c.eval_due(110.0)
    assert not c.eval_due(119.9)  # the interval restarted
    assert c.eval_due(120.0)
    assert not controller(eval_every_seconds=10, eval_episodes=0).eval_due(1e9)
    assert not controller(eval_every_seconds=0, eval_episodes=5).eval_due(1e9)
