"""Inference precision (issue 4): int8 quantization, bf16, and the interception mechanism.

Numerics of the quantizer (round-trip bounds, zero/constant channels, scales
never zero), the published parameter pytrees, the int8 convolution
implementations (exactly equal to each other and to a float convolution of
the same integers), closeness of bf16/int8 networks to fp32, greedy
action agreement on real Atari frames (random CNNs) and on a trained
CartPole policy, and the per-layer int8/fp32 plan (seedq.quant.plan) from
injected timings.
"""

import dataclasses
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from seedq import config as config_lib
from seedq import quant
from seedq.agents import inputs
from seedq.quant import conv_choice, int8_conv
from seedq.quant import plan as qplan
from seedq.quant import quantize as qz

RNG = np.random.default_rng(1234)
# Accuracy tests pin one int8 convolution implementation: all of them give
# bit-identical integer results (tested below), and the "auto" timing would
# only add seconds here.
CONV = "native"


def dequantized(q, scale) -> np.ndarray:
    """The float values int8 `q` [..., O] with per-output-channel `scale` [O] stand for."""
    return np.asarray(q).astype(np.float32) * np.asarray(scale, np.float32)


BATCH = 50  # one batch size everywhere, so each network compiles once per precision


def _obs(name, n):
    if name == "mlp":
        return RNG.standard_normal((n, 64)).astype(np.float32)
    return RNG.integers(0, 256, (n, 84, 84, 4), dtype=np.uint8)


class _Net:
    """A production V-trace network (as `seedq bench inference` builds it: the
    agent's own) with jitted init / publish / forward at every precision."""

    def __init__(self, name):
        from seedq.bench.inference import agent_net

        self.name = name
        self.agent_net = agent_net(name, 6, mlp_input=64)
        self.net = self.agent_net.module
        # The network's own (time-major, one step) inputs for one env.
        self.example = self.agent_net.inputs(jnp.asarray(_obs(name, 1)))
        self.paths = quant.quantizable_paths(quant.find_layers(self.net, *self.example))
        self._init = jax.jit(lambda rng: self.net.init(rng, *self.example))
        self.publish = {
            p: jax.jit(lambda params, p=p: quant.publish(params, p, self.paths)) for p in quant.PRECISIONS
        }
        self.forward = {p: jax.jit(lambda published, obs, p=p: self.apply(published, p, obs))
                        for p in quant.PRECISIONS}

    def apply(self, published, precision, obs, **kwargs):
        """(logits [N, A], value [N]) of one step for obs [N, ...]."""
        dist, value, _ = quant.apply(self.net, published, precision, *self.agent_net.inputs(obs),
                                     conv_impl=CONV, **kwargs)
        return dist["logits"][0], value[0]

    def init(self, seed):
        return self._init(jax.random.PRNGKey(seed))

    def outputs(self, params, precision, obs):
        """(logits, value) for obs [k * BATCH, ...], in chunks of BATCH."""
        published = self.publish[precision](params)
        chunks = [self.forward[precision](published, obs[i : i + BATCH]) for i in range(0, len(obs), BATCH)]
        return tuple(np.concatenate([np.asarray(c[j]) for c in chunks]) for j in range(2))


_NETS = {}


def _net(name) -> _Net:
    if name not in _NETS:
        _NETS[name] = _Net(name)
    return _NETS[name]


# --- the quantizer ----------------------------------------------------------------


@pytest.mark.unit
def test_every_precision_the_config_accepts_runs_and_the_rest_are_refused_by_both():
    """What the config accepts the quantizer runs, and both refuse anything else
    (the list itself is one: seedq.config.PRECISIONS)."""
    net = nn.Dense(3)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    params = net.init(jax.random.PRNGKey(0), x)
    for precision in ("fp32", "bf16", "int8", "fp16", "int4"):
        try:
            config_lib.TrainConfig(precision=precision).validate()
            accepted = True
        except ValueError as e:
            assert f"precision={precision!r}" in str(e)
            accepted = False
        if accepted:
            out = quant.apply(net, quant.publish(params, precision), precision, x)
            assert out.shape == (2, 3) and out.dtype == jnp.float32, precision
        else:
            with pytest.raises(ValueError, match=f"precision={precision!r}"):
                quant.apply(net, params, precision, x)
        assert accepted == (precision in ("fp32", "bf16", "int8")), precision


@pytest.mark.unit
@pytest.mark.parametrize("shape", [(37, 5), (3, 3, 4, 16), (8, 8, 4, 32)])
def test_per_channel_round_trip_error_is_at_most_half_a_step(shape):
    # Channels of very different magnitudes: each gets its own scale.
    magnitudes = 10.0 ** RNG.uniform(-6, 3, size=shape[-1])
    w = (RNG.standard_normal(shape) * magnitudes).astype(np.float32)
    q, scale = quant.quantize_per_channel(w)
    q, scale = np.asarray(q), np.asarray(scale)
    assert q.dtype == np.int8 and q.shape == w.shape
    assert scale.dtype == np.float32 and scale.shape == (shape[-1],)
    assert np.all(np.abs(q.astype(int)) <= 127)
    axes = tuple(range(w.ndim - 1))
    max_abs = np.max(np.abs(w), axis=axes)
    np.testing.assert_allclose(scale, max_abs / 127, rtol=1e-6)
    # The largest element of every channel maps to +-127: the full range is used.
    assert np.all(np.max(np.abs(q.astype(int)), axis=axes) == 127)
    err = np.abs(dequantized(q, scale) - w)
    bound = scale * (0.5 + 1e-5)
    assert np.all(np.max(err, axis=axes) <= bound), (np.max(err, axis=axes) / scale).max()


