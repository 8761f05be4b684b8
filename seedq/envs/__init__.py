"""Environment construction shared by actors, the learner, evaluation and benchmarks.

Every command takes the same environment ids:

* any registered gymnasium id (`CartPole-v1`, gymnasium's `module:Env-v0`
  form imports `module` first, which is how a user's own registered env is
  found in every process, actors included);
* `ALE/<Game>-v5` (and the other ALE ids): ale_py's C++ vector env does the
  Atari preprocessing (`seedq.config.AtariConfig`) and emits one grey frame
  [H, W] uint8 per step; frame stacking happens on the learner;
* `dmc:<domain>-<task>` (`dmc:cartpole-swingup`, `dmc:ball_in_cup-catch`): a
  DeepMind Control suite task through Farama's shimmy adapter, with the
  observation dict flattened to one float32 vector;
* `factory:<module>:<function>`: `function()` from an importable module
  returns a gymnasium Env (for envs that are not registered);
* `MinAtar/<Game>-v1` (Asterix, Breakout, Freeway, Seaquest, SpaceInvaders):
  the `minatar` package's own gymnasium registrations, bool [10, 10, C]
  observations. `-v1` plays the game's minimal action set (3 to 6 actions),
  as the MinAtar paper's agents do; `-v0` all 6 actions.

Observations that are not a Box (Discrete, MultiDiscrete, MultiBinary, and
Dict / Tuple of these and Boxes) are flattened in the env, on the actor side,
into one float32 vector (gymnasium's FlattenObservation: one-hot for
Discrete), so the handshake and the networks see a plain vector. A space that
does not flatten into a vector (Text, Graph, Sequence) is refused with a
ValueError naming it.

Box action spaces are clipped to their bounds before the env sees them
(gymnasium's ClipAction), so Gaussian policies can sample freely.

Actors step a gymnasium *vector* env. seedq relies on gymnasium's default
next-step autoreset: the step that ends an episode returns its final
observation, and the env's following step is a reset step (reward 0, first
observation of the next episode, action ignored). The learner masks that
reset transition out of the loss, which lets it bootstrap correctly from the
final observation of truncated episodes.
"""

from __future__ import annotations

import importlib
import os
from typing import Callable

import gymnasium as gym
import numpy as np

from seedq.config import AtariConfig, DmcConfig, EnvOptions
from seedq.schema import EnvSpec, spec_from_spaces

# Registers seedq's own check environments (e.g. seedq/CartPoleNoVelocity-v1)
# wherever envs are made: learner, actors, benchmarks.
from seedq.envs import partially_observable  # noqa: E402,F401

DMC_PREFIX = "dmc:"
FACTORY_PREFIX = "factory:"


def names_code(env_id: str) -> bool:
    """Whether making `env_id` imports a module it names or calls a function
    (`factory:<module>:<function>`, gymnasium's `module:Env-v0`): such an id
    from a file or a peer is code to run, taken only when a user gives it."""
    return env_id.startswith(FACTORY_PREFIX) or (":" in env_id and not env_id.startswith(DMC_PREFIX))


def _register_ale() -> None:
    try:
        import ale_py
    except ImportError:  # ale-py is a dependency; only a broken install lands here
        return
    gym.register_envs(ale_py)


def _register_minatar() -> None:
    """MinAtar/<Game>-v0 and -v1, registered by the minatar package itself.

    Called only for a `MinAtar/` id: importing minatar loads seaborn, pandas
    and scipy.stats (about 1.4 s), which every actor and learner start-up
    would pay otherwise."""
    try:
        from minatar import gym as minatar_gym
    except ImportError:  # an extra: say which one
        raise ValueError("MinAtar envs need the 'minatar' extra: pip install 'seedq[minatar]'") from None
    if "MinAtar/Breakout-v1" not in gym.registry:
        minatar_gym.register_envs()


_register_ale()


