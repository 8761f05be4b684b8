"""Tests for seedq.agents.vtrace.losses.

Two independent oracles: rlax (a test-only dependency) and a float64 NumPy
implementation written directly from the IMPALA paper's (non-recursive)
definition of the V-trace targets.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from seedq.agents.vtrace import losses
from seedq.agents.vtrace.networks import Categorical

pytestmark = pytest.mark.unit

T, B, A = 20, 8, 5
GAMMA = 0.99
NO_CLIP = 1e6
ATOL = RTOL = 1e-5

LAMBDAS = [1.0, 0.95]
CLIPS = [(1.0, 1.0), (0.5, 2.0), (2.0, 0.5), (NO_CLIP, NO_CLIP)]
# (seed, std of log-rho): different data and different off-policyness.
DATA = [(0, 0.5), (1, 1.0)]

grid = pytest.mark.parametrize(
    "seed,log_rho_std", DATA, ids=[f"seed{s}-std{x}" for s, x in DATA])
lambdas = pytest.mark.parametrize("lambda_", LAMBDAS)
clips = pytest.mark.parametrize(
    "clip_rho,clip_pg_rho", CLIPS, ids=[f"rho{a:g}-pg{b:g}" for a, b in CLIPS])


# ---------------------------------------------------------------------------
# Helpers.


def make_unroll(seed, log_rho_std=0.5, t=T, b=B, end_prob=0.1):
    """Random float64 unroll with episode ends (discount 0) inside it."""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(t + 1, b))  # V(x_0) .. V(x_T)
    r_t = rng.normal(size=(t, b))
    ends = rng.random((t, b)) < end_prob
    ends[t // 2, 0] = True  # Guarantee at least one end mid-unroll.
    discount_t = np.where(ends, 0.0, GAMMA)
    rho_tm1 = np.exp(rng.normal(scale=log_rho_std, size=(t, b)))
    return dict(v_tm1=values[:-1], v_t=values[1:], r_t=r_t,
                discount_t=discount_t, rho_tm1=rho_tm1)


def to_f32(unroll):
    return {k: jnp.asarray(v, jnp.float32) for k, v in unroll.items()}


def numpy_vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1, lambda_, clip_rho,
                 clip_pg_rho):
    """O(T^2) float64 V-trace, straight from IMPALA eq. 1 (per batch column)."""
    t_len, b_len = v_tm1.shape
    lam = np.broadcast_to(np.asarray(lambda_, np.float64), (t_len, b_len))
    values = np.concatenate([v_tm1, v_t[-1:]], axis=0)  # V(x_0) .. V(x_T)
    c = lam * np.minimum(1.0, rho_tm1)
    delta = np.minimum(clip_rho, rho_tm1) * (
        r_t + discount_t * values[1:] - values[:-1])

    targets = np.zeros((t_len, b_len))
    for b in range(b_len):
        for s in range(t_len):
            total = values[s, b]
            for t in range(s, t_len):
                coef = np.prod(discount_t[s:t, b] * c[s:t, b])  # 1 if t == s
                total += coef * delta[t, b]
            targets[s, b] = total

    advantages = np.zeros((t_len, b_len))
    for b in range(b_len):
        for s in range(t_len):
            if s < t_len - 1:
                q_boot = (lam[s, b] * targets[s + 1, b]
                          + (1.0 - lam[s, b]) * values[s + 1, b])
            else:
                q_boot = values[t_len, b]
            advantages[s, b] = min(clip_pg_rho, rho_tm1[s, b]) * (
                r_t[s, b] + discount_t[s, b] * q_boot - values[s, b])
    return targets, advantages


def rlax_vtrace(unroll, lambda_, clip_rho, clip_pg_rho):
    """rlax is single-sequence: vmap it over the batch axis (axis 1)."""
    fn = functools.partial(
        rlax.vtrace_td_error_and_advantage,
        clip_rho_threshold=clip_rho, clip_pg_rho_threshold=clip_pg_rho)
    args = (unroll["v_tm1"], unroll["v_t"], unroll["r_t"],
            unroll["discount_t"], unroll["rho_tm1"])
    if np.ndim(lambda_) == 0:
        out = jax.vmap(lambda *a: fn(*a, lambda_=lambda_),
                       in_axes=1, out_axes=1)(*args)
    else:
        out = jax.vmap(lambda *a: fn(*a[:-1], lambda_=a[-1]),
                       in_axes=1, out_axes=1)(*args, lambda_)
    return out.errors + unroll["v_tm1"], out.pg_advantage


def numpy_log_softmax(logits):
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def make_loss_inputs(seed, mask_dtype=np.float32):
    rng = np.random.default_rng(100 + seed)
    logits = rng.normal(scale=2.0, size=(T, B, A))
    actions = rng.integers(0, A, size=(T, B))
    advantages = rng.normal(size=(T, B))
    values = rng.normal(size=(T, B))
    targets = rng.normal(size=(T, B))
    mask = rng.random((T, B)) < 0.7
    mask[0, 0], mask[1, 0] = True, False  # Both kinds present for sure.
    return dict(logits=logits, actions=actions, advantages=advantages,
                values=values, targets=targets, mask=mask.astype(mask_dtype))


def f32(x):
    return jnp.asarray(x, jnp.float32)


# The policy-gradient and entropy losses exactly as VTraceAgent.loss composes
# them: its policy's log-probs and entropies into the masked means of `losses`.
POLICY = Categorical(A)


def agent_pg_loss(logits, actions, advantages, mask):
    log_pi_a = POLICY.log_prob({"logits": logits}, actions)
    return losses.policy_gradient_loss_from_log_probs(log_pi_a, advantages, mask)


def agent_entropy_loss(logits, mask):
    return losses.entropy_loss_from_entropy(POLICY.entropy({"logits": logits}), mask)



# ---------------------------------------------------------------------------
# V-trace targets and advantages.


@grid
@lambdas
@clips
def test_vtrace_matches_rlax(seed, log_rho_std, lambda_, clip_rho,
                             clip_pg_rho):
    unroll = to_f32(make_unroll(seed, log_rho_std))
    out = losses.vtrace(**unroll, lambda_=lambda_,
                        clip_rho_threshold=clip_rho,
                        clip_pg_rho_threshold=clip_pg_rho)
    want_targets, want_adv = rlax_vtrace(unroll, lambda_, clip_rho,
                                         clip_pg_rho)
    assert out.targets.shape == out.pg_advantages.shape == (T, B)
    assert out.targets.dtype == out.pg_advantages.dtype == jnp.float32
    np.testing.assert_allclose(out.targets, want_targets, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.pg_advantages, want_adv, rtol=RTOL,
                               atol=ATOL)


@grid
@lambdas
@clips
def test_vtrace_matches_numpy_definition(seed, log_rho_std, lambda_,
                                         clip_rho, clip_pg_rho):
    unroll = make_unroll(seed, log_rho_std)
    out = losses.vtrace(**to_f32(unroll), lambda_=lambda_,
                        clip_rho_threshold=clip_rho,
                        clip_pg_rho_threshold=clip_pg_rho)
    want_targets, want_adv = numpy_vtrace(**unroll, lambda_=lambda_,
                                          clip_rho=clip_rho,
                                          clip_pg_rho=clip_pg_rho)
    # Float32 vs float64 inputs: the tolerance also absorbs input rounding.
    np.testing.assert_allclose(out.targets, want_targets, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.pg_advantages, want_adv, rtol=RTOL,
                               atol=ATOL)


@pytest.mark.parametrize("t", [1, 2, 3])
@lambdas
def test_vtrace_short_unrolls_match_numpy(t, lambda_):
    unroll = make_unroll(7, 1.0, t=t, b=3, end_prob=0.3)
    out = losses.vtrace(**to_f32(unroll), lambda_=lambda_,
                        clip_rho_threshold=1.5, clip_pg_rho_threshold=0.8)
    want_targets, want_adv = numpy_vtrace(**unroll, lambda_=lambda_,
                                          clip_rho=1.5, clip_pg_rho=0.8)
    np.testing.assert_allclose(out.targets, want_targets, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.pg_advantages, want_adv, rtol=RTOL,
                               atol=ATOL)


def test_vtrace_per_step_lambda_matches_rlax_and_numpy():
    unroll = make_unroll(3, 1.0)
    rng = np.random.default_rng(33)
    lam = rng.random((T, B))
    lam[rng.random((T, B)) < 0.2] = 0.0  # Traces switched off at some steps.
    out = losses.vtrace(**to_f32(unroll), lambda_=f32(lam),
                        clip_rho_threshold=1.2, clip_pg_rho_threshold=0.9)
    rlax_targets, rlax_adv = rlax_vtrace(to_f32(unroll), f32(lam), 1.2, 0.9)
    np_targets, np_adv = numpy_vtrace(**unroll, lambda_=lam, clip_rho=1.2,
                                      clip_pg_rho=0.9)
    for want_t, want_a in [(rlax_targets, rlax_adv), (np_targets, np_adv)]:
        np.testing.assert_allclose(out.targets, want_t, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(out.pg_advantages, want_a, rtol=RTOL,
                                   atol=ATOL)


@pytest.mark.parametrize("rho_kind", ["ones", "above_one_clipped"])
def test_on_policy_targets_are_n_step_returns(rho_kind):
    unroll = make_unroll(5)
    unroll["discount_t"] = np.full((T, B), GAMMA)  # No episode ends.
    if rho_kind == "ones":
        unroll["rho_tm1"] = np.ones((T, B))
    else:  # rho > 1 clipped to 1 everywhere must behave exactly like rho = 1.
        unroll["rho_tm1"] = 1.0 + np.random.default_rng(6).random((T, B))
    out = losses.vtrace(**to_f32(unroll), lambda_=1.0,
                        clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0)

    r, bootstrap, v = unroll["r_t"], unroll["v_t"][-1], unroll["v_tm1"]
    returns = np.zeros((T, B))
    for s in range(T):
        powers = GAMMA ** np.arange(T - s)
        returns[s] = (powers[:, None] * r[s:]).sum(0) + GAMMA**(T - s) * bootstrap
    np.testing.assert_allclose(out.targets, returns, rtol=RTOL, atol=ATOL)
    # On-policy with lambda = 1: the advantage is the n-step return minus V(x_s).
    np.testing.assert_allclose(out.pg_advantages, returns - v, rtol=RTOL,
                               atol=ATOL)


def test_lambda_zero_gives_one_step_targets():
    unroll = make_unroll(8, 1.0)
    out = losses.vtrace(**to_f32(unroll), lambda_=0.0,
                        clip_rho_threshold=1.3, clip_pg_rho_threshold=1.0)
    u = unroll
    td = u["r_t"] + u["discount_t"] * u["v_t"] - u["v_tm1"]
    want = u["v_tm1"] + np.minimum(1.3, u["rho_tm1"]) * td
    np.testing.assert_allclose(out.targets, want, rtol=RTOL, atol=ATOL)
    # With lambda = 0 the advantage bootstraps from V(x_{s+1}), not v_{s+1}.
    np.testing.assert_allclose(out.pg_advantages,
                               np.minimum(1.0, u["rho_tm1"]) * td,
                               rtol=RTOL, atol=ATOL)


def test_episode_end_cuts_the_trace():
    unroll = make_unroll(9, 0.5, end_prob=0.0)
    k = 7
    unroll["discount_t"][k, :] = 0.0  # Every episode ends at step k.
    base = losses.vtrace(**to_f32(unroll), lambda_=1.0)

    # Change everything that happens after the episode end.
    rng = np.random.default_rng(99)
    changed = {key: val.copy() for key, val in unroll.items()}
    changed["r_t"][k + 1:] += rng.normal(size=(T - k - 1, B)) * 10
    changed["rho_tm1"][k + 1:] *= 3.0
    changed["v_tm1"][k + 1:] += 5.0
    changed["v_t"][k:] += 5.0  # v_t[k] = V(x_{k+1}) is past the end too.
    after = losses.vtrace(**to_f32(changed), lambda_=1.0)

    np.testing.assert_allclose(after.targets[:k + 1], base.targets[:k + 1],
                               rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(after.pg_advantages[:k + 1],
                               base.pg_advantages[:k + 1], rtol=RTOL,
                               atol=ATOL)
    # Sanity check that the changes did matter after the end.
    assert not np.allclose(after.targets[k + 1:], base.targets[k + 1:])


def test_vtrace_jit_matches_eager():
    unroll = to_f32(make_unroll(10, 1.0))
    eager = losses.vtrace(**unroll, lambda_=0.95, clip_rho_threshold=2.0)
    jitted = jax.jit(losses.vtrace)(**unroll, lambda_=0.95,
                                    clip_rho_threshold=2.0)
    np.testing.assert_allclose(jitted.targets, eager.targets, rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(jitted.pg_advantages, eager.pg_advantages,
                               rtol=1e-6, atol=1e-6)


def test_vtrace_rejects_bad_shapes():
    unroll = to_f32(make_unroll(11))
    bad = dict(unroll, r_t=unroll["r_t"][:-1])
    with pytest.raises(AssertionError):
        losses.vtrace(**bad)
    flat = {k: v[:, 0] for k, v in unroll.items()}  # [T], not [T, B].
    with pytest.raises(AssertionError):
        losses.vtrace(**flat)


# ---------------------------------------------------------------------------
# Gradients.


def test_no_gradient_through_vtrace_outputs():
    unroll = to_f32(make_unroll(12, 1.0))
    names = list(unroll)

    def summed(field, *args):
        out = losses.vtrace(**dict(zip(names, args)), lambda_=0.95,
                            clip_rho_threshold=NO_CLIP,
                            clip_pg_rho_threshold=NO_CLIP)
        return jnp.sum(getattr(out, field))

    argnums = tuple(range(1, len(names) + 1))
    for field in ("targets", "pg_advantages"):
        grads = jax.grad(summed, argnums=argnums)(field, *unroll.values())
        for name, g in zip(names, grads):
            np.testing.assert_array_equal(g, np.zeros((T, B)),
                                          err_msg=f"{field} wrt {name}")


def test_policy_gradient_loss_gradients():
    d = make_loss_inputs(0)
    logits, actions, adv, mask = (f32(d["logits"]), d["actions"],
                                  f32(d["advantages"]), f32(d["mask"]))
    g_logits, g_adv = jax.grad(agent_pg_loss, argnums=(0, 2))(
        logits, actions, adv, mask)
    np.testing.assert_array_equal(g_adv, np.zeros((T, B)))
    assert np.abs(g_logits).max() > 1e-3

    # Analytic: d/dz [-w log softmax(z)_a] = -w (onehot(a) - softmax(z)).
    probs = np.exp(numpy_log_softmax(d["logits"]))
    onehot = np.eye(A)[d["actions"]]
    weight = (d["mask"] * d["advantages"] / (T * B))[..., None]
    np.testing.assert_allclose(g_logits, -weight * (onehot - probs),
                               rtol=1e-4, atol=1e-6)
    # Masked steps receive no gradient at all.
    np.testing.assert_array_equal(g_logits[d["mask"] == 0], 0.0)


def test_baseline_loss_gradients():
    d = make_loss_inputs(1)
    g_values, g_targets = jax.grad(losses.baseline_loss, argnums=(0, 1))(
        f32(d["values"]), f32(d["targets"]), f32(d["mask"]))
    np.testing.assert_array_equal(g_targets, np.zeros((T, B)))
    want = -(d["targets"] - d["values"]) * d["mask"] / (T * B)
    np.testing.assert_allclose(g_values, want, rtol=1e-4, atol=1e-7)


def test_entropy_loss_gradient():
    d = make_loss_inputs(2)
    g = jax.grad(agent_entropy_loss)(f32(d["logits"]), f32(d["mask"]))
    # d/dz sum_a p log p = p * (log p - sum_a p log p).
    log_p = numpy_log_softmax(d["logits"])
    p = np.exp(log_p)
    neg_ent = (p * log_p).sum(-1, keepdims=True)
    want = p * (log_p - neg_ent) * d["mask"][..., None] / (T * B)
    np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-7)


# ---------------------------------------------------------------------------
# Losses.


def test_categorical_log_prob_matches_numpy():
    rng = np.random.default_rng(3)
    logits = rng.normal(scale=3.0, size=(3, 4, 2, A))
    actions = rng.integers(0, A, size=(3, 4, 2))
    got = losses.categorical_log_prob(f32(logits), actions)
    want = np.take_along_axis(numpy_log_softmax(logits), actions[..., None],
                              axis=-1)[..., 0]
    assert got.shape == actions.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # Each action's log-prob, exponentiated and summed, is a distribution.
    all_lp = jnp.stack([losses.categorical_log_prob(
        f32(logits), np.full(actions.shape, a)) for a in range(A)], -1)
    np.testing.assert_allclose(jnp.exp(all_lp).sum(-1), 1.0, rtol=1e-5)


def test_the_agents_policy_and_entropy_losses_match_rlax():
    """rlax's per-unroll losses (mean over time) averaged over the batch are the
    agent's masked sums over T*B."""
    d = make_loss_inputs(7)
    logits, actions, adv, mask = f32(d["logits"]), d["actions"], f32(d["advantages"]), f32(d["mask"])
    # rlax works on one unroll [T, ...]: vmap over the batch axis 1.
    want_pg = jnp.mean(jax.vmap(rlax.policy_gradient_loss, in_axes=1)(logits, actions, adv, mask))
    want_entropy = jnp.mean(jax.vmap(rlax.entropy_loss, in_axes=1)(logits, mask))
    np.testing.assert_allclose(agent_pg_loss(logits, actions, adv, mask), want_pg, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(agent_entropy_loss(logits, mask), want_entropy, rtol=1e-5, atol=1e-7)
    # Their gradients agree too (rlax also stops the gradient into the advantages).
    g_ours = jax.grad(agent_pg_loss)(logits, actions, adv, mask)
    g_rlax = jax.grad(lambda z: jnp.mean(jax.vmap(rlax.policy_gradient_loss, in_axes=1)(z, actions, adv, mask)))(logits)
    np.testing.assert_allclose(g_ours, g_rlax, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("mask_dtype", [np.float32, np.bool_])
def test_losses_match_numpy(mask_dtype):
    d = make_loss_inputs(4, mask_dtype)
    m = d["mask"].astype(np.float64)
    log_p = numpy_log_softmax(d["logits"])
    log_p_a = np.take_along_axis(log_p, d["actions"][..., None], -1)[..., 0]

    want_pg = -(m * log_p_a * d["advantages"]).sum() / (T * B)
    want_baseline = 0.5 * (m * (d["targets"] - d["values"])**2).sum() / (T * B)
    want_entropy = (m * (np.exp(log_p) * log_p).sum(-1)).sum() / (T * B)

    mask = jnp.asarray(d["mask"])
    got_pg = agent_pg_loss(f32(d["logits"]), d["actions"],
                                         f32(d["advantages"]), mask)
    got_baseline = losses.baseline_loss(f32(d["values"]), f32(d["targets"]),
                                        mask)
    got_entropy = agent_entropy_loss(f32(d["logits"]), mask)
    for got, want in [(got_pg, want_pg), (got_baseline, want_baseline),
                      (got_entropy, want_entropy)]:
        assert got.shape == ()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert float(got_entropy) < 0.0  # Negative entropy of a proper policy.


def _all_losses(d):
    mask = f32(d["mask"])
    return np.array([
        agent_pg_loss(f32(d["logits"]), d["actions"],
                                    f32(d["advantages"]), mask),
        losses.baseline_loss(f32(d["values"]), f32(d["targets"]), mask),
        agent_entropy_loss(f32(d["logits"]), mask),
    ])


def test_masked_steps_contribute_nothing():
    d = make_loss_inputs(5)
    base = _all_losses(d)
    off = d["mask"] == 0
    assert off.any()

    rng = np.random.default_rng(55)
    scrambled = {k: v.copy() for k, v in d.items()}
    scrambled["logits"][off] = rng.normal(scale=10.0, size=(off.sum(), A))
    scrambled["actions"][off] = rng.integers(0, A, size=off.sum())
    for key in ("advantages", "values", "targets"):
        scrambled[key][off] = rng.normal(scale=100.0, size=off.sum())
    np.testing.assert_allclose(_all_losses(scrambled), base, rtol=1e-6,
                               atol=1e-7)

    # Sanity check: the same scrambling on unmasked steps does change things.
    on_scrambled = {k: v.copy() for k, v in d.items()}
    on = ~off
    for key in ("advantages", "values"):
        on_scrambled[key][on] = rng.normal(scale=100.0, size=on.sum())
    assert not np.allclose(_all_losses(on_scrambled)[:2], base[:2])

    zero = dict(d, mask=np.zeros_like(d["mask"]))
    np.testing.assert_array_equal(_all_losses(zero), 0.0)


def test_losses_normalise_by_total_steps_not_batch_size():
    d = make_loss_inputs(6)
    # Duplicating the batch doubles both the masked sum and T*B: same loss.
    doubled = {k: np.concatenate([v, v], axis=1) for k, v in d.items()}
    np.testing.assert_allclose(_all_losses(doubled), _all_losses(d),
                               rtol=1e-6, atol=1e-7)

    # Normalisation is by T*B, not by the number of unmasked steps.
    full = dict(d, mask=np.ones_like(d["mask"]))
    half = dict(d, mask=np.concatenate(
        [np.ones((T, B // 2)), np.zeros((T, B // 2))], axis=1))
    left = {k: v[:, :B // 2] for k, v in full.items()}  # Unmasked half alone.
    np.testing.assert_allclose(_all_losses(half), 0.5 * _all_losses(left),
                               rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("num_actions", [2, 5, 18])
def test_entropy_of_uniform_policy_is_log_num_actions(num_actions):
    rng = np.random.default_rng(num_actions)
    # Constant logits per step (different constants) give a uniform policy.
    logits = np.broadcast_to(rng.normal(size=(T, B, 1)), (T, B, num_actions))
    full = agent_entropy_loss(f32(logits), jnp.ones((T, B)))
    np.testing.assert_allclose(full, -np.log(num_actions), rtol=1e-5)

    mask = (rng.random((T, B)) < 0.5).astype(np.float32)
    partial = agent_entropy_loss(f32(logits), f32(mask))
    np.testing.assert_allclose(partial,
                               -np.log(num_actions) * mask.sum() / (T * B),
                               rtol=1e-5)
    # Any non-uniform policy has lower entropy, i.e. a higher loss.
    peaked = logits.copy()
    peaked[..., 0] += 1.0
    assert float(agent_entropy_loss(f32(peaked), jnp.ones((T, B)))) > float(
        full)


def test_entropy_loss_ignores_impossible_actions():
    rng = np.random.default_rng(13)
    logits = rng.normal(size=(T, B, A))
    with_inf = logits.copy()
    with_inf[..., -1] = -np.inf  # Action A-1 is never taken.
    mask = jnp.ones((T, B))
    got = agent_entropy_loss(f32(with_inf), mask)
    log_p = numpy_log_softmax(logits[..., :-1])
    want = (np.exp(log_p) * log_p).sum() / (T * B)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    g = jax.grad(agent_entropy_loss)(f32(with_inf), mask)
    assert np.isfinite(np.asarray(g)).all()


# ---------------------------------------------------------------------------
# PPO's clipped surrogate (vtrace.ppo_clip).


@pytest.mark.parametrize("epsilon", [0.1, 0.2, 0.5])
def test_clipped_surrogate_matches_rlax_and_its_gradient(epsilon):
    """Log-ratios of std 0.5 put many steps outside [1-eps, 1+eps] on both sides."""
    rng = np.random.default_rng(11)
    log_ratio = f32(rng.normal(scale=0.5, size=(T, B)))
    adv = f32(rng.normal(size=(T, B)))
    mask = jnp.ones((T, B), jnp.float32)

    def ours(z):
        return losses.clipped_surrogate_loss(z, adv, mask, epsilon)

    def theirs(z):  # rlax is one unroll [T]: vmap over the batch axis 1.
        per_unroll = jax.vmap(rlax.clipped_surrogate_pg_loss, in_axes=(1, 1, None))(jnp.exp(z), adv, epsilon)
        return jnp.mean(per_unroll)

    np.testing.assert_allclose(ours(log_ratio), theirs(log_ratio), rtol=1e-5, atol=1e-7)
    g_ours, g_theirs = jax.grad(ours)(log_ratio), jax.grad(theirs)(log_ratio)
    np.testing.assert_allclose(g_ours, g_theirs, rtol=1e-5, atol=1e-7)
    # Clipped on the side that would move further: exactly no gradient there.
    ratio = np.exp(np.asarray(log_ratio))
    a = np.asarray(adv)
    beyond = ((ratio > 1 + epsilon) & (a > 0)) | ((ratio < 1 - epsilon) & (a < 0))
    assert beyond.any() and np.all(np.asarray(g_ours)[beyond] == 0.0)
    assert np.all(np.asarray(g_ours)[~beyond] != 0.0)


def test_clipped_surrogate_masks_steps_and_divides_by_all_steps():
    d = make_loss_inputs(5)
    rng = np.random.default_rng(12)
    log_ratio = rng.normal(scale=0.3, size=(T, B))
    r = np.exp(log_ratio)
    a = d["advantages"]
    want = -np.sum(np.minimum(r * a, np.clip(r, 0.8, 1.2) * a) * d["mask"]) / (T * B)
    got = losses.clipped_surrogate_loss(f32(log_ratio), f32(a), f32(d["mask"]), 0.2)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    g = jax.grad(losses.clipped_surrogate_loss)(f32(log_ratio), f32(a), f32(d["mask"]), 0.2)
    assert np.all(np.asarray(g)[d["mask"] == 0] == 0.0)
