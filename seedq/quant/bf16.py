"""The bf16 rule for Dense and 2-D Conv layers, on the bf16 parameters of
`seedq.quant.quantize.publish`."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from seedq.quant.conv_shapes import DIMENSION_NUMBERS, conv_strides, conv_supported, explicit_padding


def bf16_layer(module: nn.Module, x: jax.Array, next_fun) -> jax.Array:
    """bf16 x bf16 products accumulated in fp32 (`preferred_element_type`), which
    XLA:CPU runs on its fast bf16 matmul path (a plain bf16 dot is slower than
    fp32 there); bias added in fp32. The output stays fp32: it is rounded to
    bf16 where the next layer consumes it, while pooling, activations and
    residual adds in between run in fp32 (XLA:CPU's bf16 elementwise ops made
    the IMPALA CNN 0.5-0.6x fp32 instead of 0.8-1.0x). `next_fun` runs the
    layer's own method (layers this rule leaves alone)."""
    params = module.variables.get("params", {})
    kernel = params.get("kernel")
    if kernel is None or kernel.dtype != jnp.bfloat16:
        return next_fun(x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x)
    xb = x.astype(jnp.bfloat16)
    if isinstance(module, nn.Dense):
        y = lax.dot_general(xb, kernel, (((xb.ndim - 1,), (0,)), ((), ())),
                            preferred_element_type=jnp.float32)
    elif conv_supported(module, x.ndim):
        batch_shape = x.shape[:-3]
        xb = xb.reshape((-1,) + x.shape[-3:])
        strides = conv_strides(module)
        pads = explicit_padding(module, xb.shape[1:3], strides)
        y = lax.conv_general_dilated(xb, kernel, strides, pads, dimension_numbers=DIMENSION_NUMBERS,
                                     preferred_element_type=jnp.float32)
        y = y.reshape(batch_shape + y.shape[1:])
    else:
        return next_fun(xb)
    if "bias" in params:
        y = y + params["bias"].astype(jnp.float32)
    return y
