"""Frames, stacks, actions and rewards stay paired end to end (actor process,
inference server, the learner's stack rebuild).

The env is a pixel bandit whose rewarded action is named by a cue shown two
frames earlier: the stack's third-newest frame. So in every unroll the
learner receives, the reward that follows an action is 1 exactly when the
action names the cue in the third-newest frame of the stack the learner
rebuilds for that step. Any off-by-one between the pieces (a stack shifted by
a frame, a reward booked to the wrong step, the server's stored stack from
another step) breaks that equality on about three steps in four, whatever the
policy: the check needs no learning, only frames.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from tests.queue_tap import QueueTap

from seedq.bench.drain import drain_unrolls
from seedq.envs import run_defaults
from seedq.learner.learner import Learner

DELAYED_CUE_ENV = '''
import gymnasium as gym
import numpy as np

CUES = 4
STEPS = 20


class DelayedCue(gym.Env):
    """16x16 grey frames; one of four bands lit (the cue), and the bottom-right
    pixel the step's index in the episode. The rewarded action is the cue of two
    steps before: the stack's third frame. 20 steps; chance earns 5."""

    observation_space = gym.spaces.Box(0, 255, (16, 16), np.uint8)
    action_space = gym.spaces.Discrete(CUES)

    def _frame(self):
        frame = np.zeros((16, 16), np.uint8)
        frame[self.cues[-1] * 4:(self.cues[-1] + 1) * 4, :] = 255
        frame[15, 15] = self.t
        return frame

    def _draw(self):
        self.cues.append(int(self.np_random.integers(CUES)))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.cues = []
        for _ in range(3):  # the first two rewarded cues were never shown: 0.25 each at best
            self._draw()
        return self._frame(), {}

    def step(self, action):
        reward = float(int(action) == self.cues[-3])
        self.t += 1
        self._draw()
        return self._frame(), reward, False, self.t >= STEPS, {}


gym.register("DelayedCue-v0", entry_point="delayed_cue:DelayedCue", max_episode_steps=STEPS)
'''


ENV_ID = "delayed_cue:DelayedCue-v0"
# Unrolls checked: 80 of 41 steps (10 trained, 30 of lookahead and the
# bootstrap step), ~150 episodes of 20 steps.
UNROLLS = 80


@pytest.fixture
def delayed_cue_env(importable_module):
    """The delayed_cue module importable here and in the actor processes (PYTHONPATH)."""
    return importable_module("delayed_cue", DELAYED_CUE_ENV)


class UnrollTap(QueueTap):
    """Keeps every chunk of unrolls the learner's queue accepts."""

    def __init__(self, queue):
        self.chunks = []
        super().__init__(queue)

    def record(self, chunk):
        self.chunks.append({k: np.asarray(v) for k, v in chunk.items()})


def cue(frames: np.ndarray) -> np.ndarray:
    """The lit band (0-3) of [..., 16, 16] frames."""
    return frames[..., ::4, 0].argmax(-1)


def expected_steps(step: np.ndarray, size: int) -> np.ndarray:
    """The episode steps a stack of `size` frames ending at episode step `step`
    holds, oldest first: the reset padding repeats step 0."""
    return np.maximum(step[..., None] - np.arange(size - 1, -1, -1), 0)


@pytest.mark.e2e
def test_rewards_follow_the_action_and_the_cue_two_frames_back_in_every_unroll(tmp_path, delayed_cue_env):
    config = dataclasses.replace(run_defaults(ENV_ID), env=ENV_ID)  # the pixel envs' defaults
    learner = Learner(config, f"unix:{tmp_path}/learner.sock")
    tap = UnrollTap(learner.queue)
    actor = None
    try:
        address = learner.start(consume=drain_unrolls)
        actor = subprocess.Popen(
            [sys.executable, "-m", "seedq.cli", "actor", "--server", address, "--env", ENV_ID,
             "--num-envs", "16", "--actor-id", "cue"],
            env=delayed_cue_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 180
        while tap.unrolls < UNROLLS:
            assert time.monotonic() < deadline, f"{tap.unrolls} unrolls in 180 s"
            assert actor.poll() is None, "the actor exited"
            time.sleep(0.1)
    finally:
        if actor is not None:
            actor.kill()
            actor.wait(timeout=30)
        learner.stop()
    with tap.lock:
        chunks = list(tap.chunks)
    batch = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
    stacks = np.asarray(jax.jit(learner.agent.frames.unroll)(batch))  # the learner's own rebuild
    assert stacks.shape[2:] == (16, 16, 4), stacks.shape
    # Every step's stack holds this episode's last four frames in order, the
    # first steps' from the server's stored stack (core/frames) too.
    steps = stacks[..., 15, 15, :].astype(int)  # [B, T, 4]
    np.testing.assert_array_equal(steps, expected_steps(steps[..., -1], 4))
    assert (steps[..., -1] == 0).sum() > 20 and steps[..., -1].max() >= 19  # starts and ends covered
    # Step t's action is rewarded in step t + 1's record (unless that one
    # starts a new episode) by whether it named the cue two frames back;
    # before episode step 2 that cue was never shown, and the reward is chance.
    action, reward, first = batch["action"][:, :-1], batch["reward"][:, 1:], batch["first"][:, 1:]
    checked = ~first & (steps[:, :-1, -1] >= 2)
    named = action == cue(stacks[:, :-1, ..., -3])
    assert checked.sum() > 1000
    np.testing.assert_array_equal((reward == 1.0)[checked], named[checked])
    assert 0.1 < reward[checked].mean() < 0.5  # an untrained policy: both outcomes occur