def env_kind(env_id: str) -> str:
    """"dmc", "factory", "atari" or "gym" (raises ValueError for an unknown id)."""
    if env_id.startswith(DMC_PREFIX):
        return "dmc"
    if env_id.startswith(FACTORY_PREFIX):
        return "factory"
    spec = _gym_spec(env_id)
    if isinstance(spec.entry_point, str) and spec.entry_point.startswith("ale_py"):
        return "atari"
    return "gym"


def _gym_spec(env_id: str):
    try:
        # gym.make imports `module` of a `module:Env-v0` id itself; gym.spec does not.
        module, sep, name = env_id.partition(":")
        if env_id.startswith("MinAtar/"):
            _register_minatar()
        if sep:
            importlib.import_module(module)
        return gym.spec(name if sep else env_id)
    except (gym.error.Error, ModuleNotFoundError) as e:
        raise ValueError(f"unknown environment id {env_id!r}: {e}") from None


def make_env(
    env_id: str, options: EnvOptions = EnvOptions(), render_mode: str | None = None,
    clip_actions: bool = True,
) -> gym.Env:
    """One env of `env_id`, observing exactly what an actor's vector env observes.

    `clip_actions=False` keeps the Box action space's real bounds (ClipAction
    widens the space to +-inf); `env_spec` uses that.
    """
    kind = env_kind(env_id)
    if kind == "dmc":
        env = _make_dmc(env_id, options.dmc, render_mode)
    elif kind == "factory":
        env = _factory(env_id)()
        if not isinstance(env, gym.Env):
            raise ValueError(f"{env_id}: the factory returned {type(env).__name__}, not a gymnasium Env")
    elif kind == "atari":
        env = _make_atari_single(env_id, options.atari, render_mode)
    else:
        try:
            # render_mode only when asked for: envs without rendering need not take it.
            env = gym.make(env_id, **({"render_mode": render_mode} if render_mode else {}))
        except gym.error.DependencyNotInstalled as e:
            extra = " (pip install 'seedq[box2d]')" if "Box2D" in str(e) else ""
            raise ValueError(f"{env_id} needs a package that is not installed{extra}: {e}") from None
        except gym.error.Error as e:
            raise ValueError(f"unknown environment id {env_id!r}: {e}") from None
    env = flat_observations(env, env_id)
    if clip_actions and isinstance(env.action_space, gym.spaces.Box):
        env = gym.wrappers.ClipAction(env)
    return env


def flat_observations(env: gym.Env, env_id: str) -> gym.Env:
    """`env` unchanged where it observes a Box; else its observations flattened
    into one float32 vector (one-hot Discrete parts). Raises ValueError for a
    space no vector can hold."""
    space = env.observation_space
    if isinstance(space, gym.spaces.Box):
        return env
    if not _vector_like(space):
        env.close()
        raise ValueError(
            f"{env_id}: observation space {space} is not supported: seedq takes Box, Discrete, "
            "MultiDiscrete, MultiBinary observations and Dict/Tuple of these"
        )
    flat = gym.spaces.flatten_space(space)
    env = gym.wrappers.FlattenObservation(env)
    return gym.wrappers.TransformObservation(
        env,
        lambda obs: np.asarray(obs, np.float32),
        gym.spaces.Box(flat.low.astype(np.float32), flat.high.astype(np.float32), dtype=np.float32),
    )


