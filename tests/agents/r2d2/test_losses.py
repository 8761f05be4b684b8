"""R2D2's losses against rlax (a test-only oracle): value rescaling, n-step
double-Q targets with and without episode ends, sequence priorities."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from seedq.agents.r2d2 import losses

EPS = 1e-3


def _rng(seed=0):
    return np.random.default_rng(seed)


# --- value rescaling ------------------------------------------------------------


X = np.concatenate([np.linspace(-500, 500, 2001), [0.0, 1e-6, -1e-6, 0.3, 1e4, -1e4]])


@pytest.mark.unit
def test_value_rescaling_matches_rlax_in_float64():
    with jax.enable_x64(True):
        x = jnp.asarray(X, jnp.float64)
        h = losses.signed_hyperbolic(x, EPS)
        np.testing.assert_allclose(h, rlax.signed_hyperbolic(x, EPS), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(
            losses.signed_parabolic(h, EPS), rlax.signed_parabolic(h, EPS), rtol=1e-9, atol=1e-9
        )
        np.testing.assert_allclose(losses.signed_parabolic(h, EPS), X, rtol=1e-9, atol=1e-9)


@pytest.mark.unit
def test_value_rescaling_float32_is_accurate_and_inverts():
    """In float32 both transforms stay within float32 rounding of the exact
    (float64) values; rlax's inverse loses ~1e-5 relative to cancellation."""
    x = X.astype(np.float32)
    h = losses.signed_hyperbolic(jnp.asarray(x), EPS)
    exact_h = np.sign(X) * (np.sqrt(np.abs(X) + 1) - 1) + EPS * X
    np.testing.assert_allclose(h, exact_h, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(h, rlax.signed_hyperbolic(jnp.asarray(x), EPS), rtol=1e-6, atol=1e-6)
    back = losses.signed_parabolic(h, EPS)
    np.testing.assert_allclose(back, X, rtol=2e-6, atol=1e-6)
    # rlax's float32 inverse is off by up to ~1e-3 (cancellation); ours is not.
    np.testing.assert_allclose(back, rlax.signed_parabolic(h, EPS), rtol=5e-5, atol=2e-3)
    # The formula itself, by hand, at a few points.
    for v in (-3.0, 0.0, 8.0, 99.0):
        expected = np.sign(v) * (np.sqrt(abs(v) + 1) - 1) + EPS * v
        assert float(losses.signed_hyperbolic(jnp.float32(v), EPS)) == pytest.approx(expected, abs=1e-6)


# --- n-step double Q vs rlax ---------------------------------------------------


def _random_q_inputs(T, A, seed):
    rng = _rng(seed)
    return dict(
        q_tm1=rng.normal(size=(T, A)).astype(np.float32) * 3,
        a_tm1=rng.integers(0, A, T).astype(np.int32),
        selector_q_t=rng.normal(size=(T, A)).astype(np.float32),
        target_q_t=rng.normal(size=(T, A)).astype(np.float32) * 5,
        r_t=rng.normal(size=T).astype(np.float32),
    )


def _ours(inputs, discount_t, stop_t, n):
    """Our function on one sequence ([T] inputs, batch of 1), in float64."""
    with jax.enable_x64(True):
        return _ours64(inputs, discount_t, stop_t, n)


def _ours64(inputs, discount_t, stop_t, n):
    inputs = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in inputs.items()}
    out = losses.transformed_n_step_double_q(
        q_tm1=jnp.asarray(inputs["q_tm1"])[:, None],
        a_tm1=jnp.asarray(inputs["a_tm1"])[:, None],
        selector_q_t=jnp.asarray(inputs["selector_q_t"])[:, None],
        target_q_t=jnp.asarray(inputs["target_q_t"])[:, None],
        r_t=jnp.asarray(inputs["r_t"])[:, None],
        discount_t=jnp.asarray(discount_t, jnp.float64)[:, None],
        stop_t=jnp.asarray(stop_t)[:, None],
        n=n,
        eps=EPS,
    )
    return np.asarray(out.td_error[:, 0])


