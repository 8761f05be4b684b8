"""Environment ids, Atari preprocessing, learner-side frame stacking, and spec refusal."""

import dataclasses
import json
import subprocess
import sys
import textwrap

import gymnasium as gym
import jax
import numpy as np
import pytest

from seedq.bench.drain import drain_unrolls
from seedq.agents import frames as frames_lib
from seedq.config import AtariConfig, DmcConfig, EnvOptions
from seedq.envs import env_kind, env_spec, make_env, make_vector_env

# Deterministic emulation: no sticky actions, no random no-op starts.
EXACT = AtariConfig(noop_max=0, repeat_action_probability=0.0)


def seedq(*args, timeout=300, env=None):
    return subprocess.run(
        [sys.executable, "-m", "seedq.cli", *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )


# --- environment ids ---------------------------------------------------------


@pytest.mark.unit
def test_env_kinds_and_specs():
    assert env_kind("CartPole-v1") == "gym"
    assert env_kind("ALE/Pong-v5") == "atari"
    assert env_kind("dmc:cartpole-swingup") == "dmc"
    pong = env_spec("ALE/Pong-v5")
    assert (pong.obs_dtype, pong.obs_shape, pong.num_actions) == ("uint8", (84, 84), 6)
    assert env_spec("ALE/Pong-v5", EnvOptions(dataclasses.replace(EXACT, screen_size=64))).obs_shape == (64, 64)
    assert env_spec("ALE/Pong-v5", EnvOptions(dataclasses.replace(EXACT, full_action_space=True))).num_actions == 18
    swingup = env_spec("dmc:cartpole-swingup")
    assert (swingup.obs_dtype, swingup.obs_shape) == ("float32", (5,))
    assert (swingup.action_shape, swingup.action_low, swingup.action_high) == ((1,), (-1.0,), (1.0,))
    assert env_spec("dmc:walker-walk").obs_shape == (24,)


@pytest.mark.unit
@pytest.mark.parametrize("env_id, words", [
    ("Nope-v9", "unknown environment id 'Nope-v9'"),
    ("dmc:cartpole", "use dmc:<domain>-<task>"),
    ("dmc:cartpole-nope", "unknown DeepMind Control task 'dmc:cartpole-nope' (tasks: cartpole-balance"),
    ("factory:no_such_module_xyz:make", "cannot import 'no_such_module_xyz'"),
    ("factory:json:nothing_here", "json has no callable 'nothing_here'"),
    ("factory:json", "use factory:<module>:<function>"),
])
def test_bad_env_ids_are_clear_errors(env_id, words):
    with pytest.raises(ValueError) as e:
        env_spec(env_id)
    assert words in str(e.value)


@pytest.mark.unit
def test_dmc_episode_truncates_after_1000_steps_and_actions_are_clipped():
    env = make_vector_env("dmc:cartpole-swingup", 2, seed=0)
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2, 5) and obs.dtype == np.float32
        for step in range(1000):
            # Far out of bounds: the env clips instead of failing.
            obs, reward, terminated, truncated, _ = env.step(np.full((2, 1), 5.0, np.float32))
            assert not terminated.any()
            assert truncated.all() == (step == 999)
            assert np.all((0.0 <= reward) & (reward <= 1.0))
    finally:
        env.close()


@pytest.mark.unit
def test_dmc_action_repeat_sums_rewards_and_keeps_the_return_scale():
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (1000, 1)).astype(np.float32)
    plain = make_env("dmc:cartpole-swingup")
    repeated = make_env("dmc:cartpole-swingup", EnvOptions(dmc=DmcConfig(action_repeat=4)))
    plain.reset(seed=5)
    repeated.reset(seed=5)
    for step in range(250):
        expected = 0.0
        for k in range(4):
            obs, reward, terminated, truncated, _ = plain.step(actions[step])
            expected += reward
        got = repeated.step(actions[step])
        np.testing.assert_allclose(got[0], obs, rtol=1e-6)
        assert got[1] == pytest.approx(expected)
        assert got[3] == truncated == (step == 249)  # 1000 control steps = 250 agent steps


