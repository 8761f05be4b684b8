"""A trained policy as a user calls it: `seedq.load_policy(path).predict(obs)`.

`load_policy` reads a run directory (its newest checkpoint), a checkpoint
step directory, or a directory written by `seedq export` (StableHLO or ONNX).
Whatever it reads, the `Policy` it returns behaves the same way:

* `predict(obs)` takes one observation or a batch of them exactly as the env
  from `make_env()` returns them, and returns actions only;
* state that spans steps (the frame stack of pixel envs, R2D2's LSTM state)
  lives inside the policy, one row per env of the batch; `reset(indices)`
  starts new episodes there (call it after an env was reset).

The backends differ only in what runs the network: the run's agent through
JAX (`CheckpointBackend`), a deserialised `jax.export` program, or an
onnxruntime session (`seedq.export`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Protocol

import numpy as np

from seedq.schema import EnvSpec


class Backend(Protocol):
    """What runs a policy's network on a batch of observations."""

    stochastic: bool  # can it sample (deterministic=False)?

    def initial_state(self, n: int) -> dict[str, np.ndarray]:
        """The state of `n` envs at an episode start (empty for feed-forward policies)."""

    def act(self, obs: np.ndarray, first: np.ndarray, state: dict, deterministic: bool):
        """(actions [n, ...], new state) for observations [n, ...] and episode-start flags [n]."""


@dataclasses.dataclass(frozen=True)
class PolicyInfo:
    """Where a policy comes from and the env it acts in."""

    env: str
    env_options: Any  # seedq.config.EnvOptions
    spec: EnvSpec
    source: str  # the checkpoint or export directory read
    precision: str


class Policy:
    """A trained policy: observations in, actions out.

    Unlike Stable-Baselines3's `predict`, which returns `(action, state)`,
    `predict` here returns the actions alone: recurrent state and frame
    stacks are kept inside the policy, per env.
    """

    def __init__(self, backend: Backend, info: PolicyInfo):
        self._backend = backend
        self.info = info
        self._state: dict[str, np.ndarray] | None = None
        self._first: np.ndarray | None = None

    @property
    def env_id(self) -> str:
        return self.info.env

    @property
    def spec(self) -> EnvSpec:
        """The observation and action spaces the policy was trained on."""
        return self.info.spec

    def make_env(self, render_mode: str | None = None):
        """A gymnasium env of the run's env id with the run's preprocessing
        (Atari frames, dm_control options): it returns observations exactly
        as `predict` takes them."""
        from seedq.envs import make_env

        return make_env(self.info.env, self.info.env_options, render_mode=render_mode)

    def predict(self, obs, deterministic: bool = True) -> np.ndarray:
        """The actions for `obs`: one observation (returns one action) or a
        batch [n, ...] (returns n actions), as `make_env()` (or a vector of
        such envs) returns them.

        `deterministic`: the policy's most likely action (greedy); False
        samples from the policy (in-process checkpoints only). The first call
        on a batch of n starts n episodes; a different batch size starts over.
        """
        obs = np.asarray(obs)
        single = obs.shape == tuple(self.spec.obs_shape)
        batch = obs[None] if single else obs
        if batch.shape[1:] != tuple(self.spec.obs_shape):
            raise ValueError(
                f"observation of shape {list(obs.shape)}: this policy takes "
                f"{list(self.spec.obs_shape)} or a batch [n, {', '.join(map(str, self.spec.obs_shape))}]"
            )
        if not deterministic and not self._backend.stochastic:
            raise ValueError("this policy acts greedily only (an exported policy): use deterministic=True")
        batch = batch.astype(self.spec.obs_dtype, copy=False)
        n = len(batch)
        if self._first is None or len(self._first) != n:
            self._state, self._first = self._backend.initial_state(n), np.ones(n, bool)
        actions, self._state = self._backend.act(batch, self._first, self._state, deterministic)
        self._first = np.zeros(n, bool)
        actions = np.asarray(actions)
        return actions[0] if single else actions

    def reset(self, indices=None) -> None:
        """Starts new episodes: in every env (`indices=None`) or in the envs at
        `indices` of the batch (ints or a boolean mask, e.g. `terminated | truncated`
        of a vector env). Their frame stack / recurrent state starts afresh
        at the next `predict`."""
        if self._first is None:
            return
        if indices is None:
            self._first[:] = True
        else:
            self._first[np.asarray(indices)] = True

    # --- the episode protocol of `seedq.evaluation.evaluate` ---

    def episodes(self, *, greedy: bool = True) -> "EpisodeRunner":
        """This policy behind the start/step interface evaluation uses."""
        return EpisodeRunner(self, greedy)


