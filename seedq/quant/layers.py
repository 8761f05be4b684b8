"""The layers of a network: which Dense/Conv calls it makes, and which of them int8 quantizes.

`find_layers_in(fn, *args)` traces any function that applies flax networks
(an agent's whole acting function as much as one `module.init`) and lists
its Dense/Conv calls with their input shapes and whether they are fed pixels
or the float observation (the input hooks of `seedq.agents.inputs`).

Layers the int8 rule does not implement (1-D/3-D or dilated or grouped
convolutions, masked convolutions, modules other than Dense/Conv that own a
"kernel") are found and left out of quantization: they stay fp32 in the
published parameters and run unchanged. `quantizable_paths` also leaves the
output layers and the observation's layer in fp32.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from seedq.agents.inputs import scale_pixels
from seedq.quant.conv_choice import choose_conv_impl, default_conv_policy
from seedq.quant.conv_shapes import conv_strides, conv_supported, explicit_padding
from seedq.quant.intercept import ApplyState, active


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
    state = ApplyState("int8", "patches")

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
        with active(state):
            return fn(*a, **kw)

    jax.eval_shape(traced, *args, **kwargs)
    return list(found.values())


# Layers with these names produce the network's outputs (policy logits or
# Gaussian mean, value) and stay fp32 in int8 mode, the usual post-training
# quantization choice for the output layer: it is the smallest matmul
# (F x A), so int8 saves nothing there, while its rounding error lands
# directly on the logits. Measured on a trained CartPole policy whose int8
# greedy action agreed with fp32 on 87.9 % of its states: 100 % with an
# fp32 policy layer (docs/benchmarks.md, "Inference precision").
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
        (docs/benchmarks.md, "Inference precision"). Pixel-fed layers stay int8: their
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
        with active(ApplyState(precision, conv_impl or default_conv_policy())):
            return run(layer_params, x).astype(jnp.float32)

    return f


def auto_conv_impl(layer: LayerInfo, batch: int, kernel_shape) -> str:
    """The implementation the "auto" policy uses for this conv layer at `batch`."""
    strides = conv_strides(layer.module)
    h, w, c = layer.input.shape[-3:]
    pads = explicit_padding(layer.module, (h, w), strides)
    dtype = np.uint8 if layer.pixels else np.float32
    return choose_conv_impl((batch, h, w, c), dtype, pads, tuple(kernel_shape), strides, "auto")