USER_ENV = textwrap.dedent('''
    import gymnasium as gym
    import numpy as np

    class Corridor(gym.Env):
        """Walk right (action 1) for 8 steps to earn 1; the observation is the position."""

        observation_space = gym.spaces.Box(0.0, 8.0, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.position = 0
            return np.zeros(1, np.float32), {}

        def step(self, action):
            self.position = max(0, self.position + (1 if action == 1 else -1))
            done = self.position == 8
            return np.array([self.position], np.float32), float(done), done, False, {}

    def make_corridor():
        return gym.wrappers.TimeLimit(Corridor(), 50)
''')


@pytest.mark.e2e
def test_user_factory_env_trains_through_real_actor_processes(tmp_path, importable_module):
    env = importable_module("my_envs", USER_ENV)
    logdir = tmp_path / "run"
    result = seedq(
        "train", "--env", "factory:my_envs:make_corridor", "--max-frames", "3000",
        "--target-return", "none", "--num-actors", "1", "--envs-per-actor", "4", "--eval-episodes", "2",
        "--logdir", str(logdir), "--quiet", env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["env"] == "factory:my_envs:make_corridor"
    assert summary["frames"] >= 3000 and summary["train_steps"] > 0 and summary["episodes"] > 0


# --- Atari preprocessing ---------------------------------------------------------


def _frames(atari: AtariConfig, actions) -> np.ndarray:
    """Observations [len(actions) + 1, H, W] of one Pong env stepped with `actions`."""
    env = make_vector_env("ALE/Pong-v5", 1, options=EnvOptions(atari=atari))
    try:
        obs, _ = env.reset(seed=3)
        out = [obs[0]]
        for a in actions:
            obs, *_ = env.step(np.array([a]))
            out.append(obs[0])
        return np.stack(out)
    finally:
        env.close()


@pytest.mark.unit
def test_action_repeat_advances_the_frame_by_frame_skip_emulator_frames():
    steps = 60  # past Pong's serve, so the ball and paddles move
    actions = np.random.default_rng(0).integers(0, 6, steps)
    no_pool = dataclasses.replace(EXACT, max_pool=False)
    skip4 = _frames(dataclasses.replace(no_pool, frame_skip=4), actions)
    skip1 = _frames(dataclasses.replace(no_pool, frame_skip=1), np.repeat(actions, 4))
    # One frame_skip=4 step is four emulator frames with the same action...
    np.testing.assert_array_equal(skip4, skip1[::4])
    # ...and the picture visibly moves between consecutive observations (the
    # action repeat does not freeze the observed frame).
    moved = [np.abs(skip4[i + 1].astype(int) - skip4[i]).sum() for i in range(len(actions))]
    assert np.mean(np.asarray(moved) > 0) > 0.9


@pytest.mark.unit
def test_max_pooling_takes_the_brighter_of_the_last_two_frames():
    actions = np.random.default_rng(1).integers(0, 6, 60)
    pooled = _frames(EXACT, actions).astype(int)
    plain = _frames(dataclasses.replace(EXACT, max_pool=False), actions).astype(int)
    differs = [(pooled[i] != plain[i]).any() for i in range(len(pooled))]
    assert sum(differs) >= 10  # moving objects leave a trace in the pooled frame
    # Resizing is a non-negative weighted average: max then resize >= resize (up to rounding).
    assert (pooled >= plain - 1).all()


def _actor_and_eval_atari(atari: AtariConfig):
    """The two ways seedq builds ALE/Pong-v5: the vector env of the actors and of
    evaluations (ale_py's C++ preprocessing) and the single env of videos
    (gymnasium's AtariPreprocessing over the raw ALE env)."""
    options = EnvOptions(atari=atari)
    return make_vector_env("ALE/Pong-v5", 1, options=options), make_env("ALE/Pong-v5", options)


@pytest.mark.unit
def test_actor_and_eval_atari_envs_have_the_spec_and_truncate_at_the_same_step():
    atari = dataclasses.replace(EXACT, max_episode_frames=400)  # 100 agent steps at frame skip 4
    spec = env_spec("ALE/Pong-v5", EnvOptions(atari=atari))
    vec, single = _actor_and_eval_atari(atari)
    try:
        assert vec.single_observation_space == single.observation_space == gym.spaces.Box(0, 255, (84, 84), np.uint8)
        assert (spec.obs_dtype, spec.obs_shape, spec.num_actions) == ("uint8", (84, 84), 6)
        vec.reset(seed=3)
        single.reset(seed=3)
        ends = {"actor": None, "eval": None}
        for step in range(120):
            obs, _, _, truncated, _ = vec.step(np.zeros(1, np.int64))
            assert obs.shape == (1, 84, 84) and obs.dtype == np.uint8
            if truncated[0] and ends["actor"] is None:
                ends["actor"] = step
            if ends["eval"] is None:
                frame, _, _, truncated_single, _ = single.step(0)
                assert frame.shape == (84, 84) and frame.dtype == np.uint8
                if truncated_single:
                    ends["eval"] = step
        assert ends == {"actor": 99, "eval": 99}
    finally:
        vec.close()
        single.close()


@pytest.mark.unit
@pytest.mark.xfail(strict=True, reason=(
    "the actors' ale_py vector env (also evaluations') and gymnasium's AtariPreprocessing "
    "(videos) do not produce the same frames: the reset frame differs in 4 pixels and while the "
    "paddle moves (RIGHT/LEFT) 6-18 pixels differ per step until it stops, so a video's policy "
    "sees other observations than training; the action meanings are the same (NOOP/FIRE steps match)"))
def test_actor_and_eval_atari_frames_are_identical_under_play():
    vec, single = _actor_and_eval_atari(EXACT)
    try:
        actor_obs, _ = vec.reset(seed=3)
        eval_obs, _ = single.reset(seed=3)
        np.testing.assert_array_equal(actor_obs[0], eval_obs, err_msg="reset")
        for step, action in enumerate(np.random.default_rng(0).integers(0, 6, 60)):
            actor_obs, actor_reward, *_ = vec.step(np.array([action]))
            eval_obs, eval_reward, *_ = single.step(int(action))
            np.testing.assert_array_equal(actor_obs[0], eval_obs, err_msg=f"step {step}")
            assert actor_reward[0] == eval_reward
    finally:
        vec.close()
        single.close()


# --- learner-side frame stacking --------------------------------------------------


def _recorded_breakout(stack: int, steps: int):
    """Actor-side stacks from gymnasium's FrameStackObservation and the matching single
    frames with `first` flags, over several episodes (life loss ends an episode)."""
    atari = dataclasses.replace(EXACT, terminal_on_life_loss=True)
    env = gym.wrappers.FrameStackObservation(
        make_env("ALE/Breakout-v5", EnvOptions(atari)), stack, padding_type="reset"
    )
    rng = np.random.default_rng(0)
    stacks, first = [], []
    obs, _ = env.reset(seed=0)
    is_first = True
    for _ in range(steps):
        stacks.append(np.moveaxis(obs, 0, -1))  # [K, H, W] -> [H, W, K]
        first.append(is_first)
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(0, 4)))
        is_first = False
        if terminated or truncated:
            stacks.append(np.moveaxis(obs, 0, -1))  # the final observation
            first.append(False)
            obs, _ = env.reset()
            is_first = True
    env.close()
    stacks, first = np.stack(stacks), np.asarray(first)
    return stacks, stacks[..., -1], first


