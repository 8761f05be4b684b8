"""Policy evaluation and videos: `seedq eval` and the end-of-run evaluation.

A policy (an agent plus its inference parameters) runs in this process on
plain gymnasium envs, without gRPC: up to EVAL_ENVS envs stepped as one
vector env and reset once with `seed` (gymnasium seeds env i with seed + i).
Each env plays one counted episode, and while fewer than `episodes` have
started, an env whose episode ends starts the next one. Actions are
*greedy* (the agent's most likely action) unless `sample=True`, which draws
them from the policy with a PRNG key made from `seed`.

The same parameters, env, seed and episode count give the same returns, bit
for bit: the training run evaluates its final policy with `eval_episodes`
and `eval_seed` (summary.json, `eval`), and `seedq eval RUN_DIR` reproduces
those numbers from the final checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings

import jax
import numpy as np

from seedq import config as config_lib
from seedq.config import EnvOptions, TrainConfig
from seedq.rollout.core import ActingCore, EpisodeTracker, StepResult
from seedq.agents import make_agent
from seedq.envs import env_spec, make_env, make_vector_env, names_code, random_actions
from seedq import checkpoint
from seedq.quant.mode import InferencePrecision

VIDEO_FORMATS = (".mp4", ".gif")
# Envs stepped at once by `evaluate`: few enough that hundreds of episodes
# take turns on them instead of all being stepped until the longest ends (and
# that hundreds of Atari emulators need not be in memory at once), enough
# that one inference call serves many env steps. The measurement behind 64:
# docs/training.md, "The defaults and their evidence".
EVAL_ENVS = 64
# An evaluation episode still running after this many agent steps ends there
# with its return so far: MinAtar has no time limit, and a good greedy policy
# may play on for very long (ALE ids end at 108k emulator frames on their own).
MAX_EPISODE_STEPS = 100_000
# A GIF keeps every frame in memory and plays at most ~50 fps; longer or
# faster episodes keep every k-th frame.
GIF_MAX_FPS = 25
# Video frames are scaled up by a whole factor until their short side is at
# least this many pixels (MinAtar renders 10x10; players shrink tiny videos).
MIN_VIDEO_SIDE = 80


@dataclasses.dataclass
class EvalResult:
    env: str
    episodes: int
    seed: int
    greedy: bool
    returns: list[float]
    lengths: list[int]
    truncated: int = 0  # episodes cut at `max_steps` (their return so far counted)
    unplayed: int = 0  # episodes never started: every env was stuck in an episode cut at `max_steps`

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))

    def to_dict(self) -> dict:
        return {
            "env": self.env,
            "episodes": self.episodes,
            "seed": self.seed,
            "policy": "greedy" if self.greedy else "sampled",
            "mean": self.mean,
            "std": self.std,
            "min": float(np.min(self.returns)),
            "max": float(np.max(self.returns)),
            "mean_length": float(np.mean(self.lengths)),
            "returns": list(self.returns),
            "lengths": list(self.lengths),
            "truncated": self.truncated,
            "unplayed": self.unplayed,
        }

    def line(self) -> str:
        d = self.to_dict()
        return (
            f"{self.episodes} episodes of {self.env} (seed {self.seed}, {d['policy']} actions): "
            f"mean {d['mean']:.2f}  std {d['std']:.2f}  min {d['min']:.2f}  max {d['max']:.2f}  "
            f"(mean length {d['mean_length']:.1f})"
            + (f"; {self.truncated} cut at the step limit with their return so far" if self.truncated else "")
            + (f"; {self.unplayed} not played: every env was stuck past the step limit" if self.unplayed else "")
        )


class Policy:
    """Inference parameters acting in-process through the acting core
    (`seedq.rollout.core`): the agent at the precision of `precision` (a
    `seedq.quant.mode.InferencePrecision`), on `params` published at it.
    Greedy actions are the agent's `greedy_actions`."""

    def __init__(self, precision, params, *, greedy: bool = True):
        self.precision = precision
        self.params = params
        self.greedy = greedy
        # One core (and so one compiled `act` per env count) for every evaluation.
        self._core = ActingCore(precision.agent, precision.spec, precision, record=False,
                                greedy=greedy, capacity=1)

    def start(self, n: int, seed: int) -> "Policy":
        """Starts acting on `n` fresh envs, with a PRNG key made from `seed`."""
        self._core.ensure_capacity(n)
        self._slots, self._rng = np.arange(n), jax.random.PRNGKey(seed)
        self._core.start(self._slots)
        return self

    def step(self, obs, rewards, terminated, truncated) -> StepResult:
        result, self._rng = self._core.step(
            self.params, 0, self._rng, self._slots, obs, rewards, terminated, truncated)
        return result


