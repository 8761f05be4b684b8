"""The V-trace agent's acting and learning agree: what the server records
(behaviour distribution, frames, recurrent state) is what the learner rebuilds.

If the learner's unroll of the network (frame stacks rebuilt from single
frames, the LSTM re-run from the stored initial state, the Gaussian's
log-density) differs in any way from what acting computed, then with
unchanged parameters the importance ratios pi/mu are not 1.
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from seedq.agents.vtrace import losses
from seedq.agents.vtrace.agent import VTraceAgent
from seedq.config import TrainConfig, VTraceConfig
from seedq.schema import EnvSpec
from seedq import schema
from seedq.quant.mode import InferencePrecision
from tests.serving import serve

CARTPOLE = EnvSpec("float32", (4,), num_actions=2)
SWINGUP = EnvSpec("float32", (5,), action_shape=(2,), action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
FRAMES = EnvSpec("uint8", (36, 36), num_actions=3)
MINATAR = EnvSpec("bool", (10, 10, 4), num_actions=3)  # MinAtar/Breakout-v1


def _record(agent, params, steps: int, n: int, seed: int = 0):
    """Acts `steps` times for `n` envs like the server does; returns one batch of
    n unrolls [n, steps, ...] with the initial core state (core/<name>)."""
    rng = np.random.default_rng(seed)
    spec = agent.spec
    core = agent.initial_core_state(n)
    initial = {"core/" + k: np.asarray(v) for k, v in core.items()}
    fields = schema.step_fields(spec, agent.act_outputs())
    record = {k: [] for k in fields}
    act = jax.jit(agent.act)
    key = jax.random.PRNGKey(seed)
    for t in range(steps):
        if spec.obs_dtype == "uint8":
            obs = rng.integers(0, 256, (n, *spec.obs_shape), dtype=np.uint8)
        elif spec.obs_dtype == "bool":
            obs = rng.random((n, *spec.obs_shape)) < 0.1
        else:
            obs = rng.normal(size=(n, *spec.obs_shape)).astype(np.float32)
        # Episode starts inside the unroll (and at its first step).
        first = np.ones(n, bool) if t == 0 else rng.random(n) < 0.2
        actions, outputs, core, key = act(params, key, obs, first, core, {})
        step = {
            "obs": obs, "reward": rng.normal(size=n).astype(np.float32),
            "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool), "first": first,
            "action": np.asarray(actions), "policy_version": np.zeros(n, np.int32),
            **{k: np.asarray(v) for k, v in outputs.items()},
        }
        for k in record:
            record[k].append(step[k])
    batch = {k: np.stack(v, axis=1) for k, v in record.items()}
    return {**batch, **initial}


def _perturbed(params, scale: float, seed: int):
    """`params` with Gaussian noise of std `scale` added to every leaf (another policy)."""
    leaves, tree = jax.tree.flatten(params)
    noise = np.random.default_rng(seed)
    return jax.tree.unflatten(tree, [x + scale * noise.normal(size=x.shape) for x in leaves])


def _first_steps(batch, n: int):
    """The batch's unrolls cut to their first n steps (the initial core state kept)."""
    return {k: v if k.startswith("core/") else v[:, :n] for k, v in batch.items()}


@pytest.mark.unit
@pytest.mark.parametrize("spec, config", [
    (CARTPOLE, VTraceConfig()),
    (CARTPOLE, VTraceConfig(use_lstm=True, lstm_size=16)),
    (SWINGUP, VTraceConfig()),
    (SWINGUP, VTraceConfig(use_lstm=True, lstm_size=16)),
    (SWINGUP, VTraceConfig(shared_torso=False)),
    (SWINGUP, VTraceConfig(shared_torso=False, value_hidden_sizes=(48, 32))),
    (SWINGUP, VTraceConfig(normalize_observations=True)),
    (SWINGUP, VTraceConfig(layer_norm="first_layer", shared_torso=False)),
    (SWINGUP, VTraceConfig(layer_norm="all_layers", shared_torso=False)),
    (FRAMES, VTraceConfig(network="mlp", hidden_sizes=(32,))),
    (FRAMES, VTraceConfig(network="mlp", hidden_sizes=(32,), use_lstm=True, lstm_size=16)),
    (MINATAR, VTraceConfig()),
], ids=["mlp", "mlp-lstm", "gaussian", "gaussian-lstm", "gaussian-two-torsos", "gaussian-wide-value",
        "gaussian-normalized", "gaussian-layer-norm-first", "gaussian-layer-norm-all", "frames", "frames-lstm",
        "small-image"])
def test_learner_recomputes_exactly_the_behaviour_policy(spec, config):
    agent = VTraceAgent(spec, config, frame_stack=3)
    state = agent.init(jax.random.PRNGKey(1))
    if "obs_stats" in state.params:  # statistics that really change the inputs
        dim = spec.obs_shape[0]
        stats = {"count": np.float32(50.0), "mean": np.linspace(-1, 1, dim, dtype=np.float32),
                 "m2": np.linspace(10, 500, dim, dtype=np.float32)}
        state = state._replace(params={**state.params, "obs_stats": stats})
    batch = _record(agent, state.params, steps=config.unroll_length + 1, n=5)
    _, metrics = jax.jit(agent.loss)(state.params, batch)
    np.testing.assert_allclose(float(metrics["rho/mean"]), 1.0, atol=1e-4)
    # And it is a real check: other parameters give other ratios.
    other = _perturbed(state.params, 0.5, seed=0)
    _, metrics = jax.jit(agent.loss)(other, batch)
    # (Not rho/mean: E_mu[pi/mu] is 1 for any pi, so its mean only strays from 1
    # by sampling noise.) The share of ratios outside 1 +- ppo_clip does not.
    assert float(metrics["policy/clip_fraction"]) > 0.1