class EpisodeRunner:
    """Steps a policy with the rewards and done flags evaluation passes
    (`seedq.evaluation.evaluate`): books episodes and resets each env's state
    at its episode start."""

    def __init__(self, policy: Policy, greedy: bool):
        self.policy = policy
        self.greedy = greedy

    def start(self, n: int, seed: int) -> "EpisodeRunner":
        from seedq.rollout.core import EpisodeTracker

        self._slots, self._episodes = np.arange(n), EpisodeTracker(n)
        self.policy._first = None  # a fresh batch of n envs
        return self

    def step(self, obs, rewards, terminated, truncated):
        from seedq.rollout.core import StepResult

        first, ended, returns, lengths = self._episodes.observe(self._slots, rewards, terminated, truncated)
        if self.policy._first is not None:
            self.policy.reset(first)
        actions = self.policy.predict(np.asarray(obs), deterministic=self.greedy)
        return StepResult(actions, first, self._slots[ended], returns[ended], lengths[ended], None)


class CheckpointBackend:
    """The run's own agent through JAX, at the run's inference precision."""

    stochastic = True

    def __init__(self, precision, params, seed: int = 0):
        import jax

        self._precision = precision
        self._params = params
        self._greedy = jax.jit(precision.greedy_act)
        self._sample = jax.jit(precision.act)
        self._rng = jax.random.PRNGKey(seed)
        self._inputs: dict = {}

    def initial_state(self, n: int) -> dict[str, np.ndarray]:
        agent = self._precision.agent
        self._inputs = agent.actor_inputs(np.arange(n))
        return {k: np.asarray(v) for k, v in agent.initial_core_state(n).items()}

    def act(self, obs, first, state, deterministic: bool):
        act = self._greedy if deterministic else self._sample
        actions, _, state, self._rng = act(self._params, self._rng, obs, first, state, self._inputs)
        return np.asarray(actions), {k: np.asarray(v) for k, v in state.items()}


def load_policy(path: str | os.PathLike, *, precision: str | None = None, env: str | None = None) -> Policy:
    """The policy at `path`: a run directory (its newest checkpoint), a
    checkpoint step directory (`RUN/checkpoints/step_*`), or a directory
    written by `seedq export`. `precision` (fp32, bf16, int8) overrides a
    checkpoint's inference precision. `env` is needed for a checkpoint or an
    export whose env id imports or calls code (`factory:...`, `module:Env`):
    the same id, given when you trust it (another env must fit the policy's
    spaces). ValueError in one line where `path` is none of these."""
    path = os.fspath(path)
    from seedq.export import is_export_dir, open_export

    if is_export_dir(path):
        if precision is not None:
            raise ValueError(f"{path}: an exported policy keeps the precision it was exported at")
        backend, info = open_export(path, env=env)
        if env:
            from seedq.envs import env_spec

            mismatch = info["spec"].describe_mismatch(env_spec(env, info["env_options"]))
            if mismatch:
                raise ValueError(f"{path}: env {env} does not fit this exported policy ({mismatch})")
        return Policy(backend, PolicyInfo(**info))
    from seedq import evaluation

    loaded = evaluation.load_policy(path, precision=precision, env=env)
    config = loaded.config
    backend = CheckpointBackend(loaded.policy.precision, loaded.policy.params, seed=config.eval_seed)
    info = PolicyInfo(config.env, config.env_options, loaded.policy.precision.spec, loaded.checkpoint,
                      config.precision)
    return Policy(backend, info)
