"""V-trace targets and the IMPALA actor-critic losses, as pure JAX functions.

Reference: Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with
Importance Weighted Actor-Learner Architectures", https://arxiv.org/abs/1802.01561

Conventions used throughout:
  * Arrays are time-major: `T` unroll steps, `B` batch elements, `A` actions.
  * Step `s` is the transition x_s --a_s--> x_{s+1}: `v_tm1[s]` = V(x_s),
    `v_t[s]` = V(x_{s+1}), `r_t[s]` and `discount_t[s]` belong to that
    transition, and `rho_tm1[s]` = pi(a_s|x_s) / mu(a_s|x_s).
  * Episode ends inside an unroll are expressed as `discount_t[s] = 0`, which
    cuts both the bootstrap and the backward trace at that step.
  * Losses sum over masked steps and divide by the total number of steps T*B
    (a mean in which masked-out steps count as zero). Dividing by T*B rather
    than by the mask count keeps each step's weight fixed, so the loss scale
    depends neither on the batch size nor on how much of the batch is padding.
"""

from typing import NamedTuple, Union

import chex
import jax
import jax.numpy as jnp

from seedq.agents import health

Array = chex.Array
Numeric = Union[chex.Array, float]


class VTraceOutput(NamedTuple):
    """Outputs of `vtrace`; both fields are [T, B] and gradient-stopped."""

    targets: Array  # v_s: regression targets for the baseline.
    pg_advantages: Array  # Importance-weighted advantages for the policy.
    # The same advantages before their importance weight, r_s + discount_s q_bootstrap_s - V(x_s):
    # a clipped surrogate (`clipped_surrogate_loss`) applies its own ratio.
    advantages: Array