def _vector_like(space: gym.spaces.Space) -> bool:
    """Whether `space` flattens into a fixed vector of numbers that mean something
    to a network. (gymnasium also flattens Text, into character indices, which
    no network here reads as text; Graph and Sequence have no fixed size.)"""
    if isinstance(space, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        return True
    if isinstance(space, gym.spaces.Dict):
        return all(_vector_like(s) for s in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return all(_vector_like(s) for s in space.spaces)
    return False


def make_vector_env(
    env_id: str, num_envs: int, seed: int | None = None, options: EnvOptions = EnvOptions(), threads: int = 1
) -> gym.vector.VectorEnv:
    """A gymnasium vector env of `num_envs` copies of `env_id` (next-step autoreset).
    `threads`: the emulator threads of an Atari vector env (other envs step in
    this thread).

    Uses the env's own vectorised implementation when it has one (CartPole's
    numpy vector env steps ~8x faster than a loop of single envs; ALE's runs
    its emulators in C++ threads), else a synchronous loop in this process:
    an actor process is already one unit of parallelism, so subprocess vector
    envs would only add copies.
    """
    kind = env_kind(env_id)
    if kind == "atari":
        env = _make_atari_vector(env_id, num_envs, options.atari, threads)
    elif kind in ("dmc", "factory"):
        env = gym.vector.SyncVectorEnv([lambda: make_env(env_id, options) for _ in range(num_envs)])
    else:
        spec = _gym_spec(env_id)
        # Envs whose observations need flattening (make_env) use the loop of single envs.
        if spec.vector_entry_point is not None and _observes_box(env_id):
            env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
        else:
            env = gym.vector.SyncVectorEnv([lambda: make_env(env_id, options) for _ in range(num_envs)])
    autoreset = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
    if autoreset != gym.vector.AutoresetMode.NEXT_STEP:
        env.close()
        raise ValueError(
            f"{env_id}: vector env uses autoreset mode {autoreset}; seedq needs NEXT_STEP"
        )
    if seed is not None:
        env.reset(seed=seed)
    return env


def _observes_box(env_id: str) -> bool:
    env = gym.make(env_id)
    try:
        return isinstance(env.observation_space, gym.spaces.Box)
    finally:
        env.close()


def reward_threshold(env_id: str) -> float | None:
    """The return gymnasium registers as solving `env_id` (CartPole-v1 475,
    Acrobot-v1 -100, ...); None where it registers none (and for dmc:/factory: ids)."""
    if env_kind(env_id) in ("dmc", "factory"):
        return None
    threshold = _gym_spec(env_id).reward_threshold
    return None if threshold is None else float(threshold)


def env_facts(env_id: str, options: EnvOptions = EnvOptions()) -> tuple[EnvSpec, float | None]:
    """(its spec, its registered reward threshold): what a run's defaults
    depend on (seedq.config.resolve)."""
    return env_spec(env_id, options), reward_threshold(env_id)


def run_defaults(env_id: str):
    """The run config's defaults for `env_id` with the default env options
    (seedq.config.resolve.defaults_for_env); an env id that cannot be built
    falls back to the plain defaults (the run then reports the env error)."""
    from seedq.config import TrainConfig
    from seedq.config.resolve import defaults_for_env

    try:
        return defaults_for_env(*env_facts(env_id))
    except ValueError:
        return TrainConfig()


def env_spec(env_id: str, options: EnvOptions = EnvOptions()) -> EnvSpec:
    """The observation/action spec of one `env_id` env, as sent in the handshake."""
    if env_kind(env_id) == "atari":
        env = _make_atari_vector(env_id, 1, options.atari)
        try:
            return spec_from_spaces(env.single_observation_space, env.single_action_space)
        finally:
            env.close()
    env = make_env(env_id, options, clip_actions=False)
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


# --- Atari -----------------------------------------------------------------


def _atari_game(env_id: str) -> str:
    kwargs = _gym_spec(env_id).kwargs
    if "game" not in kwargs:
        raise ValueError(f"{env_id}: not an ALE game id")
    return kwargs["game"]


def _make_atari_vector(env_id: str, num_envs: int, atari: AtariConfig, threads: int = 1) -> gym.vector.VectorEnv:
    """ale_py's vector env emitting single frames [N, H, W] (stack 1, no reward clipping)."""
    from ale_py.vector_env import AtariVectorEnv

    env = AtariVectorEnv(
        _atari_game(env_id),
        num_envs,
        # One emulator thread per actor process (the default): actors are the
        # unit of parallelism; an evaluation alone on its machine takes more.
        num_threads=threads,
        frameskip=atari.frame_skip,
        maxpool=atari.max_pool,
        noop_max=atari.noop_max,
        episodic_life=atari.terminal_on_life_loss,
        repeat_action_probability=atari.repeat_action_probability,
        img_height=atari.screen_size,
        img_width=atari.screen_size,
        full_action_space=atari.full_action_space,
        max_num_frames_per_episode=atari.max_episode_frames,
        grayscale=True,
        stack_num=1,
        # Rewards are clipped on the learner, for training only (AtariConfig.clip_rewards).
        reward_clipping=False,
    )
    size = atari.screen_size
    frame = gym.spaces.Box(0, 255, (size, size), np.uint8)
    return gym.wrappers.vector.TransformObservation(
        env,
        lambda obs: obs.reshape(obs.shape[0], size, size),
        observation_space=gym.vector.utils.batch_space(frame, num_envs),
        single_observation_space=frame,
    )


def _make_atari_single(env_id: str, atari: AtariConfig, render_mode: str | None) -> gym.Env:
    """One Atari env with gymnasium's AtariPreprocessing (same choices as the vector env)."""
    env = gym.make(
        env_id,
        frameskip=1,
        repeat_action_probability=atari.repeat_action_probability,
        full_action_space=atari.full_action_space,
        max_num_frames_per_episode=atari.max_episode_frames,
        render_mode=render_mode,
    )
    return gym.wrappers.AtariPreprocessing(
        env,
        noop_max=atari.noop_max,
        frame_skip=atari.frame_skip,
        screen_size=atari.screen_size,
        terminal_on_life_loss=atari.terminal_on_life_loss,
        grayscale_obs=True,
        scale_obs=False,
    )


# --- DeepMind Control --------------------------------------------------------


def _make_dmc(env_id: str, dmc: DmcConfig, render_mode: str | None) -> gym.Env:
    name = env_id[len(DMC_PREFIX):]
    domain, sep, task = name.partition("-")
    if not sep or not domain or not task:
        raise ValueError(f"environment id {env_id!r}: use dmc:<domain>-<task>, e.g. dmc:cartpole-swingup")
    # Headless rendering (videos) without a display; EGL needs no X server.
    os.environ.setdefault("MUJOCO_GL", "egl")
    from dm_control import suite
    from shimmy import DmControlCompatibilityV0

    if (domain, task) not in suite.ALL_TASKS:
        known = ", ".join(f"{d}-{t}" for d, t in suite.ALL_TASKS if d == domain) or "none for this domain"
        raise ValueError(f"unknown DeepMind Control task {env_id!r} (tasks: {known})")
    control = suite.load(domain, task)
    env = DmControlCompatibilityV0(control, render_mode=render_mode)
    if dmc.action_repeat > 1:
        env = ActionRepeat(env, dmc.action_repeat)
    env = gym.wrappers.FlattenObservation(env)
    flat = env.observation_space
    env = gym.wrappers.TransformObservation(
        env,
        lambda obs: obs.astype(np.float32),
        gym.spaces.Box(flat.low.astype(np.float32), flat.high.astype(np.float32), dtype=np.float32),
    )
    # One rendered frame per agent step: shimmy's render_fps is the control
    # timestep in milliseconds (10 for 0.01 s), not a rate.
    env.metadata = {**env.metadata, "render_fps": dmc_render_fps(control.control_timestep(), dmc.action_repeat)}
    return env


def dmc_render_fps(control_timestep: float, action_repeat: int) -> float:
    """Frames per second of a video with one frame per agent step."""
    return 1.0 / (control_timestep * action_repeat)


class ActionRepeat(gym.Wrapper):
    """Applies each action `repeat` times and sums the rewards, stopping at an
    episode end. Hand-written: gymnasium's frame-skip wrappers are Atari-specific
    (they max-pool image observations)."""

    def __init__(self, env: gym.Env, repeat: int):
        super().__init__(env)
        self.repeat = repeat

    def step(self, action):
        total = 0.0
        for _ in range(self.repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


# --- user factories ------------------------------------------------------------


def _factory(env_id: str) -> Callable[[], gym.Env]:
    target = env_id[len(FACTORY_PREFIX):]
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"environment id {env_id!r}: use factory:<module>:<function>")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"environment id {env_id!r}: cannot import {module_name!r}: {e}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"environment id {env_id!r}: {module_name} has no callable {attr!r}")
    return factory
