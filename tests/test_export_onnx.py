"""`seedq.export_onnx`: the ONNX graph of every network family computes the
JAX policy's greedy actions and next state, run by onnxruntime.

Parameters are freshly drawn (shapes from the agent's own `init`), not
trained: what is checked is that the graph applies each layer as flax does
(layouts, padding, names of the parameters), which random weights expose as
well as trained ones.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime
import pytest

pytestmark = pytest.mark.unit

# Both sides compute in float32 but sum in different orders (XLA's and
# onnxruntime's kernels): a few ulps per layer, well under 1e-4 of values of
# order 1 after a handful of layers, while a wrong layout or parameter gives
# differences of the values' own size.
RTOL, ATOL = 1e-4, 1e-5


def _agent(config, spec):
    from seedq.agents import make_agent

    return make_agent(config, spec)


def _random_params(agent, seed: int):
    """Parameters of `agent`'s shapes: kernels of unit gain (std 1/sqrt(fan in)),
    biases and norm parameters spread around their initial values, observation
    statistics of 100 samples."""
    import jax

    shapes = jax.eval_shape(lambda key: agent.inference_params(agent.init(key)), jax.random.PRNGKey(0))
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        if "obs_stats" in name or "return_stats" in name:
            if "count" in name:
                return np.float32(100.0)
            if "m2" in name:
                return (100 * rng.uniform(0.5, 4.0, leaf.shape)).astype(np.float32)
            return rng.normal(0, 1, leaf.shape).astype(np.float32)
        if "kernel" in name:
            fan_in = int(np.prod(leaf.shape[:-1]))
            return rng.normal(0, 1 / np.sqrt(fan_in), leaf.shape).astype(np.float32)
        base = 1.0 if "scale" in name else 0.0
        return (base + rng.normal(0, 0.1, leaf.shape)).astype(np.float32)

    return jax.tree_util.tree_map_with_path(draw, shapes)


def _random_inputs(spec, names, example, n: int, seed: int):
    rng = np.random.default_rng(seed)
    if np.dtype(spec.obs_dtype) == np.uint8:
        obs = rng.integers(0, 256, (n, *spec.obs_shape), dtype=np.uint8)
    elif np.dtype(spec.obs_dtype) == np.bool_:
        obs = rng.random((n, *spec.obs_shape)) < 0.3
    else:
        obs = (rng.normal(0, 2, (n, *spec.obs_shape))).astype(spec.obs_dtype)
    first = rng.random(n) < 0.3
    state = {}
    for k in names:
        shape, dtype = (n, *example[k].shape[1:]), example[k].dtype
        state[k] = (rng.integers(0, 256, shape).astype(dtype) if dtype == np.uint8
                    else rng.normal(0, 0.5, shape).astype(dtype))
    return obs, first, state


def _session(model, extra_outputs=()):
    """An onnxruntime session of `model` that also returns the named inner tensors."""
    from onnx import helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    for name in extra_outputs:
        model.graph.output.append(helper.make_empty_tensor_value_info(name))
    return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _check_against_jax(config, spec, *, n: int = 16, seed: int = 0):
    """Runs the agent's greedy act (JAX) and its ONNX graph (onnxruntime) on the
    same random inputs; returns (JAX actions, ONNX actions)."""
    import jax

    from seedq import export
    from seedq.export_onnx import policy_model

    agent = _agent(config, spec)
    params = _random_params(agent, seed)
    example = agent.initial_core_state(1)
    names = sorted(example)
    model = policy_model(agent, params, names, example)
    onnx.checker.check_model(model, full_check=True)

    obs, first, state = _random_inputs(spec, names, example, n, seed + 1)
    inputs = agent.actor_inputs(np.arange(n))
    actions, outputs, new_state, _ = jax.jit(agent.act)(params, jax.random.PRNGKey(0), obs, first, state, inputs)
    greedy = np.asarray(agent.greedy_actions(outputs)).astype(np.asarray(actions).dtype)

    scores = [k for k in ("logits", "q_values", "mean") if k in {o for node in model.graph.node for o in node.output}]
    session = _session(model, scores)
    feed = {"obs": obs, **({"first": first, **state} if names else {})}
    results = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    assert [o.name for o in session.get_outputs()][:1 + len(names)] == export.output_names(names)

    for k in names:
        got, want = results[f"next_{k}"], np.asarray(new_state[k])
        assert got.dtype == want.dtype and got.shape == want.shape, k
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=k)
    got = results["actions"]
    assert got.dtype == greedy.dtype and got.shape == greedy.shape
    if "logits" in outputs:
        np.testing.assert_allclose(results["logits"], np.asarray(outputs["logits"]), rtol=RTOL, atol=ATOL)
    if spec.discrete:
        # Where the two best scores are closer than the tolerance either action is right.
        top2 = np.sort(results[scores[0]], axis=-1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 10 * (ATOL + RTOL * np.abs(top2[:, 1]))
        assert clear.sum() >= n // 2
        np.testing.assert_array_equal(got[clear], greedy[clear])
    else:
        np.testing.assert_allclose(got, greedy, rtol=RTOL, atol=ATOL)
    return greedy, got


def _pong_spec():
    from seedq.envs import env_spec

    return env_spec("ALE/Pong-v5")


def _defaults(spec, **overrides):
    """The run config `seedq train` gives an env of `spec` (its family's defaults), with `overrides`."""
    from seedq.config.resolve import defaults_for_env

    config = defaults_for_env(spec, None)
    for section, fields in overrides.items():
        config = dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **fields)})
    return config


