"""The int8 convolution kernels: padded integer input x int8 kernel -> int32.

Three implementations, all exact (bit-identical int32):
  * "patches": the padded int8 input is cut into kh*kw strided slices,
    concatenated into patches [N, Ho, Wo, kh*kw*C] and multiplied by the
    kernel [kh*kw*C, O] with one int8 matmul (portable: any backend with an
    int8 dot, e.g. GPUs, which have no integer convolution); the slices move
    4-byte words when C % 4 == 0;
  * "native": XLA's integer convolution (on XLA:CPU fast for most shapes but
    10-100x slower than fp32 for 16 -> 16 channel layers);
  * "s2d": space-to-depth rewrite (blocks of pixels become channels, the
    kernel is rearranged to match) followed by the native convolution, which
    turns small-channel layers into shapes the fast library path takes.
Which one a layer uses is measured at start-up (`seedq.quant.conv_choice`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from seedq.quant import quantize as qz
from seedq.quant.conv_shapes import DIMENSION_NUMBERS

CONV_IMPLS = ("patches", "native", "s2d")


def conv_layer(impl: str, x, pixel_scale, qw, sw, pads, strides, g=None) -> jax.Array:
    """Everything of an int8 conv layer but the bias: equalize by `g` and
    quantize (unless integer pixels with `pixel_scale`), pad, integer
    convolution `impl`, rescale."""
    if pixel_scale is not None:
        qx, sx = x, jnp.full((x.shape[0],), pixel_scale, jnp.float32)
    else:
        qx, sx = qz.quantize_rows(x if g is None else x * g)
    qx = jnp.pad(qx, ((0, 0), *pads, (0, 0)))
    acc = CONV_FUNCTIONS[impl](qx, qw, strides)
    return acc.astype(jnp.float32) * (sx[:, None, None, None] * sw)


def conv_patches(qx: jax.Array, qw: jax.Array, strides: tuple[int, int]) -> jax.Array:
    """Padded integer input [N, Hp, Wp, C] (int8 or uint8) x int8 kernel -> int32 (VALID)."""
    kh, kw, c, o = qw.shape
    n, hp, wp, _ = qx.shape
    sh, sw = strides
    ho, wo = (hp - kh) // sh + 1, (wp - kw) // sw + 1
    # Slices move 4-byte words when C allows (XLA:CPU copies int8 elements one
    # at a time: building the patches of a 16-channel layer byte by byte cost
    # more than the whole fp32 convolution); the byte layout is the same.
    words = qx.dtype.itemsize == 1 and c % 4 == 0
    if words:
        src, depth = lax.bitcast_convert_type(qx.reshape(n, hp, wp, c // 4, 4), jnp.int32), c // 4
    else:
        src, depth = qx, c
    cols = [
        lax.slice(src, (0, i, j, 0), (n, i + sh * (ho - 1) + 1, j + sw * (wo - 1) + 1, depth), (1, sh, sw, 1))
        for i in range(kh)
        for j in range(kw)
    ]
    patches = cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)
    if words:
        patches = lax.bitcast_convert_type(patches, qx.dtype).reshape(n, ho, wo, kh * kw * c)
    return lax.dot_general(
        patches, qw.reshape(kh * kw * c, o), (((3,), (0,)), ((), ())),
        preferred_element_type=jnp.int32,
    )


def conv_native(qx: jax.Array, qw: jax.Array, strides: tuple[int, int]) -> jax.Array:
    """XLA integer convolution (VALID). uint8 inputs are shifted to int8 exactly:
    conv(x, w) = conv(x - 128, w) + 128 * sum(w) per output channel."""
    if qx.dtype == jnp.uint8:
        shifted = (qx.astype(jnp.int16) - 128).astype(jnp.int8)
        acc = conv_native(shifted, qw, strides)
        return acc + 128 * jnp.sum(qw.astype(jnp.int32), axis=(0, 1, 2))
    return lax.conv_general_dilated(
        qx, qw, strides, "VALID", dimension_numbers=DIMENSION_NUMBERS, preferred_element_type=jnp.int32
    )


def _s2d_axis(k: int, s: int, bo: int):
    """Kernel-row gather for one spatial axis of `conv_s2d` (block b = s * bo).

    Output row h = bo*H + r reads input row s*h + i = b*H + (s*r + i); with
    s*r + i = b*a + p the blocked kernel tap (a, p, r) holds w[b*a + p - s*r]
    (zero outside [0, k)). Returns (clipped index [ka, b, bo], valid mask, ka, b).
    """
    b = s * bo
    ka = -(-(s * (bo - 1) + k) // b)
    a = np.arange(ka)[:, None, None]
    p = np.arange(b)[None, :, None]
    r = np.arange(bo)[None, None, :]
    i = b * a + p - s * r
    return np.clip(i, 0, k - 1), (i >= 0) & (i < k), ka, b


def _regroup(x: jax.Array, shape, perm, out_shape) -> jax.Array:
    """reshape -> transpose -> reshape of an integer tensor [..., C], moving
    4-byte words instead of single int8 values when C allows (XLA:CPU moves
    int8 elements one at a time, several times slower)."""
    c = x.shape[-1]
    if x.dtype.itemsize == 1 and c % 4 == 0:
        words = lax.bitcast_convert_type(x.reshape(x.shape[:-1] + (c // 4, 4)), jnp.int32)
        moved = _regroup(words, shape[:-1] + (c // 4,), perm, out_shape[:-1] + (out_shape[-1] // 4,))
        return lax.bitcast_convert_type(moved, x.dtype).reshape(out_shape)
    return x.reshape(shape).transpose(perm).reshape(out_shape)


def conv_s2d(qx: jax.Array, qw: jax.Array, strides: tuple[int, int]) -> jax.Array:
    """Space-to-depth rewrite + XLA integer convolution (VALID).

    The input is cut into b x b blocks (b = stride, or 2 for stride 1) that
    become channels, turning the layer into a stride-1 convolution with
    b*b*C input channels, a ceil(.)-sized kernel and, for stride 1, 2*2*O
    output channels (each block computes 2 x 2 output pixels). More
    multiply-adds, but channel counts XLA's integer convolution handles fast
    (a 3x3 16->16 layer becomes a 2x2 64->64 one).
    """
    kh, kw, c, o = qw.shape
    n, hp, wp, _ = qx.shape
    sh, sw = strides
    boh, bow = (2 if sh == 1 else 1), (2 if sw == 1 else 1)
    ho, wo = (hp - kh) // sh + 1, (wp - kw) // sw + 1
    ih, vh, kah, bh = _s2d_axis(kh, sh, boh)
    iw, vw, kaw, bw = _s2d_axis(kw, sw, bow)
    hb, wb = -(-ho // boh), -(-wo // bow)
    rows, cols = bh * (hb + kah - 1), bw * (wb + kaw - 1)
    qx = qx[:, :rows, :cols]
    qx = jnp.pad(qx, ((0, 0), (0, rows - qx.shape[1]), (0, cols - qx.shape[2]), (0, 0)))
    x = _regroup(
        qx, (n, rows // bh, bh, cols // bw, bw, c), (0, 1, 3, 2, 4, 5),
        (n, rows // bh, cols // bw, bh * bw * c),
    )
    wg = jnp.take(qw, jnp.asarray(ih.reshape(-1)), axis=0)
    wg = jnp.take(wg, jnp.asarray(iw.reshape(-1)), axis=1)  # [kah*bh*boh, kaw*bw*bow, c, o]
    mask = (vh.reshape(-1, 1) & vw.reshape(1, -1)).astype(np.int8)
    wg = wg * jnp.asarray(mask)[:, :, None, None]
    wg = wg.reshape(kah, bh, boh, kaw, bw, bow, c, o).transpose(0, 3, 1, 4, 6, 2, 5, 7)
    wg = wg.reshape(kah, kaw, bh * bw * c, boh * bow * o)
    acc = conv_native(x, wg, (1, 1))  # [n, hb, wb, boh*bow*o]
    if boh * bow > 1:
        acc = acc.reshape(n, hb, wb, boh, bow, o).transpose(0, 1, 3, 2, 4, 5)
        acc = acc.reshape(n, hb * boh, wb * bow, o)
    return acc[:, :ho, :wo]


CONV_FUNCTIONS = {"patches": conv_patches, "native": conv_native, "s2d": conv_s2d}