@pytest.mark.unit
def test_frames_and_lstm_state_are_core_state():
    agent = VTraceAgent(FRAMES, VTraceConfig(use_lstm=True, lstm_size=8), frame_stack=4)
    core = agent.initial_core_state(2)
    assert core["frames"].shape == (2, 36, 36, 3) and core["frames"].dtype == np.uint8
    assert core["lstm_c"].shape == core["lstm_h"].shape == (2, 8)
    assert agent.network_name == "nature_cnn"
    assert VTraceAgent(FRAMES, VTraceConfig(), frame_stack=1).initial_core_state(2) == {}
    assert VTraceAgent(CARTPOLE, VTraceConfig()).network_name == "mlp"


@pytest.mark.unit
@pytest.mark.parametrize("obs_shape, expected", [
    ((4,), "mlp"), ((3, 5), "mlp"), ((10, 10, 4), "small_cnn"), ((35, 84, 4), "small_cnn"),
    ((36, 36, 4), "nature_cnn"), ((84, 84, 4), "nature_cnn"),
])
def test_the_automatic_network_follows_the_observation(obs_shape, expected):
    from seedq.agents.networks import choose_network

    assert choose_network("auto", obs_shape) == expected


@pytest.mark.unit
@pytest.mark.parametrize("name, obs_shape, words", [
    ("auto", (1, 1, 3), "observation shape [1, 1, 3] (an image of 1x1 pixels) is too small for network 'small_cnn'"),
    ("nature_cnn", (10, 10, 4), "too small for network 'nature_cnn', which needs at least 36x36"),
    ("small_cnn", (4,), "network 'small_cnn' needs image observations [H, W, C]; this env observes shape [4]"),
])
def test_observations_a_network_cannot_take_are_refused_naming_them(name, obs_shape, words):
    with pytest.raises(ValueError) as e:
        VTraceAgent(EnvSpec("float32", obs_shape, num_actions=2), VTraceConfig(network=name))
    assert words in str(e.value)


@pytest.mark.unit
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_small_image_network_is_chosen_for_minatar_frames_and_runs(precision):
    """(The Nature CNN crashed on 10x10 inputs with a ZeroDivisionError inside flax.)"""
    agent = VTraceAgent(MINATAR, VTraceConfig())
    mode = InferencePrecision(agent, MINATAR, precision)
    assert agent.network_name == "small_cnn"
    state = agent.init(jax.random.PRNGKey(0))
    conv = state.params["params"]["SmallCNN_0"]["Conv_0"]["kernel"]
    assert conv.shape == (3, 3, 4, 16)  # MinAtar's reference: one 3x3 conv, 16 channels
    assert state.params["params"]["SmallCNN_0"]["Dense_0"]["kernel"].shape == (8 * 8 * 16, 128)
    obs = np.random.default_rng(0).random((6, 10, 10, 4)) < 0.1
    actions, dist, _, _ = jax.jit(mode.act)(
        mode.publish(agent.inference_params(state)), jax.random.PRNGKey(1), obs, np.ones(6, bool), {}, {}
    )
    assert actions.shape == (6,) and np.all((0 <= actions) & (actions < 3))
    assert np.all(np.isfinite(dist["logits"]))


@pytest.mark.unit
def test_layer_norm_reaches_the_mlp_torso_only_so_image_envs_keep_their_network():
    """The LayerNorm default (all_layers) changes the MLP envs' network;
    MinAtar's and Atari's CNN agents get exactly the same parameters."""
    def params(spec, mode):
        return VTraceAgent(spec, VTraceConfig(layer_norm=mode)).init(jax.random.PRNGKey(0)).params

    shapes = lambda tree: jax.tree_util.tree_map(jnp.shape, tree)
    with_norm, without = params(MINATAR, "all_layers"), params(MINATAR, "none")
    assert shapes(with_norm) == shapes(without)
    assert all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(np.array_equal, with_norm, without)))
    assert shapes(params(CARTPOLE, "all_layers")) != shapes(params(CARTPOLE, "none"))


class _WholeUnrollAgent(VTraceAgent):
    """The reference for the split below: the network applied to all T+1 steps
    at once and differentiated through all of them."""

    def _unroll_network(self, params, batch):
        params, stats = self._split(params)
        obs = self.frames.unroll(batch) if self.frames else self._normalized(stats, batch["obs"])
        carry = (batch["core/lstm_c"], batch["core/lstm_h"]) if self.config.use_lstm else None
        dist, values, _ = self.network.apply(
            params, jnp.swapaxes(obs, 0, 1), jnp.swapaxes(batch["first"], 0, 1), carry)
        return dist, values, {}, []


@pytest.mark.unit
@pytest.mark.parametrize("spec, config", [
    (CARTPOLE, VTraceConfig(lookahead=6)),
    (CARTPOLE, VTraceConfig(lookahead=6, use_lstm=True, lstm_size=16)),
    (SWINGUP, VTraceConfig(lookahead=3, normalize_observations=True)),
    (FRAMES, VTraceConfig(lookahead=0, cnn_channel_norm=True)),
], ids=["mlp-lookahead", "lstm-lookahead", "gaussian-normalized", "nature-cnn-bootstrap"])
def test_backward_pass_over_the_trained_steps_alone_gives_the_whole_unrolls_gradient(spec, config):
    """The update differentiates only the first unroll_length steps; the
    lookahead and bootstrap steps run on frozen parameters (they only set the
    targets). Loss and gradient equal those through the whole unroll."""
    config = dataclasses.replace(config, unroll_length=5)
    agent, reference = VTraceAgent(spec, config, frame_stack=3), _WholeUnrollAgent(spec, config, frame_stack=3)
    params = _perturbed(agent.init(jax.random.PRNGKey(2)).params, 0.05, seed=3)
    batch = _record(agent, params, steps=config.unroll_length + config.lookahead + 1, n=3)
    (loss, _), grads = jax.jit(jax.value_and_grad(agent.loss, has_aux=True))(params, batch)
    (want_loss, _), want = jax.jit(jax.value_and_grad(reference.loss, has_aux=True))(params, batch)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
    chex.assert_trees_all_close(grads, want, rtol=2e-4, atol=1e-6)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) > 1e-4  # a gradient worth comparing


