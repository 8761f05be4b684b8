"""One mechanism for bf16/int8 inference of any flax network: method interception.

`apply(module, published, precision, *args)` runs the *same* flax module that
training uses, inside `flax.linen.intercept_methods`. Every `nn.Dense` and
`nn.Conv` call is routed here:

  * bf16: inputs (activations) are cast to bfloat16 and multiplied with the
    bf16 parameters from `quantize.publish`, accumulating in fp32
    (`preferred_element_type`, XLA:CPU's fast bf16 path); the bias is added
    in fp32.
  * int8: the layer's published {"kernel_q", "kernel_scale", "input_scale",
    "bias"} are used instead of its fp32 kernel. Inputs are multiplied by the
    layer's input equalization factors and quantized per row (per sample)
    dynamically, products are int8 x int8 -> int32 (`lax.dot_general` /
    `lax.conv_general_dilated` with `preferred_element_type=int32`), then
    rescaled by scale_x[n] * scale_w[o] and the fp32 bias added.

Anything else (activations, pooling, residual adds, LSTM gate arithmetic,
dueling-head combination) runs unchanged, in fp32. Floating outputs of
`apply` are fp32 whatever the precision. LSTM/GRU cells made of
`nn.Dense` (flax's `LSTMCell`, `GRUCell`) are covered by the Dense rule.

Pixels: networks turn uint8 frames into floats with the input hook
`seedq.agents.inputs.scale_pixels`, which an apply here watches. Inside an
int8 apply the raw uint8 array is remembered, and a layer fed exactly that
value uses the integers as they are (scale 1/255) instead of re-quantizing
them.

Float observations: networks pass a float observation to their first layer
through the hook `observation_input`; that layer (the input layer of an MLP
torso) stays fp32 in int8 mode, like the output layers (see
`quantizable_paths`).

Convolutions have three int8 implementations, all exact (bit-identical int32):
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
With the default conv policy "auto" the first trace of each layer shape
(input shape, float or uint8 input, padding, kernel shape, strides; so per
batch size) times the whole int8 layer (quantize, pad, convolution,
rescale) with each on random data (interleaved rounds, best round wins; a
candidate 2x slower than the best on a first call is dropped early) and
keeps the fastest;
`conv_choices()` lists the decisions and timings. A candidate that fails to
compile is skipped; if timing itself fails, "patches" is used.
`SEEDQ_INT8_CONV=auto|patches|native|s2d` or the `conv_impl` argument of
`apply` overrides the choice.

Layers the int8 rule does not implement (1-D/3-D or dilated or grouped
convolutions, masked convolutions, modules other than Dense/Conv that own a
"kernel") are found by `find_layers` and left out of quantization: they stay
fp32 in the published parameters and run unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import threading
import time
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from seedq.agents import inputs
from seedq.agents.inputs import scale_pixels
from seedq.quant import quantize as qz

CONV_IMPLS = ("patches", "native", "s2d")
CONV_POLICIES = ("auto",) + CONV_IMPLS
_DN = ("NHWC", "HWIO", "NHWC")
_DOT_LAST = (((1,), (0,)), ((), ()))


@dataclasses.dataclass
class _ApplyState:
    precision: str
    conv_policy: str
    # id(float array) -> (that array, raw integer array, scale): see scale_pixels.
    pixels: dict = dataclasses.field(default_factory=dict)
    # id(float observation array) -> that array: see observation_input.
    observations: dict = dataclasses.field(default_factory=dict)
    # When set, find_layers' recorder: called with (module, input) per layer.
    record: Callable[[nn.Module, Any], None] | None = None
    # int8 only: the layer paths to run in int8 (an `Int8Plan` entry, see
    # seedq.quant.plan); None: every layer published in int8.
    int8_layers: frozenset | None = None

    def pixel_source(self, x):
        hit = self.pixels.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1], hit[2]
        return None

    def is_observation(self, x) -> bool:
        hit = self.observations.get(id(x))
        return hit is not None and hit is x

    # The input hooks' observer (seedq.agents.inputs.InputObserver).
    def saw_pixels(self, scaled, raw, scale: float) -> None:
        if self.precision == "int8" and raw.dtype == jnp.uint8:
            self.pixels[id(scaled)] = (scaled, raw, scale)

    def saw_observation(self, x) -> None:
        self.observations[id(x)] = x


_ACTIVE: contextvars.ContextVar[_ApplyState | None] = contextvars.ContextVar(
    "seedq_quant_apply", default=None
)


@contextlib.contextmanager
def _active(state: _ApplyState) -> Iterator[None]:
    """Runs the block with `state` intercepting Dense/Conv calls and watching the
    networks' input hooks (`seedq.agents.inputs`)."""
    token = _ACTIVE.set(state)
    try:
        with inputs.observed_by(state), nn.intercept_methods(_intercept):
            yield
    finally:
        _ACTIVE.reset(token)