def vtrace(
    v_tm1: Array,
    v_t: Array,
    r_t: Array,
    discount_t: Array,
    rho_tm1: Array,
    lambda_: Numeric = 1.0,
    clip_rho_threshold: float = 1.0,
    clip_pg_rho_threshold: float = 1.0,
) -> VTraceOutput:
    """V-trace targets and policy-gradient advantages for a batch of unrolls.

    Targets follow IMPALA eq. 1, with per-step discounts:

        v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{k=s}^{t-1} discount_k c_k) delta_t
        delta_t = min(clip_rho_threshold, rho_t)
                  * (r_t + discount_t V(x_{t+1}) - V(x_t))
        c_k = lambda_ * min(1, rho_k)

    i.e. the trace coefficient c is clipped at c-bar = 1 (as in SEED and rlax)
    while rho in the TD terms is clipped at `clip_rho_threshold` (rho-bar).
    V(x_T) is the bootstrap value `v_t[-1]`. The sum is evaluated with the
    equivalent backward recursion
    v_s - V(x_s) = delta_s + discount_s c_s (v_{s+1} - V(x_{s+1})).

    Advantages use the rlax/Acme convention:

        pg_advantages_s = min(clip_pg_rho_threshold, rho_s)
                          * (r_s + discount_s q_bootstrap_s - V(x_s))
        q_bootstrap_s = lambda_ v_{s+1} + (1 - lambda_) V(x_{s+1})  (s < T-1)
        q_bootstrap_{T-1} = v_t[-1]

    For lambda_ = 1 this is exactly the paper's advantage
    rho_s (r_s + gamma_s v_{s+1} - V(x_s)); for lambda_ < 1 the next target is
    mixed with the plain value estimate, the same way lambda_ enters the targets.

    Both outputs are wrapped in `stop_gradient`: they are fixed regression
    targets and policy-gradient weights, so gradients flow only through the
    caller's own use of its values and logits.

    Args:
      v_tm1: V(x_s), values at the start of each step, [T, B].
      v_t: V(x_{s+1}), values at the end of each step, [T, B]; `v_t[-1]` is the
        bootstrap value. Expected to satisfy `v_t[:-1] == v_tm1[1:]`.
      r_t: rewards, [T, B].
      discount_t: discounts (gamma, or 0 at episode ends), [T, B].
      rho_tm1: importance ratios pi(a_s|x_s) / mu(a_s|x_s), [T, B].
      lambda_: trace mixing parameter, a scalar or a [T, B] array.
      clip_rho_threshold: rho-bar, clip for rho in the TD terms of the targets.
      clip_pg_rho_threshold: clip for rho in the policy-gradient advantages.

    Returns:
      VTraceOutput(targets, pg_advantages, advantages), each [T, B].
    """
    chex.assert_rank([v_tm1, v_t, r_t, discount_t, rho_tm1], 2)
    chex.assert_equal_shape([v_tm1, v_t, r_t, discount_t, rho_tm1])
    chex.assert_type([v_tm1, v_t, r_t, discount_t, rho_tm1], float)

    # Broadcasting a scalar lambda_ lets scalar and per-step lambdas share one
    # code path (a [T, B] lambda_ can switch traces off at chosen steps).
    lambda_ = jnp.broadcast_to(
        jnp.asarray(lambda_, dtype=v_tm1.dtype), v_tm1.shape)

    c_tm1 = lambda_ * jnp.minimum(1.0, rho_tm1)
    clipped_rho_tm1 = jnp.minimum(clip_rho_threshold, rho_tm1)
    deltas = clipped_rho_tm1 * (r_t + discount_t * v_t - v_tm1)
    # How much of the correction at step s+1 is carried back to step s.
    decay_tm1 = discount_t * c_tm1

    def _backward_step(next_correction, xs):
        delta, decay = xs
        correction = delta + decay * next_correction  # = v_s - V(x_s)
        return correction, correction

    # The carry is [B], so the scan over time handles the whole batch at once.
    # Past the end of the unroll there is nothing to correct: start from zero.
    _, corrections = jax.lax.scan(
        _backward_step, jnp.zeros_like(v_tm1[0]), (deltas, decay_tm1),
        reverse=True)
    targets = jax.lax.stop_gradient(v_tm1 + corrections)

    # The last step has no v_{s+1} inside the unroll; it bootstraps from V(x_T).
    q_bootstrap = jnp.concatenate([
        lambda_[:-1] * targets[1:] + (1.0 - lambda_[:-1]) * v_tm1[1:],
        v_t[-1:],
    ], axis=0)
    advantages = jax.lax.stop_gradient(r_t + discount_t * q_bootstrap - v_tm1)
    clipped_pg_rho_tm1 = jnp.minimum(clip_pg_rho_threshold, rho_tm1)
    return VTraceOutput(
        targets=targets,
        pg_advantages=jax.lax.stop_gradient(clipped_pg_rho_tm1 * advantages),
        advantages=advantages)


def categorical_log_prob(logits: Array, actions: Array) -> Array:
    """log pi(a|x) under the softmax policy given by `logits`.

    Args:
      logits: unnormalised log-probabilities, [..., A].
      actions: integer action indices, [...].

    Returns:
      log-probabilities of `actions`, [...].
    """
    chex.assert_rank(logits, actions.ndim + 1)
    chex.assert_equal_shape_prefix([logits, actions], actions.ndim)
    chex.assert_type(actions, int)
    log_pi = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(log_pi, actions[..., None], axis=-1)[..., 0]


def _masked_mean(x: Array, mask: Array) -> Array:
    """sum(x * mask) / x.size; see the module docstring for why x.size."""
    chex.assert_equal_shape([x, mask])
    return jnp.sum(x * mask.astype(x.dtype)) / x.size


def standardize(x: Array, mask: Array, eps: float = 1e-6) -> Array:
    """(x - mean) / (std + eps) over the steps where mask is 1, the statistics
    gradient-stopped; [T, B] -> [T, B] (masked steps come out arbitrary).

    Used on advantages as PPO does: centring matters as much as scaling, since
    on an all-positive-reward task like CartPole early advantages are all > 0
    and scaling them alone pushes up every action taken.
    """
    mean, std = health.masked_mean_std(x, mask.astype(x.dtype))
    return (x - jax.lax.stop_gradient(mean)) / jax.lax.stop_gradient(std + eps)


