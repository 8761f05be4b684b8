"""Frame stacking on the learner: actors send one frame per step, the learner stacks.

The last K-1 frames of every env are part of the agent's recurrent
("core") state, so the inference server keeps them per env like an LSTM
state, resets them at episode starts, and stores the stack an unroll starts
from once per unroll (`core/frames`). The learner rebuilds every step's
stack from that and the unroll's single frames (`stack_unroll`): 4x less
wire traffic and unroll memory than sending stacks.

Episode starts use gymnasium's FrameStackObservation "reset" padding: the
first frame fills the whole stack.

Shapes: frames [N, H, W] uint8; stacks [N, H, W, K] (channels last, oldest
first, as the CNN torsos expect).
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np

CORE_KEY = "frames"


def push_frame(previous: jax.Array, frame: jax.Array, first: jax.Array) -> jax.Array:
    """One step: (previous [N, H, W, K-1], frame [N, H, W], first [N]) -> stack [N, H, W, K].

    The next step's `previous` is `stack[..., 1:]`.
    """
    chex.assert_rank([previous, frame, first], [4, 3, 1])
    chex.assert_equal_shape_prefix([previous, frame, first], 1)
    frame = frame[..., None]
    padded = jnp.broadcast_to(frame, previous.shape)  # reset padding
    previous = jnp.where(first[:, None, None, None], padded, previous.astype(frame.dtype))
    return jnp.concatenate([previous, frame], axis=-1)


def stack_unroll(initial_previous: jax.Array, frames: jax.Array, first: jax.Array) -> jax.Array:
    """Every step's stack of a batch of unrolls.

    Args:
      initial_previous: the K-1 frames before each unroll's first step, [B, H, W, K-1].
      frames: the unrolls' single frames, [B, T, H, W].
      first: episode-start flags, [B, T].

    Returns:
      stacks [B, T, H, W, K], equal to applying `push_frame` step by step.
    """
    chex.assert_rank([initial_previous, frames, first], [4, 4, 2])
    chex.assert_equal_shape_prefix([frames, first], 2)

    def step(previous, inputs):
        frame, is_first = inputs
        stack = push_frame(previous, frame, is_first)
        return stack[..., 1:], stack

    _, stacks = jax.lax.scan(
        step, initial_previous.astype(frames.dtype),
        (jnp.swapaxes(frames, 0, 1), jnp.swapaxes(first, 0, 1)),
    )
    return jnp.swapaxes(stacks, 0, 1)


@dataclasses.dataclass(frozen=True)
class FrameStacker:
    """Stacking of `size` frames of shape `frame_shape` (an agent holds one for pixel envs)."""

    size: int
    frame_shape: tuple[int, int]
    dtype: np.dtype = np.dtype(np.uint8)

    @property
    def stacked_shape(self) -> tuple[int, int, int]:
        return (*self.frame_shape, self.size)

    def initial_core_state(self, n: int) -> dict[str, np.ndarray]:
        if self.size == 1:
            return {}
        return {CORE_KEY: np.zeros((n, *self.frame_shape, self.size - 1), self.dtype)}

    def act(self, core_state: dict, frames: jax.Array, first: jax.Array):
        """(core {frames: [N, H, W, K-1]}, frames [N, H, W], first [N]) -> (stacks [N, H, W, K], new core)."""
        if self.size == 1:
            return frames[..., None], core_state
        stack = push_frame(core_state[CORE_KEY], frames, first)
        return stack, {**core_state, CORE_KEY: stack[..., 1:]}

    def unroll(self, batch: dict) -> jax.Array:
        """Stacks [B, T, H, W, K] of a batch with obs [B, T, H, W], first, core/frames."""
        if self.size == 1:
            return batch["obs"][..., None]
        return stack_unroll(batch["core/" + CORE_KEY], batch["obs"], batch["first"])


def frame_stacker(obs_shape: tuple[int, ...], obs_dtype, size: int) -> FrameStacker | None:
    """A FrameStacker for single grey frames [H, W] uint8, else None (vectors, or RGB frames
    that are already [H, W, C] are fed to the network as they are)."""
    if np.dtype(obs_dtype) != np.uint8 or len(obs_shape) != 2:
        return None
    if size < 1:
        raise ValueError(f"frame_stack={size}: must be >= 1")
    return FrameStacker(size, tuple(int(d) for d in obs_shape))