class RandomPolicy:
    """Uniform random actions over the env's action space, the same interface as
    `Policy` (the learning suite's "random" baseline for normalised scores)."""

    greedy = False

    def __init__(self, spec):
        self.spec = spec

    def start(self, n: int, seed: int) -> "RandomPolicy":
        self._slots, self._rng, self._episodes = np.arange(n), np.random.default_rng(seed), EpisodeTracker(n)
        return self

    def step(self, obs, rewards, terminated, truncated) -> StepResult:
        first, ended, returns, lengths = self._episodes.observe(self._slots, rewards, terminated, truncated)
        actions = random_actions(self.spec, len(obs), self._rng)
        return StepResult(actions, first, self._slots[ended], returns[ended], lengths[ended], None)


def evaluate(
    policy: "Policy | RandomPolicy", env_id: str, episodes: int, seed: int, options: EnvOptions = EnvOptions(),
    max_steps: int | None = MAX_EPISODE_STEPS, num_envs: int = EVAL_ENVS, on_episode=None, env_threads: int = 1,
) -> EvalResult:
    """Plays `episodes` episodes on min(episodes, num_envs) envs and returns
    their returns, in the order the episodes started (env order first).

    An env whose episode ends starts another while fewer than `episodes` have
    started; the evaluation ends when every started episode has ended. Which
    episodes are counted depends only on the episodes that ended before they
    started, never on their own outcome, so the mean is an unbiased estimate
    (counting the first `episodes` to *end* would favour short episodes).
    `max_steps` (None: no limit): an episode still running after that many
    steps ends there, with its return so far (for envs without a time limit
    of their own, where a good greedy policy may play on indefinitely;
    `truncated` counts them). Its env plays that episode on uncounted (not
    every vector env can reset one of its envs alone) and starts a counted one
    when it ends; should every env be so stuck for another `max_steps` steps,
    the evaluation ends with the episodes it has (`unplayed` says how many
    fewer).
    `on_episode(ended, mean)`, if given, is called as each counted episode
    ends, with how many have and the mean of their returns (for progress
    lines: short episodes end first, so it is no estimate until the end).
    `env_threads`: the emulator threads of an Atari env; an evaluation that
    has the machine to itself (`seedq eval`, a comparison's) gives it
    `seedq.process.affinity.usable_cores()`, one during training leaves the cores to
    the actors."""
    if episodes < 1:
        raise ValueError(f"episodes={episodes}: must be >= 1")
    if num_envs < 1:
        raise ValueError(f"num_envs={num_envs}: must be >= 1")
    n = min(episodes, num_envs)
    env = make_vector_env(env_id, n, options=options, threads=env_threads)
    played: list[tuple[int, float, int, bool]] = []  # (start index, return, length, cut at max_steps)
    index = np.arange(n)  # the start index of each env's current episode; -1: not counted
    started = n
    so_far = np.zeros(n, np.float64)  # the running return and length of each env's current episode
    length = np.zeros(n, np.int64)
    total = 0.0  # of the counted returns so far

    def stuck() -> bool:  # every env plays an uncounted episode cut over max_steps ago
        return max_steps is not None and bool((length >= 2 * max_steps).all())

    try:
        obs, _ = env.reset(seed=seed)
        no = np.zeros(n, bool)
        result = policy.start(n, seed).step(obs, np.zeros(n, np.float32), no, no)
        while (index >= 0).any() or (started < episodes and not stuck()):
            obs, rewards, terminated, truncated, _ = env.step(result.actions)
            # An env that ended its episode last step resets on this one (next-step
            # autoreset): reward 0, and the step is not one of the new episode's.
            resetting = length < 0
            so_far += np.asarray(rewards, np.float64)
            length += 1
            so_far[resetting], length[resetting] = 0.0, 0
            result = policy.step(obs, rewards, terminated, truncated)
            for slot, ret, steps in zip(result.ended_slots, result.ended_returns, result.ended_lengths):
                if index[slot] >= 0:
                    played.append((int(index[slot]), float(ret), int(steps), False))
                    total += float(ret)
                    if on_episode is not None:
                        on_episode(len(played), total / len(played))
                index[slot], started = (started, started + 1) if started < episodes else (-1, started)
                length[slot] = -1
            if max_steps is not None:
                for slot in np.flatnonzero((index >= 0) & (length >= max_steps)):
                    played.append((int(index[slot]), float(so_far[slot]), int(length[slot]), True))
                    index[slot] = -1
    finally:
        env.close()
    played.sort()
    return EvalResult(
        env=env_id, episodes=len(played), seed=seed, greedy=policy.greedy,
        returns=[r for _, r, _, _ in played], lengths=[k for _, _, k, _ in played],
        truncated=sum(cut for *_, cut in played), unplayed=episodes - len(played),
    )


