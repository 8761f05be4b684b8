"""Running mean/variance of observations, for normalising vector inputs.

Continuous-control observations mix positions (~1) and velocities (~10):
without normalisation a tanh torso saturates on the large ones. The learner
updates the statistics from every training batch and publishes them with the
parameters, so acting and learning normalise identically (a change of
statistics is just a policy change, which V-trace's importance weights
absorb).

Statistics merge batches exactly (Chan et al.'s parallel variance update),
so they equal the mean/variance over every observation seen so far.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

# Normalised values are clipped to +-CLIP (a rare outlier must not dominate a layer).
CLIP = 10.0
_EPS = 1e-8


class RunningStats(NamedTuple):
    count: jax.Array  # [] float32: observations seen
    mean: jax.Array  # [D]
    m2: jax.Array  # [D]: sum of squared deviations from the mean


def init_stats(dim: int) -> RunningStats:
    return RunningStats(jnp.zeros((), jnp.float32), jnp.zeros(dim, jnp.float32), jnp.zeros(dim, jnp.float32))


def update_stats(stats: RunningStats, x: jax.Array) -> RunningStats:
    """Merges a batch x [N, D] into `stats`."""
    chex.assert_rank(x, 2)
    x = x.astype(jnp.float32)
    n = jnp.float32(x.shape[0])
    batch_mean = jnp.mean(x, axis=0)
    batch_m2 = jnp.sum(jnp.square(x - batch_mean), axis=0)
    total = stats.count + n
    delta = batch_mean - stats.mean
    mean = stats.mean + delta * n / total
    m2 = stats.m2 + batch_m2 + jnp.square(delta) * stats.count * n / total
    return RunningStats(total, mean, m2)


def normalize(stats: RunningStats, x: jax.Array) -> jax.Array:
    """(x - mean) / std, clipped to +-CLIP; x [..., D]. Identity-scaled until two
    observations were seen. No gradient flows into the statistics."""
    stats = jax.lax.stop_gradient(stats)
    var = jnp.where(stats.count > 1, stats.m2 / jnp.maximum(stats.count, 1.0), 1.0)
    return jnp.clip((x.astype(jnp.float32) - stats.mean) / jnp.sqrt(var + _EPS), -CLIP, CLIP)