def policy_gradient_loss_from_log_probs(log_pi_a: Array, advantages: Array, mask: Array) -> Array:
    """-sum(mask * log_pi_a * advantages) / (T*B), for any policy distribution.

    Args:
      log_pi_a: log pi(a_s|x_s) of the actions taken, [T, B].
      advantages: [T, B].
      mask: [T, B].

    Returns:
      scalar loss.
    """
    chex.assert_rank([log_pi_a, advantages, mask], 2)
    chex.assert_equal_shape([log_pi_a, advantages, mask])
    # Advantages weight the score function; they are not something to fit.
    return -_masked_mean(log_pi_a * jax.lax.stop_gradient(advantages), mask)


def clipped_surrogate_loss(
    log_ratio: Array, advantages: Array, mask: Array, epsilon: float
) -> Array:
    """PPO's clipped surrogate, -sum(mask * min(r A, clip(r, 1-eps, 1+eps) A)) / (T*B).

    r = exp(log_ratio) is pi(a|x) / mu(a|x) against the behaviour policy, as in
    APPO (Sample Factory): within [1-eps, 1+eps] its gradient is r A grad log pi,
    V-trace's policy gradient with an unclipped importance weight; beyond it, on
    the side that would move pi further from mu, the gradient is 0. That bound is
    what lets one batch be trained on several times (`vtrace.reuse`).

    Args:
      log_ratio: log pi(a_s|x_s) - log mu(a_s|x_s), [T, B]; gradients flow through it.
      advantages: e.g. `VTraceOutput.advantages`, [T, B] (gradient-stopped here).
      mask: [T, B].
      epsilon: the clip range, > 0.

    Returns:
      scalar loss.
    """
    chex.assert_rank([log_ratio, advantages, mask], 2)
    chex.assert_equal_shape([log_ratio, advantages, mask])
    advantages = jax.lax.stop_gradient(advantages)
    # A far-off Gaussian sample can give a huge log-ratio; exp() of it must stay finite.
    ratio = jnp.exp(jnp.minimum(log_ratio, 20.0))
    surrogate = jnp.minimum(
        ratio * advantages, jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon) * advantages)
    return -_masked_mean(surrogate, mask)


def gaussian_log_prob(mean: Array, log_std: Array, actions: Array) -> Array:
    """log N(a; mean, diag(exp(log_std)^2)), summed over the action dimensions.

    Args:
      mean, log_std, actions: [..., D].

    Returns:
      log-densities, [...].
    """
    chex.assert_equal_shape([mean, log_std, actions])
    z = (actions - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * jnp.square(z) - log_std - 0.5 * jnp.log(2.0 * jnp.pi), axis=-1)


def gaussian_entropy(log_std: Array) -> Array:
    """Entropy of a diagonal Gaussian: sum_d (log_std_d + 0.5 log(2 pi e)); [..., D] -> [...]."""
    return jnp.sum(log_std + 0.5 * jnp.log(2.0 * jnp.pi * jnp.e), axis=-1)


def entropy_loss_from_entropy(entropy: Array, mask: Array) -> Array:
    """-sum(mask * entropy) / (T*B): minimising it increases the policy's entropy; [T, B] -> scalar."""
    chex.assert_rank([entropy, mask], 2)
    return -_masked_mean(entropy, mask)


