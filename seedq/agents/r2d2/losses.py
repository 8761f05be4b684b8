"""R2D2's learning math as pure JAX functions: value rescaling, n-step
double-Q targets with episode ends inside a sequence, sequence priorities.

Reference: Kapturowski et al. 2019, "Recurrent Experience Replay in
Distributed Reinforcement Learning", https://openreview.net/pdf?id=r1lyTjAqYX

Conventions (time-major, `T` transitions, `B` batch elements, `A` actions):
transition s is x_s --a_s--> x_{s+1}. Arrays named `*_t` belong to the end
of the transition: `r_t[s]` is the reward of transition s, `discount_t[s]`
is gamma, or 0 when x_{s+1} is terminal, `stop_t[s]` is True when x_{s+1}
ends its episode (terminated *or* truncated), `v_t[s]` is the value of
x_{s+1}. A truncated episode keeps its discount (the final observation is
bootstrapped from) but still stops the n-step sum, because the transition out
of a final observation is the env's reset, not a real step.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

Array = chex.Array


def signed_hyperbolic(x: Array, eps: float = 1e-3) -> Array:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x: R2D2's value rescaling.

    Shape-preserving, any shape. Compresses large returns roughly to their
    square root while staying invertible (`signed_parabolic` is h^-1).
    """
    chex.assert_type(x, float)
    return jnp.sign(x) * (jnp.sqrt(jnp.abs(x) + 1.0) - 1.0) + eps * x


def signed_parabolic(y: Array, eps: float = 1e-3) -> Array:
    """h^-1(y), the inverse of `signed_hyperbolic`. Shape-preserving.

    For y >= 0, write s = sqrt(x + 1): h(x) = y reads
    eps s^2 + s - c = 0 with c = 1 + eps + y, so
    s = (sqrt(1 + 4 eps c) - 1) / (2 eps) = 2 c / (sqrt(1 + 4 eps c) + 1)
    (the second form avoids the cancellation of the first in float32) and
    x = s^2 - 1 = (s - 1)(s + 1); odd symmetry gives negative y.
    """
    chex.assert_type(y, float)
    c = 1.0 + eps + jnp.abs(y)
    root = 2.0 * c / (jnp.sqrt(1.0 + 4.0 * eps * c) + 1.0)
    return jnp.sign(y) * (root - 1.0) * (root + 1.0)


def n_step_returns(r_t: Array, discount_t: Array, v_t: Array, stop_t: Array, n: int) -> Array:
    """Per-step n-step bootstrapped returns over a sequence, [T, B] -> [T, B].

        G_s = r_t[s] + discount_t[s] * r_t[s+1] + ...
              + discount_t[s] ... discount_t[s+k-2] * r_t[s+k-1]
              + discount_t[s] ... discount_t[s+k-1] * v_t[s+k-1]

    where k = min(n, T - s, 1 + (steps from s to the first stop_t at or after s)):
    the sum stops after n transitions, at the end of the sequence (a shorter
    return, as near the end of any finite sequence) and at an episode end,
    where it bootstraps from the final observation's value (multiplied by a
    zero discount if the episode terminated, by gamma if it was truncated).

    Args:
      r_t: rewards [T, B].
      discount_t: per-transition discounts [T, B].
      v_t: bootstrap values V(x_{s+1}) [T, B].
      stop_t: bool [T, B], x_{s+1} ends its episode.
      n: number of steps, >= 1.

    Returns:
      G [T, B] (not gradient-stopped).
    """
    chex.assert_rank([r_t, discount_t, v_t, stop_t], 2)
    chex.assert_equal_shape([r_t, discount_t, v_t, stop_t])
    chex.assert_type([r_t, discount_t, v_t], float)
    if n < 1:
        raise ValueError(f"n={n}: need n >= 1")
    T = r_t.shape[0]
    last = jnp.arange(T) == T - 1  # the sequence ends after this transition
    stop = stop_t.astype(bool) | last[:, None]

    def ahead(x, j, fill):
        """x[s + j] at row s (fill past the end)."""
        if j == 0:
            return x
        pad = jnp.full((min(j, T),) + x.shape[1:], fill, x.dtype)
        return jnp.concatenate([x[j:], pad], axis=0)[:T]

    total = jnp.zeros_like(r_t)
    scale = jnp.ones_like(r_t)  # product of the discounts passed so far
    open_ = jnp.ones_like(r_t)  # 1 while the sum for row s is still running
    for j in range(n):
        stop_j = ahead(stop, j, True) | (j == n - 1)
        scale_after = scale * ahead(discount_t, j, 0.0)
        total = total + open_ * (scale * ahead(r_t, j, 0.0))
        total = total + open_ * stop_j * (scale_after * ahead(v_t, j, 0.0))
        open_ = open_ * (1.0 - stop_j.astype(r_t.dtype))
        scale = scale_after
    return total


