"""Running mean/variance of observations (normalising vector inputs) and of
returns (scaling rewards: VTraceConfig.normalize_returns).

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
    return merge(stats, batch_stats(x, jnp.ones(x.shape[0], jnp.float32)))


def batch_stats(x: jax.Array, weight: jax.Array) -> RunningStats:
    """Statistics of the rows of x [N, D] whose weight [N] is 1 (0: left out)."""
    chex.assert_rank([x, weight], [2, 1])
    n = jnp.sum(weight)
    mean = jnp.sum(x * weight[:, None], axis=0) / jnp.maximum(n, 1.0)
    m2 = jnp.sum(jnp.square(x - mean) * weight[:, None], axis=0)
    return RunningStats(n, mean, m2)


def merge(stats: RunningStats, batch: RunningStats) -> RunningStats:
    """Chan et al.'s parallel merge of two sets of statistics."""
    n, batch_mean, batch_m2 = batch
    total = stats.count + n
    delta = batch_mean - stats.mean
    safe_total = jnp.maximum(total, 1.0)
    mean = stats.mean + delta * n / safe_total
    m2 = stats.m2 + batch_m2 + jnp.square(delta) * stats.count * n / safe_total
    return RunningStats(total, mean, m2)


def root_mean_square(stats: RunningStats) -> jax.Array:
    """sqrt(mean^2 + variance) of what `stats` saw [D]; 1 until two values were seen."""
    var = stats.m2 / jnp.maximum(stats.count, 1.0)
    return jnp.where(stats.count > 1, jnp.sqrt(jnp.square(stats.mean) + var + _EPS), 1.0)


def location_and_scale(stats: RunningStats) -> tuple[jax.Array, jax.Array]:
    """(mean [D], std [D]) that `normalize` uses; std 1 until two observations were seen.
    (The ONNX export writes them into its graph as constants.)"""
    var = jnp.where(stats.count > 1, stats.m2 / jnp.maximum(stats.count, 1.0), 1.0)
    return stats.mean, jnp.sqrt(var + _EPS)


def normalize(stats: RunningStats, x: jax.Array) -> jax.Array:
    """(x - mean) / std, clipped to +-CLIP; x [..., D]. Identity-scaled until two
    observations were seen. No gradient flows into the statistics."""
    mean, std = location_and_scale(jax.lax.stop_gradient(stats))
    return jnp.clip((x.astype(jnp.float32) - mean) / std, -CLIP, CLIP)