@pytest.mark.unit
def test_learning_health_metrics_measure_the_batch():
    agent = VTraceAgent(CARTPOLE, VTraceConfig())
    state = agent.init(jax.random.PRNGKey(0))
    batch = _record(agent, state.params, steps=11, n=4)
    _, metrics = jax.jit(agent.loss)(state.params, batch)
    # A fresh policy head (orthogonal gain 0.01) is close to uniform over 2 actions.
    np.testing.assert_allclose(float(metrics["policy/entropy"]), np.log(2), atol=1e-3)
    assert 0.0 <= float(metrics["torso/saturation"]) < 0.5
    for key in ("value/mean", "value/std", "advantage/abs_mean", "policy/logit_spread_across_states"):
        assert np.isfinite(float(metrics[key])), key
    # Weights scaled up 100x drive every tanh unit to +-1: saturation reads ~1.
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x * 100.0 if "MLPTorso" in jax.tree_util.keystr(path) else x, state.params
    )
    _, metrics = jax.jit(agent.loss)(params, batch)
    assert float(metrics["torso/saturation"]) > 0.9


@pytest.mark.unit
def test_dead_channels_count_the_relu_channels_no_frame_of_the_batch_activates():
    from seedq.agents import health

    maps = np.zeros((2, 3, 3, 4), np.float32)
    maps[1, 2, 0, 1], maps[0, 0, 0, 3] = 0.5, 2.0  # channels 0 and 2 never active
    assert float(health.dead_channels(jnp.asarray(maps))) == 0.5
    agent = VTraceAgent(FRAMES, VTraceConfig(reuse=1, lookahead=0))
    state = agent.init(jax.random.PRNGKey(0))
    batch = _record(agent, state.params, steps=11, n=4)
    _, metrics = jax.jit(agent.loss)(state.params, batch)
    assert sorted(k for k in metrics if k.startswith("torso/dead_channels/")) == [
        f"torso/dead_channels/{i}" for i in range(3)]  # the Nature CNN's three convolutions
    assert float(metrics["torso/dead_channels/0"]) < 0.5
    # First-layer biases below anything a frame can reach: every channel of it is dead.
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x - 1e3 if "Conv_0" in jax.tree_util.keystr(path) and "bias" in jax.tree_util.keystr(path)
        else x, state.params,
    )
    _, metrics = jax.jit(agent.loss)(params, batch)
    assert float(metrics["torso/dead_channels/0"]) == 1.0


@pytest.mark.unit
def test_layer_norm_keeps_the_torso_unsaturated_however_wide_the_inputs():
    """A torso with layer_norm (the default: all_layers) reads inputs 100x
    wider as it reads the originals, where the plain tanh torso saturates."""
    def saturation(config, scale):
        agent = VTraceAgent(SWINGUP, config)
        state = agent.init(jax.random.PRNGKey(0))
        batch = _record(agent, state.params, steps=11, n=4)
        batch["obs"] = batch["obs"] * scale
        # The first layer: the one that reads the inputs.
        return float(jax.jit(agent.loss)(state.params, batch)[1]["torso/saturation/MLPTorso_0/0"])

    plain = VTraceConfig(shared_torso=False, layer_norm="none")
    assert saturation(plain, 100.0) > 0.9
    for mode in ("first_layer", "all_layers"):
        normed = VTraceConfig(shared_torso=False, layer_norm=mode)
        wide = saturation(normed, 100.0)
        assert wide < 0.5, mode
        assert wide == pytest.approx(saturation(normed, 1.0), abs=0.02), mode


@pytest.mark.unit
def test_the_value_torso_takes_its_own_sizes_and_the_policy_keeps_hidden_sizes():
    agent = VTraceAgent(SWINGUP, VTraceConfig(shared_torso=False, hidden_sizes=(16, 8), value_hidden_sizes=(48, 32)))
    params = agent.init(jax.random.PRNGKey(0)).params["params"]
    widths = lambda torso: [params[torso][layer]["kernel"].shape[1] for layer in sorted(params[torso])
                            if "kernel" in params[torso][layer]]
    assert widths("value_torso") == [48, 32]
    assert params["value"]["kernel"].shape == (32, 1)
    assert params["policy"]["kernel"].shape[0] == 8
    with pytest.raises(ValueError, match="value_hidden_sizes needs vtrace.shared_torso=false"):
        TrainConfig(vtrace=VTraceConfig(value_hidden_sizes=(256, 256))).validate()


@pytest.mark.unit
def test_health_statistics_match_numpy():
    from seedq.agents import health

    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 3)).astype(np.float32)
    mask = (rng.random((5, 3)) < 0.7).astype(np.float32)
    mean, std = health.masked_mean_std(jnp.asarray(x), jnp.asarray(mask))
    kept = x[mask == 1]
    np.testing.assert_allclose([float(mean), float(std)], [kept.mean(), kept.std()], rtol=1e-5)
    logits = rng.normal(size=(5, 3, 4)).astype(np.float32)
    spread = health.spread_across_states(jnp.asarray(logits), jnp.asarray(mask))
    np.testing.assert_allclose(float(spread), logits[mask == 1].std(axis=0).mean(), rtol=1e-5)
    acts = [jnp.asarray([[0.995, -0.2], [-0.999, 0.5]]), jnp.asarray([[1.0, 0.0, 0.98]])]
    assert float(health.saturation(acts)) == pytest.approx(3 / 7)


@pytest.mark.unit
def test_gaussian_policy_samples_its_distribution_and_starts_at_initial_log_std():
    config = VTraceConfig(initial_log_std=-1.0)
    agent = VTraceAgent(SWINGUP, config)
    state = agent.init(jax.random.PRNGKey(0))
    n = 4000
    obs = np.zeros((n, 5), np.float32)
    actions, dist, _, _ = jax.jit(agent.act)(state.params, jax.random.PRNGKey(3), obs, np.ones(n, bool), {}, {})
    actions, mean = np.asarray(actions), np.asarray(dist["mean"])
    np.testing.assert_allclose(np.asarray(dist["log_std"]), -1.0)
    z = (actions - mean) / np.exp(-1.0)
    assert stats.kstest(z.ravel(), "norm").pvalue > 1e-3
    np.testing.assert_array_equal(np.asarray(agent.greedy_actions(dist)), mean)


