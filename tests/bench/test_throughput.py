"""`seedq bench throughput`'s trained frames and bottleneck, and the unroll
queue's drop_oldest rule that keeps inference from waiting on training."""

import dataclasses

import numpy as np
import pytest

from seedq.bench import throughput
from seedq.server.unrolls import UnrollQueue


def _chunk(first: int, n: int) -> dict:
    return {"reward": np.arange(first, first + n, dtype=np.float32)}


@pytest.mark.unit
def test_a_full_queue_drops_its_oldest_unrolls_under_drop_oldest():
    queue = UnrollQueue(4, drop_oldest=True)
    for first in (0, 2, 4):
        assert queue.try_put(_chunk(first, 2))  # never refused
    # The third chunk found 4 queued: the oldest chunk (0, 1) made room for it.
    assert queue.dropped_unrolls == 2 and len(queue) == 4
    assert list(queue.get(4)["reward"]) == [2, 3, 4, 5]


@pytest.mark.unit
def test_a_full_queue_refuses_under_wait():
    queue = UnrollQueue(4)
    assert queue.try_put(_chunk(0, 4))
    assert not queue.try_put(_chunk(4, 2))
    assert queue.dropped_unrolls == 0 and len(queue) == 4


@pytest.mark.unit
@pytest.mark.parametrize("measured, expected", [
    (dict(queue_full_share=0.9, inference_share=0.05, server_thread_busy=0.3), "training"),
    (dict(queue_full_share=0.0, inference_share=0.05, server_thread_busy=0.3, dropped_share=0.7), "training"),
    (dict(queue_full_share=0.1, inference_share=0.8, server_thread_busy=0.9), "inference"),
    (dict(queue_full_share=0.0, inference_share=0.2, server_thread_busy=0.95), "transport"),
    (dict(queue_full_share=0.0, inference_share=0.2, server_thread_busy=0.3), "env"),
])
def test_the_bottleneck_is_the_capacity_the_loop_spent_its_time_on(measured, expected):
    assert throughput.bottleneck_of(True, **measured) == expected


@pytest.mark.unit
def test_without_training_the_learner_is_never_the_bottleneck():
    assert throughput.bottleneck_of(False, 0.9, 0.1, 0.2) == "env"


@pytest.mark.e2e
def test_trained_and_dropped_frames_account_for_the_frames_stepped():
    """With drop_oldest and a small queue, every frame the actors stepped was
    trained on, dropped unseen, or is still queued / in an unfinished unroll."""
    import dataclasses

    from seedq.config import ServerConfig
    from seedq.envs import run_defaults

    base = run_defaults("CartPole-v1")
    config = dataclasses.replace(
        base, env="CartPole-v1", num_actors=1, envs_per_actor=8,
        vtrace=dataclasses.replace(base.vtrace, reuse=1, lookahead=0),
        server=ServerConfig(queue_capacity_unrolls=16, queue_full="drop_oldest"),
    )
    config.validate()
    seconds = 3.0
    result = throughput.system_fps(config, seconds=seconds, warmup_seconds=1.0, train=True)
    assert result["trained_fps"] > 0
    assert result["bottleneck"] in ("env", "inference", "training", "transport")
    unroll = config.vtrace.unroll_length
    # In flight at either end of the window: a queue's worth, a batch being
    # trained on, and each env's unfinished unroll.
    slack = (16 + config.vtrace.batch_size + 8) * unroll * 2 / seconds
    accounted = result["trained_fps"] + result["dropped_fps"]
    assert accounted == pytest.approx(result["system_fps"], abs=slack)


@pytest.mark.e2e
def test_the_cli_resolves_the_envs_defaults_and_passes_agent_flags_through(capsys):
    """As `seedq train`: Pong's pixel defaults (agent and server), then the --vtrace.* flags given."""
    import json

    from seedq import cli

    argv = ["bench", "throughput", "--env", "ALE/Pong-v5", "--actors", "1", "--envs-per-actor", "2",
            "--seconds", "1", "--warmup-seconds", "0.5", "--json", "--no-train", "--vtrace.unroll-length", "5"]
    assert cli.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["vtrace.reuse"], result["vtrace.lookahead"], result["vtrace.unroll_length"]) == (1, 0, 5)
    assert result["server.queue_full"] == "pace"  # the server section too
    assert result["system_fps"] > 0


@pytest.mark.e2e
@pytest.mark.parametrize("rule, drops, paced", [("wait", False, False), ("drop_oldest", True, False), ("pace", False, True)])
def test_the_learner_builds_its_unroll_queue_with_the_configured_rule(tmp_path, rule, drops, paced):
    from seedq.config import ServerConfig, TrainConfig
    from seedq.learner.learner import Learner

    config = TrainConfig(env="CartPole-v1", logdir=str(tmp_path), server=ServerConfig(queue_full=rule))
    config.validate()
    learner = Learner(config, f"unix:{tmp_path}/l.sock")
    try:
        assert learner.queue.drop_oldest is drops and learner.inference.pace is paced
    finally:
        learner.stop()
    # IMPALA actors push past the batch loop: their service paces the pushes.
    config = dataclasses.replace(config, architecture="impala", logdir=str(tmp_path / "impala"))
    config.validate()
    learner = Learner(config, f"unix:{tmp_path}/i.sock")
    try:
        assert learner.queue.drop_oldest is drops and learner._make_service().pace is paced
    finally:
        learner.stop()


