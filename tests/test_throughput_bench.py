"""`seedq bench throughput`'s trained frames and bottleneck, and the unroll
queue's drop_oldest rule that keeps inference from waiting on training."""

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
    from seedq.flags import env_defaults

    base = env_defaults("CartPole-v1")
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
    """As `seedq train`: Pong's pixel defaults, then the --vtrace.* flags given."""
    import json

    from seedq import cli

    argv = ["bench", "throughput", "--env", "ALE/Pong-v5", "--actors", "1", "--envs-per-actor", "2",
            "--seconds", "1", "--warmup-seconds", "0.5", "--json", "--no-train", "--vtrace.unroll-length", "5"]
    assert cli.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["vtrace.reuse"], result["vtrace.lookahead"], result["vtrace.unroll_length"]) == (1, 0, 5)
    assert result["system_fps"] > 0


@pytest.mark.e2e
@pytest.mark.parametrize("rule, drops", [("wait", False), ("drop_oldest", True)])
def test_the_learner_builds_its_unroll_queue_with_the_configured_rule(tmp_path, rule, drops):
    from seedq.config import ServerConfig, TrainConfig
    from seedq.learner.learner import Learner

    config = TrainConfig(env="CartPole-v1", logdir=str(tmp_path), server=ServerConfig(queue_full=rule))
    config.validate()
    learner = Learner(config, f"unix:{tmp_path}/l.sock")
    try:
        assert learner.queue.drop_oldest is drops
    finally:
        learner.stop()


@pytest.mark.unit
def test_an_unknown_queue_full_rule_is_one_line():
    from seedq.config import ServerConfig

    with pytest.raises(ValueError, match=r"^server.queue_full='drop': choose one of wait, drop_oldest$"):
        ServerConfig(queue_full="drop").validate()
