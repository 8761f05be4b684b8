"""seedq.agents.optimizer: the one optimizer both agents train with."""

from __future__ import annotations

import numpy as np
import pytest

from seedq.config import DEFAULT_DECAY_FRAMES, OptimizerConfig

pytestmark = pytest.mark.unit


def _numpy_steps(config: OptimizerConfig, rates: list[float], grads: list[dict]) -> dict:
    """Ground truth written out from the papers: clip by the global norm of all
    gradients, then Adam (Kingma & Ba, bias-corrected moments, eps outside the
    root) at `rates[t]` for step t; returns the parameter change."""
    b1, b2 = 0.9, 0.999
    mu = {k: np.zeros_like(v) for k, v in grads[0].items()}
    nu = {k: np.zeros_like(v) for k, v in grads[0].items()}
    change = {k: np.zeros_like(v) for k, v in grads[0].items()}
    for t, (rate, g) in enumerate(zip(rates, grads), start=1):
        norm = np.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for v in g.values()))
        g = {k: v * min(1.0, config.max_grad_norm / norm) for k, v in g.items()}
        for k in g:
            mu[k] = b1 * mu[k] + (1 - b1) * g[k]
            nu[k] = b2 * nu[k] + (1 - b2) * g[k] ** 2
            mu_hat, nu_hat = mu[k] / (1 - b1 ** t), nu[k] / (1 - b2 ** t)
            change[k] = change[k] - rate * mu_hat / (np.sqrt(nu_hat) + config.adam_eps)
    return change


def test_clip_adam_and_the_linear_anneal_match_a_numpy_reference():
    import jax.numpy as jnp
    import optax

    from seedq.agents.optimizer import Optimizer

    config = OptimizerConfig(learning_rate=0.1, learning_rate_decay_frames=400, adam_eps=1e-3, max_grad_norm=1.5)
    optimizer = Optimizer(config, frames_per_step=100.0)  # 4 steps from 0.1 to 0
    rng = np.random.default_rng(0)
    grads = [{"w": rng.normal(size=(3, 2)).astype(np.float32), "b": rng.normal(size=(2,)).astype(np.float32)}
             for _ in range(5)]
    params = {k: jnp.zeros_like(v) for k, v in grads[0].items()}
    state = optimizer.init(params)
    rates = []
    for step, g in enumerate(grads):
        updates, state, rate = optimizer.update(g, state, params, jnp.asarray(step))
        params = optax.apply_updates(params, updates)
        rates.append(float(rate))
    assert rates == pytest.approx([0.1, 0.075, 0.05, 0.025, 0.0])
    want = _numpy_steps(config, [0.1 - 0.025 * t for t in range(5)], grads)
    for k in want:
        np.testing.assert_allclose(np.asarray(params[k]), want[k], rtol=1e-5, atol=1e-7)


def test_the_rate_follows_the_step_it_is_given_not_a_count_of_its_own():
    """A learner resumed at step s continues the anneal there (the optimiser
    state holds no count of its own: one layout for every schedule)."""
    import jax
    import jax.numpy as jnp

    from seedq.agents.optimizer import Optimizer

    optimizer = Optimizer(OptimizerConfig(learning_rate=1.0, learning_rate_decay_frames=10), frames_per_step=1.0)
    params = {"w": jnp.zeros(2)}
    state = optimizer.init(params)
    _, _, rate = optimizer.update({"w": jnp.ones(2)}, state, params, jnp.asarray(5))
    assert float(rate) == pytest.approx(0.5)
    constant = Optimizer(OptimizerConfig(learning_rate_decay_frames=0), frames_per_step=1.0)
    shapes = lambda o: jax.tree.map(lambda x: x.shape, o.init(params))  # noqa: E731
    assert jax.tree.structure(constant.init(params)) == jax.tree.structure(state)
    assert shapes(constant) == shapes(optimizer)


@pytest.mark.parametrize("decay_frames, max_frames, want_frames", [
    (-1, 500_000, 500_000),  # the run's budget
    (-1, 0, DEFAULT_DECAY_FRAMES),  # no budget
    (0, 500_000, 0),  # constant
    (80_000, 500_000, 80_000),  # its own horizon
])
def test_the_horizon_resolves_minus_one_against_the_runs_budget(decay_frames, max_frames, want_frames):
    from seedq.agents.optimizer import anneal_steps

    config = OptimizerConfig(learning_rate_decay_frames=decay_frames)
    assert config.decay_frames_for(max_frames) == want_frames
    assert anneal_steps(config, 40.0, max_frames) == want_frames // 40


def test_both_agents_anneal_over_their_own_frames_per_step():
    """V-trace counts batch_size x unroll_length / reuse new frames a step,
    R2D2 batch_size x trace_length / replay_ratio; both through the one builder."""
    from seedq.agents import make_agent
    from seedq.config import R2D2Config, TrainConfig, VTraceConfig
    from seedq.schema import EnvSpec

    spec = EnvSpec("float32", (4,), num_actions=2)
    vtrace = make_agent(TrainConfig(max_frames=64_000, vtrace=VTraceConfig(batch_size=8, unroll_length=10, reuse=2)),
                        spec)
    r2d2 = make_agent(TrainConfig(agent="r2d2", max_frames=64_000,
                                  r2d2=R2D2Config(batch_size=8, trace_length=20, replay_ratio=4.0)), spec)
    assert vtrace.optimizer.anneal_steps == 64_000 // 40
    assert r2d2.optimizer.anneal_steps == 64_000 // 40
    assert float(vtrace.learning_rate(800)) == pytest.approx(0.5e-3)
    assert float(r2d2.learning_rate(800)) == pytest.approx(0.5e-3)