def baseline_loss(values: Array, targets: Array, mask: Array) -> Array:
    """Baseline loss: 0.5 * sum(mask * (targets - values)^2) / (T*B).

    Args:
      values: predicted V(x_s), [T, B].
      targets: e.g. `VTraceOutput.targets`, [T, B].
      mask: 1 (or True) where a step counts, 0 where it does not, [T, B].

    Returns:
      scalar loss.
    """
    chex.assert_rank([values, targets, mask], 2)
    chex.assert_equal_shape([values, targets, mask])
    # Values regress towards fixed targets; no gradient goes into the targets.
    errors = jax.lax.stop_gradient(targets) - values
    return _masked_mean(0.5 * jnp.square(errors), mask)


# --- from unrolls to transitions ---------------------------------------------
# An unroll of T+1 steps holds at step t the observation x_t, the reward and
# episode flags that arrived with x_t (produced by action t-1) and the action
# a_t chosen at x_t; transition t (t < T) is x_t --a_t--> x_{t+1}.


def transition_rewards(reward: Array, scale: float, return_rms: Array | None = None) -> Array:
    """The reward of each transition, scaled: [T+1, B] per step -> [T, B].

    Divided by `return_rms` (a scalar, the running RMS of the discounted
    return) where returns are normalised."""
    chex.assert_rank(reward, 2)
    r_t = reward[1:] * scale
    return r_t if return_rms is None else r_t / return_rms


def transition_discounts(terminated: Array, discount: float) -> Array:
    """`discount`, or 0 where the transition terminated the episode: [T+1, B] -> [T, B].

    A truncated episode keeps its discount: it bootstraps from its final observation."""
    chex.assert_rank(terminated, 2)
    return discount * (1.0 - terminated[1:].astype(jnp.float32))


def valid_transitions(terminated: Array, truncated: Array) -> Array:
    """1.0 where a_t was taken, 0.0 where x_t was a final observation (the env reset
    instead of taking a_t): [T+1, B] flags -> [T, B] float mask."""
    chex.assert_rank([terminated, truncated], 2)
    chex.assert_equal_shape([terminated, truncated])
    return 1.0 - (terminated[:-1] | truncated[:-1]).astype(jnp.float32)


def importance_weights(log_ratio: Array, valid: Array) -> Array:
    """rho = pi(a|x) / mu(a|x) from log pi - log mu, 0 on masked transitions; [T, B] -> [T, B].

    rho = 0 zeroes a step's TD error, trace and policy gradient in one place;
    the log-ratio is clipped at 20 so that exp() stays finite for far-off
    Gaussian samples."""
    chex.assert_rank([log_ratio, valid], 2)
    chex.assert_equal_shape([log_ratio, valid])
    return jnp.exp(jnp.minimum(log_ratio, 20.0)) * valid


def trace_cut_at(lambda_: float, shape: tuple[int, int], last_step: Array) -> Array:
    """Per-step trace lambdas [T, B]: `lambda_`, and 0 at step `last_step` (a
    scalar), so targets bootstrap from that step's value and see nothing after it."""
    cut = jnp.arange(shape[0])[:, None] == last_step
    return jnp.where(cut, 0.0, jnp.full(shape, lambda_, jnp.float32))


def policy_loss(target_log_prob: Array, behaviour_log_prob: Array, advantages: Array, mask: Array,
                ppo_clip: float = 0.0) -> Array:
    """The policy's loss on [T, B] log-probabilities of the actions taken: V-trace's
    policy gradient (`advantages` = `VTraceOutput.pg_advantages`, importance-weighted),
    or with `ppo_clip` > 0 PPO's clipped surrogate (`advantages` =
    `VTraceOutput.advantages`; the surrogate applies its own ratio). Scalar."""
    if ppo_clip:
        return clipped_surrogate_loss(target_log_prob - behaviour_log_prob, advantages, mask, ppo_clip)
    return policy_gradient_loss_from_log_probs(target_log_prob, advantages, mask)


def masked_average(x: Array, mask: Array) -> Array:
    """The mean of `x` over the steps where `mask` is 1 (0 if none); [T, B] -> scalar.

    A metric's mean, unlike the losses' division by T*B."""
    chex.assert_equal_shape([x, mask])
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