@pytest.mark.unit
def test_min_std_floors_the_policy_std_and_keeps_its_start():
    """std = min_std + exp(parameter): the policy starts at exp(initial_log_std),
    no parameter takes it under the floor, and the gradient reaches the parameter."""
    config = VTraceConfig(initial_log_std=-0.5, min_std=0.35)
    agent = VTraceAgent(SWINGUP, config)
    state = agent.init(jax.random.PRNGKey(0))
    obs, first = np.zeros((8, 5), np.float32), np.ones(8, bool)
    act = jax.jit(agent.act)
    _, dist, _, _ = act(state.params, jax.random.PRNGKey(1), obs, first, {}, {})
    np.testing.assert_allclose(np.asarray(dist["log_std"]), -0.5, rtol=1e-6)

    def with_log_std(params, value):
        return jax.tree_util.tree_map_with_path(
            lambda path, x: jnp.full_like(x, value) if "log_std" in jax.tree_util.keystr(path) else x, params)

    for parameter in (-3.0, -100.0):  # the latter is clipped to LOG_STD_MIN first
        _, dist, _, _ = act(with_log_std(state.params, parameter), jax.random.PRNGKey(1), obs, first, {}, {})
        std = np.exp(np.asarray(dist["log_std"]))
        np.testing.assert_allclose(std, 0.35 + np.exp(max(parameter, -5.0)), rtol=1e-5)
    batch = _record(agent, state.params, steps=11, n=4)
    grads = jax.grad(lambda p: agent.loss(p, batch)[0])(state.params)
    log_std_grads = [g for path, g in jax.tree_util.tree_leaves_with_path(grads)
                     if "log_std" in jax.tree_util.keystr(path)]
    assert log_std_grads and np.all(np.abs(np.asarray(log_std_grads[0])) > 0)


@pytest.mark.unit
def test_box_health_reports_the_policy_std():
    """policy/std (geometric mean over dimensions) and policy/std_min follow the
    log-std parameter; Discrete policies have neither."""
    spec = EnvSpec("float32", (5,), action_shape=(3,), action_low=(-1.0,) * 3, action_high=(1.0,) * 3)
    agent = VTraceAgent(spec, VTraceConfig())
    state = agent.init(jax.random.PRNGKey(0))
    log_std = np.array([-1.6, -0.2, 0.3], np.float32)
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.asarray(log_std) if "log_std" in jax.tree_util.keystr(path) else x, state.params)
    batch = _record(agent, params, steps=11, n=4)
    _, metrics = jax.jit(agent.loss)(params, batch)
    np.testing.assert_allclose(float(metrics["policy/std"]), np.exp(log_std.mean()), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["policy/std_min"]), np.exp(-1.6), rtol=1e-5)
    cartpole = VTraceAgent(CARTPOLE, VTraceConfig())
    cstate = cartpole.init(jax.random.PRNGKey(0))
    _, cmetrics = jax.jit(cartpole.loss)(cstate.params, _record(cartpole, cstate.params, steps=11, n=4))
    assert "policy/std" not in cmetrics


@pytest.mark.unit
def test_gaussian_log_prob_and_entropy_match_scipy():
    rng = np.random.default_rng(0)
    mean, log_std, x = (rng.normal(size=(7, 3)) for _ in range(3))
    expected = stats.norm(mean, np.exp(log_std)).logpdf(x).sum(-1)
    got = losses.gaussian_log_prob(jnp.asarray(mean), jnp.asarray(log_std), jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5)
    entropy = stats.norm(mean, np.exp(log_std)).entropy().sum(-1)
    np.testing.assert_allclose(np.asarray(losses.gaussian_entropy(jnp.asarray(log_std))), entropy, rtol=1e-5)


@pytest.mark.unit
def test_continuous_agent_learns_a_target_action():
    """A one-step bandit: reward -(a - 0.5)^2. V-trace moves the Gaussian's mean to 0.5.

    In process and deterministic: fixed seeds and 150 updates of 64 samples
    (the learning tier is the three runs of the whole system). Margin: with these seeds
    (and inits 1, 2) the mean is first within 0.1 of 0.5 after 7-8 updates and
    ends 0.006-0.009 from it, an order of magnitude inside the bound.
    """
    config = VTraceConfig(unroll_length=1, learning_rate=3e-2, entropy_cost=0.0, hidden_sizes=(8,))
    agent = VTraceAgent(dataclasses.replace(SWINGUP, action_shape=(1,), action_low=(-1.0,),
                                            action_high=(1.0,)), config)
    state = agent.init(jax.random.PRNGKey(0))
    update = jax.jit(agent.update)
    act = jax.jit(agent.act)
    key = jax.random.PRNGKey(1)
    n = 64
    obs = np.zeros((n, 5), np.float32)
    for _ in range(150):
        actions, dist, _, key = act(state.params, key, obs, np.ones(n, bool), {}, {})
        reward = -np.square(np.asarray(actions)[:, 0] - 0.5)
        batch = {
            "obs": np.stack([obs, obs], 1), "first": np.ones((n, 2), bool),
            "reward": np.stack([np.zeros(n), reward], 1).astype(np.float32),
            "terminated": np.stack([np.zeros(n, bool), np.ones(n, bool)], 1),
            "truncated": np.zeros((n, 2), bool),
            "action": np.stack([np.asarray(actions)] * 2, 1),
            "policy_version": np.zeros((n, 2), np.int32),
            **{k: np.stack([np.asarray(v)] * 2, 1) for k, v in dist.items()},
        }
        state, _ = update(state, batch)
    _, dist, _, _ = act(state.params, key, obs[:1], np.ones(1, bool), {}, {})
    assert abs(float(dist["mean"][0, 0]) - 0.5) < 0.1