@pytest.mark.unit
def test_zero_constant_and_tiny_channels():
    w = np.zeros((6, 5), np.float32)
    w[:, 1] = 0.75  # constant
    w[:, 2] = np.array([-3, 3, -3, 3, -3, 3])  # constant magnitude, both signs
    w[:, 3] = 1e-42  # subnormal: max/127 underflows
    w[:, 4] = RNG.standard_normal(6)
    q, scale = (np.asarray(a) for a in quant.quantize_per_channel(w))
    assert np.all(scale > 0) and np.all(np.isfinite(scale))
    assert scale[0] == 1.0 and np.all(q[:, 0] == 0)  # zero channel: scale 1, exact zeros
    deq = dequantized(q, scale)
    np.testing.assert_array_equal(deq[:, 0], 0.0)
    np.testing.assert_allclose(deq[:, 1], 0.75, rtol=1e-6)  # constant channels round-trip
    np.testing.assert_allclose(deq[:, 2], w[:, 2], rtol=1e-6)
    assert np.all(np.abs(q[:, 1]) == 127) and np.all(np.abs(q[:, 2]) == 127)
    assert np.all(np.abs(deq[:, 3] - w[:, 3]) <= 1e-41)


@pytest.mark.unit
def test_scale_is_never_zero_for_any_input():
    for x in (np.zeros((4, 3)), np.full((4, 3), 1e-45), np.full((4, 3), -0.0)):
        _, s = quant.quantize_per_channel(x.astype(np.float32))
        assert np.all(np.asarray(s) > 0)
        _, s = quant.quantize_rows(x.astype(np.float32))
        assert np.all(np.asarray(s) > 0)


@pytest.mark.unit
def test_row_quantization_bounds_and_zero_rows():
    x = (RNG.standard_normal((5, 7, 7, 3)) * np.array([1e-3, 1, 10, 1e4, 0])[:, None, None, None])
    x = x.astype(np.float32)
    q, s = (np.asarray(a) for a in quant.quantize_rows(x))
    assert q.dtype == np.int8 and q.shape == x.shape
    assert s.dtype == np.float32 and s.shape == (5,)
    assert s[4] == 1.0 and np.all(q[4] == 0)
    err = np.abs(q * s[:, None, None, None] - x).reshape(5, -1).max(axis=1)
    assert np.all(err <= s * (0.5 + 1e-5))


# --- published parameters -----------------------------------------------------------


def _layer_dicts(tree, path=()):
    if isinstance(tree, dict):
        if "kernel" in tree or qz.QKERNEL in tree:
            yield path, tree
        else:
            for k, v in tree.items():
                yield from _layer_dicts(v, path + (k,))


@pytest.mark.unit
@pytest.mark.parametrize("name", ["mlp", "nature_cnn", "impala_cnn"])
def test_published_leaves_have_the_right_shapes_and_dtypes(name):
    net = _net(name)
    params = net.init(0)
    fp32_layers = dict(_layer_dicts(params["params"]))
    outputs = {p for p in fp32_layers if p[-1] in quant.OUTPUT_LAYER_NAMES}
    assert {p[-1] for p in outputs} == {"policy", "value"}
    # The MLP's input layer takes the float observation: fp32 like the outputs.
    # The CNNs' first conv takes uint8 pixels and is quantized.
    torso = {"mlp": "MLPTorso_0", "nature_cnn": "NatureCNN_0", "impala_cnn": "ImpalaCNN_0"}[name]
    kept = outputs | ({(torso, "Dense_0")} if name == "mlp" else set())
    # Every other Dense/Conv here is quantizable.
    assert set(net.paths) == set(fp32_layers) - kept

    assert quant.publish(params, "fp32", net.paths) is params
    bf16 = net.publish["bf16"](params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(bf16)):
        assert b.dtype == jnp.bfloat16 and b.shape == a.shape

    int8 = net.publish["int8"](params)
    int8_layers = dict(_layer_dicts(int8["params"]))
    assert set(int8_layers) == set(fp32_layers)
    for path in kept:  # unchanged fp32 leaves
        assert set(int8_layers[path]) == {"kernel", "bias"}
        np.testing.assert_array_equal(int8_layers[path]["kernel"], fp32_layers[path]["kernel"])
    for path, layer in int8_layers.items():
        if path in kept:
            continue
        kernel = fp32_layers[path]["kernel"]
        equalized = net.paths[path]["equalize"]
        assert equalized == (path != (torso, "Conv_0"))  # pixels: exact ints
        assert set(layer) == {qz.QKERNEL, qz.QSCALE, "bias"} | ({qz.QINPUT} if equalized else set())
        assert layer[qz.QKERNEL].dtype == jnp.int8 and layer[qz.QKERNEL].shape == kernel.shape
        assert layer[qz.QSCALE].dtype == jnp.float32 and layer[qz.QSCALE].shape == kernel.shape[-1:]
        assert layer["bias"].dtype == jnp.float32 and layer["bias"].shape == kernel.shape[-1:]
        assert np.all(np.asarray(layer[qz.QSCALE]) > 0)
        np.testing.assert_array_equal(layer["bias"], fp32_layers[path]["bias"])
        if equalized:
            g = np.asarray(layer[qz.QINPUT])
            assert g.dtype == np.float32 and g.shape == kernel.shape[-2:-1] and np.all(g > 0)
            # Equalization is exact before rounding: q * scale / g ~= kernel.
            deq = dequantized(layer[qz.QKERNEL], layer[qz.QSCALE])
            deq = deq * g.reshape((-1, 1))
            step = np.asarray(layer[qz.QSCALE])[None, :] * g.reshape((-1, 1))
            err = np.abs(deq - np.asarray(kernel)).reshape((-1,) + step.shape)
            assert np.all(err <= step * (0.5 + 1e-4))


@pytest.mark.unit
def test_publish_rejects_unknown_precision():
    with pytest.raises(ValueError, match="int4"):
        quant.publish({"params": {}}, "int4")


class _OwnKernel(nn.Module):
    """Owns a 'kernel' but is not a Dense/Conv: must stay fp32."""

    @nn.compact
    def __call__(self, x):
        k = self.param("kernel", nn.initializers.normal(1.0), (x.shape[-1], 3))
        return x @ k


