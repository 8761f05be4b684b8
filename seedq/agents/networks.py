"""Networks shared by the agents and the benchmarks (flax linen).

Every network here is built from plain `nn.Dense` / `nn.Conv` layers (LSTM
cores from `nn.LSTMCell`, which is itself made of `nn.Dense`), so the
inference server can run any of them in fp32, bf16 or int8 through the single
interception mechanism of `seedq.quant` without a hand-written quantized
copy. Observations enter through the input hooks of `seedq.agents.inputs`
(`scale_pixels` for uint8 frames, `observation_input` for float vectors),
which the int8 path watches: it uses the exact uint8 values instead of
re-quantizing them, and keeps the float observation's layer in fp32.

Shapes: torsos map observations [N, *obs_shape] to features [N, F]; heads map
features to Q-values [N, A] (DuelingHead); V-trace's heads are in
seedq.agents.vtrace.networks.
"""

from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from seedq.config import LAYER_NORM_MODES
from seedq.agents.inputs import observation_input, scale_pixels
from seedq.agents.strided_conv import conv_general_dilated as blocks_conv

NETWORKS = ("mlp", "small_cnn", "nature_cnn", "impala_cnn")
# Smallest image side each conv torso takes. The Nature CNN's VALID convs
# (8x8/4, 4x4/2, 3x3/1) need 36 pixels; the small CNN's one 3x3 VALID conv
# needs 3; the IMPALA ResNet pads (SAME) and takes any size.
MIN_IMAGE_SIDE = {"small_cnn": 3, "nature_cnn": 36, "impala_cnn": 1}


def merge_time_batch(x: jax.Array) -> jax.Array:
    """[T, B, ...] -> [B*T, ...], batch-major: each env's steps stay together,
    so a batch sharded along B (data-parallel training, seedq.devices) stays
    sharded through the merge. A time-major merge ([T*B]) cannot keep that
    sharding, and XLA all-gathers the activations to every device instead."""
    return jnp.swapaxes(x, 0, 1).reshape(x.shape[1] * x.shape[0], *x.shape[2:])


def split_time_batch(x: jax.Array, T: int, B: int) -> jax.Array:
    """The inverse of `merge_time_batch`: [B*T, ...] -> [T, B, ...]."""
    return jnp.swapaxes(x.reshape(B, T, *x.shape[1:]), 0, 1)


def _to_float(obs: jax.Array) -> jax.Array:
    """uint8 pixels -> [0, 1] floats (through the int8-aware hook); floats unchanged."""
    if obs.dtype == jnp.uint8:
        return scale_pixels(obs)
    return obs.astype(jnp.float32)


class MLPTorso(nn.Module):
    """obs [N, ...] -> features [N, hidden_sizes[-1]] (flattened input)."""

    hidden_sizes: tuple[int, ...] = (256, 256, 256)
    activation: Callable[[jax.Array], jax.Array] = nn.relu
    # LayerNorm of the pre-activations across a layer's units, before its
    # activation (config.LAYER_NORM_MODES): "first_layer" only where the
    # observation comes in, "all_layers" everywhere, "none". On the first layer,
    # raw inputs of very different spreads (walker-walk's joint velocities of
    # std 4-12 beside a height of std 0.2) neither saturate the tanh units nor
    # need input statistics that move while the policy learns; on the later
    # ones, the features stay unsaturated as the weights grow (walker-walk's
    # policy torso: 2 % saturated with all_layers, 31 % with first_layer).
    layer_norm: str = "none"

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        # Flatten before scaling, so uint8 inputs keep their exact int8 path.
        x = _to_float(obs.reshape(obs.shape[0], -1))
        if obs.dtype != jnp.uint8:
            x = observation_input(x)
        if self.layer_norm not in LAYER_NORM_MODES:
            raise ValueError(f"layer_norm={self.layer_norm!r}: choose one of {', '.join(LAYER_NORM_MODES)}")
        for i, size in enumerate(self.hidden_sizes):
            x = nn.Dense(size, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x)
            if self.layer_norm == "all_layers" or (self.layer_norm == "first_layer" and i == 0):
                x = nn.LayerNorm()(x)
            x = self.activation(x)
            # Kept only when applied with mutable=["intermediates"] (the learner's
            # health metrics: seedq.agents.health); free otherwise.
            self.sow("intermediates", "activations", x)
        return x


