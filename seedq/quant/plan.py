"""Int8 where it pays: a per-layer, per-batch-size int8/fp32 plan chosen by measurement.

On a CPU an int8 layer is not always faster than its fp32 form: for small
matmuls at small batch sizes the per-row input quantization and the rescale
cost more than the narrower multiply saves. So the int8 mode times every
quantizable layer alone in fp32 and in int8 at each padded batch size the
server runs (`measure_layer_seconds`: 7 interleaved rounds of ~30 ms each,
median; a first sitting with 5 rounds of ~10 ms flipped layers that are
clearly faster in int8 to fp32 at load 10 on 2 cores), keeps a
layer in int8 at a batch size only where int8 was faster (`choose_int8_layers`,
a pure function of the timings) and fixes that plan for the run. `force`
puts every quantizable layer in int8 (tests and comparisons).

The plan is reported as the share of the network's multiply-accumulates
that run in int8 (`Int8Plan.mac_share`), counted from the layer shapes
(`layer_macs`) over every Dense/Conv layer of the network, including the
ones that always stay fp32 (input and output layers).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from seedq.quant import layers as ql
from seedq.quant import quantize as qz
from seedq.quant.conv_shapes import conv_strides, explicit_padding
from seedq.quant.timing import time_interleaved

Path = tuple[str, ...]


def layer_macs(layer: ql.LayerInfo) -> int:
    """Multiply-accumulates of one call of `layer` per sample (per input row of a
    Dense layer, per image of a 2-D conv), from its input shape and configuration."""
    mod = layer.module
    c = int(layer.input.shape[-1])
    if layer.kind == "dense":
        return c * int(mod.features)
    kh, kw = (int(k) for k in mod.kernel_size)
    strides = conv_strides(mod)
    h, w = (int(d) for d in layer.input.shape[-3:-1])
    (pt, pb), (pl, pr) = explicit_padding(mod, (h, w), strides)
    ho = (h + pt + pb - kh) // strides[0] + 1
    wo = (w + pl + pr - kw) // strides[1] + 1
    return ho * wo * kh * kw * c * int(mod.features)


def choose_int8_layers(seconds: Mapping[int, Mapping[Path, Mapping[str, float | None]]]
                       ) -> dict[int, frozenset]:
    """{batch: {path: {"fp32": s, "int8": s}}} -> {batch: paths run in int8}.

    A layer runs in int8 at a batch size only where its int8 time is strictly
    below its fp32 time; a missing int8 time (it failed to compile) keeps fp32.
    """
    plan = {}
    for batch, row in seconds.items():
        plan[int(batch)] = frozenset(
            path for path, t in row.items()
            if t.get("int8") is not None and t.get("fp32") is not None and t["int8"] < t["fp32"]
        )
    return plan


def mac_share(macs: Mapping[Path, int], int8_paths: Iterable[Path]) -> float:
    """Share of all the layers' multiply-accumulates done by the `int8_paths`."""
    total = sum(macs.values())
    if total <= 0:
        return 0.0
    return sum(macs[p] for p in set(int8_paths) if p in macs) / total


@dataclasses.dataclass(frozen=True)
class Int8Plan:
    """Which quantizable layers run in int8 at each padded batch size (fixed for a run)."""

    int8: Mapping[int, frozenset]  # batch size -> paths in int8
    macs: Mapping[Path, int]  # every Dense/Conv layer -> MACs per sample
    options: Mapping[Path, dict]  # every quantizable layer -> publish options ({"equalize"})
    forced: bool = False
    # batch -> path -> {"fp32": s, "int8": s}: the measurement behind the plan (empty when forced).
    seconds: Mapping[int, Mapping[Path, Mapping[str, float | None]]] = dataclasses.field(
        default_factory=dict)

    def batch_for(self, n: int) -> int:
        """The planned batch size that serves a call of `n`: the smallest >= n, else the largest."""
        sizes = sorted(self.int8)
        return next((b for b in sizes if b >= n), sizes[-1])

    def layers_for(self, n: int) -> frozenset:
        return self.int8[self.batch_for(n)]

    def mac_share(self, n: int) -> float:
        return mac_share(self.macs, self.layers_for(n))

    def mac_shares(self) -> dict[int, float]:
        return {b: mac_share(self.macs, paths) for b, paths in sorted(self.int8.items())}

    def publish_layers(self) -> dict[Path, dict]:
        """The `layers` argument of `quantize.publish` for this plan: layers int8 at
        every batch size published int8 only, those int8 at some also keep their
        fp32 kernel, those int8 at none are not quantized."""
        counts: dict[Path, int] = {}
        for paths in self.int8.values():
            for p in paths:
                counts[p] = counts.get(p, 0) + 1
        return {
            p: {**self.options[p], **({} if n == len(self.int8) else {"keep_fp32": True})}
            for p, n in counts.items()
        }

    def describe(self) -> str:
        """One line: the int8 MAC share per batch size."""
        shares = ", ".join(f"{b}: {100 * s:.0f}%" for b, s in self.mac_shares().items())
        return f"int8 MAC share per batch size{' (forced)' if self.forced else ''}: {shares}"

    def to_dict(self) -> dict:
        """JSON-ready, per batch size: MAC share, int8 layers, quantizable
        layers kept fp32, and the layer timings."""
        def names(paths):
            return sorted("/".join(p) for p in paths)

        return {
            "forced": self.forced,
            "mac_share": {str(b): s for b, s in self.mac_shares().items()},
            "int8_layers": {str(b): names(paths) for b, paths in sorted(self.int8.items())},
            "fp32_layers": {str(b): names(set(self.options) - paths) for b, paths in sorted(self.int8.items())},
            # The measurement behind it: median ms per call of each layer alone.
            "layer_ms": {
                str(b): {"/".join(p): {k: None if t is None else 1e3 * t for k, t in times.items()}
                         for p, times in sorted(row.items())}
                for b, row in sorted(self.seconds.items())
            },
        }


