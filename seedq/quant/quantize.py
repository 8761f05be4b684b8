"""Pure functions that turn fp32 parameters/activations into their int8 or bf16 form.

Scheme (int8):
  * weights: symmetric, per output channel (the last axis of a flax `Dense`
    kernel [in, out] or `Conv` kernel [kh, kw, in, out]):
    scale[o] = max|w[..., o]| / 127, q = round(w / scale) in [-127, 127].
    An all-zero channel gets scale 1 (q = 0, exact), so a scale is never 0.
  * activations: symmetric, dynamic, one scale per row (per sample), computed
    at inference time: scale[n] = max|x[n]| / 127.
  * products: int8 x int8 with int32 accumulation, then
    y = acc * scale_x[n] * scale_w[o] + bias[o] in fp32 (biases stay fp32).
  * input equalization (data-free, exact in real arithmetic): each layer's
    input feature k is multiplied by g[k] = max|w[k, :]| before the per-row
    quantization and the kernel row divided by it (`input_equalization`).
    Layers fed raw uint8 pixels are not equalized (their input is exact).

Round-trip error per element is at most scale/2 (half a quantization step).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seedq.config import PRECISIONS  # the one list; re-exported as seedq.quant.PRECISIONS
INT8_MAX = 127
# Published leaf names of one quantized layer (replacing its fp32 "kernel", so
# a module that is not intercepted can never silently read int8 weights).
QKERNEL = "kernel_q"
QSCALE = "kernel_scale"
QINPUT = "input_scale"
_TINY = float(np.finfo(np.float32).tiny)


def safe_scale(max_abs: jax.Array) -> jax.Array:
    """max|x| -> symmetric int8 scale; 1.0 where the range is zero (or subnormal)."""
    scale = jnp.asarray(max_abs, jnp.float32) / INT8_MAX
    return jnp.where(scale >= _TINY, scale, jnp.float32(1.0))


def quantize_per_channel(w: jax.Array, axis: int = -1) -> tuple[jax.Array, jax.Array]:
    """w float [..., O] -> (q int8 same shape, scale float32 [O]) along `axis`.

    `w ~= q * scale` (scale broadcast along `axis`), |w - q * scale| <= scale / 2.
    """
    w = jnp.asarray(w, jnp.float32)
    axis = axis % w.ndim
    others = tuple(i for i in range(w.ndim) if i != axis)
    scale = safe_scale(jnp.max(jnp.abs(w), axis=others))
    shape = [1] * w.ndim
    shape[axis] = w.shape[axis]
    q = jnp.clip(jnp.round(w / scale.reshape(shape)), -INT8_MAX, INT8_MAX).astype(jnp.int8)
    return q, scale


def quantize_rows(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Dynamic per-row activation quantization.

    x float [N, ...] -> (q int8 [N, ...], scale float32 [N]): one symmetric
    scale per leading index (a row of a matmul input, or a whole sample of a
    convolution input), so `x[n] ~= q[n] * scale[n]`.
    """
    x = jnp.asarray(x)
    reduce_axes = tuple(range(1, x.ndim))
    max_abs = jnp.max(jnp.abs(x), axis=reduce_axes).astype(jnp.float32)
    scale = safe_scale(max_abs)
    inv = (1.0 / scale).reshape((-1,) + (1,) * (x.ndim - 1))
    q = jnp.clip(jnp.round(x.astype(jnp.float32) * inv), -INT8_MAX, INT8_MAX).astype(jnp.int8)
    return q, scale


# --- publishing parameters ---------------------------------------------------


def _is_layer(node: Any) -> bool:
    """A dict holding a Dense/Conv-like fp32 kernel (rank >= 2) and maybe a bias."""
    if not isinstance(node, Mapping) or "kernel" not in node:
        return False
    kernel = node["kernel"]
    return (
        hasattr(kernel, "ndim")
        and kernel.ndim >= 2
        and jnp.issubdtype(kernel.dtype, jnp.floating)
        and set(node) <= {"kernel", "bias"}
    )