@pytest.mark.unit
def test_unsupported_action_spaces_are_refused():
    with pytest.raises(ValueError, match="Discrete or a 1-d Box"):
        VTraceAgent(EnvSpec("float32", (3,), action_shape=(2, 2), action_low=(0.0,) * 4,
                            action_high=(1.0,) * 4), VTraceConfig())


@pytest.mark.unit
def test_server_clips_training_rewards_but_books_unclipped_returns():
    from seedq.server.env_table import EnvTable, EpisodeLog
    from seedq.server.inference import InferenceServer
    from seedq.server.unrolls import UnrollQueue
    from seedq.wire import codec

    agent = VTraceAgent(CARTPOLE, VTraceConfig(unroll_length=3, lookahead=0))  # an unroll every 3 steps
    episodes = EpisodeLog()
    server = InferenceServer(
        agent, CARTPOLE, EnvTable(episodes), UnrollQueue(16), max_batch_size=8,
        batch_timeout_ms=0, rng=jax.random.PRNGKey(0), reward_clip=1.0,
    )
    server.publish(agent.init(jax.random.PRNGKey(0)).params, 0)
    entry, _ = server.connect("a", "run", 1)
    rewards = [0.0, 5.0, -3.0, 0.5]  # the first arrives with the first observation
    unrolls = None
    for t, reward in enumerate(rewards):
        done = np.array([t == len(rewards) - 1])
        steps = codec.Steps(np.zeros(1, np.int32), np.array([reward], np.float32), done,
                            np.zeros(1, bool), np.zeros((1, 4), np.float32))
        unrolls = serve(server, entry, steps)[2] or unrolls
    np.testing.assert_array_equal(unrolls["reward"][0], [0.0, 1.0, -1.0, 0.5])
    assert episodes.window()[0] == [2.5]  # 5 - 3 + 0.5, unclipped


@pytest.mark.unit
@pytest.mark.parametrize("spec", [CARTPOLE, SWINGUP], ids=["discrete", "gaussian"])
def test_server_records_what_it_answered_and_the_learner_recomputes_it(spec):
    """Through the real batch path (answer the actors, then record): every
    recorded step holds the observation sent and the action answered for it,
    and the learner, with the acting parameters, recomputes exactly the
    behaviour policy (ratios 1, nothing clipped)."""
    from seedq.server.env_table import EnvTable, EpisodeLog
    from seedq.server.inference import InferenceServer
    from seedq.server.unrolls import UnrollQueue
    from seedq.wire import codec

    config = VTraceConfig(unroll_length=4, lookahead=0)  # unrolls of 5 steps
    agent = VTraceAgent(spec, config)
    server = InferenceServer(agent, spec, EnvTable(EpisodeLog()), UnrollQueue(16), max_batch_size=8,
                             batch_timeout_ms=0, rng=jax.random.PRNGKey(0))
    params = agent.init(jax.random.PRNGKey(1)).params
    server.publish(params, 0)
    n = 3
    entry, _ = server.connect("a", "run", n)
    rng = np.random.default_rng(0)
    sent_obs, answered, unrolls = [], [], None
    for t in range(config.unroll_length + 1):
        obs = rng.normal(size=(n, *spec.obs_shape)).astype(np.float32)
        steps = codec.Steps(np.arange(n, dtype=np.int32), np.full(n, 0.5, np.float32), np.zeros(n, bool),
                            np.zeros(n, bool), obs)
        actions, _, finished = serve(server, entry, steps)
        sent_obs.append(obs)
        answered.append(np.asarray(actions))
        unrolls = finished or unrolls
    assert unrolls is not None and unrolls["obs"].shape[:2] == (n, config.unroll_length + 1)
    np.testing.assert_array_equal(unrolls["obs"], np.stack(sent_obs, axis=1))
    np.testing.assert_array_equal(unrolls["action"], np.stack(answered, axis=1))
    _, metrics = jax.jit(agent.loss)(params, unrolls)
    np.testing.assert_allclose(float(metrics["rho/mean"]), 1.0, atol=1e-4)
    assert float(metrics["policy/clip_fraction"]) == 0.0


@pytest.mark.unit
def test_running_observation_statistics_match_numpy_over_batches():
    from seedq.agents import normalization

    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 5.0, size=(n, 4)) * [1, 10, 0.1, 1] for n in (1, 7, 300, 2)]
    stats = normalization.init_stats(4)
    for x in batches:
        stats = normalization.update_stats(stats, jnp.asarray(x, jnp.float32))
    everything = np.concatenate(batches)
    np.testing.assert_allclose(float(stats.count), len(everything))
    np.testing.assert_allclose(np.asarray(stats.mean), everything.mean(0), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(stats.m2) / len(everything), everything.var(0), rtol=1e-3)
    z = np.asarray(normalization.normalize(stats, jnp.asarray(everything, jnp.float32)))
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-3)
    np.testing.assert_allclose(z.std(0), 1.0, rtol=1e-3)


@pytest.mark.unit
def test_update_merges_the_batch_into_the_published_statistics():
    agent = VTraceAgent(SWINGUP, VTraceConfig(normalize_observations=True, unroll_length=3))
    state = agent.init(jax.random.PRNGKey(0))
    batch = _record(agent, state.params, steps=4, n=6)
    new, _ = jax.jit(agent.update)(state, batch)
    stats = new.params["obs_stats"]
    obs = batch["obs"].reshape(-1, 5)
    assert float(stats["count"]) == len(obs)
    np.testing.assert_allclose(np.asarray(stats["mean"]), obs.mean(0), rtol=1e-4, atol=1e-6)
    assert set(agent.inference_params(new)) == {"params", "obs_stats"}