def test_a_pong_policy_with_its_default_network_and_frame_stack():
    spec = _pong_spec()
    config = _defaults(spec)
    assert config.agent == "vtrace" and config.vtrace.cnn_channel_norm  # Pong's default: Nature CNN, channel norm
    greedy, _ = _check_against_jax(config, spec, n=8)
    assert len(np.unique(greedy)) > 1


def test_a_cartpole_mlp_policy():
    from seedq.schema import EnvSpec

    spec = EnvSpec("float32", (4,), 2)
    greedy, _ = _check_against_jax(_defaults(spec), spec, n=64)
    assert len(np.unique(greedy)) == 2


def test_an_impala_resnet_with_an_lstm_core():
    spec = _pong_spec()
    config = _defaults(spec, vtrace={"network": "impala_cnn", "use_lstm": True, "lstm_size": 32})
    _check_against_jax(config, spec, n=4)


def test_a_small_cnn_on_boolean_frames():
    from seedq.schema import EnvSpec

    spec = EnvSpec("bool", (10, 10, 4), 5)  # MinAtar's frames
    _check_against_jax(_defaults(spec), spec, n=32)


@pytest.mark.parametrize("layer_norm", ["first_layer", "all_layers"])
def test_a_continuous_policy_with_normalised_observations_and_bounded_actions(layer_norm):
    from seedq.schema import EnvSpec

    spec = EnvSpec("float64", (3, 2), action_shape=(2,), action_low=(-2.0, -np.inf), action_high=(2.0, np.inf))
    config = _defaults(spec, vtrace={"normalize_observations": True, "layer_norm": layer_norm})
    greedy, _ = _check_against_jax(config, spec, n=32)
    assert np.all(np.abs(greedy[:, 0]) <= 2.0) and np.any(np.abs(greedy[:, 1]) > 0.1)


@pytest.mark.parametrize("use_lstm", [True, False])
def test_r2d2_on_cartpole(use_lstm):
    from seedq.schema import EnvSpec

    spec = EnvSpec("float32", (4,), 2)
    config = dataclasses.replace(_defaults(spec), agent="r2d2")
    config = dataclasses.replace(config, r2d2=dataclasses.replace(config.r2d2, use_lstm=use_lstm))
    greedy, _ = _check_against_jax(config, spec, n=64)
    assert len(np.unique(greedy)) == 2


def test_r2d2_on_pong_frames():
    spec = _pong_spec()
    config = dataclasses.replace(_defaults(spec), agent="r2d2")
    _check_against_jax(config, spec, n=8)


def test_a_network_the_writer_does_not_cover_is_one_line():
    from seedq.export_onnx import UnsupportedNetwork, policy_model
    from seedq.schema import EnvSpec

    spec = EnvSpec("float32", (4,), 2)
    agent = _agent(_defaults(spec), spec)
    agent.network = object()
    with pytest.raises(UnsupportedNetwork, match="does not cover object") as refused:
        policy_model(agent, {}, [], {})
    assert "\n" not in str(refused.value)


def test_a_pong_export_carries_its_frame_stack_through_real_frames_step_by_step(tmp_path):
    """The written .onnx file, fed Pong's own frames one at a time: the frame
    stack goes in and out as state (one symbolic batch size for every input,
    output names apart from the inputs'); at every step onnxruntime's action
    is the JAX policy's and its state the stack of the last three frames.
    `seedq.load_policy` reads it back as an export too."""
    from seedq import export
    from seedq.envs import make_env
    from seedq.export_onnx import policy_model
    from seedq.policy import CheckpointBackend, Policy, PolicyInfo
    from seedq.quant.mode import InferencePrecision

    spec = _pong_spec()
    config = _defaults(spec)
    agent = _agent(config, spec)
    params = _random_params(agent, seed=3)
    example = agent.initial_core_state(1)
    names = sorted(example)
    assert names == ["frames"]
    path = str(tmp_path / "policy.onnx")
    onnx.save(policy_model(agent, params, names, example), path)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["obs", "first", "frames"]
    assert [o.name for o in session.get_outputs()] == export.output_names(names) == ["actions", "next_frames"]
    info = PolicyInfo("ALE/Pong-v5", config.env_options, spec, "test", "fp32")
    own = Policy(CheckpointBackend(InferencePrecision(agent, spec, "fp32"), params), info)
    meta = {"state": export.state_meta(names, example)}
    exported = Policy(export._ExportedBackend(meta, export._onnx_runner(path, ["obs", "first", *names])), info)

    env = make_env("ALE/Pong-v5", config.env_options)
    obs, _ = env.reset(seed=1)
    frames = np.zeros((1, *example["frames"].shape[1:]), np.uint8)
    rng, seen, chosen = np.random.default_rng(0), [obs], []
    for t in range(60):
        action, frames = session.run(None, {"obs": obs[None], "first": np.array([t == 0]), "frames": frames})
        assert action[0] == own.predict(obs) == exported.predict(obs)
        # The state: the last three frames, oldest first (the first one repeated at the episode's start).
        np.testing.assert_array_equal(frames[0], np.stack(([seen[0]] * 3 + seen)[-3:], axis=-1))
        chosen.append(int(action[0]))
        obs, _, terminated, truncated, _ = env.step(action[0] if rng.random() < 0.7 else env.action_space.sample())
        seen.append(obs)
        assert not (terminated or truncated)
    env.close()
    assert len(set(chosen)) > 1, chosen  # the actions compared are real choices
