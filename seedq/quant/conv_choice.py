"""Which int8 convolution implementation each layer shape uses, chosen by measurement.

With the default conv policy "auto" the first trace of each layer shape
(input shape, float or uint8 input, padding, kernel shape, strides; so per
batch size) times the whole int8 layer (quantize, pad, convolution,
rescale) with each implementation of `seedq.quant.int8_conv` on random data
(interleaved rounds, best round wins; a candidate 2x slower than the best on
a first call is dropped early) and keeps the fastest; `conv_choices()` lists
the decisions and timings. A candidate that fails to compile is skipped; if
timing itself fails, "patches" is used. `SEEDQ_INT8_CONV=auto|patches|...`
or the `conv_impl` argument of `seedq.quant.apply` overrides the choice.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from seedq.quant import int8_conv
from seedq.quant.timing import time_interleaved

CONV_POLICIES = ("auto",) + int8_conv.CONV_IMPLS


def default_conv_policy() -> str:
    """The policy of `SEEDQ_INT8_CONV` ("auto" unless set): "auto" or one implementation."""
    policy = os.environ.get("SEEDQ_INT8_CONV", "auto").strip().lower() or "auto"
    if policy not in CONV_POLICIES:
        raise ValueError(f"SEEDQ_INT8_CONV={policy!r}: choose one of {', '.join(CONV_POLICIES)}")
    return policy


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
    if policy in int8_conv.CONV_IMPLS:
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
            for impl in int8_conv.CONV_FUNCTIONS:
                try:
                    g = None if pixel_scale is not None else jnp.ones((x_shape[-1],), jnp.float32)
                    f = jax.jit(lambda x, w, s, impl=impl, g=g: int8_conv.conv_layer(
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