class _Mixed(nn.Module):
    @nn.compact
    def __call__(self, x):
        y = nn.Conv(4, (3, 3), kernel_dilation=(2, 2))(x)  # dilated: not implemented in int8
        y = nn.Conv(4, (3, 3), padding=((1, 2), (0, 1)), strides=(2, 1))(y)  # explicit padding: int8
        y = y.reshape(y.shape[0], -1)
        return _OwnKernel()(y) + nn.Dense(3)(y)


@pytest.mark.unit
def test_unsupported_layers_stay_fp32_and_still_run():
    net = _Mixed()
    x = RNG.standard_normal((3, 12, 12, 2)).astype(np.float32)
    params = jax.jit(net.init)(jax.random.PRNGKey(0), x)
    layers = {layer.path: layer for layer in quant.find_layers(net, x)}
    assert not layers[("Conv_0",)].quantizable and layers[("Conv_1",)].quantizable
    assert ("_OwnKernel_0",) not in layers
    published = quant.publish(params, "int8", quant.quantizable_paths(list(layers.values())))
    p = published["params"]
    assert p["Conv_0"]["kernel"].dtype == jnp.float32
    assert p["_OwnKernel_0"]["kernel"].dtype == jnp.float32
    assert p["Conv_1"][qz.QKERNEL].dtype == jnp.int8 and p["Dense_0"][qz.QKERNEL].dtype == jnp.int8
    ref = jax.jit(net.apply)(params, x)
    for impl in int8_conv.CONV_IMPLS:
        out = jax.jit(lambda p, v: quant.apply(net, p, "int8", v, conv_impl=impl))(published, x)
        assert float(jnp.max(jnp.abs(out - ref)) / jnp.max(jnp.abs(ref))) < 0.05


# --- int8 convolution implementations ---------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    "h, w, c, o, k, stride, dtype",
    [
        (12, 12, 16, 16, 3, 1, np.int8),
        (13, 11, 4, 16, 3, 1, np.uint8),
        (84, 84, 4, 32, 8, 4, np.uint8),
        (20, 20, 32, 64, 4, 2, np.int8),
        (9, 9, 64, 64, 3, 1, np.int8),
        (10, 9, 3, 7, 5, 3, np.int8),
        (7, 7, 8, 3, 1, 1, np.int8),
    ],
)
def test_int8_conv_implementations_are_exact(h, w, c, o, k, stride, dtype):
    lo, hi = (0, 256) if dtype == np.uint8 else (-127, 128)
    qx = jnp.asarray(RNG.integers(lo, hi, (2, h, w, c)).astype(dtype))
    qw = jnp.asarray(RNG.integers(-127, 128, (k, k, c, o)).astype(np.int8))
    # Reference: the same integers in float64 numpy (exact), VALID padding.
    x64, w64 = np.asarray(qx, np.float64), np.asarray(qw, np.float64)
    ho, wo = (h - k) // stride + 1, (w - k) // stride + 1
    ref = np.zeros((2, ho, wo, o))
    for i in range(k):
        for j in range(k):
            patch = x64[:, i : i + stride * (ho - 1) + 1 : stride, j : j + stride * (wo - 1) + 1 : stride]
            ref += patch @ w64[i, j]
    for impl, fn in int8_conv.CONV_FUNCTIONS.items():
        out = jax.jit(fn, static_argnums=2)(qx, qw, (stride, stride))
        assert out.dtype == jnp.int32, impl
        np.testing.assert_array_equal(np.asarray(out), ref.astype(np.int64), err_msg=impl)


@pytest.mark.unit
def test_patches_conv_equals_lax_conv_on_float_layer():
    """The int8 patches path of a SAME-padded layer == lax conv of the dequantized operands."""
    x = np.abs(RNG.standard_normal((3, 10, 10, 8))).astype(np.float32)
    conv = nn.Conv(16, (3, 3), padding="SAME")
    params = jax.jit(conv.init)(jax.random.PRNGKey(0), x)
    published = jax.jit(lambda p: quant.publish(p, "int8"))(params)
    layer = published["params"]
    g = np.asarray(layer[qz.QINPUT])  # input equalization
    qx, sx = quant.quantize_rows(x * g)
    deq_x = np.asarray(qx, np.float32) * np.asarray(sx)[:, None, None, None]
    deq_w = dequantized(layer[qz.QKERNEL], layer[qz.QSCALE])
    ref = lax.conv_general_dilated(deq_x, deq_w, (1, 1), "SAME",
                                   dimension_numbers=("NHWC", "HWIO", "NHWC")) + layer["bias"]
    for impl in int8_conv.CONV_IMPLS:
        out = jax.jit(lambda p, v: quant.apply(conv, p, "int8", v, conv_impl=impl))(published, x)
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-4, atol=1e-5)


class _Recorder:
    """An input observer (seedq.agents.inputs.InputObserver) that lists what it saw."""

    def __init__(self):
        self.seen = []

    def saw_pixels(self, scaled, raw, scale):
        self.seen.append(("pixels", raw.dtype, scaled.dtype, scale))

    def saw_observation(self, x):
        self.seen.append(("observation", x.dtype))


@pytest.mark.unit
def test_the_networks_input_hooks_report_to_the_registered_observer_only():
    from seedq.agents.networks import MLPTorso, NatureCNN

    frames = np.zeros((1, 84, 84, 4), np.uint8)
    vectors = np.zeros((1, 6), np.float32)
    cnn_params = jax.eval_shape(NatureCNN().init, jax.random.PRNGKey(0), frames)
    mlp_params = jax.eval_shape(MLPTorso((8,)).init, jax.random.PRNGKey(0), vectors)
    recorder = _Recorder()
    with inputs.observed_by(recorder):
        jax.eval_shape(NatureCNN().apply, cnn_params, frames)
        jax.eval_shape(MLPTorso((8,)).apply, mlp_params, vectors)
    assert recorder.seen == [("pixels", np.uint8, np.float32, 1.0 / 255.0), ("observation", np.float32)]
    jax.eval_shape(NatureCNN().apply, cnn_params, frames)  # outside the context: nobody is told
    assert len(recorder.seen) == 2
    x = jnp.arange(3.0)
    assert inputs.observation_input(x) is x