@pytest.mark.unit
def test_learning_rate_decays_linearly_to_zero_over_the_trained_frames():
    config = VTraceConfig(learning_rate=6e-4, learning_rate_decay_frames=160_000, reuse=1)  # 16 x 10 per step
    schedule = VTraceAgent(CARTPOLE, config).learning_rate
    assert [float(schedule(s)) for s in (0, 500, 1000, 2000)] == pytest.approx([6e-4, 3e-4, 0.0, 0.0])
    constant = VTraceAgent(CARTPOLE, VTraceConfig(learning_rate_decay_frames=0)).learning_rate
    assert float(constant(10**6)) == pytest.approx(1e-3)
    # The optimiser really uses it: 2 steps of horizon move the parameters, the third does not.
    agent = VTraceAgent(CARTPOLE, dataclasses.replace(config, learning_rate_decay_frames=2 * 16 * 10))
    state = agent.init(jax.random.PRNGKey(0))
    batch = _record(agent, state.params, steps=11, n=4)
    update = jax.jit(agent.update)
    for step in range(3):
        before = state.params
        state, metrics = update(state, batch)
        moved = any(not np.allclose(x, y, atol=1e-8)
                    for x, y in zip(jax.tree.leaves(state.params), jax.tree.leaves(before)))
        assert moved == (step < 2), step
        assert float(metrics["learning_rate"]) == pytest.approx([6e-4, 3e-4, 0.0][step], abs=1e-10)


@pytest.mark.unit
@pytest.mark.parametrize("anneal", [False, True])
def test_the_entropy_bonus_anneals_with_the_learning_rate_when_asked(anneal):
    """At train step s the loss is step 0's less (c_0 - c_s) x the entropy term,
    c_s falling to 0 with the learning rate (constant without the anneal), and
    `update` passes the state's step."""
    config = VTraceConfig(entropy_cost=0.02, learning_rate_decay_frames=1000 * 16 * 10, reuse=1,
                          anneal_entropy_cost=anneal)
    agent = VTraceAgent(CARTPOLE, config)
    state = agent.init(jax.random.PRNGKey(0))
    batch = _record(agent, state.params, steps=11, n=4)
    loss = jax.jit(agent.loss)
    start_total, start = loss(state.params, batch, 0)
    for step, annealed_cost in [(500, 0.01), (1000, 0.0), (5000, 0.0)]:
        total, metrics = loss(state.params, batch, step)
        cost = annealed_cost if anneal else 0.02
        assert float(metrics["loss/entropy_cost"]) == pytest.approx(cost, rel=1e-6, abs=1e-9)
        assert float(metrics["loss/entropy"]) == pytest.approx(float(start["loss/entropy"]), rel=1e-6)
        assert float(total) == pytest.approx(
            float(start_total) - (0.02 - cost) * float(start["loss/entropy"]), rel=1e-5, abs=1e-7)
    _, metrics = jax.jit(agent.update)(state._replace(step=jnp.asarray(500)), batch)
    assert float(metrics["loss/entropy_cost"]) == pytest.approx(0.01 if anneal else 0.02, rel=1e-6)


@pytest.mark.unit
def test_masked_batch_statistics_merge_like_numpy():
    from seedq.agents import normalization

    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, size=(40, 1)).astype(np.float32)
    weight = (rng.random(40) < 0.6).astype(np.float32)
    stats = normalization.init_stats(1)
    for part in (slice(0, 15), slice(15, 40)):
        stats = normalization.merge(stats, normalization.batch_stats(jnp.asarray(x[part]), jnp.asarray(weight[part])))
    kept = x[weight == 1, 0]
    assert float(stats.count) == len(kept)
    np.testing.assert_allclose(float(stats.mean[0]), kept.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(stats.m2[0]) / len(kept), kept.var(), rtol=1e-4)
    np.testing.assert_allclose(float(normalization.root_mean_square(stats)[0]),
                               np.sqrt(np.mean(kept ** 2)), rtol=1e-4)


@pytest.mark.unit
def test_return_normalisation_makes_the_loss_independent_of_the_reward_scale():
    """Rewards x100 with return statistics x100 give the same loss, up to the value
    head's bias (zero at init): what the network learns no longer depends on the scale."""
    config = VTraceConfig(normalize_returns=True)
    agent = VTraceAgent(CARTPOLE, config)
    state = agent.init(jax.random.PRNGKey(0))
    batch = _record(agent, state.params, steps=11, n=4)
    seen = {"count": np.float32(1000.0), "mean": np.array([20.0], np.float32), "m2": np.array([1000.0 * 25.0], np.float32)}

    def loss_with(scale):
        params = {**state.params, "return_stats": {"count": seen["count"], "mean": seen["mean"] * scale,
                                                   "m2": seen["m2"] * scale ** 2}}
        loss, metrics = jax.jit(agent.loss)(params, {**batch, "reward": batch["reward"] * scale})
        return float(loss), float(metrics["return/rms"])

    (loss_1, rms_1), (loss_100, rms_100) = loss_with(1.0), loss_with(100.0)
    assert rms_100 == pytest.approx(100 * rms_1, rel=1e-5)
    assert loss_100 == pytest.approx(loss_1, rel=1e-4)
    # And the update merges this batch's returns into the statistics.
    new_state, metrics = jax.jit(agent.update)(state, batch)
    assert "_return_batch" not in metrics
    valid_steps = 10 * 4  # no episode ends in _record's batch
    assert float(new_state.params["return_stats"]["count"]) == valid_steps
    assert float(metrics["return/rms"]) == 1.0  # nothing seen before this update


@pytest.mark.unit
def test_the_anneal_horizon_is_the_runs_frame_budget():
    """-1 (the default) anneals over max_frames; without one over DEFAULT_DECAY_FRAMES;
    reuse trains each batch several times without shortening the horizon in env frames."""
    from seedq.agents import make_agent
    from seedq.config import DEFAULT_DECAY_FRAMES, TrainConfig

    assert VTraceConfig().learning_rate_decay_frames == -1
    assert VTraceConfig().decay_frames_for(500_000) == 500_000
    assert VTraceConfig().decay_frames_for(0) == DEFAULT_DECAY_FRAMES
    assert VTraceConfig(learning_rate_decay_frames=0).decay_frames_for(500_000) == 0

    frames_per_step = 16 * 10
    agent = make_agent(TrainConfig(max_frames=500_000, vtrace=VTraceConfig(reuse=1)), CARTPOLE)
    half = 250_000 // frames_per_step
    assert float(agent.learning_rate(half)) == pytest.approx(0.5 * agent.config.learning_rate, rel=1e-3)
    reused = make_agent(TrainConfig(max_frames=500_000, vtrace=VTraceConfig(reuse=4)), CARTPOLE)
    assert float(reused.learning_rate(4 * half)) == pytest.approx(0.5 * agent.config.learning_rate, rel=1e-3)