# --- applying a network ------------------------------------------------------


def default_conv_policy() -> str:
    policy = os.environ.get("SEEDQ_INT8_CONV", "auto").strip().lower() or "auto"
    if policy not in CONV_POLICIES:
        raise ValueError(f"SEEDQ_INT8_CONV={policy!r}: choose one of {', '.join(CONV_POLICIES)}")
    return policy


def apply(module: nn.Module, published, precision: str, *args, method=None,
          conv_impl: str | None = None, int8_layers: frozenset | None = None, **kwargs):
    """`module.apply(published, *args)` at `precision` ("fp32" | "bf16" | "int8").

    `published` is `quantize.publish(params, precision, ...)`. Floating
    outputs are returned as float32 whatever the precision. Jittable.
    `int8_layers` (int8 only): the paths that run in int8 at this call's batch
    size (`Int8Plan.layers_for`); a layer outside it that was also published
    with its fp32 kernel runs in fp32. None: every int8-published layer in int8.
    """
    return run_at_precision(
        lambda *a, **kw: module.apply(published, *a, method=method, **kw), precision, *args,
        conv_impl=conv_impl, int8_layers=int8_layers, **kwargs,
    )


def run_at_precision(fn: Callable, precision: str, *args, conv_impl: str | None = None,
                     int8_layers: frozenset | None = None, **kwargs):
    """`fn(*args)` with every flax Dense/Conv it applies run at `precision`, on
    the published parameters `fn` passes to its networks (see `apply`).
    Floating outputs are float32. Jittable."""
    if precision == "fp32":
        return fn(*args, **kwargs)
    if precision not in qz.PRECISIONS:
        raise ValueError(f"precision={precision!r}: choose one of {', '.join(qz.PRECISIONS)}")
    policy = conv_impl or default_conv_policy()
    if policy not in CONV_POLICIES:
        raise ValueError(f"conv_impl={policy!r}: choose one of {', '.join(CONV_POLICIES)}")
    state = _ApplyState(precision, policy, int8_layers=None if int8_layers is None else frozenset(int8_layers))
    with _active(state):
        out = fn(*args, **kwargs)
    return jax.tree.map(
        lambda y: y.astype(jnp.float32) if jnp.issubdtype(y.dtype, jnp.floating) else y, out
    )


def _intercept(next_fun, args, kwargs, context):
    state = _ACTIVE.get()
    module = context.module
    if (
        state is None
        or context.method_name != "__call__"
        or not isinstance(module, (nn.Dense, nn.Conv))
    ):
        return next_fun(*args, **kwargs)
    x = args[0] if args else kwargs["inputs"]
    if state.record is not None:
        state.record(module, x)
        return next_fun(*args, **kwargs)
    if state.precision == "bf16":
        return _bf16_layer(module, x, next_fun)
    params = module.variables.get("params", {})
    if qz.QKERNEL not in params:  # left in fp32 at publish time
        return next_fun(*args, **kwargs)
    if (
        state.int8_layers is not None
        and tuple(module.scope.path) not in state.int8_layers
        and "kernel" in params  # published in both forms: fp32 at this batch size
    ):
        return next_fun(*args, **kwargs)
    pixels = state.pixel_source(x)
    if isinstance(module, nn.Conv):
        return conv_int8(module, x, params, pixels, state.conv_policy)
    return dense_int8(x, params, pixels)


# --- bf16 layers ---------------------------------------------------------------