@pytest.mark.unit
def test_uint8_pixels_are_used_exactly():
    """A conv fed by scale_pixels computes with the raw integers (scale 1/255), no re-quantization."""

    class PixelConv(nn.Module):
        @nn.compact
        def __call__(self, obs):
            return nn.Conv(8, (4, 4), strides=(2, 2), padding="VALID")(inputs.scale_pixels(obs))

    net = PixelConv()
    obs = RNG.integers(0, 256, (2, 12, 12, 4), dtype=np.uint8)
    params = jax.jit(net.init)(jax.random.PRNGKey(0), obs)
    plan = quant.quantizable_paths(quant.find_layers(net, obs))
    assert plan == {("Conv_0",): {"equalize": False}}  # fed pixels: no equalization
    published = jax.jit(lambda p: quant.publish(p, "int8", plan))(params)
    layer = published["params"]["Conv_0"]
    assert qz.QINPUT not in layer
    w = dequantized(layer[qz.QKERNEL], layer[qz.QSCALE]).astype(np.float64)
    x = obs.astype(np.float64) / 255.0
    ref = np.zeros((2, 5, 5, 8))
    for i in range(4):
        for j in range(4):
            ref += x[:, i : i + 9 : 2, j : j + 9 : 2] @ w[i, j]
    ref += np.asarray(layer["bias"])
    for impl in int8_conv.CONV_IMPLS:
        out = np.asarray(jax.jit(lambda p, v: quant.apply(net, p, "int8", v, conv_impl=impl))(published, obs))
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6, err_msg=impl)


class _ScriptedClock:
    """perf_counter() for `seedq.quant.conv_choice`: each start/stop pair of the one
    timed call per implementation lasts the next scripted number of seconds."""

    def __init__(self, durations):
        self._ticks = [t for d in durations for t in (0.0, d)]

    def perf_counter(self):
        return self._ticks.pop(0)


def _calibrate_with(monkeypatch, single, interleaved, broken=()):
    """conv_choice._calibrate on a small conv with the one-call timings `single` (impl ->
    seconds, in CONV_FUNCTIONS order, for those that compile) and the interleaved
    round results `interleaved`; implementations in `broken` fail to compile.
    Returns (choice, the set of implementations that reached the interleaved rounds)."""
    real_layer = int8_conv.conv_layer

    def layer(impl, *args):
        if impl in broken:
            raise RuntimeError(f"{impl}: no integer convolution here")
        return real_layer(impl, *args)

    raced = []
    monkeypatch.setattr(int8_conv, "conv_layer", layer)
    monkeypatch.setattr(conv_choice, "time", _ScriptedClock([single[i] for i in int8_conv.CONV_FUNCTIONS if i not in broken]))
    monkeypatch.setattr(conv_choice, "time_interleaved",
                        lambda fns, *a, **k: raced.append(set(fns)) or {i: interleaved[i] for i in fns})
    choice = conv_choice._calibrate((2, 9, 9, 16), "float", ((1, 1), (1, 1)), (3, 3, 16, 16), (1, 1))
    return choice, (raced[0] if raced else set())


@pytest.mark.unit
def test_conv_choice_races_the_candidates_within_2x_and_picks_the_fastest_round(monkeypatch):
    assert set(int8_conv.CONV_FUNCTIONS) == {"patches", "native", "s2d"}
    # native is > 2x slower than the best single call: dropped before the rounds.
    choice, raced = _calibrate_with(monkeypatch, {"patches": 1.0, "native": 2.5, "s2d": 1.9},
                                    {"patches": 0.9, "s2d": 0.7})
    assert raced == {"patches", "s2d"}
    assert (choice.impl, choice.reason) == ("s2d", "measured")
    assert choice.seconds == {"patches": 0.9, "native": 2.5, "s2d": 0.7}
    # The rounds decide, not the single calls.
    choice, _ = _calibrate_with(monkeypatch, {"patches": 1.0, "native": 1.1, "s2d": 1.2},
                                {"patches": 0.8, "native": 0.5, "s2d": 0.6})
    assert choice.impl == "native"


@pytest.mark.unit
def test_conv_choice_skips_implementations_that_fail_and_defaults_when_none_compiles(monkeypatch):
    choice, raced = _calibrate_with(monkeypatch, {"patches": 1.0, "s2d": 3.0}, {}, broken=("native",))
    # One candidate left within 2x: no rounds needed.
    assert raced == set() and choice.impl == "patches" and choice.seconds["native"] is None
    choice, _ = _calibrate_with(monkeypatch, {}, {}, broken=tuple(int8_conv.CONV_FUNCTIONS))
    assert (choice.impl, choice.reason) == ("patches", "no implementation compiled")


@pytest.mark.unit
def test_auto_policy_calibrates_each_layer_shape_once_and_computes_what_every_impl_computes(monkeypatch):
    calls = []
    fixed = {"native": conv_choice.ConvChoice("native", {}, "measured")}
    monkeypatch.setattr(conv_choice, "_calibrate", lambda *key: calls.append(key) or fixed["native"])
    shape = (2, 9, 9, 13)  # a shape no other test calibrates
    args = (np.float32, ((1, 1), (1, 1)), (3, 3, 13, 16), (1, 1))
    assert conv_choice.choose_conv_impl(shape, *args) == "native"
    assert conv_choice.choose_conv_impl(shape, *args) == "native"
    assert len(calls) == 1  # cached per (platform, shapes, strides)
    assert conv_choice.choose_conv_impl(shape, *args, policy="s2d") == "s2d"  # a named policy is not timed
    assert len(calls) == 1
    # Whatever "auto" picks, the layer's output is bit-identical to each named implementation's.
    conv = nn.Conv(16, (3, 3), padding="SAME")
    x = np.abs(RNG.standard_normal(shape)).astype(np.float32)
    published = jax.jit(lambda p: quant.publish(p, "int8"))(jax.jit(conv.init)(jax.random.PRNGKey(0), x))
    outs = {impl: np.asarray(jax.jit(lambda p, v, impl=impl: quant.apply(conv, p, "int8", v, conv_impl=impl))(
        published, x)) for impl in ("auto", *int8_conv.CONV_IMPLS)}
    for impl, out in outs.items():
        np.testing.assert_array_equal(out, outs["auto"], err_msg=impl)


