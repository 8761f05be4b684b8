"""Videos written by `seedq eval --video` (seedq.evaluation.record_video) show the
game: non-blank frames, at least MIN_VIDEO_SIDE pixels on the short side
(small frames scaled up by whole pixels), at the env's own frame rate."""

from __future__ import annotations

import numpy as np
import pytest

from seedq.config import DmcConfig, EnvOptions
from seedq.envs import env_spec
from seedq.evaluation import MIN_VIDEO_SIDE, RandomPolicy, record_video, video_frame

pytestmark = pytest.mark.e2e  # ffmpeg runs as a subprocess


def read_video(path: str) -> tuple[list[np.ndarray], float]:
    import imageio.v2 as imageio

    reader = imageio.get_reader(path)
    try:
        return [np.asarray(frame) for frame in reader], float(reader.get_meta_data()["fps"])
    finally:
        reader.close()


@pytest.mark.parametrize("env_id, options, fps", [
    # MinAtar renders float [0, 1] 10x10 images and declares no rate (the default 30 fps).
    ("MinAtar/Breakout-v1", EnvOptions(), 30.0),
    # cartpole's control timestep is 0.01 s: 1 / (0.01 x 8) with an action repeat of 8.
    ("dmc:cartpole-balance", EnvOptions(dmc=DmcConfig(action_repeat=8)), 12.5),
])
def test_a_video_shows_the_game_large_enough_at_the_envs_rate(tmp_path, env_id, options, fps):
    path = str(tmp_path / "episode.mp4")
    written = record_video(RandomPolicy(env_spec(env_id, options)), env_id, path, seed=0, options=options)
    frames, read_fps = read_video(path)
    assert written["fps"] == pytest.approx(fps) and read_fps == pytest.approx(fps)
    assert len(frames) == written["frames"] > 1
    assert min(frames[0].shape[:2]) >= MIN_VIDEO_SIDE, frames[0].shape
    # Not blank: each frame has contrast (a uint8 cast of [0, 1] floats gave all-black frames).
    assert all(frame.std() > 10 for frame in frames), [round(float(f.std()), 1) for f in frames[:5]]


def test_small_frames_are_scaled_up_by_whole_pixels():
    frame = np.zeros((10, 12, 3))
    frame[3, 4] = (1.0, 0.5, 0.0)
    big = video_frame(frame)
    assert big.dtype == np.uint8 and big.shape == (80, 96, 3)  # x8: the short side reaches 80
    assert (big[24:32, 32:40] == (255, 128, 0)).all() and big[:24].max() == 0
    assert video_frame(np.zeros((240, 320, 3), np.uint8)).shape == (240, 320, 3)  # large frames stay as they are
