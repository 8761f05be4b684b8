"""Learning-health statistics: the signs of a collapse before the return shows it.

Issue 11's probe: with value targets of about +-100, Adam drove every unit of
the shared tanh torso to +-1, the features stopped depending on the state,
the policy drifted to one constant action and every gradient vanished. Each
stage of that has a number here, logged to TensorBoard by the learner:
saturation of the torso, the spread of the logits across states, the policy's
entropy, the value's mean and spread, the advantage scale; and for ReLU
convolutions the channels that no input of the batch activates (a dead
channel passes no gradient and never comes back).

Pure functions on time-major arrays [T, B, ...] with a validity mask [T, B]
(1 where a step is a real transition); masked steps count nowhere.
"""

from __future__ import annotations

from typing import Sequence

import chex
import jax
import jax.numpy as jnp

# A tanh unit this close to +-1 passes (almost) no gradient: 1 - 0.99^2 ~ 0.02.
SATURATED = 0.99


def masked_mean_std(x: chex.Array, mask: chex.Array) -> tuple[jax.Array, jax.Array]:
    """(mean, std) of x [T, B] over the steps where mask [T, B] is 1."""
    chex.assert_equal_shape([x, mask])
    count = jnp.maximum(jnp.sum(mask), 1.0)
    mean = jnp.sum(x * mask) / count
    var = jnp.sum(jnp.square(x - mean) * mask) / count
    return mean, jnp.sqrt(var)


def spread_across_states(logits: chex.Array, mask: chex.Array) -> jax.Array:
    """Mean over actions of the std across valid states of logits [T, B, A] - mask [T, B].

    Near 0 when the policy no longer depends on the state."""
    chex.assert_rank([logits, mask], [3, 2])
    chex.assert_equal_shape_prefix([logits, mask], 2)
    stds = jax.vmap(lambda a: masked_mean_std(a, mask)[1], in_axes=2)(logits)
    return jnp.mean(stds)


def saturation(activations: Sequence[chex.Array]) -> jax.Array:
    """Share of the hidden units' outputs (tanh layers [N, H] each) with |x| > SATURATED."""
    saturated = sum(jnp.sum(jnp.abs(a) > SATURATED) for a in activations)
    total = sum(a.size for a in activations)
    return saturated / max(total, 1)


def dead_channels(feature_maps: chex.Array) -> jax.Array:
    """Share of the channels of ReLU feature maps [N, H, W, C] that are 0 at
    every position of every sample of the batch."""
    chex.assert_rank(feature_maps, 4)
    alive = jnp.any(feature_maps > 0, axis=(0, 1, 2))
    return 1.0 - jnp.mean(alive.astype(jnp.float32))


def geometric_mean_and_min_std(log_std: chex.Array) -> tuple[jax.Array, jax.Array]:
    """A Gaussian policy's std over its action dimensions: (exp(mean log std),
    min std). log_std [..., d] (state-independent stds repeat along the
    leading axes, so no mask is needed)."""
    return jnp.exp(jnp.mean(log_std)), jnp.exp(jnp.min(log_std))