def _bf16_layer(module: nn.Module, x: jax.Array, next_fun) -> jax.Array:
    """bf16 x bf16 products accumulated in fp32 (`preferred_element_type`), which
    XLA:CPU runs on its fast bf16 matmul path (a plain bf16 dot is slower than
    fp32 there); bias added in fp32. The output stays fp32: it is rounded to
    bf16 where the next layer consumes it, while pooling, activations and
    residual adds in between run in fp32 (XLA:CPU's bf16 elementwise ops made
    the IMPALA CNN 0.5-0.6x fp32 instead of 0.8-1.0x)."""
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
        strides = tuple(int(s) for s in np.broadcast_to(module.strides or 1, (2,)))
        pads = _explicit_padding(module, xb.shape[1:3], strides)
        y = lax.conv_general_dilated(xb, kernel, strides, pads, dimension_numbers=_DN,
                                     preferred_element_type=jnp.float32)
        y = y.reshape(batch_shape + y.shape[1:])
    else:
        return next_fun(xb)
    if "bias" in params:
        y = y + params["bias"].astype(jnp.float32)
    return y


# --- int8 layers ---------------------------------------------------------------


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


def conv_supported(module: nn.Module, x_ndim: int) -> bool:
    """Whether `conv_int8` implements this `nn.Conv` configuration."""
    if len(module.kernel_size) != 2 or x_ndim < 3:
        return False
    if getattr(module, "mask", None) is not None or module.feature_group_count != 1:
        return False
    for dilation in (module.input_dilation, module.kernel_dilation):
        if dilation not in (None, 1) and tuple(np.broadcast_to(dilation, (2,))) != (1, 1):
            return False
    padding = module.padding
    if isinstance(padding, str):
        return padding.upper() in ("SAME", "VALID")
    return True


def _explicit_padding(module: nn.Module, spatial: tuple[int, int], strides: tuple[int, int]):
    padding = module.padding
    if isinstance(padding, str):
        return lax.padtype_to_pads(spatial, module.kernel_size, strides, padding.upper())
    if isinstance(padding, int):
        return [(padding, padding)] * 2
    pads = []
    for p in padding:
        pads.append((p, p) if isinstance(p, int) else tuple(p))
    return pads


def conv_int8(module: nn.Module, x: jax.Array, params: dict, pixels=None,
              policy: str = "auto") -> jax.Array:
    """2-D `nn.Conv` in int8: x [*batch, H, W, C] -> [*batch, Ho, Wo, O]."""
    qw, sw = params[qz.QKERNEL], params[qz.QSCALE]
    batch_shape = x.shape[:-3]
    strides = tuple(int(s) for s in np.broadcast_to(module.strides or 1, (2,)))
    n = int(np.prod(batch_shape)) if batch_shape else 1
    g = params.get(qz.QINPUT)
    if pixels is not None and g is None:
        raw, scale = pixels
        x = raw.reshape((n,) + raw.shape[-3:])
    else:
        x, scale = x.reshape((n,) + x.shape[-3:]), None
    pads = tuple(tuple(p) for p in _explicit_padding(module, x.shape[1:3], strides))
    impl = choose_conv_impl(x.shape, x.dtype, pads, qw.shape, strides, policy)
    y = _conv_layer(impl, x, scale, qw, sw, pads, strides, g)
    if "bias" in params:
        y = y + params["bias"]
    return y.reshape(batch_shape + y.shape[1:])


def _conv_layer(impl: str, x, pixel_scale, qw, sw, pads, strides, g=None) -> jax.Array:
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
        qx, qw, strides, "VALID", dimension_numbers=_DN, preferred_element_type=jnp.int32
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


# --- measured choice of the convolution implementation ----------------------------


@dataclasses.dataclass(frozen=True)
class ConvChoice:
    impl: str
    seconds: dict  # impl -> seconds per call (None: failed)
    reason: str


_CHOICES: dict[tuple, ConvChoice] = {}
_CHOICES_LOCK = threading.Lock()


def conv_choices() -> dict[tuple, ConvChoice]:
    """Decisions so far: (platform, input shape, "float" | "uint8", pads, kernel shape, strides) -> choice."""
    with _CHOICES_LOCK:
        return dict(_CHOICES)


def choose_conv_impl(x_shape, x_dtype, pads, w_shape, strides, policy: str = "auto") -> str:
    """The implementation for a conv layer fed x [N, H, W, C] (float, or uint8 pixels)."""
    if policy in CONV_IMPLS:
        return policy
    x_dtype = np.dtype(x_dtype)
    kind = "uint8" if x_dtype == np.uint8 else "float"
    key = (jax.default_backend(), tuple(x_shape), kind, tuple(map(tuple, pads)), tuple(w_shape),
           tuple(strides))
    with _CHOICES_LOCK:
        hit = _CHOICES.get(key)
    if hit is None:
        hit = _calibrate(*key[1:])
        with _CHOICES_LOCK:
            hit = _CHOICES.setdefault(key, hit)
    return hit.impl