# --- whole networks ---------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("name", ["mlp", "nature_cnn", "impala_cnn"])
def test_bf16_and_int8_outputs_are_close_to_fp32(name):
    net = _net(name)
    obs = _obs(name, BATCH)
    params = net.init(1)
    ref_logits, ref_value = net.outputs(params, "fp32", obs)
    # Measured (3 seeds): logits bf16 <= 0.012, int8 <= 0.047. The value is one
    # output that random networks put near 0 for every state, so its error
    # relative to max|value| is looser (IMPALA: up to 0.08 bf16, 0.21 int8).
    for precision, tol in (("bf16", 0.05), ("int8", 0.1)):
        logits, value = net.outputs(params, precision, obs)
        assert logits.dtype == np.float32 and value.dtype == np.float32
        rel = np.max(np.abs(logits - ref_logits)) / np.max(np.abs(ref_logits))
        assert rel < tol, (precision, rel)
        rel_v = np.max(np.abs(value - ref_value)) / np.max(np.abs(ref_value))
        assert rel_v < 3 * tol, (precision, rel_v)


@pytest.mark.unit
def test_r2d2_network_lstm_and_dueling_head_run_through_the_same_mechanism():
    """The production R2D2 network (MLP torso -> scanned LSTM -> dueling head)."""
    from seedq.agents.r2d2.networks import RecurrentQNetwork

    net = RecurrentQNetwork(5, hidden_sizes=(32,), lstm_size=32, head_hidden_size=32)
    obs = RNG.standard_normal((6, 4, 10)).astype(np.float32)
    first = np.zeros((6, 4), bool)
    first[0] = True
    carry = net.initial_carry(4)
    params = jax.jit(net.init)(jax.random.PRNGKey(0), obs, first, carry)
    layers = quant.find_layers(net, obs, first, carry)
    paths = quant.quantizable_paths(layers)
    # The LSTM's gate layer and the dueling head's four; the torso's one layer
    # takes the float observation and stays fp32.
    assert sorted("/".join(p) for p in paths) == [
        "DuelingHead_0/Dense_0", "DuelingHead_0/Dense_1", "DuelingHead_0/Dense_2", "DuelingHead_0/Dense_3",
        "lstm/cell/gates"]
    assert [layer.path for layer in layers if layer.observation] == [layers[0].path]
    assert layers[0].path not in paths
    ref_q, (ref_c, ref_h) = jax.jit(net.apply)(params, obs, first, carry)
    for precision, tol in (("bf16", 0.05), ("int8", 0.1)):
        published = quant.publish(params, precision, paths)
        q, (c, h) = jax.jit(lambda p: quant.apply(net, p, precision, obs, first, carry))(published)
        assert q.dtype == c.dtype == h.dtype == jnp.float32
        rel = jnp.max(jnp.abs(q - ref_q)) / jnp.max(jnp.abs(ref_q))
        assert float(rel) < tol, (precision, float(rel))
        np.testing.assert_allclose(np.asarray(h), np.asarray(ref_h), atol=tol)


@pytest.fixture(scope="module")
def atari_frames():
    pytest.importorskip("ale_py")
    from seedq.bench.inference import collect_atari_frames

    return collect_atari_frames(6 * BATCH, "ALE/Pong-v5", seed=3)


@pytest.mark.unit
@pytest.mark.parametrize("name", ["nature_cnn", "impala_cnn"])
def test_int8_greedy_actions_agree_on_real_atari_frames(name, atari_frames):
    """The production V-trace CNNs (random initialisations) on real Pong frames.

    A fresh policy head (orthogonal 0.01) leaves many states near-indifferent:
    for seed 0 of the Nature CNN only 6 % of these states have a logit gap of 5 %
    of the logit scale, so the raw agreement mostly counts ties (measured, seeds
    0-3: int8 0.85-1.0, bf16 0.96-1.0). What int8 must get right is the states
    where fp32 prefers an action clearly: there every seed 0-3 of both nets agreed
    on >= 98.8 % (1.0 for seeds 0 and 1), with a logit error <= 0.06 of the scale.
    """
    assert atari_frames.shape == (300, 84, 84, 4) and atari_frames.dtype == np.uint8
    assert len(np.unique(atari_frames.reshape(300, -1), axis=0)) > 250  # distinct states
    net = _net(name)
    rows = []
    for seed in (0, 1):  # two random initialisations
        params = net.init(seed)
        ref = net.outputs(params, "fp32", atari_frames)[0]
        top2 = np.sort(ref, axis=-1)[:, -2:]
        decided = (top2[:, 1] - top2[:, 0]) >= 0.05 * np.abs(ref).max()
        assert decided.sum() >= 10, (seed, decided.sum())
        for precision in ("int8", "bf16"):
            logits = net.outputs(params, precision, atari_frames)[0]
            same = logits.argmax(-1) == ref.argmax(-1)
            rows.append((precision, seed, float(np.mean(same[decided])),
                         float(np.abs(logits - ref).max() / np.abs(ref).max())))
    assert all(agree >= 0.98 and error < 0.1 for _, _, agree, error in rows), rows


