"""Environment construction shared by actors, the learner and benchmarks.

Actors step a gymnasium *vector* env. seedq relies on gymnasium's default
next-step autoreset: the step that ends an episode returns its final
observation, and the env's following step is a reset step (reward 0, first
observation of the next episode, action ignored). The learner masks that
reset transition out of the loss, which lets it bootstrap correctly from the
final observation of truncated episodes.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from seedq.wire.codec import EnvSpec, spec_from_spaces

# Registers seedq's own check environments (e.g. seedq/CartPoleNoVelocity-v1)
# wherever envs are made: learner, actors, benchmarks.
from seedq.envs import partially_observable  # noqa: E402,F401


def make_vector_env(env_id: str, num_envs: int, seed: int | None = None) -> gym.vector.VectorEnv:
    """A gymnasium vector env of `num_envs` copies of `env_id`, reset with `seed`.

    Uses the env's own vectorised implementation when it has one (CartPole's
    numpy vector env steps ~8x faster than a loop of single envs), else a
    synchronous loop in this process: an actor process is already one unit of
    parallelism, so subprocess vector envs would only add copies.
    """
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as e:
        raise ValueError(f"unknown environment id {env_id!r}: {e}") from None
    mode = "vector_entry_point" if spec.vector_entry_point is not None else "sync"
    env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode)
    autoreset = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
    if autoreset != gym.vector.AutoresetMode.NEXT_STEP:
        env.close()
        raise ValueError(
            f"{env_id}: vector env uses autoreset mode {autoreset}; seedq needs NEXT_STEP"
        )
    return env


def env_spec(env_id: str) -> EnvSpec:
    """The observation/action spec of one `env_id` env, as sent in the handshake."""
    try:
        env = gym.make(env_id)
    except gym.error.Error as e:
        raise ValueError(f"unknown environment id {env_id!r}: {e}") from None
    try:
        return spec_from_spaces(env.observation_space, env.action_space)
    finally:
        env.close()


def random_actions(spec: EnvSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """Uniform random actions for `n` envs (raw-stepping benchmarks)."""
    if spec.discrete:
        return rng.integers(0, spec.num_actions, size=n, dtype=np.int64)
    low = np.asarray(spec.action_low, np.float32).reshape(spec.action_shape)
    high = np.asarray(spec.action_high, np.float32).reshape(spec.action_shape)
    return rng.uniform(low, high, size=(n, *spec.action_shape)).astype(np.float32)