class DoubleQTargets(NamedTuple):
    """Outputs of `transformed_n_step_double_q`; all [T, B]."""

    td_error: Array  # h(G) - Q(x_s, a_s)
    target: Array  # h(G), gradient-stopped


def transformed_n_step_double_q(
    q_tm1: Array,
    a_tm1: Array,
    selector_q_t: Array,
    target_q_t: Array,
    r_t: Array,
    discount_t: Array,
    stop_t: Array,
    n: int,
    eps: float = 1e-3,
) -> DoubleQTargets:
    """n-step double Q-learning TD errors in rescaled value space.

    The bootstrap action at x_{s+1} is argmax_a selector_q_t[s] (the online
    network: double Q-learning); its value is read from `target_q_t` (the
    target network) and mapped back to return space with h^-1. n-step returns
    are formed there (`n_step_returns`) and mapped into the network's space with h:

        target_s = h(G_s),  td_s = target_s - q_tm1[s, a_tm1[s]]

    Args:
      q_tm1: online Q(x_s, .) [T, B, A].
      a_tm1: actions a_s, int [T, B].
      selector_q_t: online Q(x_{s+1}, .) [T, B, A] (selects the action).
      target_q_t: target-network Q(x_{s+1}, .) [T, B, A] (evaluates it).
      r_t, discount_t, stop_t: [T, B], see `n_step_returns`.
      n: number of steps.
      eps: value-rescaling epsilon.

    Returns:
      DoubleQTargets(td_error [T, B], target [T, B]).
    """
    chex.assert_rank([q_tm1, selector_q_t, target_q_t, a_tm1], [3, 3, 3, 2])
    chex.assert_equal_shape([q_tm1, selector_q_t, target_q_t])
    chex.assert_equal_shape([a_tm1, r_t, discount_t, stop_t])
    chex.assert_equal_shape_prefix([q_tm1, a_tm1], 2)
    chex.assert_type(a_tm1, int)
    a_t = jnp.argmax(jax.lax.stop_gradient(selector_q_t), axis=-1)
    q_t = jnp.take_along_axis(jax.lax.stop_gradient(target_q_t), a_t[..., None], axis=-1)[..., 0]
    returns = n_step_returns(r_t, discount_t, signed_parabolic(q_t, eps), stop_t, n)
    target = jax.lax.stop_gradient(signed_hyperbolic(returns, eps))
    q_a = jnp.take_along_axis(q_tm1, a_tm1[..., None], axis=-1)[..., 0]
    return DoubleQTargets(td_error=target - q_a, target=target)


def sequence_priorities(abs_td: Array, mask: Array, eta: float = 0.9) -> Array:
    """R2D2 priority per sequence: eta * max_s |td| + (1 - eta) * mean_s |td|.

    Max and mean run over the steps where `mask` is set; a sequence with no
    such step gets priority 0.

    Args:
      abs_td: |td errors| [T, B].
      mask: 1 where the step counts [T, B].
      eta: mixing weight of the max.

    Returns:
      priorities [B].
    """
    chex.assert_rank([abs_td, mask], 2)
    chex.assert_equal_shape([abs_td, mask])
    mask = mask.astype(abs_td.dtype)
    count = jnp.sum(mask, axis=0)
    mean = jnp.sum(abs_td * mask, axis=0) / jnp.maximum(count, 1.0)
    maximum = jnp.max(abs_td * mask, axis=0)  # |td| >= 0, so masked zeros never win
    return eta * maximum + (1.0 - eta) * mean


def weighted_sequence_loss(td: Array, mask: Array, weights: Array) -> Array:
    """Importance-weighted squared TD loss: mean_b w_b * sum_s mask 0.5 td^2 / T.

    Args:
      td: TD errors [T, B].
      mask: 1 where the step counts [T, B].
      weights: importance-sampling weights [B].

    Returns:
      scalar loss. Masked steps count as zero in the per-sequence mean over
      T, so every step has the same weight whatever the mask.
    """
    chex.assert_rank([td, mask, weights], [2, 2, 1])
    chex.assert_equal_shape([td, mask])
    chex.assert_equal_shape_prefix([td[0], weights], 1)
    per_sequence = jnp.mean(0.5 * jnp.square(td) * mask.astype(td.dtype), axis=0)
    return jnp.mean(jax.lax.stop_gradient(weights) * per_sequence)