@pytest.mark.unit
def test_reuse_hands_each_batch_out_that_many_times_in_arrival_order():
    import threading

    from seedq.agents.base import FifoBatches
    from seedq.server.unrolls import UnrollQueue

    queue = UnrollQueue(capacity=16)
    queue.put({"x": np.arange(6)})
    batches = FifoBatches(queue, batch_size=2, reuse=3)
    stop = threading.Event()
    got = [batches.next_batch(stop)["x"].tolist() for _ in range(7)]
    assert got == [[0, 1]] * 3 + [[2, 3]] * 3 + [[4, 5]]
    with pytest.raises(ValueError, match="reuse"):
        FifoBatches(queue, batch_size=2, reuse=0)


@pytest.mark.unit
def test_reuse_pool_makes_shuffled_epochs_over_the_pooled_sequences():
    import threading

    from seedq.agents.base import FifoBatches
    from seedq.server.unrolls import UnrollQueue

    queue = UnrollQueue(capacity=32)
    queue.put({"x": np.arange(12), "y": np.arange(12) * 10})
    batches = FifoBatches(queue, batch_size=2, reuse=3, pool=3)
    stop = threading.Event()
    got = [batches.next_batch(stop) for _ in range(9)]  # 3 epochs x 3 batches of the first 6
    for b in got:
        assert b["x"].shape == (2,)
        np.testing.assert_array_equal(b["y"], b["x"] * 10)  # fields stay aligned
    epochs = [sorted(np.concatenate([b["x"] for b in got[3 * e:3 * e + 3]]).tolist()) for e in range(3)]
    assert epochs == [list(range(6))] * 3  # each pass uses every pooled sequence once
    orders = [np.concatenate([b["x"] for b in got[3 * e:3 * e + 3]]).tolist() for e in range(3)]
    assert len({tuple(o) for o in orders}) > 1  # and in a new order
    nxt = batches.next_batch(stop)["x"].tolist()
    assert set(nxt) <= set(range(6, 12))  # then the next pool, not a 4th pass
    with pytest.raises(ValueError, match="pool"):
        FifoBatches(queue, batch_size=2, reuse=1, pool=0)


@pytest.mark.unit
def test_the_run_seed_orders_the_pooled_passes():
    """Two runs that differ only in --seed shuffle their pooled passes differently;
    the same seed gives the same order."""
    import threading

    from seedq.agents import make_agent
    from seedq.config import TrainConfig
    from seedq.server.unrolls import UnrollQueue

    def first_pass(seed: int) -> list:
        config = TrainConfig(seed=seed, vtrace=VTraceConfig(batch_size=4, reuse=2, reuse_pool=4))
        queue = UnrollQueue(capacity=32)
        queue.put({"x": np.arange(16)})
        batches = make_agent(config, CARTPOLE).make_batch_source(queue)
        stop = threading.Event()
        return np.concatenate([batches.next_batch(stop)["x"] for _ in range(4)]).tolist()

    assert first_pass(1) == first_pass(1)
    assert first_pass(1) != first_pass(2)


@pytest.mark.unit
def test_standardize_matches_numpy_over_the_valid_steps():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 5.0, (7, 5)).astype(np.float32)
    mask = rng.random((7, 5)) < 0.7
    out = np.asarray(losses.standardize(jnp.asarray(x), jnp.asarray(mask)))
    kept = x[mask]
    np.testing.assert_allclose(out[mask], (kept - kept.mean()) / kept.std(), rtol=1e-4, atol=1e-5)


@pytest.mark.unit
def test_standardised_advantages_make_the_policy_loss_independent_of_the_reward_scale():
    """Rewards that dwarf the (initial, near 0) values: the policy loss with
    normalize_advantages is the same at x1000 and x4000, and not without it."""
    def policy_loss(normalize, scale):
        # V-trace's policy gradient (ppo_clip 0): on policy, the clipped surrogate of
        # standardised advantages is their mean, 0 at any scale.
        agent = VTraceAgent(CARTPOLE, VTraceConfig(normalize_advantages=normalize, reward_scale=1.0, ppo_clip=0.0))
        state = agent.init(jax.random.PRNGKey(0))
        batch = _record(agent, state.params, steps=11, n=4)
        batch = {**batch, "reward": np.abs(batch["reward"]) * scale}
        return float(jax.jit(agent.loss)(state.params, batch)[1]["loss/policy"])

    assert policy_loss(True, 4000.0) == pytest.approx(policy_loss(True, 1000.0), rel=1e-3)
    assert policy_loss(False, 4000.0) == pytest.approx(4 * policy_loss(False, 1000.0), rel=1e-2)


@pytest.mark.unit
def test_clipped_surrogate_gives_vtraces_gradient_on_policy_and_differs_once_the_policy_moved():
    """On the policy that acted (ratio 1) ppo_clip's policy gradient is V-trace's;
    once the parameters have moved, the two differ."""
    def policy_grads(ppo_clip, params, batch):
        agent = VTraceAgent(CARTPOLE, VTraceConfig(ppo_clip=ppo_clip, baseline_cost=0.0, entropy_cost=0.0))
        return jax.grad(lambda p: agent.loss(p, batch)[0])(params)

    agent = VTraceAgent(CARTPOLE, VTraceConfig())
    params = agent.init(jax.random.PRNGKey(0)).params
    batch = _record(agent, params, steps=11, n=4)
    leaves = lambda tree: np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])
    on_policy_clip, on_policy_vtrace = leaves(policy_grads(0.2, params, batch)), leaves(policy_grads(0.0, params, batch))
    clip_agent = VTraceAgent(CARTPOLE, VTraceConfig(ppo_clip=0.2))
    assert float(clip_agent.loss(params, batch)[1]["policy/clip_fraction"]) == 0.0
    np.testing.assert_allclose(on_policy_clip, on_policy_vtrace, rtol=1e-4, atol=1e-7)
    assert np.abs(on_policy_clip).max() > 0

    moved = jax.tree.map(lambda x: x + 0.3 * jnp.sign(x), params)
    diff = leaves(policy_grads(0.2, moved, batch)) - leaves(policy_grads(0.0, moved, batch))
    assert np.abs(diff).max() > 1e-4
    assert 0.0 < float(clip_agent.loss(moved, batch)[1]["policy/clip_fraction"]) <= 1.0