def _rlax(inputs, discount_t, n, sl=slice(None)):
    """rlax.transformed_n_step_q_learning (double Q: a_t = argmax of the selector), float64."""
    with jax.enable_x64(True):
        return _rlax64(inputs, discount_t, n, sl)


def _rlax64(inputs, discount_t, n, sl):
    inputs = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in inputs.items()}
    a_t = np.argmax(inputs["selector_q_t"], axis=-1).astype(np.int32)
    return np.asarray(
        rlax.transformed_n_step_q_learning(
            jnp.asarray(inputs["q_tm1"][sl]),
            jnp.asarray(inputs["a_tm1"][sl]),
            jnp.asarray(inputs["target_q_t"][sl]),
            jnp.asarray(a_t[sl]),
            jnp.asarray(inputs["r_t"][sl]),
            jnp.asarray(np.asarray(discount_t, np.float64)[sl]),
            n,
            tx_pair=rlax.SIGNED_HYPERBOLIC_PAIR,
        )
    )


@pytest.mark.unit
@pytest.mark.parametrize("n", [1, 3, 5])
def test_n_step_double_q_matches_rlax_without_episode_ends(n):
    T = 12
    inputs = _random_q_inputs(T, 3, seed=n)
    discount = np.full(T, 0.97, np.float32)
    np.testing.assert_allclose(
        _ours(inputs, discount, np.zeros(T, bool), n), _rlax(inputs, discount, n), rtol=1e-10, atol=1e-10
    )


@pytest.mark.unit
@pytest.mark.parametrize("n", [1, 3, 5])
def test_n_step_double_q_matches_rlax_with_terminations_inside(n):
    """Terminal x_{s+1}: discount 0 there, which rlax cuts the same way."""
    T = 16
    inputs = _random_q_inputs(T, 2, seed=10 + n)
    discount = np.full(T, 0.99, np.float32)
    stop = np.zeros(T, bool)
    for s in (4, 5, 11):  # two back-to-back ends, one later
        discount[s], stop[s] = 0.0, True
    np.testing.assert_allclose(_ours(inputs, discount, stop, n), _rlax(inputs, discount, n), rtol=1e-10, atol=1e-10)


@pytest.mark.unit
@pytest.mark.parametrize("n", [2, 5])
def test_n_step_double_q_truncation_bootstraps_and_does_not_cross(n):
    """A time-limit end at x_{k+1}: keep the discount, bootstrap from x_{k+1}, never
    sum past it. Equals rlax run separately on the two segments (rlax shortens
    n-step returns at the end of a sequence and bootstraps from its last value)."""
    T, k = 14, 6
    inputs = _random_q_inputs(T, 2, seed=20 + n)
    discount = np.full(T, 0.95, np.float32)
    stop = np.zeros(T, bool)
    stop[k] = True  # truncated: discount stays 0.95
    ours = _ours(inputs, discount, stop, n)
    expected = np.concatenate(
        [_rlax(inputs, discount, n, slice(0, k + 1)), _rlax(inputs, discount, n, slice(k + 1, T))]
    )
    np.testing.assert_allclose(ours, expected, rtol=1e-10, atol=1e-10)
    # ... and differs from running across the boundary (the test has teeth).
    assert not np.allclose(ours[: k + 1], _rlax(inputs, discount, n)[: k + 1], atol=1e-3)


@pytest.mark.unit
def test_sequence_priorities_mix_max_and_mean_over_valid_steps():
    abs_td = jnp.asarray([[1.0, 0.5], [3.0, 0.25], [9.0, 0.0]])  # [T=3, B=2]
    mask = jnp.asarray([[1, 1], [1, 1], [0, 1]], jnp.float32)  # 9.0 is masked out
    p = np.asarray(losses.sequence_priorities(abs_td, mask, eta=0.9))
    np.testing.assert_allclose(p, [0.9 * 3.0 + 0.1 * 2.0, 0.9 * 0.5 + 0.1 * 0.25], rtol=1e-6)