@pytest.mark.unit
def test_learner_side_stacking_equals_actor_side_stacking_across_episodes():
    stack, unroll = 4, 11
    expected, frames, first = _recorded_breakout(stack, steps=400)
    assert first.sum() >= 3  # several episode boundaries are covered

    # Acting: the server keeps the last K-1 frames as the env's core state.
    stacker = frames_lib.FrameStacker(stack, frames.shape[1:])
    core = stacker.initial_core_state(1)
    act = jax.jit(stacker.act)
    acted, initial = [], []
    for t in range(len(frames)):
        initial.append(core[frames_lib.CORE_KEY][0])
        stacked, core = act(core, frames[t][None], first[t][None])
        acted.append(np.asarray(stacked[0]))
    np.testing.assert_array_equal(np.stack(acted), expected)

    # Learning: unrolls of `unroll` steps overlapping by one, each with the
    # core state its first step was acted from (as the unroll store keeps them).
    starts = list(range(0, len(frames) - unroll + 1, unroll - 1))
    batch = {
        "obs": np.stack([frames[s:s + unroll] for s in starts]),
        "first": np.stack([first[s:s + unroll] for s in starts]),
        "core/" + frames_lib.CORE_KEY: np.stack([initial[s] for s in starts]),
    }
    rebuilt = np.asarray(jax.jit(stacker.unroll)(batch))
    np.testing.assert_array_equal(rebuilt, np.stack([expected[s:s + unroll] for s in starts]))