@pytest.mark.unit
def test_a_lookahead_lengthens_the_targets_and_trains_on_the_unrolls_steps_only():
    """With lookahead L an unroll carries T + L + 1 steps: V-trace's targets for
    its first T steps are rlax's over all T + L, and only those T steps are
    trained on (the next unroll, overlapping by L + 1 steps, trains on the rest)."""
    import rlax

    T, L, B = 4, 6, 5
    config = VTraceConfig(unroll_length=T, lookahead=L, grow_lookahead=False)
    agent = VTraceAgent(CARTPOLE, config)
    spec = agent.sequence_spec()
    assert (spec.length, spec.overlap) == (T + L + 1, L + 1)  # T new steps per unroll
    state = agent.init(jax.random.PRNGKey(0))
    batch = _record(agent, state.params, steps=T + L + 1, n=B)
    batch["terminated"][:, 7] = True  # an episode end inside the lookahead cuts the trace there
    params = _perturbed(state.params, 0.3, seed=1)
    _, metrics = jax.jit(agent.loss)(params, batch)

    dist, values, *_ = agent._unroll_network(params, batch)
    tm = {k: np.swapaxes(batch[k], 0, 1) for k in ("reward", "terminated", "truncated", "action", "logits")}
    log_pi = jax.nn.log_softmax(dist["logits"][:-1])
    log_mu = jax.nn.log_softmax(tm["logits"][:-1])
    pick = lambda logp: np.take_along_axis(np.asarray(logp), tm["action"][:-1, :, None], -1)[..., 0]
    valid = 1.0 - (tm["terminated"][:-1] | tm["truncated"][:-1])
    rho = np.exp(pick(log_pi) - pick(log_mu)) * valid
    out = jax.vmap(
        lambda v_tm1, v_t, r, d, p: rlax.vtrace_td_error_and_advantage(v_tm1, v_t, r, d, p, lambda_=1.0),
        in_axes=1, out_axes=1,
    )(values[:-1], values[1:], tm["reward"][1:] * config.reward_scale,
      config.discount * (1.0 - tm["terminated"][1:]), rho)
    targets = np.asarray(out.errors + values[:-1])
    want = 0.5 * np.mean(valid[:T] * (targets[:T] - np.asarray(values[:T])) ** 2)
    np.testing.assert_allclose(float(metrics["loss/baseline"]), want, rtol=1e-4)

    # Without the lookahead the same T steps have targets cut at step T: the
    # lookahead changed them; the trained steps' entropy is the same.
    short = VTraceAgent(CARTPOLE, dataclasses.replace(config, lookahead=0))
    _, short_metrics = jax.jit(short.loss)(params, _first_steps(batch, T + 1))
    assert abs(float(short_metrics["loss/baseline"]) - want) > 1e-3 * want
    np.testing.assert_allclose(float(metrics["loss/entropy"]), float(short_metrics["loss/entropy"]), rtol=1e-5)


@pytest.mark.unit
def test_a_negative_lookahead_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^vtrace.lookahead=-1: must be >= 0$"):
        TrainConfig(vtrace=VTraceConfig(lookahead=-1)).validate()


@pytest.mark.unit
def test_a_growing_lookahead_starts_at_the_unroll_and_reaches_the_whole_lookahead_with_the_anneal():
    """With grow_lookahead the targets reach no further than the unroll at step
    0 (the loss of the same steps without a lookahead), half way at half the
    anneal's horizon, and the whole lookahead once it is over."""
    T, L, B = 4, 6, 5
    frames_per_step = 16 * T / 4  # batch 16, reuse 4
    config = VTraceConfig(unroll_length=T, lookahead=L, grow_lookahead=True,
                          learning_rate_decay_frames=int(1000 * frames_per_step))
    agent = VTraceAgent(CARTPOLE, config)
    full = VTraceAgent(CARTPOLE, dataclasses.replace(config, grow_lookahead=False))
    reach = lambda k: VTraceAgent(CARTPOLE, dataclasses.replace(config, lookahead=k, grow_lookahead=False))
    state = agent.init(jax.random.PRNGKey(0))
    batch = _record(agent, state.params, steps=T + L + 1, n=B)
    params = _perturbed(state.params, 0.3, seed=1)

    def baseline(a, b, step):
        return float(jax.jit(a.loss)(params, b, step)[1]["loss/baseline"])

    for step, k in [(0, 0), (500, 3), (1000, L), (5000, L)]:
        _, metrics = jax.jit(agent.loss)(params, batch, step)
        assert float(metrics["vtrace/lookahead"]) == k
        # The targets of a lookahead of k steps are those of an unroll cut k steps past the trained ones.
        np.testing.assert_allclose(baseline(agent, batch, step),
                                   baseline(reach(k), _first_steps(batch, T + k + 1), step), rtol=1e-5)
    assert abs(baseline(agent, batch, 0) - baseline(full, batch, 0)) > 1e-3 * baseline(full, batch, 0)
    # A constant learning rate has nothing to grow with: the whole lookahead from the start.
    constant = VTraceAgent(CARTPOLE, dataclasses.replace(config, learning_rate_decay_frames=0))
    np.testing.assert_allclose(baseline(constant, batch, 0), baseline(full, batch, 0), rtol=1e-5)
