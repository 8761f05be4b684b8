"""The optimizer both agents train with, and the linear anneal its learning
rate follows (which V-trace's entropy bonus and lookahead follow too).

Gradients are clipped to a global norm, then Adam takes a step of unit rate,
which `Optimizer.update` scales by the learning rate at the learner's train
step. The rate follows the step the learner state already counts (optax
schedules inside Adam would keep a second count in the optimiser state), so
the optimiser state has one layout for both agents, annealed or not.
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from seedq.config import OptimizerConfig


def linear_anneal(start: float, steps: int) -> optax.Schedule:
    """By train step: `start` falling linearly to 0 over `steps` steps, then 0;
    constant `start` when `steps` is 0 (no anneal)."""
    if not steps:
        return optax.constant_schedule(start)
    return optax.linear_schedule(start, 0.0, steps)


def anneal_steps(config: OptimizerConfig, frames_per_step: float, max_frames: int = 0) -> int:
    """Train steps over which the rate falls to 0 (0: constant): the horizon in
    env frames (-1: the run's `max_frames`, `OptimizerConfig.decay_frames_for`)
    at `frames_per_step` new env frames per train step; at least 1 step."""
    frames = config.decay_frames_for(max_frames)
    return max(int(frames / frames_per_step), 1) if frames else 0


class Optimizer:
    """Clip, Adam and the annealed rate of one agent (`config`: its section's
    optimizer fields; `frames_per_step`: new env frames per train step;
    `max_frames`: the run's budget, 0 for none)."""

    def __init__(self, config: OptimizerConfig, frames_per_step: float, max_frames: int = 0):
        self.anneal_steps = anneal_steps(config, frames_per_step, max_frames)
        self.learning_rate = self.annealed(config.learning_rate)
        self._transform = optax.chain(
            optax.clip_by_global_norm(config.max_grad_norm),
            optax.adam(1.0, eps=config.adam_eps),
        )

    @property
    def anneals(self) -> bool:
        """Whether the rate falls (false: constant)."""
        return bool(self.anneal_steps)

    def annealed(self, start: float) -> optax.Schedule:
        """A coefficient by train step that falls from `start` to 0 with the learning rate."""
        return linear_anneal(start, self.anneal_steps)

    def init(self, params) -> Any:
        return self._transform.init(params)

    def update(self, grads, opt_state, params, step: jax.Array) -> tuple[Any, Any, jax.Array]:
        """(updates to add to `params`, the new optimiser state, the rate used)
        at train step `step` (the learner state's count of updates so far)."""
        rate = self.learning_rate(step)
        updates, opt_state = self._transform.update(grads, opt_state, params)
        return optax.tree.scale(rate, updates), opt_state, rate