def record_video(
    policy: Policy, env_id: str, path: str, seed: int, options: EnvOptions = EnvOptions()
) -> dict:
    """Plays one episode rendered with render_mode="rgb_array" and writes it
    to `path` (.mp4 via ffmpeg, or .gif); returns {path, frames, return, fps}."""
    with warnings.catch_warnings():
        # imageio starts ffmpeg with fork+exec, which JAX warns about; the exec makes it safe.
        warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
        return _record_video(policy, env_id, path, seed, options)


def _record_video(policy: Policy, env_id: str, path: str, seed: int, options: EnvOptions) -> dict:
    import imageio.v2 as imageio

    ext = os.path.splitext(path)[1].lower()
    if ext not in VIDEO_FORMATS:
        raise ValueError(f"video {path!r}: use a {' or '.join(VIDEO_FORMATS)} file name")
    # Off-screen rendering: no display or sound device needed (pygame-based envs).
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    env = make_env(env_id, options, render_mode="rgb_array")
    fps = float(env.metadata.get("render_fps") or 30)
    stride = max(1, math.ceil(fps / GIF_MAX_FPS)) if ext == ".gif" else 1
    frames: list[np.ndarray] = []
    writer = None
    if ext == ".mp4":
        # macro_block_size=1: frames are padded to even sizes here instead of resized.
        writer = imageio.get_writer(path, fps=fps, codec="libx264", macro_block_size=1,
                                    ffmpeg_log_level="error")
    count = 0
    total = 0.0

    def add(frame) -> None:
        nonlocal count
        if frame is None:
            return
        if count % stride == 0:
            if writer is not None:
                writer.append_data(_even(video_frame(frame)))
            else:
                frames.append(video_frame(frame))
        count += 1

    try:
        obs, _ = env.reset(seed=seed)
        result = policy.start(1, seed).step(np.asarray(obs)[None], np.zeros(1, np.float32),
                                            np.zeros(1, bool), np.zeros(1, bool))
        add(env.render())
        while not len(result.ended_slots):
            obs, reward, terminated, truncated, _ = env.step(result.actions[0])
            add(env.render())
            result = policy.step(np.asarray(obs)[None], np.array([reward], np.float32),
                                 np.array([terminated]), np.array([truncated]))
        total = float(result.ended_returns[0])
    finally:
        env.close()
        if writer is not None:
            writer.close()
    if ext == ".gif":
        imageio.mimsave(path, frames, duration=1000.0 * stride / fps, loop=0)
    return {"path": path, "frames": (count + stride - 1) // stride, "return": total,
            "fps": fps / stride}


