"""Partially observable check environments, registered with gymnasium on import.

`seedq/CartPoleNoVelocity-v1`: CartPole-v1 (500-step limit, same dynamics and
reward) whose observation keeps only the cart position and the pole angle
(obs[0], obs[2]); the two velocities are removed. A feed-forward policy sees
only where the pole is, not where it is going, so it needs memory (e.g. an
LSTM that can difference consecutive observations) to balance it well.

Both the single env (`gym.make`) and the numpy vector env (`gym.make_vec`,
CartPole's fast vectorised implementation with next-step autoreset) are
registered, so actors step it exactly as fast as CartPole-v1.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv, CartPoleVectorEnv

CARTPOLE_NO_VELOCITY = "seedq/CartPoleNoVelocity-v1"
# Observation components kept: cart position, pole angle.
KEPT = np.array([0, 2])


def _masked_box(box: gym.spaces.Box) -> gym.spaces.Box:
    return gym.spaces.Box(box.low[..., KEPT], box.high[..., KEPT], dtype=box.dtype)


class VelocityMask(gym.ObservationWrapper):
    """Drops the velocity components of a CartPole observation: [4] -> [2]."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space = _masked_box(env.observation_space)

    def observation(self, observation):
        return observation[KEPT]


def make_cartpole_no_velocity(**kwargs) -> gym.Env:
    return VelocityMask(CartPoleEnv(**kwargs))


def make_cartpole_no_velocity_vector(num_envs: int = 1, **kwargs) -> gym.vector.VectorEnv:
    env = CartPoleVectorEnv(num_envs=num_envs, **kwargs)
    return gym.wrappers.vector.TransformObservation(
        env,
        lambda obs: obs[:, KEPT],
        observation_space=_masked_box(env.observation_space),
        single_observation_space=_masked_box(env.single_observation_space),
    )


def register() -> None:
    if CARTPOLE_NO_VELOCITY in gym.registry:
        return
    gym.register(
        id=CARTPOLE_NO_VELOCITY,
        entry_point=make_cartpole_no_velocity,
        vector_entry_point=make_cartpole_no_velocity_vector,
        max_episode_steps=500,
        reward_threshold=475.0,
    )


register()
