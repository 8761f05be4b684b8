"""A strided VALID convolution whose weight gradient is one matrix product.

XLA:CPU computes the weight gradient of a strided convolution (the Nature
CNN's 8x8 stride-4 and 4x4 stride-2 layers) through a generic loop that is
several times slower than the forward pass; on Pong it was most of the
learner's update (docs/benchmarks.md, "The learner's work per frame"). When
the kernel is a whole number of strides (8 = 2 x 4, 4 = 2 x 2), the input
regrouped into stride x stride blocks (space to depth) holds every kernel
window as a few shifted slices, and the weight gradient becomes one
contraction over (batch, output rows, output columns): a plain matrix product,
which XLA:CPU runs at full speed. No library offers this as a drop-in for
`flax.linen.Conv`, hence this module; the forward pass and the input gradient
stay XLA's own.

`conv_general_dilated` has `lax.conv_general_dilated`'s signature, so
`nn.Conv(..., conv_general_dilated=conv_general_dilated)` keeps the layer an
ordinary `nn.Conv` (same parameters, same checkpoints, the same int8/bf16
interception) and only changes how its gradient is computed. The rewrite is
used on the CPU backend only: on GPU/TPU the vendors' convolution kernels
have fast weight gradients and nothing here was measured there.
"""

from __future__ import annotations

import functools
from typing import Sequence

import chex
import jax
import jax.numpy as jnp
from jax import lax

# flax.linen.Conv's layout for 2-D convolutions: inputs [N, H, W, C], kernels
# [kh, kw, C, O], outputs [N, Ho, Wo, O].
_NHWC = ("NHWC", "HWIO", "NHWC")


def _valid_output_size(size: int, kernel: int, stride: int) -> int:
    return (size - kernel) // stride + 1


def weight_grad_by_blocks(x: jax.Array, g: jax.Array, kernel_hw: tuple[int, int],
                          strides: tuple[int, int]) -> jax.Array:
    """The weight gradient of a VALID convolution, as one contraction.

    x [N, H, W, C] the layer's input; g [N, Ho, Wo, O] the gradient of its
    output; each kernel side a multiple of its stride. Returns
    dW [kh, kw, C, O] = sum over n, i, j of x[n, i*sh + a, j*sw + b, c] * g[n, i, j, o].
    """
    (kh, kw), (sh, sw) = kernel_hw, strides
    n, h, w, c = x.shape
    ho, wo = g.shape[1], g.shape[2]
    chex.assert_equal(kh % sh, 0)
    chex.assert_equal(kw % sw, 0)
    chex.assert_shape(g, (n, _valid_output_size(h, kh, sh), _valid_output_size(w, kw, sw), None))
    mh, mw = kh // sh, kw // sw  # kernel side in blocks
    bh, bw = ho + mh - 1, wo + mw - 1  # blocks the windows cover
    # Space to depth: [N, bh, sh, bw, sw, C]; rows past the last window are unused.
    blocks = x[:, : bh * sh, : bw * sw].reshape(n, bh, sh, bw, sw, c)
    # The window of output (i, j) is blocks i..i+mh-1, j..j+mw-1: stack the shifts.
    windows = jnp.stack(
        [jnp.stack([blocks[:, p: p + ho, :, q: q + wo] for q in range(mw)], axis=-1) for p in range(mh)],
        axis=-1,
    )  # [N, ho, sh, wo, sw, C, mw, mh]
    dw = jnp.einsum("nisjtcqp,nijo->psqtco", windows, g.astype(windows.dtype))
    return dw.reshape(kh, kw, c, g.shape[-1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _strided_valid_conv(x: jax.Array, kernel: jax.Array, strides: tuple[int, int]) -> jax.Array:
    return lax.conv_general_dilated(x, kernel, strides, "VALID", dimension_numbers=_NHWC)


def _forward(x, kernel, strides):
    return _strided_valid_conv(x, kernel, strides), (x, kernel)


def _backward(strides, residuals, g):
    x, kernel = residuals
    # The input's gradient (unused, and so removed by XLA, when x is the data).
    _, input_vjp = jax.vjp(lambda inputs: lax.conv_general_dilated(
        inputs, kernel, strides, "VALID", dimension_numbers=_NHWC), x)
    (dx,) = input_vjp(g)
    dw = weight_grad_by_blocks(x, g, kernel.shape[:2], strides)
    return dx, dw.astype(kernel.dtype)


_strided_valid_conv.defvjp(_forward, _backward)


def _blocks_apply(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
                  feature_group_count) -> bool:
    """Whether the call is one this module rewrites: a 2-D NHWC/HWIO VALID convolution,
    strided, undilated, ungrouped, each kernel side a multiple of its stride, on the CPU."""
    if jax.default_backend() != "cpu" or lhs.ndim != 4 or feature_group_count != 1:
        return False
    strides = tuple(window_strides)
    if len(strides) != 2 or strides == (1, 1):
        return False
    valid = padding == "VALID" or (not isinstance(padding, str) and all(tuple(p) == (0, 0) for p in padding))
    undilated = all(d is None or tuple(d) == (1, 1) for d in (lhs_dilation, rhs_dilation))
    if not valid or not undilated:
        return False
    if dimension_numbers is None:
        return False
    dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    if dn != lax.conv_dimension_numbers(lhs.shape, rhs.shape, _NHWC):
        return False
    return all(k % s == 0 for k, s in zip(rhs.shape[:2], strides))


def conv_general_dilated(lhs, rhs, window_strides: Sequence[int], padding, lhs_dilation=None,
                         rhs_dilation=None, dimension_numbers=None, feature_group_count: int = 1,
                         batch_group_count: int = 1, precision=None, preferred_element_type=None):
    """`lax.conv_general_dilated`, with the weight gradient of strided VALID
    convolutions computed by `weight_grad_by_blocks` on the CPU (see the module)."""
    if batch_group_count == 1 and precision is None and preferred_element_type is None and _blocks_apply(
            lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers, feature_group_count):
        return _strided_valid_conv(lhs, rhs, tuple(int(s) for s in window_strides))
    return lax.conv_general_dilated(
        lhs, rhs, window_strides, padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
        dimension_numbers=dimension_numbers, feature_group_count=feature_group_count,
        batch_group_count=batch_group_count, precision=precision, preferred_element_type=preferred_element_type,
    )
