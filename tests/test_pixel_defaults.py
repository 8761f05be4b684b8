"""The V-trace defaults follow the observation: pixel frames (Atari) get one
pass per frame and unscaled clipped rewards, and a server that paces its
batches to the learner; small grids and vectors keep the
small-env defaults."""

import json

import numpy as np
import pytest

from seedq import cli
from seedq.config import PIXEL_VTRACE, VTraceConfig, is_pixel_observation
from seedq.envs import run_defaults

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("shape, dtype, pixels", [
    ((84, 84), np.uint8, True),  # Atari's grey frames, stacked on the learner
    ((64, 64, 3), np.uint8, True),
    ((10, 10, 4), bool, False),  # MinAtar
    ((10, 10, 4), np.uint8, False),  # too small for the Nature CNN
    ((84,), np.uint8, False),
    ((4,), np.float32, False),
])
def test_pixel_observations_are_uint8_frames_of_nature_cnn_size(shape, dtype, pixels):
    assert is_pixel_observation(shape, dtype) is pixels


def test_pong_gets_the_pixel_defaults_and_minatar_the_small_env_ones():
    pong, minatar = run_defaults("ALE/Pong-v5"), run_defaults("MinAtar/Breakout-v1")
    assert pong.vtrace == PIXEL_VTRACE and minatar.vtrace == VTraceConfig()
    assert PIXEL_VTRACE.reuse == 1 and PIXEL_VTRACE.lookahead == 0
    assert PIXEL_VTRACE.learning_rate < VTraceConfig().learning_rate and PIXEL_VTRACE.adam_eps > VTraceConfig().adam_eps
    assert PIXEL_VTRACE.cnn_channel_norm and not minatar.vtrace.cnn_channel_norm  # MinAtar's small CNN has none
    assert PIXEL_VTRACE.batch_size == 4 and minatar.vtrace.batch_size == 16
    assert (pong.server.queue_full, minatar.server.queue_full) == ("pace", "wait")


def test_print_config_shows_the_pixel_defaults_and_flags_override_them(capsys):
    assert cli.main(["train", "--env", "ALE/Pong-v5", "--vtrace.reuse", "2", "--print-config"]) == 0
    config = json.loads(capsys.readouterr().out)
    vtrace = config["vtrace"]
    assert (vtrace["reuse"], vtrace["lookahead"], vtrace["reward_scale"]) == (2, 0, 1.0)
    assert (vtrace["cnn_channel_norm"], vtrace["batch_size"]) == (True, 4)
    assert config["server"]["queue_full"] == "pace"
