"""`vtrace.cnn_channel_norm`: the Nature CNN's channels normalised per frame,
so that a channel pushed below zero on Atari's flat background still fires
where the frame has something on it, and the option runs at every precision."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from seedq import config as config_lib
from seedq.agents.networks import NatureCNN

pytestmark = pytest.mark.unit


def _flat_frames_with_objects(n: int = 4) -> np.ndarray:
    """Pong-like stacks [n, 84, 84, 4]: a flat grey background, a bright 2x6 paddle and a ball."""
    rng = np.random.default_rng(0)
    frames = np.full((n, 84, 84, 4), 87, np.uint8)
    for i in range(n):
        row, col = rng.integers(10, 70, size=2)
        frames[i, row:row + 6, 74:76] = 148
        frames[i, col:col + 2, row:row + 2] = 236
    return frames


def _alive_first_channels(channel_norm: bool, bias: float) -> int:
    """First-conv channels positive anywhere on the frames, with every channel's bias set to `bias`."""
    net = NatureCNN(channel_norm=channel_norm)
    frames = jnp.asarray(_flat_frames_with_objects())
    params = net.init(jax.random.PRNGKey(0), frames)
    params["params"]["Conv_0"]["bias"] = jnp.full_like(params["params"]["Conv_0"]["bias"], bias)
    _, sown = net.apply(params, frames, mutable=["intermediates"])
    first = sown["intermediates"]["relu_maps"][0]
    return int(jnp.sum(jnp.any(first > 0, axis=(0, 1, 2))))


def test_a_channel_driven_below_zero_everywhere_still_fires_on_the_frames_objects_when_normalised():
    # Without the norm a bias of -5 silences every channel on every frame (the
    # frames are in [0, 1] and a fresh kernel sums to about +-1); with it each
    # channel is measured against its own mean over the frame.
    assert _alive_first_channels(channel_norm=False, bias=-5.0) == 0
    assert _alive_first_channels(channel_norm=True, bias=-5.0) == 32
    assert _alive_first_channels(channel_norm=False, bias=0.0) < 32  # some dark on the flat background from the start


def test_the_option_is_off_by_default_keeps_the_parameters_and_other_torsos_ignore_it():
    from seedq.agents import make_agent
    from seedq.envs import env_spec

    frames = jnp.zeros((1, 84, 84, 4), jnp.uint8)
    plain = NatureCNN().init(jax.random.PRNGKey(0), frames)["params"]
    assert sorted(plain) == ["Conv_0", "Conv_1", "Conv_2", "Dense_0"]  # old checkpoints keep loading
    assert config_lib.VTraceConfig().cnn_channel_norm is False
    # Pong's defaults turn it on; the IMPALA ResNet (the GPU recipe's torso) builds without it.
    spec = env_spec("ALE/Pong-v5")
    for network, norms in (("nature_cnn", 3), ("impala_cnn", 0)):
        vtrace = config_lib.VTraceConfig(cnn_channel_norm=True, network=network)
        agent = make_agent(config_lib.TrainConfig(env="ALE/Pong-v5", vtrace=vtrace), spec)
        modules = {name for path in flatten_dict(agent.init(jax.random.PRNGKey(0)).params) for name in path}
        assert len({m for m in modules if m.startswith("GroupNorm_")}) == norms, (network, modules)


def test_a_normalised_pong_network_acts_at_every_precision_close_to_fp32():
    from seedq import quant
    from seedq.agents import make_agent
    from seedq.envs import env_spec
    from seedq.quant.mode import InferencePrecision

    spec = env_spec("ALE/Pong-v5")
    config = config_lib.TrainConfig(env="ALE/Pong-v5", vtrace=config_lib.VTraceConfig(cnn_channel_norm=True))
    agent = make_agent(config, spec)
    params = agent.inference_params(agent.init(jax.random.PRNGKey(0)))
    frames = _flat_frames_with_objects()[..., -1]  # the actors send single frames
    n = frames.shape[0]
    args = (jax.random.PRNGKey(1), frames, np.ones(n, bool), agent.initial_core_state(n),
            agent.actor_inputs(np.arange(n)))
    logits = {}
    for precision in quant.PRECISIONS:
        mode = InferencePrecision(agent, spec, precision)
        actions, out, _, _ = jax.jit(mode.act)(mode.publish(params), *args)
        assert actions.shape == (n,)
        logits[precision] = np.asarray(out["logits"])
    for precision in ("bf16", "int8"):
        err = np.abs(logits[precision] - logits["fp32"]).max() / (np.abs(logits["fp32"]).max() + 1e-6)
        assert err < 0.1, (precision, err)
