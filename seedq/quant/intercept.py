"""One mechanism for bf16/int8 inference of any flax network: method interception.

`apply(module, published, precision, *args)` runs the *same* flax module that
training uses, inside `flax.linen.intercept_methods`. Every `nn.Dense` and
`nn.Conv` call is routed to a precision's rule:

  * bf16 (`seedq.quant.bf16`): inputs (activations) are cast to bfloat16 and
    multiplied with the bf16 parameters from `quantize.publish`,
    accumulating in fp32; the bias is added in fp32.
  * int8 (`seedq.quant.int8`): the layer's published int8 kernel and scales
    are used instead of its fp32 kernel; products are int8 x int8 -> int32,
    rescaled to fp32.

Anything else (activations, pooling, residual adds, LSTM gate arithmetic,
dueling-head combination) runs unchanged, in fp32. Floating outputs of
`apply` are fp32 whatever the precision. LSTM/GRU cells made of
`nn.Dense` (flax's `LSTMCell`, `GRUCell`) are covered by the Dense rule.

The networks' input hooks (`seedq.agents.inputs`) report to the apply:
inside an int8 apply, a layer fed exactly the output of `scale_pixels` uses
the raw uint8 integers (scale 1/255) instead of re-quantizing them, and
`seedq.quant.layers` finds the layers fed the float observation
(`observation_input`), which stay fp32.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp

from seedq.agents import inputs
from seedq.quant import quantize as qz
from seedq.quant.bf16 import bf16_layer
from seedq.quant.conv_choice import CONV_POLICIES, default_conv_policy
from seedq.quant.int8 import conv_int8, dense_int8


@dataclasses.dataclass
class ApplyState:
    """What one apply (or one layer discovery) runs with and has seen."""

    precision: str
    conv_policy: str
    # id(float array) -> (that array, raw integer array, scale): see scale_pixels.
    pixels: dict = dataclasses.field(default_factory=dict)
    # id(float observation array) -> that array: see observation_input.
    observations: dict = dataclasses.field(default_factory=dict)
    # When set, a layer discovery's recorder: called with (module, input) per layer.
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


_ACTIVE: contextvars.ContextVar[ApplyState | None] = contextvars.ContextVar(
    "seedq_quant_apply", default=None
)


@contextlib.contextmanager
def active(state: ApplyState) -> Iterator[None]:
    """Runs the block with `state` intercepting Dense/Conv calls and watching the
    networks' input hooks (`seedq.agents.inputs`)."""
    token = _ACTIVE.set(state)
    try:
        with inputs.observed_by(state), nn.intercept_methods(_intercept):
            yield
    finally:
        _ACTIVE.reset(token)


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
    state = ApplyState(precision, policy, int8_layers=None if int8_layers is None else frozenset(int8_layers))
    with active(state):
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
        return bf16_layer(module, x, next_fun)
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