def _calibrate(x_shape, kind, pads, w_shape, strides, budget_s: float = 0.4) -> ConvChoice:
    """Times the whole int8 layer (quantize, pad, convolution, rescale) with each
    implementation on random data of these shapes, as it runs in the network
    (XLA fuses the input quantization into the patch building, for example).

    One timed call each first; candidates more than 2x slower than the best
    are dropped (XLA's integer convolution can be 10-100x slower for some
    channel counts); the rest are timed in interleaved rounds, best round wins.
    """
    try:
        with jax.ensure_compile_time_eval():
            rng = np.random.default_rng(0)
            if kind == "uint8":
                x = jnp.asarray(rng.integers(0, 256, x_shape, np.uint8))
                pixel_scale = 1.0 / 255.0
            else:  # post-ReLU-like activations
                x = jnp.asarray(np.abs(rng.standard_normal(x_shape)).astype(np.float32))
                pixel_scale = None
            qw = jnp.asarray(rng.integers(-127, 128, w_shape, np.int8))
            sw = jnp.full((w_shape[-1],), 1e-3, jnp.float32)
            fns, seconds = {}, {}
            for impl in CONV_FUNCTIONS:
                try:
                    g = None if pixel_scale is not None else jnp.ones((x_shape[-1],), jnp.float32)
                    f = jax.jit(lambda x, w, s, impl=impl, g=g: _conv_layer(
                        impl, x, pixel_scale, w, s, pads, strides, g))
                    jax.block_until_ready(f(x, qw, sw))  # compile
                    started = time.perf_counter()
                    jax.block_until_ready(f(x, qw, sw))
                    seconds[impl] = time.perf_counter() - started
                    fns[impl] = f
                except Exception:  # e.g. no integer convolution on this backend
                    seconds[impl] = None
            if not fns:
                return ConvChoice("patches", seconds, "no implementation compiled")
            fastest = min(seconds[i] for i in fns)
            fns = {i: f for i, f in fns.items() if seconds[i] <= 2 * fastest}
            if len(fns) > 1:
                seconds.update(time_interleaved(fns, (x, qw, sw), budget_s, rounds=7))
            best = min(fns, key=lambda i: seconds[i])
            return ConvChoice(best, seconds, "measured")
    except Exception as e:  # timing must never break inference
        return ConvChoice("patches", {}, f"calibration failed ({type(e).__name__}); default")


