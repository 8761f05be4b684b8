"""What an env observes besides its id: Atari preprocessing, DMC action repeat."""

from __future__ import annotations

import dataclasses

from seedq.config.checks import check_non_negative, check_positive, check_unit_interval


@dataclasses.dataclass(frozen=True)
class AtariConfig:
    """Preprocessing of ALE/* envs (ale_py's vector env, in the actor) and their rewards.

    Actors send one grey screen_size x screen_size uint8 frame per step; the
    learner stacks `frame_stack` of them (see TrainConfig.frame_stack).
    """

    # Each action is repeated this many emulator frames (1: no repeat).
    frame_skip: int = 4
    # Observe the max of the last two emulator frames of a repeat (removes sprite flicker).
    max_pool: bool = True
    # Up to this many no-op actions after a reset (random start states).
    noop_max: int = 30
    # End the episode (for learning) when a life is lost; returns still count whole games.
    terminal_on_life_loss: bool = False
    # Sticky actions: probability that the emulator repeats the previous action.
    repeat_action_probability: float = 0.25
    screen_size: int = 84  # side of the square grey frame, in pixels
    # All 18 actions instead of the game's minimal set.
    full_action_space: bool = False
    # Episodes are truncated after this many emulator frames (30 min of play).
    max_episode_frames: int = 108_000
    # Clip training rewards to [-1, 1] on the learner (reported returns stay unclipped).
    clip_rewards: bool = True

    def validate(self) -> None:
        check_positive({
            "atari.frame_skip": self.frame_skip,
            "atari.screen_size": self.screen_size,
            "atari.max_episode_frames": self.max_episode_frames,
        })
        check_non_negative({"atari.noop_max": self.noop_max})
        check_unit_interval({"atari.repeat_action_probability": self.repeat_action_probability})


@dataclasses.dataclass(frozen=True)
class DmcConfig:
    """DeepMind Control suite envs (dmc:<domain>-<task>)."""

    # Each action is applied for this many control steps, their rewards summed
    # (the usual DMC agent setting; episodes keep their 1000-step return scale).
    action_repeat: int = 1

    def validate(self) -> None:
        check_positive({"dmc.action_repeat": self.action_repeat})


@dataclasses.dataclass(frozen=True)
class EnvOptions:
    """Everything besides the id that decides what an env observes; the learner and
    every actor must agree on it (TrainConfig.env_options)."""

    atari: AtariConfig = AtariConfig()
    dmc: DmcConfig = DmcConfig()

    def validate(self) -> None:
        self.atari.validate()
        self.dmc.validate()
