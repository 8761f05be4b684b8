"""The int8 rule for Dense and 2-D Conv layers, on the published parameters.

A layer's published {"kernel_q", "kernel_scale", "input_scale", "bias"}
(`seedq.quant.quantize.publish`) are used instead of its fp32 kernel. Inputs
are multiplied by the layer's input equalization factors and quantized per
row (per sample) dynamically, products are int8 x int8 -> int32, then
rescaled by scale_x[n] * scale_w[o] and the fp32 bias added. Integer pixels
(`pixels`: the raw uint8 array and its scale, see `seedq.agents.inputs`) are
used as they are instead of being re-quantized.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from seedq.quant import int8_conv
from seedq.quant import quantize as qz
from seedq.quant.conv_choice import choose_conv_impl
from seedq.quant.conv_shapes import conv_strides, explicit_padding

_DOT_LAST = (((1,), (0,)), ((), ()))


def dense_int8(x: jax.Array, params: dict, pixels=None) -> jax.Array:
    """x [..., K] -> [..., O] with the published int8 kernel [K, O]."""
    qw, sw = params[qz.QKERNEL], params[qz.QSCALE]
    k, o = qw.shape
    lead = x.shape[:-1]
    if pixels is not None and qz.QINPUT not in params:
        raw, scale = pixels
        qx = raw.reshape(-1, k)
        sx = jnp.full((qx.shape[0],), scale, jnp.float32)
    else:
        x = x.reshape(-1, k)
        if qz.QINPUT in params:
            x = x * params[qz.QINPUT]
        qx, sx = qz.quantize_rows(x)
    acc = lax.dot_general(qx, qw, _DOT_LAST, preferred_element_type=jnp.int32)
    y = acc.astype(jnp.float32) * (sx[:, None] * sw[None, :])
    if "bias" in params:
        y = y + params["bias"]
    return y.reshape(lead + (o,))


def conv_int8(module: nn.Module, x: jax.Array, params: dict, pixels=None,
              policy: str = "auto") -> jax.Array:
    """2-D `nn.Conv` in int8: x [*batch, H, W, C] -> [*batch, Ho, Wo, O]; the
    convolution implementation is `policy`, or for "auto" the measured choice."""
    qw, sw = params[qz.QKERNEL], params[qz.QSCALE]
    batch_shape = x.shape[:-3]
    strides = conv_strides(module)
    n = int(np.prod(batch_shape)) if batch_shape else 1
    g = params.get(qz.QINPUT)
    if pixels is not None and g is None:
        raw, scale = pixels
        x = raw.reshape((n,) + raw.shape[-3:])
    else:
        x, scale = x.reshape((n,) + x.shape[-3:]), None
    pads = explicit_padding(module, x.shape[1:3], strides)
    impl = choose_conv_impl(x.shape, x.dtype, pads, qw.shape, strides, policy)
    y = int8_conv.conv_layer(impl, x, scale, qw, sw, pads, strides, g)
    if "bias" in params:
        y = y + params["bias"]
    return y.reshape(batch_shape + y.shape[1:])