# --- spec refusal -----------------------------------------------------------------


@pytest.mark.e2e
def test_actor_with_a_different_preprocessing_is_refused(tmp_path):
    from seedq.config import TrainConfig
    from seedq.learner.learner import Learner

    learner = Learner(
        TrainConfig(env="ALE/Pong-v5", logdir=str(tmp_path)), f"unix:{tmp_path}/l.sock"
    )
    address = learner.start(consume=drain_unrolls)
    try:
        result = seedq(
            "actor", "--server", address, "--env", "ALE/Pong-v5", "--num-envs", "2",
            "--atari.screen-size", "64", "--retry-max-seconds", "20", timeout=120,
        )
    finally:
        learner.stop()
    assert result.returncode == 2, result.stdout + result.stderr
    assert "handshake.observation.shape" in result.stderr
    assert "actor sends [64, 64], learner expects [84, 84]" in result.stderr


# --- end to end on Atari and DeepMind Control -------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("agent, extra", [
    ("vtrace", []),
    ("r2d2", ["--r2d2.min-replay-size", "4", "--r2d2.batch-size", "4", "--r2d2.burn-in", "4",
              "--r2d2.trace-length", "8", "--r2d2.n-step", "3", "--r2d2.replay-ratio", "1"]),
])
def test_pong_runs_end_to_end(tmp_path, agent, extra):
    """Real ALE frames through actor processes, the server (frame stacking on the
    learner), train steps on the Nature CNN, a checkpoint and a greedy evaluation."""
    logdir = tmp_path / agent
    result = seedq(
        # 4,000 frames: V-trace's first batch (16 unrolls of 10 + 1 steps from 8
        # envs, the pixel defaults) is complete at 8 x 21 steps = 168 frames, and
        # the budget is above the 2,560 frames the unroll queue holds (256 unrolls
        # of 10 steps), so the actors cannot reach it before the learner has
        # taken unrolls: below that, a slow first compile ends the run untrained.
        "train", "--agent", agent, "--env", "ALE/Pong-v5", "--max-frames", "4000",
        "--target-return", "none", "--num-actors", "1", "--envs-per-actor", "8",
        "--eval-episodes", "1", "--atari.max-episode-frames", "1000",
        "--logdir", str(logdir), "--quiet", *extra, timeout=400,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["frames"] >= 4000 and summary["train_steps"] > 0
    assert summary["stop_reason"] == "max_frames"
    assert any((logdir / "checkpoints").iterdir())
    # --atari.max-episode-frames 1000 at frame skip 4 truncates the game at 250 agent
    # steps (what the frames themselves look like: the unit tests above and below).
    assert summary["eval"]["lengths"] == [250]
    config = json.loads((logdir / "config.json").read_text())
    assert config["frame_stack"] == 4 and config["atari"]["frame_skip"] == 4


@pytest.mark.e2e
def test_dmc_gaussian_policy_runs_end_to_end(tmp_path):
    logdir = tmp_path / "dmc"
    result = seedq(
        "train", "--env", "dmc:cartpole-swingup", "--max-frames", "6000", "--target-return", "none",
        "--num-actors", "1", "--envs-per-actor", "4", "--eval-episodes", "1",
        "--logdir", str(logdir), "--quiet", timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["frames"] >= 6000 and summary["train_steps"] > 0
    assert summary["episodes"] >= 4  # 1000-step episodes
    # dm_control's 1000-step limit reaches the greedy evaluation through seedq's wrapping
    # (its observations and action repeat: the dmc unit tests above).
    assert summary["eval"]["lengths"] == [1000]


# --- observations of every family -------------------------------------------------

OBS_ENVS = textwrap.dedent('''
    """Small envs with non-Box observations, registered as obs_envs:<Name>-v0."""
    import gymnasium as gym
    import numpy as np


    class DictCorridor(gym.Env):
        """Walk right (action 1) for 4 steps to earn 1; observes a Dict of every family."""

        observation_space = gym.spaces.Dict({
            "position": gym.spaces.Discrete(5),
            "velocity": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            "flags": gym.spaces.MultiBinary(3),
            "pair": gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.MultiDiscrete([3, 2]))),
        })
        action_space = gym.spaces.Discrete(2)

        def _obs(self):
            return {"position": self.position, "velocity": np.array([0.5, -0.5], np.float32),
                    "flags": np.array([1, 0, 1], np.int8),
                    "pair": (self.position % 2, np.array([self.position % 3, 1]))}

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.position = 0
            return self._obs(), {}

        def step(self, action):
            self.position = min(4, max(0, self.position + (1 if action == 1 else -1)))
            done = self.position == 4
            return self._obs(), float(done), done, False, {}


    class TextObservation(DictCorridor):
        observation_space = gym.spaces.Text(8)


    class OnePixel(DictCorridor):
        observation_space = gym.spaces.Box(0, 255, (1, 1, 3), np.uint8)


    for name in ("DictCorridor", "TextObservation", "OnePixel"):
        gym.register(f"{name}-v0", entry_point=f"obs_envs:{name}", max_episode_steps=20)
''')


@pytest.fixture
def obs_envs(importable_module):
    """The obs_envs module importable here and in the actor processes (PYTHONPATH)."""
    return importable_module("obs_envs", OBS_ENVS)


@pytest.mark.unit
def test_non_box_observations_are_flattened_to_one_float_vector(obs_envs):
    # FrozenLake: Discrete(16) -> one-hot; Blackjack: Tuple(Discrete(32), Discrete(11), Discrete(2)).
    assert env_spec("FrozenLake-v1").obs_shape == (16,) and env_spec("FrozenLake-v1").obs_dtype == "float32"
    assert env_spec("Blackjack-v1").obs_shape == (32 + 11 + 2,)
    env = make_env("obs_envs:DictCorridor-v0")
    raw = gym.make("obs_envs:DictCorridor-v0")
    try:
        # Keys sorted: flags 3 + pair (2 one-hot + 3 + 2 one-hot) + position 5 one-hot + velocity 2 = 17
        assert env_spec("obs_envs:DictCorridor-v0").obs_shape == (17,)
        obs, _ = env.reset(seed=0)
        raw_obs, _ = raw.reset(seed=0)
        for _ in range(3):
            assert obs.dtype == np.float32
            np.testing.assert_array_equal(obs, gym.spaces.flatten(raw.observation_space, raw_obs))
            obs, *_ = env.step(1)
            raw_obs, *_ = raw.step(1)
        assert obs[10:15].tolist() == [0, 0, 0, 1, 0]  # position 3, one-hot
    finally:
        env.close()
        raw.close()
    vector = make_vector_env("FrozenLake-v1", 3, seed=0)
    try:
        obs, _ = vector.reset(seed=0)
        assert obs.shape == (3, 16) and obs.dtype == np.float32
        assert obs.sum(axis=1).tolist() == [1.0, 1.0, 1.0]
    finally:
        vector.close()


@pytest.mark.e2e
@pytest.mark.parametrize("env_id", ["FrozenLake-v1", "obs_envs:DictCorridor-v0"])
def test_discrete_and_dict_observations_train_through_real_actor_processes(tmp_path, obs_envs, env_id):
    logdir = tmp_path / "run"
    result = seedq(
        "train", "--env", env_id, "--max-frames", "3000", "--target-return", "none",
        "--num-actors", "1", "--envs-per-actor", "4", "--eval-episodes", "2",
        "--logdir", str(logdir), "--quiet", env=obs_envs,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["frames"] >= 3000 and summary["train_steps"] > 0 and summary["episodes"] > 0
    assert len(summary["eval"]["lengths"]) == 2


@pytest.mark.e2e
@pytest.mark.parametrize("env_id, words", [
    ("obs_envs:TextObservation-v0", "obs_envs:TextObservation-v0: observation space Text("),
    ("obs_envs:OnePixel-v0", "observation shape [1, 1, 3] (an image of 1x1 pixels) is too small"),
])
def test_observations_no_network_takes_are_refused_at_start_up_in_one_line(tmp_path, obs_envs, env_id, words):
    result = seedq("train", "--env", env_id, "--logdir", str(tmp_path / "x"), "--quiet",
                   timeout=120, env=obs_envs)
    assert result.returncode != 0
    assert words in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()  # refused before the run started


@pytest.mark.unit
def test_minatar_ids_build_the_real_games():
    from minatar import Environment

    spec = env_spec("MinAtar/Breakout-v1")
    assert (spec.obs_dtype, spec.obs_shape) == ("bool", (10, 10, 4))
    # -v1: the game's minimal action set (MinAtar's own), -v0: all six actions.
    assert spec.num_actions == len(Environment("breakout").minimal_action_set()) == 3
    assert env_spec("MinAtar/Breakout-v0").num_actions == 6
    for game, channels in (("Asterix", 4), ("Freeway", 7), ("Seaquest", 10), ("SpaceInvaders", 6)):
        assert env_spec(f"MinAtar/{game}-v1").obs_shape == (10, 10, channels)
    env = make_vector_env("MinAtar/Breakout-v1", 2, seed=0)
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2, 10, 10, 4) and obs.dtype == bool and obs.any()
        for _ in range(5):
            obs, reward, terminated, truncated, _ = env.step(np.array([0, 2]))
        assert obs.shape == (2, 10, 10, 4)
    finally:
        env.close()


@pytest.mark.e2e
def test_minatar_trains_with_the_automatic_network(tmp_path):
    logdir = tmp_path / "minatar"
    result = seedq(
        "train", "--env", "MinAtar/Breakout-v1", "--max-frames", "3000", "--num-actors", "1",
        "--envs-per-actor", "4", "--eval-episodes", "1", "--logdir", str(logdir), "--quiet",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["frames"] >= 3000 and summary["train_steps"] > 0
    assert summary["target_return"] is None  # MinAtar registers no reward_threshold


@pytest.mark.unit
def test_an_env_whose_package_is_missing_names_the_extra_that_installs_it(monkeypatch):
    """Box2D hidden from the import system: LunarLander is refused in one line naming seedq's extra."""
    monkeypatch.setitem(sys.modules, "Box2D", None)
    for name in [n for n in sys.modules if n.startswith("gymnasium.envs.box2d")]:  # imported earlier
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ValueError) as e:
        make_env("LunarLander-v3")
    message = str(e.value)
    assert "LunarLander-v3 needs a package that is not installed" in message
    assert "seedq[box2d]" in message and "\n" not in message