class SmallCNN(nn.Module):
    """MinAtar's reference torso: one 3x3/1 conv of 16 channels (VALID), dense 128 (ReLU).

    For images smaller than the Nature CNN's receptive field (MinAtar's
    10x10xC boolean frames)."""

    channels: int = 16
    dense_size: int = 128

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        """obs [N, H, W, C] (bool, uint8 or float; H, W >= 3) -> [N, dense_size]."""
        x = _to_float(obs)
        x = nn.relu(nn.Conv(self.channels, (3, 3), strides=(1, 1), padding="VALID")(x))
        x = x.reshape(x.shape[0], -1)
        return nn.relu(nn.Dense(self.dense_size)(x))


class NatureCNN(nn.Module):
    """The DQN Nature torso: conv 32 8x8/4, 64 4x4/2, 64 3x3/1, dense 512 (ReLU).

    `channel_norm`: each conv's output normalised per sample and channel over
    its positions (a GroupNorm of one channel per group) before the ReLU, so
    every channel fires where its input stands out from the rest of the frame
    and none can be pushed below zero everywhere. On Atari frames, mostly one
    flat background colour, an unnormalised channel's response is dominated by
    that background, and Adam's equal-size steps on all of its weights can drive
    it negative at every position: the channel then passes no gradient and
    never recovers (docs/studies/pong-first-convolution.md)."""

    channel_norm: bool = False

    def _conv(self, x: jax.Array, features: int, kernel: int, stride: int, blocks: bool) -> jax.Array:
        x = nn.Conv(features, (kernel, kernel), strides=(stride, stride), padding="VALID",
                    **({"conv_general_dilated": blocks_conv} if blocks else {}))(x)
        if self.channel_norm:
            x = nn.GroupNorm(num_groups=features)(x)
        x = nn.relu(x)
        self.sow("intermediates", "relu_maps", x)  # the learner's dead-channel count (seedq.agents.health)
        return x

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        """obs [N, 84, 84, C] uint8 (or float in [0, 1]) -> [N, 512]."""
        x = _to_float(obs)
        # The strided layers' weight gradients as matrix products (XLA:CPU's own are slow).
        x = self._conv(x, 32, 8, 4, blocks=True)
        x = self._conv(x, 64, 4, 2, blocks=True)
        x = self._conv(x, 64, 3, 1, blocks=False)
        x = x.reshape(x.shape[0], -1)
        return nn.relu(nn.Dense(512)(x))


class ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))), 3x3 convs keeping the channel count."""

    channels: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        y = nn.Conv(self.channels, (3, 3), padding="SAME")(nn.relu(x))
        y = nn.Conv(self.channels, (3, 3), padding="SAME")(nn.relu(y))
        return x + y


class ImpalaCNN(nn.Module):
    """The IMPALA ResNet torso: per stage conv 3x3, max-pool 3x3/2, residual blocks."""

    channels: tuple[int, ...] = (16, 32, 32)
    blocks_per_stage: int = 2
    dense_size: int = 256

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        """obs [N, 84, 84, C] uint8 (or float in [0, 1]) -> [N, dense_size]."""
        x = _to_float(obs)
        for channels in self.channels:
            x = nn.Conv(channels, (3, 3), padding="SAME")(x)
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            for _ in range(self.blocks_per_stage):
                x = ResidualBlock(channels)(x)
        x = nn.relu(x).reshape(x.shape[0], -1)
        return nn.relu(nn.Dense(self.dense_size)(x))


class DuelingHead(nn.Module):
    """features [N, F] -> Q-values [N, A] = V + A - mean(A) (dueling DQN)."""

    num_actions: int
    hidden_size: int = 512

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        value = nn.Dense(1)(nn.relu(nn.Dense(self.hidden_size)(x)))
        advantage = nn.Dense(self.num_actions)(nn.relu(nn.Dense(self.hidden_size)(x)))
        return value + advantage - jnp.mean(advantage, axis=-1, keepdims=True)


Carry = tuple[jax.Array, jax.Array]  # (cell c [B, H], hidden h [B, H])


class LSTMCell(nn.Module):
    """A standard LSTM step: ((c, h), x [B, F]) -> ((c', h'), h' [B, H]).

    The four gates come from a single `nn.Dense` (quantizable like any layer)."""

    hidden_size: int

    @nn.compact
    def __call__(self, carry: Carry, x: jax.Array) -> tuple[Carry, jax.Array]:
        c, h = carry
        gates = nn.Dense(4 * self.hidden_size, name="gates")(jnp.concatenate([x, h], axis=-1))
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = nn.sigmoid(f) * c + nn.sigmoid(i) * jnp.tanh(g)
        h = nn.sigmoid(o) * jnp.tanh(c)
        return (c, h), h


class _ResettingLSTMStep(nn.Module):
    """One time step; zeroes the carry of envs whose `first` flag is set."""

    hidden_size: int

    @nn.compact
    def __call__(self, carry: Carry, inputs: tuple[jax.Array, jax.Array]):
        x, first = inputs  # [B, F], [B] bool
        keep = 1.0 - first.astype(x.dtype)[:, None]
        carry = jax.tree.map(lambda state: state * keep, carry)
        return LSTMCell(self.hidden_size, name="cell")(carry, x)


# (carry, (x [T, B, F], first [T, B])) -> (carry after step T-1, outputs [T, B, H]):
# the LSTM scanned over time, reset to zeros before every step whose `first`
# flag is set, so state never carries across episodes (acting: T = 1).
ScannedLSTM = nn.scan(
    _ResettingLSTMStep,
    variable_broadcast="params",
    split_rngs={"params": False},
    in_axes=0,
    out_axes=0,
)


def choose_network(name: str, obs_shape: Sequence[int]) -> str:
    """The torso for observations [*obs_shape] (after frame stacking): `name`, or
    for "auto" mlp for vectors, small_cnn for images [H, W, C] with a side
    under 36 pixels and nature_cnn for larger ones. Raises ValueError (one line
    naming the observation) where the torso cannot take it."""
    shape = tuple(int(d) for d in obs_shape)
    is_image = len(shape) == 3
    if name == "auto":
        if not is_image:
            return "mlp"
        name = "nature_cnn" if min(shape[:2]) >= MIN_IMAGE_SIDE["nature_cnn"] else "small_cnn"
    if name not in NETWORKS:
        raise ValueError(f"network {name!r}: choose auto or one of {', '.join(NETWORKS)}")
    if name == "mlp":
        return name
    if not is_image:
        raise ValueError(f"network {name!r} needs image observations [H, W, C]; this env observes shape {list(shape)}")
    if min(shape[:2]) < MIN_IMAGE_SIDE[name]:
        raise ValueError(
            f"observation shape {list(shape)} (an image of {shape[0]}x{shape[1]} pixels) is too small "
            f"for network {name!r}, which needs at least {MIN_IMAGE_SIDE[name]}x{MIN_IMAGE_SIDE[name]}"
        )
    return name


def make_torso(
    name: str, mlp_hidden: Sequence[int] = (256, 256, 256),
    mlp_activation: Callable[[jax.Array], jax.Array] = nn.relu, module_name: str | None = None,
    mlp_layer_norm: str = "none", cnn_channel_norm: bool = False,
) -> nn.Module:
    """The torso called `name`; `module_name` names the flax submodule (default: automatic)."""
    if name == "mlp":
        return MLPTorso(tuple(mlp_hidden), mlp_activation, mlp_layer_norm, name=module_name)
    if name == "small_cnn":
        return SmallCNN(name=module_name)
    if name == "nature_cnn":
        return NatureCNN(channel_norm=cnn_channel_norm, name=module_name)
    if name == "impala_cnn":
        return ImpalaCNN(name=module_name)
    raise ValueError(f"network {name!r}: choose one of {', '.join(NETWORKS)}")