def video_frame(frame) -> np.ndarray:
    """An env's rendered frame as uint8 RGB [H, W, 3] with its short side at
    least MIN_VIDEO_SIDE, scaled by a whole factor (sharp pixels). Float
    frames are in [0, 1] (MinAtar), so they are scaled to 0..255 first: a
    plain uint8 cast made them black."""
    frame = np.asarray(frame)
    if np.issubdtype(frame.dtype, np.floating):
        frame = np.clip(np.rint(frame * 255.0), 0, 255)
    frame = frame.astype(np.uint8)
    if frame.ndim == 2:
        frame = frame[..., None]
    if frame.shape[-1] == 1:
        frame = np.repeat(frame, 3, axis=-1)
    factor = math.ceil(MIN_VIDEO_SIDE / min(frame.shape[:2]))
    if factor > 1:
        frame = frame.repeat(factor, axis=0).repeat(factor, axis=1)
    return frame


def _even(frame: np.ndarray) -> np.ndarray:
    """Pads H and W to even sizes (yuv420p video needs them)."""
    h, w = frame.shape[:2]
    if h % 2 or w % 2:
        frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    return frame


@dataclasses.dataclass
class LoadedPolicy:
    policy: Policy
    config: TrainConfig  # the run's config with the eval overrides applied
    checkpoint: str  # the step directory
    counters: dict  # the checkpoint's counters


def load_policy(
    path: str, *, env: str | None = None, precision: str | None = None, greedy: bool = True
) -> LoadedPolicy:
    """The policy in the checkpoint at `path` (a run directory: its newest
    checkpoint; or a checkpoint step directory), rebuilt from the config saved
    with it. `env` / `precision` override the run's; CheckpointError (a
    ValueError) explains anything that does not fit, in one line."""
    meta, step_dir = checkpoint.read_meta(path)
    try:
        config = config_lib.from_saved(meta["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise checkpoint.CheckpointError(
            f"{step_dir}: its config (written by {checkpoint.written_by(meta)}) cannot be read here ({e})"
        ) from None
    if not env and names_code(config.env):
        # A checkpoint may come from anyone: its env id must not run code unasked.
        raise checkpoint.CheckpointError(
            f"{step_dir}: its env {config.env!r} imports or calls code named in the checkpoint; "
            "give it explicitly (--env, or env= of seedq.load_policy; the same id, if you trust it)"
        )
    trained_on = config.env
    overrides = {k: v for k, v in (("env", env), ("precision", precision)) if v}
    config = dataclasses.replace(config, **overrides)
    config.validate()
    spec = env_spec(config.env, config.env_options)
    if config.env != trained_on and not names_code(trained_on):
        mismatch = env_spec(trained_on, config.env_options).describe_mismatch(spec)
        if mismatch:
            raise checkpoint.CheckpointError(
                f"{step_dir}: trained on {trained_on}, which {config.env} does not fit ({mismatch}); "
                f"evaluate it on {trained_on} (leave out --env)"
            )
    agent = make_agent(config, spec)
    like_state = jax.jit(agent.init)(jax.random.PRNGKey(0))
    snapshot, step_dir = checkpoint.restore(
        step_dir, like_state, jax.random.PRNGKey(0), env=config.env
    )
    precision = InferencePrecision(agent, spec, config.precision)
    params = precision.publish(agent.inference_params(jax.device_put(snapshot.state)))
    return LoadedPolicy(Policy(precision, params, greedy=greedy), config, step_dir, snapshot.counters)
