"""V-trace's actor-critic network and its action distributions.

`PolicyValueNetwork` maps time-major observations [T, B, *obs] (and episode
start flags, and an LSTM carry when it has one) to the policy's distribution
parameters and the value. One module serves acting (T = 1, N envs) and
learning (T+1 steps of B unrolls): the torso and heads run on all T*B steps
at once; only the optional LSTM is scanned over time.

The distribution parameters are what the server records per step as the
behaviour policy ("logits" for Discrete actions; "mean" and "log_std" for
Box actions), so the learner recomputes behaviour log-probs with exactly the
functions the target policy uses.

Continuous actions use a *clipped* diagonal Gaussian: actions are sampled
unbounded, their log-probabilities are those of the unbounded sample, and
the environment clips them to its bounds (gymnasium's ClipAction in
`seedq.envs`). Unlike squashing the samples this keeps the density exact
and cheap. The Gaussian's *mean* is squashed into the bounds (tanh, scaled
to [low, high] where the bounds are finite): an unbounded mean drifts far
outside them, where every clipped action is the same and the policy
gradient carries no information (measured on dmc:cartpole-swingup: means
of +-8 on a [-1, 1] action and a collapsed return).
"""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from seedq.schema import StepFieldSpec
from seedq.agents.networks import Carry, ScannedLSTM, make_torso, merge_time_batch, split_time_batch
from seedq.agents.vtrace import losses

# log_std is clipped to this range in every use (keeps exp() sane early in training).
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def std_parameter(initial_log_std: float, min_std: float) -> float:
    """The log-std parameter's initial value for a policy that starts at std
    exp(initial_log_std) above a floor of min_std (std = min_std + exp(parameter))."""
    return float(np.log(np.exp(initial_log_std) - min_std))


class PolicyValueNetwork(nn.Module):
    """(obs [T, B, *obs], first [T, B], carry | None) -> (dist params {k: [T, B, ...]}, value [T, B], carry)."""

    torso: str
    num_outputs: int  # Discrete: number of actions; Box: action dimensions
    continuous: bool = False
    hidden_sizes: tuple[int, ...] = (64, 64)
    use_lstm: bool = False
    lstm_size: int = 256
    initial_log_std: float = -0.5
    # Box actions: std = min_std + exp(log_std parameter) (VTraceConfig.min_std).
    min_std: float = 0.0
    # False: the value head gets a torso of its own, so value regression does
    # not shape the policy's features (feed-forward networks only).
    shared_torso: bool = True
    # The value torso's layer sizes when it is its own (empty: hidden_sizes).
    value_hidden_sizes: tuple[int, ...] = ()
    # LayerNorm in the MLP torsos (MLPTorso.layer_norm): none, first_layer or all_layers.
    layer_norm: str = "none"
    # Per-channel normalisation in the Nature CNN (NatureCNN.channel_norm).
    cnn_channel_norm: bool = False
    # Box actions: finite bounds squash the mean into [low, high] (see module docstring).
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()

    @nn.compact
    def __call__(self, obs: jax.Array, first: jax.Array, carry: Optional[Carry]):
        T, B = obs.shape[:2]
        flat = merge_time_batch(obs)
        # tanh MLPs (the CartPole defaults were tuned with them); ReLU CNNs.
        x = make_torso(self.torso, self.hidden_sizes, nn.tanh, mlp_layer_norm=self.layer_norm,
                       cnn_channel_norm=self.cnn_channel_norm)(flat)
        if self.use_lstm:
            carry, y = ScannedLSTM(self.lstm_size, name="lstm")(carry, (split_time_batch(x, T, B), first))
            x = merge_time_batch(y)
        if self.shared_torso:
            value_x = x
        else:  # feed-forward only (TrainConfig.validate)
            value_x = make_torso(
                self.torso, self.value_hidden_sizes or self.hidden_sizes, nn.tanh, "value_torso",
                mlp_layer_norm=self.layer_norm, cnn_channel_norm=self.cnn_channel_norm,
            )(flat)
        policy = nn.Dense(
            self.num_outputs, kernel_init=nn.initializers.orthogonal(0.01), name="policy"
        )(x)
        policy = split_time_batch(policy, T, B)
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0), name="value")(value_x)
        value = split_time_batch(value, T, B)[..., 0]
        if not self.continuous:
            return {"logits": policy}, value, carry
        log_std = self.param(
            "log_std", nn.initializers.constant(std_parameter(self.initial_log_std, self.min_std)),
            (self.num_outputs,),
        )
        log_std = jnp.clip(log_std.astype(policy.dtype), LOG_STD_MIN, LOG_STD_MAX)
        if self.min_std:
            log_std = jnp.log(self.min_std + jnp.exp(log_std))
        if self.action_low:
            low, high = np.asarray(self.action_low), np.asarray(self.action_high)
            bounded = np.isfinite(low) & np.isfinite(high)
            center = np.where(bounded, (low + high) / 2, 0.0).astype(np.float32)
            half = np.where(bounded, (high - low) / 2, 1.0).astype(np.float32)
            policy = jnp.where(bounded, center + half * jnp.tanh(policy), policy)
        return {"mean": policy, "log_std": jnp.broadcast_to(log_std, policy.shape)}, value, carry

    def initial_carry(self, batch_size: int) -> Optional[Carry]:
        if not self.use_lstm:
            return None
        zeros = jnp.zeros((batch_size, self.lstm_size), jnp.float32)
        return zeros, zeros


class Categorical:
    """Softmax policy over Discrete(num_actions); parameters {"logits": [..., A]}."""

    def __init__(self, num_actions: int):
        self.num_actions = num_actions

    def fields(self) -> dict[str, StepFieldSpec]:
        return {"logits": StepFieldSpec((self.num_actions,), np.float32)}

    def sample(self, rng, dist) -> jax.Array:
        return jax.random.categorical(rng, dist["logits"]).astype(jnp.int32)

    def mode(self, dist) -> jax.Array:
        return jnp.argmax(dist["logits"], axis=-1).astype(jnp.int32)

    def log_prob(self, dist, actions) -> jax.Array:
        return losses.categorical_log_prob(dist["logits"], actions)

    def entropy(self, dist) -> jax.Array:
        log_pi = jax.nn.log_softmax(dist["logits"], axis=-1)
        pi = jnp.exp(log_pi)
        # pi = 0 actions contribute 0 (not 0 * -inf).
        return -jnp.sum(pi * jnp.where(pi > 0, log_pi, 0.0), axis=-1)


class DiagonalGaussian:
    """Clipped diagonal Gaussian over Box([D]); parameters {"mean", "log_std": [..., D]}."""

    def __init__(self, action_dims: int):
        self.action_dims = action_dims

    def fields(self) -> dict[str, StepFieldSpec]:
        shape = (self.action_dims,)
        return {"mean": StepFieldSpec(shape, np.float32), "log_std": StepFieldSpec(shape, np.float32)}

    def sample(self, rng, dist) -> jax.Array:
        noise = jax.random.normal(rng, dist["mean"].shape, jnp.float32)
        return (dist["mean"] + jnp.exp(dist["log_std"]) * noise).astype(jnp.float32)

    def mode(self, dist) -> jax.Array:
        return dist["mean"].astype(jnp.float32)

    def log_prob(self, dist, actions) -> jax.Array:
        return losses.gaussian_log_prob(dist["mean"], dist["log_std"], actions)

    def entropy(self, dist) -> jax.Array:
        return losses.gaussian_entropy(dist["log_std"])