@pytest.mark.unit
def test_an_unknown_queue_full_rule_is_one_line():
    from seedq.config import ServerConfig

    with pytest.raises(ValueError, match=r"^server.queue_full='drop': choose one of wait, drop_oldest, pace$"):
        ServerConfig(queue_full="drop").validate()


@pytest.mark.unit
def test_pacing_starts_past_two_batches_matches_the_learners_rate_and_slows_further_with_the_backlog():
    from seedq.server.pacing import MAX_SLOWDOWN, pace_interval

    # The learner takes 64 unrolls/s; the batch recorded 1.6 unrolls' worth of steps.
    assert pace_interval(1.6, backlog=32, target=32, take_rate=64.0) == 0.0  # at the target: full speed
    assert pace_interval(1.6, backlog=40, target=32, take_rate=None) == 0.0  # rate not known yet
    assert pace_interval(1.6, backlog=33, target=32, take_rate=64.0) == pytest.approx(1.6 / 64 * 33 / 32)
    assert pace_interval(1.6, backlog=900, target=32, take_rate=64.0) == pytest.approx(1.6 / 64 * MAX_SLOWDOWN)


@pytest.mark.unit
def test_an_impala_push_is_acknowledged_once_the_learner_has_drained_the_queue_to_it_and_the_target():
    """IMPALA actors push unrolls past the batch loop; under `pace` the
    acknowledgement (and so the actor) waits until the queue holds no more
    than this push and two learner batches: a push larger than the target is
    not held longer than the learner needs to reach it."""
    import asyncio
    import types

    from seedq.impala.service import ImpalaLearnerService

    queue = UnrollQueue(capacity=256)
    chunk = lambda n: {"x": np.zeros((n, 3), np.float32)}
    queue.try_put(chunk(8))
    assert queue.get(4, timeout=1) is not None  # the learner's batch: 4 unrolls, target 2 x 4
    assert queue.pace_target() == 8
    queue.try_put(chunk(36))
    queue.try_put(chunk(32))  # this stream's push: 72 queued, acknowledged at 32 + 8 = 40
    entry = types.SimpleNamespace(closed=False)
    backlog_at_ack = []

    async def push_and_train():
        hold = asyncio.ensure_future(ImpalaLearnerService._hold_until_drained(queue, 32, entry))
        while not hold.done():
            await asyncio.sleep(0.01)
            if hold.done():
                break
            assert len(queue) > 40, "held past the point it should have been acknowledged"
            queue.get(4, timeout=1)  # one train step
            await asyncio.sleep(0.03)  # > the poll's longest wait: the hold sees each backlog
        backlog_at_ack.append(len(queue))
        await hold

    asyncio.run(push_and_train())
    assert backlog_at_ack == [40]
    # Under the target plus the push: acknowledged at once.
    asyncio.run(ImpalaLearnerService._hold_until_drained(queue, 32, entry))
    # A superseded run stops waiting.
    queue.try_put(chunk(100))
    from seedq.server.inference import RunSuperseded
    entry.closed = True
    with pytest.raises(RunSuperseded):
        asyncio.run(ImpalaLearnerService._hold_until_drained(queue, 32, entry))


@pytest.mark.unit
def test_the_queue_measures_the_rate_the_learner_takes_unrolls_and_its_pacing_target(monkeypatch):
    from seedq.server import unrolls

    clock = iter([10.0, 10.5, 11.0])
    monkeypatch.setattr(unrolls.time, "monotonic", lambda: next(clock))
    queue = UnrollQueue(64)
    assert queue.pace_target() == 0 and queue.take_rate.per_second() is None
    queue.try_put(_chunk(0, 48))
    for _ in range(3):
        queue.get(16)
    # Two takes of 16 after the first, over one second; two batches of 16 kept.
    assert queue.take_rate.per_second() == pytest.approx(32.0)
    assert queue.pace_target() == 32


@pytest.mark.e2e
def test_pacing_keeps_the_learner_on_fresh_unrolls_when_training_is_the_bottleneck():
    """A learner far slower than its actors (a wide MLP trained 16 times per
    batch): under `wait` the 256-unroll queue fills and the learner trains on
    unrolls 16 batches old; paced, the loop slows before that.

    Reuse 16 holds the loop back for ~75 % of the window, alone or beside
    other CPU work; at reuse 8 it was ~55 %, so a busy machine (another test
    worker stepping envs) could tip the verdict to `env`. Much slower still
    (reuse 32) and the queue a first compile let fill is not drained by the
    end of the warm-up, so the window would measure that backlog's lag."""
    import dataclasses

    from seedq.config import ServerConfig
    from seedq.envs import run_defaults

    base = run_defaults("CartPole-v1")
    config = dataclasses.replace(
        base, env="CartPole-v1", num_actors=1, envs_per_actor=16,
        vtrace=dataclasses.replace(base.vtrace, reuse=16, hidden_sizes=(512, 512)),
        server=ServerConfig(queue_full="pace"),
    )
    config.validate()
    result = throughput.system_fps(config, seconds=4.0, warmup_seconds=2.0, train=True)
    assert result["bottleneck"] == "training" and result["paced_share"] > 0
    batches_queued_when_full = config.server.queue_capacity_unrolls / config.vtrace.batch_size
    assert result["policy_lag_mean"] < batches_queued_when_full * config.vtrace.reuse / 2
