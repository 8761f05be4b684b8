"""IMPALA / V-trace agent: network, acting, and the learner's update step.

Unroll layout (from the server's unroll store), batch-major [B, T+1, ...]:
step t holds the observation x_t, the reward/flags that arrived *with* x_t
(i.e. produced by action t-1), and the action/behaviour logits chosen at x_t.
Transition t (t < T) is x_t --a_t--> x_{t+1} with reward[t+1].

Episode ends: `terminated[t+1]` cuts the bootstrap (discount 0);
`truncated[t+1]` keeps it, bootstrapping from the final observation x_{t+1}.
When x_t is itself a final observation (terminated or truncated at t) the env
ignored a_t and performed a reset: that transition is masked out by giving it
importance weight 0, which zeroes its TD error, its trace and its
policy-gradient term in one place, so nothing flows across the boundary.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from seedq.agents.base import Agent, FifoBatches
from seedq.schema import SequenceSpec, StepFieldSpec
from seedq.agents import health, normalization
from seedq.agents.frames import frame_stacker
from seedq.agents.networks import choose_network
from seedq.agents.optimizer import Optimizer
from seedq.agents.vtrace import losses
from seedq.agents.vtrace.networks import Categorical, DiagonalGaussian, PolicyValueNetwork
from seedq.config import VTraceConfig
from seedq.schema import EnvSpec


class LearnerState(NamedTuple):
    params: Any
    opt_state: Any
    step: jax.Array


# Parameter entries that are statistics, not network variables (no gradient;
# replaced after every update).
STATISTICS = ("obs_stats", "return_stats")
# The loss's batch statistics of the discounted return (not a logged metric).
RETURN_BATCH = "_return_batch"


def entropy_cost_schedule(config: VTraceConfig, optimizer: Optimizer) -> optax.Schedule:
    """The entropy bonus's coefficient by train step: constant, or falling to 0
    with the learning rate (`anneal_entropy_cost`, the same horizon)."""
    if not config.anneal_entropy_cost:
        return optax.constant_schedule(config.entropy_cost)
    return optimizer.annealed(config.entropy_cost)


def lookahead_schedule(config: VTraceConfig, optimizer: Optimizer) -> optax.Schedule:
    """How many lookahead steps the targets use, by train step: all of them, or
    (`grow_lookahead`) a reach rising from 0 to `lookahead` as the learning rate
    falls (the same horizon; all of them when the rate is constant)."""
    if not config.grow_lookahead or not optimizer.anneals:
        return optax.constant_schedule(float(config.lookahead))
    falling = optimizer.annealed(float(config.lookahead))
    return lambda step: config.lookahead - falling(step)


class VTraceAgent(Agent):
    """Plugs V-trace into the learner through `seedq.agents.base.Agent`.

    Core (per-env recurrent) state, kept by the server and stored once per
    unroll as `core/<name>`: the last K-1 frames for pixel envs (frame stacking
    on the learner, `seedq.agents.frames`) and the LSTM's (c, h) with
    `use_lstm`; empty for an MLP on vectors.
    """

    def __init__(self, spec: EnvSpec, config: VTraceConfig, frame_stack: int = 4, seed: int = 0,
                 max_frames: int = 0):
        """`max_frames`: the run's budget (0: none), the anneal's horizon by default."""
        if spec.discrete:
            self.policy = Categorical(spec.num_actions)
        elif len(spec.action_shape) == 1:
            self.policy = DiagonalGaussian(spec.action_shape[0])
        else:
            raise ValueError(
                f"the vtrace agent needs a Discrete or a 1-d Box action space; this env has "
                f"{spec.action_text()}"
            )
        self.spec = spec
        self.config = config
        self.seed = seed  # the run's: it orders reuse_pool's shuffled passes
        self.frames = frame_stacker(spec.obs_shape, spec.obs_dtype, frame_stack)
        self.obs_shape = self.frames.stacked_shape if self.frames else tuple(spec.obs_shape)
        self.network_name = choose_network(config.network, self.obs_shape)
        # Running observation statistics live in the parameters as params["obs_stats"]
        # (no gradient; replaced after every update), so they are checkpointed
        # and published with the network.
        self.normalize = config.normalize_observations
        if self.normalize and np.dtype(spec.obs_dtype) == np.uint8:
            raise ValueError("vtrace.normalize_observations applies to vector observations, not uint8 frames")
        self.network = PolicyValueNetwork(
            torso=self.network_name,
            num_outputs=spec.num_actions if spec.discrete else spec.action_shape[0],
            continuous=not spec.discrete,
            hidden_sizes=tuple(config.hidden_sizes),
            use_lstm=config.use_lstm,
            lstm_size=config.lstm_size,
            initial_log_std=config.initial_log_std,
            min_std=config.min_std,
            shared_torso=config.shared_torso,
            value_hidden_sizes=tuple(config.value_hidden_sizes),
            layer_norm=config.layer_norm,
            cnn_channel_norm=config.cnn_channel_norm,
            action_low=tuple(spec.action_low),
            action_high=tuple(spec.action_high),
        )
        self.optimizer = Optimizer(config, config.new_frames_per_train_step, max_frames)
        self.learning_rate = self.optimizer.learning_rate
        self.entropy_cost = entropy_cost_schedule(config, self.optimizer)
        self.lookahead = lookahead_schedule(config, self.optimizer)

    def _split(self, params):
        """(network variables, observation statistics or None)."""
        net = {k: v for k, v in params.items() if k not in STATISTICS}
        if not self.normalize:
            return net, None
        return net, normalization.RunningStats(**params["obs_stats"])

    def _normalized(self, stats, obs):
        """Observations as the network sees them ([..., *obs_shape])."""
        if stats is None:
            return obs
        flat = obs.reshape(*obs.shape[: obs.ndim - len(self.spec.obs_shape)], -1)
        return normalization.normalize(stats, flat).reshape(obs.shape)

    def _example_inputs(self):
        obs = jnp.zeros((1, 1, *self.obs_shape), self.spec.obs_dtype)
        return obs, jnp.ones((1, 1), bool), self.network.initial_carry(1)

    # --- acting (inference server) ---

    def sequence_spec(self) -> SequenceSpec:
        # T transitions plus the bootstrap observation, shared with the next unroll.
        # With a lookahead, each unroll carries `lookahead` more steps, used only
        # for the targets; consecutive unrolls share them, and the trained steps
        # still come once each.
        lookahead = self.config.lookahead
        return SequenceSpec(length=self.config.unroll_length + lookahead + 1, overlap=lookahead + 1)

    def act_outputs(self) -> dict[str, StepFieldSpec]:
        """The behaviour policy's distribution parameters, recorded per step."""
        return self.policy.fields()

    def initial_core_state(self, n: int) -> dict[str, np.ndarray]:
        core = self.frames.initial_core_state(n) if self.frames else {}
        if self.config.use_lstm:
            zeros = np.zeros((n, self.config.lstm_size), np.float32)
            core.update(lstm_c=zeros, lstm_h=zeros.copy())
        return core

    def actor_inputs(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        return {}

    def make_batch_source(self, queue, batch_size: int | None = None) -> FifoBatches:
        return FifoBatches(
            queue, batch_size or self.config.batch_size, self.config.reuse, self.config.reuse_pool, seed=self.seed
        )

    def init(self, rng: jax.Array) -> LearnerState:
        params = self.network.init(rng, *self._example_inputs())
        if self.normalize:
            dim = int(np.prod(self.spec.obs_shape))
            params = {**params, "obs_stats": normalization.init_stats(dim)._asdict()}
        if self.config.normalize_returns:
            params = {**params, "return_stats": normalization.init_stats(1)._asdict()}
        return LearnerState(params, self.optimizer.init(params), jnp.zeros((), jnp.int32))

    def inference_params(self, state: LearnerState):
        """The fp32 parameters acting uses (statistics included); the server's
        precision mode (`seedq.quant.mode`) publishes them at its precision."""
        return state.params

    def act(self, params, rng, obs, first, core_state, inputs):
        """(obs [N, *obs_shape], first [N], core {k: [N, ...]}) -> (actions [N, ...],
        distribution params {k: [N, ...]}, new core, new rng)."""
        del inputs
        params, stats = self._split(params)
        obs = self._normalized(stats, obs)
        net_obs, core_state = self.frames.act(core_state, obs, first) if self.frames else (obs, core_state)
        carry = (core_state["lstm_c"], core_state["lstm_h"]) if self.config.use_lstm else None
        dist, _, carry = self.network.apply(params, net_obs[None], first[None], carry)
        dist = {k: v[0].astype(jnp.float32) for k, v in dist.items()}
        if self.config.use_lstm:
            core_state = {**core_state, "lstm_c": carry[0], "lstm_h": carry[1]}
        rng, sample_rng = jax.random.split(rng)
        return self.policy.sample(sample_rng, dist), dist, core_state, rng

    def greedy_actions(self, outputs: dict[str, jax.Array]) -> jax.Array:
        """The greedy policy (evaluation): the most likely action (the Gaussian's mean)."""
        return self.policy.mode(outputs)

    # --- learning ---

    def _unroll_network(self, params, batch: dict[str, jax.Array]):
        """Distribution params {k: [T+1, B, ...]}, values [T+1, B] along batch-major
        unrolls, the MLP torsos' hidden activations {torso: ([N, H] per layer)}, the
        policy's torso first (empty for CNNs), and the ReLU feature maps of the
        CNN torsos that report them ([N, H, W, C] per layer; empty for MLPs); the
        activations and maps are those of the trained steps (N = unroll_length x B)."""
        params, stats = self._split(params)
        obs = self.frames.unroll(batch) if self.frames else self._normalized(stats, batch["obs"])
        obs, first = jnp.swapaxes(obs, 0, 1), jnp.swapaxes(batch["first"], 0, 1)
        carry = (batch["core/lstm_c"], batch["core/lstm_h"]) if self.config.use_lstm else None
        # The losses train on the first unroll_length steps only; the rest (the
        # lookahead and the bootstrap observation) set V-trace's targets, which
        # carry no gradient. Running that part apart, on frozen parameters, keeps
        # the backward pass to the trained steps: the others cost a forward pass
        # only (on Pong, the bootstrap frame is 1 of every 11 frames).
        cut = self.config.unroll_length
        (dist, values, carry), sown = self.network.apply(
            params, obs[:cut], first[:cut], carry, mutable=["intermediates"],
        )
        frozen_params, frozen_carry = jax.lax.stop_gradient((params, carry))
        target_dist, target_values, _ = self.network.apply(frozen_params, obs[cut:], first[cut:], frozen_carry)
        dist = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), dist, target_dist)
        values = jnp.concatenate([values, target_values])
        torsos = sown.get("intermediates", {})
        activations = {name: layers["activations"] for name, layers in torsos.items() if "activations" in layers}
        relu_maps = [m for layers in torsos.values() for m in layers.get("relu_maps", ())]
        return dist, values, activations, relu_maps

    def _time_major(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """The per-step fields the loss reads, [B, T+1, ...] -> [T+1, B, ...]."""
        names = ("reward", "terminated", "truncated", "action", *self.policy.fields())
        return {k: jnp.swapaxes(batch[k], 0, 1) for k in names}

    def _return_rms(self, params) -> jax.Array | None:
        """The running RMS of the discounted return (a scalar, no gradient), or None
        unless `normalize_returns`."""
        if not self.config.normalize_returns:
            return None
        stats = jax.lax.stop_gradient(normalization.RunningStats(**params["return_stats"]))
        return normalization.root_mean_square(stats)[0]

    def _trace_lambda(self, reach: jax.Array, shape: tuple[int, int]):
        """V-trace's lambda: the config's, or with `grow_lookahead` per step [T, B],
        cut where the targets' reach ends (`reach` lookahead steps past the unroll)."""
        cfg = self.config
        if not cfg.grow_lookahead:
            return cfg.lambda_
        return losses.trace_cut_at(cfg.lambda_, shape, cfg.unroll_length - 1 + reach.astype(jnp.int32))

    def loss(self, params, batch: dict[str, jax.Array], step: jax.Array | int = 0):
        """Scalar V-trace loss and metrics on batch-major unrolls [B, T+1, ...] at
        train step `step` (which sets an annealed entropy bonus and the lookahead's reach).

        T is unroll_length + lookahead: V-trace runs over all T transitions, and the
        losses and metrics cover the first unroll_length of them (the next unrolls
        train on the lookahead's steps)."""
        cfg = self.config
        tm = self._time_major(batch)
        chex.assert_rank(tm["reward"], 2)
        dist, values, activations, relu_maps = self._unroll_network(params, batch)  # [T+1, B, ...]
        return_rms = self._return_rms(params)

        actions = tm["action"][:-1]
        target_dist = {k: v[:-1] for k, v in dist.items()}
        target_logp = self.policy.log_prob(target_dist, actions)  # [T, B]
        behaviour_logp = self.policy.log_prob({k: tm[k][:-1] for k in self.policy.fields()}, actions)
        valid = losses.valid_transitions(tm["terminated"], tm["truncated"])
        rhos = losses.importance_weights(target_logp - behaviour_logp, valid)
        reach = jnp.floor(self.lookahead(step))  # lookahead steps the targets use
        vt = losses.vtrace(
            v_tm1=values[:-1],
            v_t=values[1:],
            r_t=losses.transition_rewards(tm["reward"], cfg.reward_scale, return_rms),
            discount_t=losses.transition_discounts(tm["terminated"], cfg.discount),
            rho_tm1=rhos,
            lambda_=self._trace_lambda(reach, rhos.shape),
            clip_rho_threshold=cfg.clip_rho_threshold,
            clip_pg_rho_threshold=cfg.clip_pg_rho_threshold,
        )

        def trained(tree):  # [T, B, ...] -> [unroll_length, B, ...]
            return jax.tree.map(lambda x: x[: cfg.unroll_length], tree)

        valid, rhos, target_logp, behaviour_logp, target_dist, values, vt = trained(
            (valid, rhos, target_logp, behaviour_logp, target_dist, values[:-1], vt))
        advantages = vt.advantages if cfg.ppo_clip else vt.pg_advantages
        if cfg.normalize_advantages:
            advantages = losses.standardize(advantages, valid)
        pg_loss = losses.policy_loss(target_logp, behaviour_logp, advantages, valid, cfg.ppo_clip)
        baseline_loss = losses.baseline_loss(values, vt.targets, valid)
        entropy_loss = losses.entropy_loss_from_entropy(self.policy.entropy(target_dist), valid)
        entropy_cost = self.entropy_cost(step)
        total = pg_loss + cfg.baseline_cost * baseline_loss + entropy_cost * entropy_loss
        metrics = {
            "loss/total": total,
            "loss/policy": pg_loss,
            "loss/baseline": baseline_loss,
            "loss/entropy": entropy_loss,
            "loss/entropy_cost": entropy_cost,
            "vtrace/lookahead": reach,
            "rho/mean": losses.masked_average(rhos, valid),
            **self._health(target_dist, values, vt.pg_advantages, activations, relu_maps, valid),
        }
        if cfg.ppo_clip:  # PPO's clip fraction: how far the reused passes have moved the policy
            clipped = (jnp.abs(rhos - 1.0) > cfg.ppo_clip).astype(jnp.float32)
            metrics["policy/clip_fraction"] = losses.masked_average(clipped, valid)
        if return_rms is not None:
            # This batch's discounted returns in reward units, merged into the statistics by `update`.
            returns = (vt.targets * return_rms).reshape(-1, 1)
            metrics[RETURN_BATCH] = normalization.batch_stats(returns, valid.reshape(-1))
            metrics["return/rms"] = return_rms
        return total, metrics

    def _health(self, target_dist, values, advantages, activations, relu_maps, valid) -> dict[str, jax.Array]:
        """Learning-health scalars (seedq.agents.health) of one batch: all [T, B] but
        the distribution parameters [T, B, ...] and the torso's activations and maps."""
        entropy, _ = health.masked_mean_std(self.policy.entropy(target_dist), valid)
        value_mean, value_std = health.masked_mean_std(values, valid)
        abs_advantage, _ = health.masked_mean_std(jnp.abs(advantages), valid)
        out = {
            "policy/entropy": entropy,
            "value/mean": value_mean,
            "value/std": value_std,
            "advantage/abs_mean": abs_advantage,
        }
        if "logits" in target_dist:
            out["policy/logit_spread_across_states"] = health.spread_across_states(
                target_dist["logits"], valid
            )
        if "log_std" in target_dist:
            # Box: the std itself, which entropy summed over d dimensions hides
            # (walker-walk runs that stopped exploring had driven it to ~0.2).
            out["policy/std"], out["policy/std_min"] = health.geometric_mean_and_min_std(target_dist["log_std"])
        # tanh MLP torsos, per layer; "torso/saturation": the last layer of the
        # policy's torso, the features the heads read.
        for torso, layers in activations.items():
            for i, layer in enumerate(layers):
                out[f"torso/saturation/{torso}/{i}"] = health.saturation([layer])
        if activations:
            out["torso/saturation"] = health.saturation([next(iter(activations.values()))[-1]])
        # ReLU CNNs, per layer over the batch's frames: a dead first layer ends learning.
        for i, feature_maps in enumerate(relu_maps):
            out[f"torso/dead_channels/{i}"] = health.dead_channels(feature_maps)
        return out

    def update(self, state: LearnerState, batch: dict[str, jax.Array]):
        grads, metrics = jax.grad(self.loss, has_aux=True)(state.params, batch, state.step)
        updates, opt_state, learning_rate = self.optimizer.update(grads, state.opt_state, state.params, state.step)
        params = optax.apply_updates(state.params, updates)
        if self.normalize:  # the statistics get no gradient; they are merged here
            # The lookahead's steps are counted with the unrolls that train on them.
            obs = batch["obs"][:, : self.config.unroll_length + 1].reshape(-1, int(np.prod(self.spec.obs_shape)))
            stats = normalization.update_stats(self._split(state.params)[1], obs)
            params = {**params, "obs_stats": stats._asdict()}
        if self.config.normalize_returns:
            stats = normalization.merge(
                normalization.RunningStats(**state.params["return_stats"]), metrics.pop(RETURN_BATCH)
            )
            params = {**params, "return_stats": stats._asdict()}
        metrics["grad_norm"] = optax.tree.norm(grads)
        metrics["learning_rate"] = learning_rate
        return LearnerState(params, opt_state, state.step + 1), metrics
