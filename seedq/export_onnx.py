"""The ONNX graph of a seedq policy, written node by node (`seedq export --format onnx`).

Why by hand: no JAX-to-ONNX converter installs beside seedq's pins (jax2onnx
pins orbax-checkpoint < 0.11.37, older than the checkpoint library every run
uses), so the graph of each of seedq's own network families is written here
with `onnx.helper` from the trained parameters: the MLP, small CNN, Nature CNN
(with its per-channel norm) and IMPALA ResNet torsos, the LSTM core with its
reset at episode starts, V-trace's policy head (argmax of the logits, or the
Gaussian's squashed mean) and R2D2's dueling Q head (argmax), vector
observation normalisation, uint8 pixel scaling and the learner's frame stack.
Each function mirrors one flax module of `seedq.agents` and names it; the
export tests run every family through onnxruntime against the JAX policy.

The program's interface is `seedq.export`'s: inputs `obs` [B, *obs_shape]
(the env's dtype) and, for a policy with state, `first` [B] bool and the state
arrays in `policy.json`'s order; outputs `actions` and `next_<state name>`.
Everything is computed in float32 (the export's fp32 precision). The tensor
that the action is taken from is named `logits`, `mean` or `q_values`.

Layouts: flax is channels-last (NHWC, kernels HWIO) and ONNX's Conv channels-first
(NCHW, OIHW): a CNN torso transposes its input once, and back before flattening,
so the dense layer after it sees flax's order.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from seedq.agents import normalization
from seedq.agents.frames import CORE_KEY as FRAMES_KEY
from seedq.agents.r2d2.networks import RecurrentQNetwork
from seedq.agents.vtrace.networks import PolicyValueNetwork

# Opset 17: LayerNormalization's first; ir_version 8 is the oldest file format
# that carries it, so older onnxruntime releases load the file too.
OPSET = 17
IR_VERSION = 8
# flax.linen's LayerNorm and GroupNorm default epsilon (the networks use the defaults).
_NORM_EPSILON = 1e-6
# The LSTM state names each network family's agent gives its carry (c, h).
_LSTM_STATE = {PolicyValueNetwork: ("lstm_c", "lstm_h"), RecurrentQNetwork: ("c", "h")}


class UnsupportedNetwork(ValueError):
    """A policy whose network the graph writer does not cover (one line naming it)."""


class _Graph:
    """Nodes and constants of one ONNX graph; every value is a tensor name."""

    def __init__(self):
        self.nodes: list = []
        self.initializers: list = []
        self._count = 0

    def _fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, value, hint: str = "const") -> str:
        from onnx import numpy_helper

        name = self._fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, *inputs: str, out: str | None = None, outputs: int = 1, **attrs):
        """The node's output name (a list of them when `outputs` > 1)."""
        from onnx import helper

        names = [out] if out else [self._fresh(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names if outputs > 1 else names[0]


def _f32(array) -> np.ndarray:
    return np.asarray(array, np.float32)


# --- layers (flax.linen) ---


def dense(g: _Graph, x: str, p: dict) -> str:
    """nn.Dense: x [N, F] @ kernel [F, O] + bias [O]."""
    return g.op("Add", g.op("MatMul", x, g.const(_f32(p["kernel"]), "kernel")), g.const(_f32(p["bias"]), "bias"))


def _pads(size: Sequence[int], kernel: int, stride: int, padding: str) -> tuple[list[int], list[int]]:
    """(ONNX pads [h_lo, w_lo, h_hi, w_hi], output size [h, w]) of XLA's VALID or SAME
    padding: SAME puts the odd pixel at the end (ONNX's SAME_UPPER)."""
    if padding == "VALID":
        return [0, 0, 0, 0], [(s - kernel) // stride + 1 for s in size]
    out = [-(-s // stride) for s in size]
    total = [max((o - 1) * stride + kernel - s, 0) for o, s in zip(out, size)]
    return [t // 2 for t in total] + [t - t // 2 for t in total], out


def conv(g: _Graph, x: str, hw: Sequence[int], p: dict, stride: int, padding: str) -> tuple[str, list[int]]:
    """nn.Conv on NCHW x [N, C, H, W] (kernel HWIO -> OIHW): (y [N, O, Ho, Wo], [Ho, Wo])."""
    kernel = _f32(p["kernel"])
    pads, out = _pads(hw, kernel.shape[0], stride, padding)
    y = g.op("Conv", x, g.const(kernel.transpose(3, 2, 0, 1), "kernel"), g.const(_f32(p["bias"]), "bias"),
             kernel_shape=list(kernel.shape[:2]), strides=[stride, stride], pads=pads)
    return y, out


def max_pool(g: _Graph, x: str, hw: Sequence[int], window: int, stride: int) -> tuple[str, list[int]]:
    """nn.max_pool with SAME padding (padded positions never win) on NCHW x."""
    pads, out = _pads(hw, window, stride, "SAME")
    return g.op("MaxPool", x, kernel_shape=[window, window], strides=[stride, stride], pads=pads), out


def channel_norm(g: _Graph, x: str, p: dict) -> str:
    """nn.GroupNorm with one channel per group (NatureCNN.channel_norm) = InstanceNormalization."""
    return g.op("InstanceNormalization", x, g.const(_f32(p["scale"]), "scale"), g.const(_f32(p["bias"]), "bias"),
                epsilon=_NORM_EPSILON)


def layer_norm(g: _Graph, x: str, p: dict) -> str:
    """nn.LayerNorm over the last axis."""
    return g.op("LayerNormalization", x, g.const(_f32(p["scale"]), "scale"), g.const(_f32(p["bias"]), "bias"),
                axis=-1, epsilon=_NORM_EPSILON)


# --- inputs (seedq.agents.inputs, normalization, frames) ---


def to_float(g: _Graph, x: str, dtype: np.dtype) -> str:
    """networks._to_float: uint8 pixels * float32(1/255) (scale_pixels); other dtypes cast."""
    y = g.op("Cast", x, to=_onnx_type(np.float32))
    if np.dtype(dtype) == np.uint8:
        y = g.op("Mul", y, g.const(np.float32(1.0 / 255.0), "pixel_scale"))
    return y


def normalized(g: _Graph, obs: str, stats: dict) -> str:
    """The agent's observation normalisation (normalization.normalize), shape kept."""
    import jax

    mean, std = jax.device_get(normalization.location_and_scale(normalization.RunningStats(**stats)))
    flat = g.op("Flatten", g.op("Cast", obs, to=_onnx_type(np.float32)), axis=1)
    y = g.op("Div", g.op("Sub", flat, g.const(_f32(mean), "obs_mean")), g.const(_f32(std), "obs_std"))
    y = g.op("Clip", y, g.const(np.float32(-normalization.CLIP)), g.const(np.float32(normalization.CLIP)))
    return g.op("Reshape", y, g.op("Shape", obs))


def push_frame(g: _Graph, previous: str, frame: str, first: str) -> tuple[str, str]:
    """frames.push_frame: (previous [N, H, W, K-1], frame [N, H, W], first [N]) ->
    (stack [N, H, W, K], next previous = stack[..., 1:])."""
    frame = g.op("Unsqueeze", frame, g.const(np.array([-1], np.int64)))
    padded = g.op("Expand", frame, g.op("Shape", previous))  # reset padding: the first frame everywhere
    starts = g.op("Unsqueeze", first, g.const(np.array([1, 2, 3], np.int64)))
    stack = g.op("Concat", g.op("Where", starts, padded, previous), frame, axis=-1)
    rest = g.op("Slice", stack, g.const(np.array([1], np.int64)), g.const(np.array([np.iinfo(np.int64).max])),
                g.const(np.array([-1], np.int64)))
    return stack, rest


# --- torsos (seedq.agents.networks) ---


def mlp_torso(g: _Graph, obs: str, dtype, p: dict, activation: str, norm: str, layers: int) -> str:
    """MLPTorso: flattened obs -> Dense (+ LayerNorm) + activation, `layers` times."""
    x = to_float(g, g.op("Flatten", obs, axis=1), dtype)
    for i in range(layers):
        x = dense(g, x, p[f"Dense_{i}"])
        if norm == "all_layers" or (norm == "first_layer" and i == 0):
            x = layer_norm(g, x, p[f"LayerNorm_{0 if norm == 'first_layer' else i}"])
        x = g.op(activation, x)
    return x


def _nchw(g: _Graph, obs: str, dtype, shape: Sequence[int]) -> tuple[str, list[int]]:
    return g.op("Transpose", to_float(g, obs, dtype), perm=[0, 3, 1, 2]), list(shape[:2])


def _flattened_nhwc(g: _Graph, x: str) -> str:
    return g.op("Flatten", g.op("Transpose", x, perm=[0, 2, 3, 1]), axis=1)


def small_cnn(g: _Graph, obs: str, dtype, shape, p: dict) -> str:
    """SmallCNN: conv 3x3/1 VALID + ReLU, dense + ReLU."""
    x, hw = _nchw(g, obs, dtype, shape)
    x, hw = conv(g, x, hw, p["Conv_0"], 1, "VALID")
    return g.op("Relu", dense(g, _flattened_nhwc(g, g.op("Relu", x)), p["Dense_0"]))


def nature_cnn(g: _Graph, obs: str, dtype, shape, p: dict, with_channel_norm: bool) -> str:
    """NatureCNN: conv 8x8/4, 4x4/2, 3x3/1 (each optionally channel-normed) + ReLU, dense 512 + ReLU."""
    x, hw = _nchw(g, obs, dtype, shape)
    for i, stride in enumerate((4, 2, 1)):
        x, hw = conv(g, x, hw, p[f"Conv_{i}"], stride, "VALID")
        if with_channel_norm:
            x = channel_norm(g, x, p[f"GroupNorm_{i}"])
        x = g.op("Relu", x)
    return g.op("Relu", dense(g, _flattened_nhwc(g, x), p["Dense_0"]))


def impala_cnn(g: _Graph, obs: str, dtype, shape, p: dict, stages: int, blocks_per_stage: int) -> str:
    """ImpalaCNN: per stage conv 3x3 SAME, max-pool 3x3/2, residual blocks; ReLU, dense + ReLU."""
    x, hw = _nchw(g, obs, dtype, shape)
    block = 0
    for stage in range(stages):
        x, hw = conv(g, x, hw, p[f"Conv_{stage}"], 1, "SAME")
        x, hw = max_pool(g, x, hw, 3, 2)
        for _ in range(blocks_per_stage):
            q = p[f"ResidualBlock_{block}"]
            y, _ = conv(g, g.op("Relu", x), hw, q["Conv_0"], 1, "SAME")
            y, _ = conv(g, g.op("Relu", y), hw, q["Conv_1"], 1, "SAME")
            x, block = g.op("Add", x, y), block + 1
    return g.op("Relu", dense(g, _flattened_nhwc(g, g.op("Relu", x)), p["Dense_0"]))


def torso(g: _Graph, name: str, obs: str, dtype, shape, p: dict, *, mlp_layers: int, mlp_activation: str,
          mlp_layer_norm: str = "none", cnn_channel_norm: bool = False) -> str:
    """networks.make_torso's torso `name` on obs [N, *shape]; `p` its parameters."""
    if name == "mlp":
        return mlp_torso(g, obs, dtype, p["MLPTorso_0"], mlp_activation, mlp_layer_norm, mlp_layers)
    if name == "small_cnn":
        return small_cnn(g, obs, dtype, shape, p["SmallCNN_0"])
    if name == "nature_cnn":
        return nature_cnn(g, obs, dtype, shape, p["NatureCNN_0"], cnn_channel_norm)
    if name == "impala_cnn":
        q = p["ImpalaCNN_0"]
        stages = sum(1 for k in q if k.startswith("Conv_"))
        blocks = sum(1 for k in q if k.startswith("ResidualBlock_"))
        return impala_cnn(g, obs, dtype, shape, q, stages, blocks // stages)
    raise UnsupportedNetwork(f"--format onnx: the ONNX graph writer does not cover the {name!r} torso "
                             "(--format stablehlo exports every policy)")


def lstm_step(g: _Graph, x: str, c: str, h: str, first: str, p: dict, size: int) -> tuple[str, str]:
    """networks._ResettingLSTMStep for one step: zero (c, h) where `first`, then
    LSTMCell's gates from one dense layer on [x, h]. Returns (c', h')."""
    keep = g.op("Unsqueeze", g.op("Sub", g.const(np.float32(1.0)), g.op("Cast", first, to=_onnx_type(np.float32))),
                g.const(np.array([1], np.int64)))
    c, h = g.op("Mul", c, keep), g.op("Mul", h, keep)
    gates = dense(g, g.op("Concat", x, h, axis=-1), p["gates"])
    i, f, cell, o = g.op("Split", gates, g.const(np.full(4, size, np.int64)), axis=-1, outputs=4)
    c = g.op("Add", g.op("Mul", g.op("Sigmoid", f), c), g.op("Mul", g.op("Sigmoid", i), g.op("Tanh", cell)))
    return c, g.op("Mul", g.op("Sigmoid", o), g.op("Tanh", c))


def dueling_head(g: _Graph, x: str, p: dict) -> str:
    """DuelingHead: V + A - mean(A) -> Q [N, A] (flax names the value branch's
    output layer Dense_0, its hidden Dense_1; the advantage's Dense_2, Dense_3)."""
    value = dense(g, g.op("Relu", dense(g, x, p["Dense_1"])), p["Dense_0"])
    advantage = dense(g, g.op("Relu", dense(g, x, p["Dense_3"])), p["Dense_2"])
    mean = g.op("ReduceMean", advantage, axes=[-1], keepdims=1)
    return g.op("Sub", g.op("Add", value, advantage), mean, out="q_values")


def _argmax(g: _Graph, scores: str) -> str:
    """jnp.argmax (the first of equal maxima) as int32."""
    return g.op("Cast", g.op("ArgMax", scores, axis=-1, keepdims=0), to=_onnx_type(np.int32), out="actions")


# --- the policy ---


def _onnx_type(dtype) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _policy_family(agent) -> type:
    """The network class of `agent`'s policy, where the writer covers it."""
    try:
        network = type(agent.network)
    except AttributeError:
        network = type(agent)
    if network not in _LSTM_STATE:
        raise UnsupportedNetwork(f"--format onnx: the ONNX graph writer does not cover {network.__name__} "
                                 "(--format stablehlo exports every policy)")
    return network


def _network_input(g: _Graph, agent, params: dict, obs: str, first: str, state: dict[str, str]):
    """The agent's act before its network: observation normalisation, the frame
    stack. (network input, its dtype, {"frames": next stack} or {})."""
    dtype, next_state = np.dtype(agent.spec.obs_dtype), {}
    if params.get("obs_stats") is not None:
        obs, dtype = normalized(g, obs, params["obs_stats"]), np.dtype(np.float32)
    if agent.frames is not None:
        if agent.frames.size == 1:
            obs = g.op("Unsqueeze", obs, g.const(np.array([-1], np.int64)))
        else:
            obs, next_state[FRAMES_KEY] = push_frame(g, state[FRAMES_KEY], obs, first)
    return obs, dtype, next_state


def squashed_mean(g: _Graph, mean: str, action_low: Sequence[float], action_high: Sequence[float]) -> str:
    """PolicyValueNetwork's Gaussian mean: tanh-squashed into [low, high] where both are finite."""
    low, high = np.asarray(action_low), np.asarray(action_high)
    bounded = np.isfinite(low) & np.isfinite(high)
    low, high = np.where(bounded, low, 0.0), np.where(bounded, high, 0.0)  # no inf - inf
    center = _f32(np.where(bounded, (low + high) / 2, 0.0))
    half = _f32(np.where(bounded, (high - low) / 2, 1.0))
    squashed = g.op("Add", g.const(center, "center"), g.op("Mul", g.const(half, "half"), g.op("Tanh", mean)))
    return g.op("Where", g.const(bounded, "bounded"), squashed, mean)


def _greedy_actions(g: _Graph, network, x: str, p: dict) -> str:
    """The greedy action from the core's features: argmax Q (RecurrentQNetwork),
    argmax logits or the Gaussian's mean (PolicyValueNetwork)."""
    if isinstance(network, RecurrentQNetwork):
        return _argmax(g, dueling_head(g, x, p["DuelingHead_0"]))
    if not network.continuous:
        return _argmax(g, g.op("Identity", dense(g, x, p["policy"]), out="logits"))
    mean = dense(g, x, p["policy"])
    if network.action_low:
        mean = squashed_mean(g, mean, network.action_low, network.action_high)
    return g.op("Identity", g.op("Identity", mean, out="mean"), out="actions")


def _body(g: _Graph, agent, params: dict, obs: str, first: str, state: dict[str, str]) -> tuple[str, dict]:
    """(the greedy actions' tensor, {state name: next state tensor}) of `agent`'s greedy act."""
    network, family, p = agent.network, _policy_family(agent), params["params"]
    obs, dtype, next_state = _network_input(g, agent, params, obs, first, state)
    # V-trace's MLPs are tanh, R2D2's ReLU; only V-trace's configure norms.
    vtrace = family is PolicyValueNetwork
    x = torso(g, agent.network_name, obs, dtype, tuple(agent.obs_shape), p, mlp_layers=len(network.hidden_sizes),
              mlp_activation="Tanh" if vtrace else "Relu", mlp_layer_norm=network.layer_norm if vtrace else "none",
              cnn_channel_norm=vtrace and network.cnn_channel_norm)
    if network.use_lstm:
        c_name, h_name = _LSTM_STATE[family]
        next_state[c_name], x = lstm_step(g, x, state[c_name], state[h_name], first, p["lstm"]["cell"],
                                          network.lstm_size)
        next_state[h_name] = x
    elif not vtrace:  # R2D2's feed-forward control: a dense layer in the LSTM's place
        x = g.op("Relu", dense(g, x, p["feedforward"]))
    return _greedy_actions(g, network, x, p), next_state


def policy_model(agent, params, state_names: Sequence[str], example_state: dict):
    """The onnx.ModelProto of `agent`'s greedy policy with fp32 `params` (its
    inference parameters); `state_names` the state arrays in argument order,
    `example_state` {name: [1, ...]} their shapes and dtypes.
    UnsupportedNetwork (one line) for a network the writer does not cover."""
    import jax
    from onnx import helper

    params = jax.device_get(params)
    spec = agent.spec
    g = _Graph()
    batch = "B"

    def value_info(name, dtype, shape):
        return helper.make_tensor_value_info(name, _onnx_type(dtype), [batch, *shape])

    inputs = [value_info("obs", spec.obs_dtype, spec.obs_shape)]
    state = {}
    if state_names:
        inputs.append(value_info("first", np.bool_, ()))
        for name in state_names:
            inputs.append(value_info(name, example_state[name].dtype, example_state[name].shape[1:]))
            state[name] = name
    actions, next_state = _body(g, agent, params, "obs", "first", state)
    if sorted(next_state) != sorted(state_names):
        raise UnsupportedNetwork(f"--format onnx: the ONNX graph writer does not cover a policy with state "
                                 f"{sorted(state_names)} (--format stablehlo exports every policy)")
    action_dtype = np.int32 if spec.discrete else np.float32
    outputs = [value_info(actions, action_dtype, () if spec.discrete else spec.action_shape)]
    for name in state_names:
        out = g.op("Identity", next_state[name], out=f"next_{name}")
        outputs.append(value_info(out, example_state[name].dtype, example_state[name].shape[1:]))
    graph = helper.make_graph(g.nodes, "seedq_policy", inputs, outputs, g.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="seedq",
                             ir_version=IR_VERSION)