@pytest.mark.e2e
def test_an_int8_run_records_its_measured_per_layer_plan(tmp_path):
    """`seedq train --precision int8` with the real system: the learner's
    server measures its per-layer int8/fp32 plan and the summary records it.
    (int8's agreement with fp32 on a solved policy: the learning run of
    tests/test_local.py.)"""
    logdir = tmp_path / "cartpole"
    result = subprocess.run(
        [sys.executable, "-m", "seedq.cli", "train", "--env", "CartPole-v1", "--precision", "int8",
         "--target-return", "none", "--max-frames", "5000", "--max-seconds", "0",
         "--eval-episodes", "0", "--logdir", str(logdir), "--quiet"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["precision"] == "int8" and summary["stop_reason"] == "max_frames"
    # The measured per-layer plan, one MAC share per padded batch size of the server.
    shares = summary["int8_plan"]["mac_share"]
    assert set(shares) == {"8", "16", "32", "64", "128", "256"}, summary["int8_plan"]
    assert all(0.0 <= s <= 1.0 for s in shares.values()), shares
    assert summary["int8_plan"]["forced"] is False


def _agents():
    from seedq.agents import make_agent
    from seedq.envs import env_spec

    spec = env_spec("CartPole-v1")
    vtrace = config_lib.TrainConfig()
    r2d2 = config_lib.TrainConfig(agent="r2d2")  # LSTM + dueling head
    return spec, {"vtrace": make_agent(vtrace, spec), "r2d2": make_agent(r2d2, spec)}


@pytest.mark.unit
@pytest.mark.parametrize("name", ["vtrace", "r2d2"])
def test_the_precision_mode_runs_any_agent_at_every_precision(name):
    """Precision is a mode wrapped around the agent's own `act`: the same agent
    object acts at fp32, bf16 and int8, with every Dense (R2D2's LSTM gates and
    dueling head included) routed through the quantized rule."""
    from seedq.quant.mode import InferencePrecision

    spec, agents = _agents()
    agent = agents[name]
    params = agent.inference_params(agent.init(jax.random.PRNGKey(0)))
    n = 8
    obs = RNG.standard_normal((n, 4)).astype(np.float32)
    args = (jax.random.PRNGKey(1), obs, np.ones(n, bool), agent.initial_core_state(n),
            agent.actor_inputs(np.arange(n)))
    outputs = {}
    for precision in quant.PRECISIONS:
        mode = InferencePrecision(agent, spec, precision)
        published = mode.publish(params)
        actions, out, core, _ = jax.jit(mode.act)(published, *args)
        assert actions.shape == (n,) and actions.dtype == jnp.int32
        assert all(v.dtype != jnp.bfloat16 for v in jax.tree.leaves(core))
        outputs[precision] = out
        if precision == "int8":
            paths = set(quant.quantizable_paths(mode.layers))
            quantized = {p for p, d in _layer_dicts(published["params"]) if qz.QKERNEL in d}
            assert quantized == paths and paths  # every quantizable layer published int8
    if name == "r2d2":
        paths = {p for p in (l.path for l in InferencePrecision(agent, spec, "int8").layers)}
        assert any("lstm" in p for p in paths), paths  # the gates' Dense is found inside nn.scan
    # Outputs of the fp32 network at lower precision, as a first-order check
    # (the trained-policy agreement is measured in docs/benchmarks.md).
    key = "logits" if name == "vtrace" else None
    if key:
        ref = np.asarray(outputs["fp32"][key])
        for precision in ("bf16", "int8"):
            err = np.abs(np.asarray(outputs[precision][key]) - ref).max() / (np.abs(ref).max() + 1e-6)
            assert err < 0.1, (precision, err)
    with pytest.raises(ValueError, match="int4"):
        InferencePrecision(agent, spec, "int4")


@pytest.mark.unit
def test_r2d2_q_values_at_int8_stay_close_to_fp32():
    """R2D2's Q-values through the int8 mode (LSTM and dueling head quantized)
    against the fp32 network on the same inputs, over an 8-step unroll."""
    from seedq.quant.mode import InferencePrecision

    spec, agents = _agents()
    agent = agents["r2d2"]
    params = agent.inference_params(agent.init(jax.random.PRNGKey(3)))
    int8 = InferencePrecision(agent, spec, "int8")
    int8.plan_int8(params, [8], force=True)
    published = int8.publish(params)
    obs = RNG.standard_normal((8, 8, 4)).astype(np.float32)
    first = np.zeros((8, 8), bool)
    first[0] = True

    def q_values(p, precision):
        return quant.apply(agent.network, p, precision, obs, first, agent.network.initial_carry(8),
                           int8_layers=int8.plan.layers_for(8) if precision == "int8" else None)[0]

    ref, got = np.asarray(q_values(params, "fp32")), np.asarray(q_values(published, "int8"))
    assert np.abs(got - ref).max() < 0.05 * (np.abs(ref).max() + 1e-6), np.abs(got - ref).max()
    assert int8.plan.mac_share(8) > 0.5  # the LSTM and the hidden layers: most of the MACs


@pytest.mark.unit
def test_bench_r2d2_network_is_the_agents_and_its_greedy_action_is_the_agents():
    from seedq.agents.r2d2.agent import R2D2Agent
    from seedq.bench.inference import NetBench
    from seedq.envs import env_spec

    obs = RNG.standard_normal((8, 4)).astype(np.float32)
    bench = NetBench("r2d2_mlp", quant.PRECISIONS, num_actions=2, seed=0, example=obs)
    agent = R2D2Agent(env_spec("CartPole-v1"), config_lib.R2D2Config(), num_envs=8)
    # The bench's parameters fit the agent's network as they are: the same module.
    _, outputs, _, _ = jax.jit(agent.act)(bench.params, jax.random.PRNGKey(0), obs, np.ones(8, bool),
                                          agent.initial_core_state(8), {"epsilon": np.zeros(8, np.float32)})
    np.testing.assert_array_equal(bench.logits("fp32", obs).argmax(-1), np.asarray(outputs["greedy_action"]))
    int8 = bench.published["int8"]["params"]
    assert qz.QKERNEL in int8["lstm"]["cell"]["gates"] and qz.QKERNEL in int8["DuelingHead_0"]["Dense_1"]
    assert "kernel" in int8["MLPTorso_0"]["Dense_0"]  # fed the float observation: fp32


@pytest.mark.unit
def test_trained_policy_agreement_reads_an_r2d2_checkpoint(tmp_path):
    from seedq.bench.inference import trained_policy_agreement
    from seedq.envs import env_spec
    from seedq import checkpoint
    from seedq.learner.learner import make_agent

    run = tmp_path / "r2d2"
    run.mkdir()
    config = dataclasses.replace(config_lib.TrainConfig(agent="r2d2", env="CartPole-v1"), logdir=str(run))
    state = make_agent(config, env_spec("CartPole-v1")).init(jax.random.PRNGKey(3))
    config_lib.save(config, str(run / "config.json"))
    writer = checkpoint.CheckpointWriter(str(run), keep=1)
    writer.save(checkpoint.Snapshot(
        state=jax.device_get(state), rng=jax.random.PRNGKey(1),
        counters={"train_steps": 1, "trained_frames": 0, "frames": 0, "episodes": 0, "policy_version": 1,
                  "elapsed_seconds": 0.0},
        episode_window={"returns": [], "lengths": []}, target={}, config=config_lib.to_dict(config)), wait=True)
    writer.close()
    out = trained_policy_agreement(str(run), steps=25, num_envs=4)
    assert out["agent"] == "r2d2" and set(out["modes"]) == {"greedy", "eps"}
    assert out["int8_layers"] == ["DuelingHead_0/Dense_0", "DuelingHead_0/Dense_1", "DuelingHead_0/Dense_2",
                                  "DuelingHead_0/Dense_3", "lstm/cell/gates"]
    for row in out["modes"].values():
        assert row["states"] == 100
        for precision in ("bf16", "int8"):
            assert 0.0 <= row[precision]["argmax_agreement"] <= 1.0
            assert 0.0 < row[precision]["max_rel_logit_error"] < 0.1  # it ran in that precision, and close


@pytest.mark.e2e
def test_bench_inference_cli_reports_ratios_and_errors():
    result = subprocess.run(
        [sys.executable, "-m", "seedq.cli", "bench", "inference", "--net", "mlp,r2d2_mlp",
         "--precision", "fp32,bf16,int8", "--batch", "16", "--rounds", "2",
         "--seconds-per-case", "0.2", "--eval-states", "16", "--json"],
        capture_output=True, text=True, timeout=180, env={**os.environ, "SEEDQ_JAX_CACHE_DIR": "off"},
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    rows = {(r["net"], r["batch"], r["precision"]): r for r in out["results"]}
    assert set(rows) == {(n, 16, p) for n in ("mlp", "r2d2_mlp") for p in ("fp32", "bf16", "int8")}
    for r in rows.values():
        assert r["samples_per_second"] > 0 and r["ratio_to_fp32"] > 0
        assert 0.0 <= r["argmax_agreement"] <= 1.0
    for net in ("mlp", "r2d2_mlp"):
        assert rows[(net, 16, "fp32")]["ratio_to_fp32"] == 1.0
        assert rows[(net, 16, "fp32")]["max_rel_logit_error"] == 0.0
        assert rows[(net, 16, "bf16")]["max_rel_logit_error"] > 0.0  # it ran in bf16


# --- the per-layer int8/fp32 plan (issue 16) ---------------------------------------------


@pytest.mark.unit
def test_plan_keeps_int8_only_where_it_was_faster():
    a, b, c, d = ("a",), ("b",), ("c",), ("d",)
    seconds = {
        8: {a: {"fp32": 1.0, "int8": 2.0}, b: {"fp32": 1.0, "int8": 0.5},
            c: {"fp32": 1.0, "int8": 1.0}, d: {"fp32": 1.0, "int8": None}},
        64: {a: {"fp32": 3.0, "int8": 1.0}, b: {"fp32": 1.0, "int8": 0.9},
             c: {"fp32": 1.0, "int8": 1.1}, d: {"fp32": 1.0, "int8": None}},
    }
    chosen = qplan.choose_int8_layers(seconds)
    # Slower, equal, or not compiled: fp32.
    assert chosen == {8: frozenset({b}), 64: frozenset({a, b})}

    options = {p: {"equalize": True} for p in (a, b, c, d)}
    plan = qplan.Int8Plan(chosen, {a: 10, b: 30, c: 50, d: 10}, options, seconds=seconds)
    # A call is served by the smallest planned size >= its batch, else the largest.
    assert [plan.batch_for(n) for n in (1, 8, 9, 64, 300)] == [8, 8, 64, 64, 64]
    assert plan.layers_for(20) == frozenset({a, b})
    # Always int8: int8 only; sometimes: both forms; never: not quantized at all.
    assert plan.publish_layers() == {a: {"equalize": True, "keep_fp32": True}, b: {"equalize": True}}
    assert plan.mac_shares() == {8: 0.3, 64: 0.4}
    assert plan.to_dict()["int8_layers"] == {"8": ["b"], "64": ["a", "b"]}
    assert plan.to_dict()["fp32_layers"] == {"8": ["a", "c", "d"], "64": ["c", "d"]}


class _SmallCnn(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3), strides=(2, 2), padding="VALID")(x))
        x = nn.relu(nn.Dense(16)(x.reshape(x.shape[0], -1)))
        return nn.Dense(3, name="policy")(x)


@pytest.mark.unit
def test_mac_share_counts_every_layer_from_its_shape():
    layers = quant.find_layers(_SmallCnn(), np.zeros((1, 9, 9, 4), np.float32))
    macs = {layer.path: qplan.layer_macs(layer) for layer in layers}
    # Conv: 4x4 outputs x (3*3*4) inputs x 8 channels; Dense: (4*4*8) x 16; policy: 16 x 3.
    assert macs == {("Conv_0",): 16 * 36 * 8, ("Dense_0",): 128 * 16, ("policy",): 48}
    # The output layer stays fp32 and still counts in the total.
    assert qplan.mac_share(macs, quant.quantizable_paths(layers)) == pytest.approx(6656 / 6704)
    assert qplan.mac_share(macs, [("Conv_0",)]) == pytest.approx(4608 / 6704)
    assert qplan.mac_share(macs, []) == 0.0
    # SAME padding, stride 1: every input pixel is an output pixel.
    same = quant.find_layers(nn.Conv(5, (3, 3), padding="SAME"), np.zeros((1, 6, 7, 2), np.float32))
    assert qplan.layer_macs(same[0]) == 6 * 7 * 9 * 2 * 5


@pytest.mark.unit
def test_force_int8_quantizes_every_quantizable_layer():
    net = _net("nature_cnn")
    params = net.init(0)
    layers = quant.find_layers(net.net, *net.example)
    plan = quant.make_plan(layers, params, [8, 32], force=True)
    quantizable = set(quant.quantizable_paths(layers))
    assert plan.forced and plan.seconds == {}
    assert plan.int8 == {8: frozenset(quantizable), 32: frozenset(quantizable)}
    published = quant.publish(params, "int8", plan.publish_layers())
    for path, node in _layer_dicts(published["params"]):
        assert (qz.QKERNEL in node) == (path in quantizable), path
        assert "kernel" not in node or path not in quantizable, path  # no fp32 copy kept
    assert {layer.path[-1] for layer in layers if layer.path not in quantizable} == {"policy", "value"}


@pytest.mark.unit
def test_mixed_plan_outputs_are_close_to_fp32_and_fp32_layers_exact():
    net = _net("nature_cnn")
    params = net.init(2)
    layers = quant.find_layers(net.net, *net.example)
    options = quant.quantizable_paths(layers)
    convs = sorted(p for p in options if p[-1].startswith("Conv"))
    # Injected timings: at 8 nothing pays, at BATCH the first two convolutions do.
    seconds = {8: {p: {"fp32": 1.0, "int8": 2.0} for p in options},
               BATCH: {p: {"fp32": 1.0, "int8": 0.5 if p in convs[:2] else 2.0} for p in options}}
    plan = qplan.Int8Plan(qplan.choose_int8_layers(seconds), {l.path: qplan.layer_macs(l) for l in layers},
                          options, seconds=seconds)
    published = quant.publish(params, "int8", plan.publish_layers())
    node = published["params"]
    for key in convs[0]:
        node = node[key]
    assert {"kernel", qz.QKERNEL} <= set(node)  # int8 at one size, fp32 at the other
    forward = jax.jit(lambda pub, obs, layers: net.apply(pub, "int8", obs, int8_layers=layers),
                      static_argnames="layers")
    obs = _obs("nature_cnn", BATCH)
    ref_logits, _ = net.forward["fp32"](params, obs)
    logits, _ = forward(published, obs, plan.layers_for(BATCH))
    rel = np.max(np.abs(logits - ref_logits)) / np.max(np.abs(ref_logits))
    assert 0 < rel < 0.1, rel  # int8 layers ran, and stay close (tolerance as for full int8 above)
    all_fp32, _ = forward(published, obs, plan.layers_for(8))
    np.testing.assert_allclose(all_fp32, ref_logits, rtol=1e-5, atol=1e-6)


@pytest.mark.unit
def test_the_precision_mode_measures_a_plan_and_acts_with_it():
    from seedq.quant.mode import InferencePrecision

    spec, agents = _agents()
    agent = agents["vtrace"]
    params = agent.inference_params(agent.init(jax.random.PRNGKey(0)))
    mode = InferencePrecision(agent, spec, "int8")
    plan = mode.plan_int8(params, [8, 16])
    hidden = set(quant.quantizable_paths(mode.layers))
    assert hidden and set(plan.seconds) == {8, 16}
    for batch, row in plan.seconds.items():
        assert set(row) == hidden
        assert all(t["fp32"] > 0 and t["int8"] > 0 for t in row.values())
    assert plan.int8 == qplan.choose_int8_layers(plan.seconds)  # the plan is what the timings say
    obs = RNG.standard_normal((16, 4)).astype(np.float32)
    actions, outputs, _, _ = jax.jit(mode.act)(
        mode.publish(params), jax.random.PRNGKey(1), obs, np.zeros(16, bool), {}, {})
    assert actions.shape == (16,) and outputs["logits"].shape == (16, 2)
    assert InferencePrecision(agent, spec, "fp32").plan_int8(params, [8]) is None


@pytest.mark.unit
def test_force_int8_needs_int8_precision():
    with pytest.raises(ValueError, match="quant.force_int8 applies to precision='int8'"):
        config_lib.TrainConfig(quant=config_lib.QuantConfig(force_int8=True)).validate()
    config_lib.TrainConfig(precision="int8", quant=config_lib.QuantConfig(force_int8=True)).validate()


@pytest.mark.unit
def test_progress_line_and_summary_report_the_int8_mac_share():
    from seedq.reporting import sinks

    a, b = ("a",), ("b",)
    plan = qplan.Int8Plan({8: frozenset(), 64: frozenset({a}), 256: frozenset({a, b})},
                          {a: 3, b: 1}, {a: {}, b: {}})
    # LearnerStats.int8_plan (and summary.json's) is the plan's dict.
    assert sinks.int8_share_text(plan.to_dict()) == " MACs 0-100%"
    assert plan.to_dict()["mac_share"] == {"8": 0.0, "64": 0.75, "256": 1.0}
    assert sinks.int8_share_text(None) == ""  # no int8 plan (fp32, bf16, r2d2)


@pytest.mark.unit
def test_bench_inference_policy_run_that_is_no_run_is_one_line(tmp_path, capsys):
    from seedq import cli

    (tmp_path / "no_checkpoint").mkdir()
    config_lib.save(config_lib.TrainConfig(agent="r2d2"), str(tmp_path / "no_checkpoint" / "config.json"))
    for run, words in ((tmp_path / "missing", "not a seedq run directory (no config.json)"),
                       (tmp_path / "no_checkpoint", "no checkpoint in it")):
        assert cli.main(["bench", "inference", "--net", "", "--policy-run", str(run)]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