def input_equalization(w: jax.Array) -> jax.Array:
    """Per input feature/channel factor g[k] = max |w[..., k, :]| (1 where zero).

    Folding g into the layer (x' = x * g, w' = w / g) leaves its output
    unchanged but gives each input feature a share of the per-row int8 range
    in proportion to how strongly it drives the layer, instead of to its raw
    magnitude: a small but influential input (CartPole's pole angle next to
    its velocities) is no longer rounded away. Data-free: uses weights only.
    """
    w = jnp.asarray(w, jnp.float32)
    axes = tuple(i for i in range(w.ndim) if i != w.ndim - 2)
    g = jnp.max(jnp.abs(w), axis=axes)
    return jnp.where(g >= _TINY, g, jnp.float32(1.0))


def quantize_layer(node: Mapping, equalize: bool = True, keep_fp32: bool = False) -> dict:
    """{"kernel": w, "bias": b} -> {"kernel_q": int8, "kernel_scale": fp32 [O],
    "input_scale": fp32 [K] (with `equalize`), "bias": fp32 [O]}.

    With equalization the int8 kernel holds w / g (g broadcast along the
    input axis, -2) and inference multiplies its input by g before quantizing.
    `keep_fp32` also keeps the fp32 "kernel", for a layer that the int8 plan
    runs in int8 at some batch sizes and in fp32 at others.
    """
    w = jnp.asarray(node["kernel"], jnp.float32)
    out = {"kernel": w} if keep_fp32 else {}
    if equalize:
        g = input_equalization(w)
        shape = [1] * w.ndim
        shape[-2] = w.shape[-2]
        w = w / g.reshape(shape)
        out[QINPUT] = g
    q, scale = quantize_per_channel(w)
    out.update({QKERNEL: q, QSCALE: scale})
    if "bias" in node:
        out["bias"] = jnp.asarray(node["bias"], jnp.float32)
    return out


def publish(params: Any, precision: str, layers=None) -> Any:
    """Turns an fp32 flax params pytree into what the inference server runs.

    fp32: returned unchanged. bf16: every floating leaf of the "params" collection
    (of the whole tree when it has none) cast to bfloat16.
    int8: each Dense/Conv layer's {"kernel", "bias"} becomes
    {"kernel_q" int8, "kernel_scale" fp32 [out], "input_scale" fp32 [in],
    "bias" fp32} (see `quantize_layer`); everything else stays fp32.

    `layers` says which layers to quantize: a mapping path -> {"equalize":
    bool, optionally "keep_fp32": bool} as returned by `seedq.quant.quantizable_paths(find_layers(...))`
    (paths inside the "params" collection, e.g. ("torso", "Conv_0")), or
    an iterable of paths (all equalized). Layers fed uint8 pixels are not
    equalized, so they keep using the exact integers. Without `layers`, every
    dict holding only a rank >= 2 "kernel" (+ "bias") is quantized.

    Pure and jittable (`layers` must be static).
    """
    if precision == "fp32":
        return params
    if precision == "bf16":
        def cast(tree):
            return jax.tree.map(
                lambda x: x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
            )

        # Only the network's variables: statistics stored beside them (running
        # observation or return statistics) stay fp32.
        if isinstance(params, Mapping) and "params" in params:
            return {k: cast(v) if k == "params" else v for k, v in params.items()}
        return cast(params)
    if precision != "int8":
        raise ValueError(f"precision={precision!r}: choose one of {', '.join(PRECISIONS)}")
    if layers is None:
        options = None
    elif isinstance(layers, Mapping):
        options = {tuple(p): dict(o) for p, o in layers.items()}
    else:
        options = {tuple(p): {"equalize": True} for p in layers}

    def walk(node: Any, path: tuple[str, ...]) -> Any:
        if _is_layer(node) and (options is None or path in options):
            return quantize_layer(node, **(options or {}).get(path, {}))
        if isinstance(node, Mapping):
            return {k: walk(v, path + (k,)) for k, v in node.items()}
        return node

    if isinstance(params, Mapping) and "params" in params:
        return {k: walk(v, ()) if k == "params" else v for k, v in params.items()}
    return walk(params, ())