def time_interleaved(fns: dict[str, Callable], args: tuple, budget_s: float = 0.25,
                     rounds: int = 5, statistic: Callable = min) -> dict[str, float]:
    """Seconds per call of each (already compiled) function: `statistic` (best
    by default; the int8 plan uses the median) over interleaved rounds.

    Each round runs every function in turn, so load changes hit all of them
    alike; the number of calls per round is sized to spend ~budget_s total.
    """
    single = {}
    for name, f in fns.items():
        started = time.perf_counter()
        jax.block_until_ready(f(*args))
        single[name] = max(time.perf_counter() - started, 1e-6)
    per_round = budget_s / rounds
    calls = {name: max(1, int(per_round / len(fns) / t)) for name, t in single.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, f in fns.items():
            started = time.perf_counter()
            for _ in range(calls[name]):
                out = f(*args)
            jax.block_until_ready(out)
            samples[name].append((time.perf_counter() - started) / calls[name])
    return {name: float(statistic(s)) for name, s in samples.items()}


# --- finding the layers of a network -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LayerInfo:
    """One Dense/Conv call found by `find_layers`."""

    path: tuple[str, ...]  # inside the "params" collection
    kind: str  # "dense" | "conv"
    module: nn.Module  # an unbound copy of the layer (same configuration)
    input: jax.ShapeDtypeStruct
    pixels: bool  # fed by scale_pixels (exact integer input in int8 mode)
    quantizable: bool  # implemented by the int8 rule
    observation: bool = False  # fed the float observation (observation_input)


def find_layers(module: nn.Module, *args, method=None, **kwargs) -> list[LayerInfo]:
    """Traces `module.init(rng, *args)` abstractly and lists its Dense/Conv calls."""
    return find_layers_in(
        lambda *a, **kw: module.init(jax.random.PRNGKey(0), *a, method=method, **kw), *args, **kwargs
    )


def find_layers_in(fn: Callable, *args, **kwargs) -> list[LayerInfo]:
    """Traces `fn(*args)` abstractly and lists the Dense/Conv calls of every flax
    network it applies (paths inside that network's "params" collection).

    Any function that applies its networks on their variables works: an
    agent's whole acting function as much as one `module.init`. Layers called
    more than once (shared weights) are listed once, with the first call's input.
    """
    found: dict[tuple[str, ...], LayerInfo] = {}
    state = _ApplyState("int8", "patches")

    def record(layer: nn.Module, x) -> None:
        path = tuple(layer.scope.path)
        if path in found:
            return
        if isinstance(layer, nn.Conv):
            kind, ok = "conv", conv_supported(layer, x.ndim)
        else:
            kind, ok = "dense", True
        found[path] = LayerInfo(
            path=path,
            kind=kind,
            module=layer.clone(parent=None, name=None),
            input=jax.ShapeDtypeStruct(x.shape, x.dtype),
            pixels=state.pixel_source(x) is not None,
            quantizable=ok,
            observation=state.is_observation(x),
        )

    state.record = record

    def traced(*a, **kw):
        with _active(state):
            return fn(*a, **kw)

    jax.eval_shape(traced, *args, **kwargs)
    return list(found.values())


# Layers with these names produce the network's outputs (policy logits or
# Gaussian mean, value) and stay fp32 in int8 mode, the usual post-training
# quantization choice for the output layer: it is the smallest matmul
# (F x A), so int8 saves nothing there, while its rounding error lands
# directly on the logits. Measured on a trained CartPole policy whose int8
# greedy action agreed with fp32 on 87.9 % of its states: 100 % with an
# fp32 policy layer (docs/benchmarks.md, issue 4).
OUTPUT_LAYER_NAMES = frozenset({"policy", "value"})


def quantizable_paths(layers: list[LayerInfo]) -> dict[tuple[str, ...], dict]:
    """The `layers` argument for `quantize.publish`: path -> {"equalize": bool}
    for every layer the int8 rule implements (pixel-fed layers unequalized),
    except those that stay fp32:
      * the output layers (OUTPUT_LAYER_NAMES);
      * layers fed the float observation (`observation_input`), the other
        usual choice: raw features of very different ranges share one
        per-row int8 scale there, and the layer is tiny (obs_dim x hidden).
        On three trained CartPole policies this raised int8 agreement on
        greedy-rollout states from 97.6-98.4 % to 98.6-99.2 %
        (docs/benchmarks.md, issue 4). Pixel-fed layers stay int8: their
        uint8 input is exact, and they are the CNNs' costliest layers.
    """
    return {
        layer.path: {"equalize": not layer.pixels}
        for layer in layers
        if layer.quantizable
        and layer.path[-1] not in OUTPUT_LAYER_NAMES
        and not (layer.observation and not layer.pixels)
    }


def layer_fn(layer: LayerInfo, precision: str, conv_impl: str | None = None) -> Callable:
    """A jittable `f(layer_params, x)` running just this layer at `precision`.

    `layer_params` is the layer's published dict; for a pixel-fed layer `x` is
    the raw uint8 input. Used by the per-layer profile.
    """
    mod = layer.module

    def run(layer_params, x):
        if layer.pixels:
            x = scale_pixels(x)
        return mod.apply({"params": layer_params}, x)

    def f(layer_params, x):
        if precision == "fp32":
            return run(layer_params, x)
        with _active(_ApplyState(precision, conv_impl or default_conv_policy())):
            return run(layer_params, x).astype(jnp.float32)

    return f


def auto_conv_impl(layer: LayerInfo, batch: int, kernel_shape) -> str:
    """The implementation the "auto" policy uses for this conv layer at `batch`."""
    mod = layer.module
    strides = tuple(int(s) for s in np.broadcast_to(mod.strides or 1, (2,)))
    h, w, c = layer.input.shape[-3:]
    pads = tuple(tuple(p) for p in _explicit_padding(mod, (h, w), strides))
    dtype = np.uint8 if layer.pixels else np.float32
    return choose_conv_impl((batch, h, w, c), dtype, pads, tuple(kernel_shape), strides, "auto")