def _layer_params(params, path: Path) -> dict:
    node = params["params"] if "params" in params else params
    for key in path:
        node = node[key]
    return node


def _feature_shape(layer: ql.LayerInfo) -> tuple[int, ...]:
    """The input of one sample: [K] for Dense, [H, W, C] for a 2-D conv."""
    return tuple(layer.input.shape[-1:] if layer.kind == "dense" else layer.input.shape[-3:])


def _time_layer(layer: ql.LayerInfo, node: dict, equalize: bool, batch: int, *, rounds: int,
                budget_s: float, rng: np.random.Generator) -> dict[str, float | None]:
    """Median seconds per call of the layer alone at fp32 and int8 on random data."""
    shape = (batch,) + _feature_shape(layer)
    if layer.pixels:
        x = jnp.asarray(rng.integers(0, 256, shape, dtype=np.uint8))
    else:  # post-ReLU-like activations
        x = jnp.asarray(np.abs(rng.standard_normal(shape)).astype(np.float32))
    fp32 = {k: jnp.asarray(v, jnp.float32) for k, v in node.items()}
    fns = {"fp32": functools.partial(jax.jit(ql.layer_fn(layer, "fp32")), fp32)}
    try:
        int8 = qz.quantize_layer(fp32, equalize=equalize)
        f = functools.partial(jax.jit(ql.layer_fn(layer, "int8")), int8)
        jax.block_until_ready(f(x))  # compiles (and picks the conv implementation)
        fns["int8"] = f
    except Exception:  # noqa: BLE001 - no int8 form on this backend: the layer stays fp32
        pass
    jax.block_until_ready(fns["fp32"](x))
    out: dict[str, float | None] = {"int8": None}
    out.update(time_interleaved(fns, (x,), budget_s, rounds=rounds, statistic=statistics.median))
    return out


def measure_layer_seconds(layers: list[ql.LayerInfo], params, options: Mapping[Path, dict],
                          batches: Iterable[int], *, rounds: int = 7, budget_s: float = 0.2,
                          seed: int = 0) -> dict[int, dict[Path, dict]]:
    """{batch: {path: {"fp32": s, "int8": s}}} for every layer in `options`.

    Layers of identical shape and configuration (the IMPALA CNN's residual
    blocks) are timed once per batch size.
    """
    rng = np.random.default_rng(seed)
    cache: dict[tuple, dict] = {}
    out: dict[int, dict[Path, dict]] = {}
    for batch in batches:
        row = {}
        for layer in layers:
            if layer.path not in options:
                continue
            node = _layer_params(params, layer.path)
            equalize = bool(options[layer.path].get("equalize", True))
            key = (int(batch), repr(layer.module), _feature_shape(layer), layer.pixels, equalize,
                   tuple(np.shape(node["kernel"])), "bias" in node)
            if key not in cache:
                cache[key] = _time_layer(layer, node, equalize, int(batch), rounds=rounds,
                                         budget_s=budget_s, rng=rng)
            row[layer.path] = cache[key]
        out[int(batch)] = row
    return out


def make_plan(layers: list[ql.LayerInfo], params, batches: Iterable[int], *, force: bool = False,
              rounds: int = 7, budget_s: float = 0.2) -> Int8Plan:
    """Measures (unless `force`) and returns the int8 plan for these batch sizes.

    `layers` is `find_layers(network, ...)`; `params` the network's fp32
    variables (their values do not matter for the timing, only the shapes).
    """
    batches = sorted({int(b) for b in batches})
    if not batches:
        raise ValueError("an int8 plan needs at least one batch size")
    options = ql.quantizable_paths(layers)
    macs = {layer.path: layer_macs(layer) for layer in layers}
    if force:
        return Int8Plan({b: frozenset(options) for b in batches}, macs, options, forced=True)
    seconds = measure_layer_seconds(layers, params, options, batches, rounds=rounds, budget_s=budget_s)
    return Int8Plan(choose_int8_layers(seconds), macs, options, seconds=seconds)
