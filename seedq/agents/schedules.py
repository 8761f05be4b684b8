"""The linear anneal both agents use for the learning rate, and V-trace also for
its entropy bonus (optax schedules by train step)."""

from __future__ import annotations

import optax

from seedq.config import DEFAULT_DECAY_FRAMES


def annealed_learning_rate(learning_rate: float, decay_frames: int, frames_per_step: float) -> optax.Schedule:
    """Constant (`decay_frames` 0), or linear from `learning_rate` (or a
    coefficient annealed alongside it) to 0 over
    `decay_frames` env frames, then 0, at `frames_per_step` new frames per train step.

    -1 (the run's budget) is resolved by `seedq.config.agent_config_for_run` when
    there is a run; an agent built without one anneals over DEFAULT_DECAY_FRAMES."""
    if decay_frames == -1:
        decay_frames = DEFAULT_DECAY_FRAMES
    if not decay_frames:
        return optax.constant_schedule(learning_rate)
    steps = max(int(decay_frames / frames_per_step), 1)
    return optax.linear_schedule(learning_rate, 0.0, steps)
