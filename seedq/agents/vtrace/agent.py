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

from seedq import quant
from seedq.agents.base import FifoBatches, SequenceSpec, StepFieldSpec
from seedq.agents.networks import ActorCritic  # moved to networks.py; re-exported here
from seedq.agents.vtrace import losses
from seedq.config import VTraceConfig
from seedq.wire.codec import EnvSpec


class LearnerState(NamedTuple):
    params: Any
    opt_state: Any
    step: jax.Array


def _flatten_obs(obs: jax.Array, leading: int) -> jax.Array:
    """[*lead, *obs_shape] -> [*lead, D] float32."""
    return obs.reshape(obs.shape[:leading] + (-1,)).astype(jnp.float32)


class VTraceAgent:
    """Plugs V-trace into the learner through `seedq.agents.base.Agent`."""

    def __init__(self, spec: EnvSpec, config: VTraceConfig, precision: str = "fp32"):
        if precision not in quant.PRECISIONS:
            raise ValueError(f"precision={precision!r}: choose one of {', '.join(quant.PRECISIONS)}")
        if not spec.discrete:
            raise ValueError(
                f"the vtrace agent needs a Discrete action space; this env has {spec.action_text()}"
            )
        self.spec = spec
        self.config = config
        self.network = ActorCritic(spec.num_actions, tuple(config.hidden_sizes))
        self.optimizer = optax.chain(
            optax.clip_by_global_norm(config.max_grad_norm),
            optax.adam(config.learning_rate, eps=config.adam_eps),
        )
        # Inference precision (training stays fp32): which layers the server
        # runs in int8, and the jitted fp32 -> published conversion.
        self.precision = precision
        dummy = jnp.zeros((1, int(np.prod(spec.obs_shape))), jnp.float32)
        layers = quant.quantizable_paths(quant.find_layers(self.network, dummy))
        self._publish = jax.jit(lambda params: quant.publish(params, precision, layers))

    # --- acting (inference server) ---

    def sequence_spec(self) -> SequenceSpec:
        # T transitions plus the bootstrap observation, shared with the next unroll.
        return SequenceSpec(length=self.config.unroll_length + 1, overlap=1)

    def act_outputs(self) -> dict[str, StepFieldSpec]:
        return {"logits": StepFieldSpec((self.spec.num_actions,), np.float32)}

    def initial_core_state(self, n: int) -> dict[str, np.ndarray]:
        return {}  # feed-forward

    def actor_inputs(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        return {}

    def make_batch_source(self, queue) -> FifoBatches:
        return FifoBatches(queue, self.config.batch_size)

    def init(self, rng: jax.Array) -> LearnerState:
        dummy = jnp.zeros((1, int(np.prod(self.spec.obs_shape))), jnp.float32)
        params = self.network.init(rng, dummy)
        return LearnerState(params, self.optimizer.init(params), jnp.zeros((), jnp.int32))

    def inference_params(self, state: LearnerState):
        """fp32 params, or their bf16 / int8 (quantized) form for the server."""
        if self.precision == "fp32":
            return state.params
        return self._publish(state.params)

    def act(self, params, rng, obs, first, core_state, inputs):
        """obs [N, *obs_shape] -> (actions int32 [N], {"logits": [N, A]}, {}, new rng)."""
        del first, inputs  # feed-forward policy: episode starts need no state reset
        rng, sample_rng = jax.random.split(rng)
        logits, _ = quant.apply(self.network, params, self.precision, _flatten_obs(obs, 1))
        actions = jax.random.categorical(sample_rng, logits).astype(jnp.int32)
        return actions, {"logits": logits}, core_state, rng

    def greedy_actions(self, outputs: dict[str, jax.Array]) -> jax.Array:
        """The greedy policy (evaluation): the most likely action under `act`'s logits."""
        return jnp.argmax(outputs["logits"], axis=-1).astype(jnp.int32)

    # --- learning ---

    def loss(self, params, batch: dict[str, jax.Array]):
        """Scalar V-trace loss and metrics on batch-major unrolls [B, T+1, ...]."""
        cfg = self.config
        tm = {k: jnp.swapaxes(v, 0, 1) for k, v in batch.items()}  # time-major [T+1, B, ...]
        chex.assert_rank([tm["reward"], tm["action"]], 2)
        logits, values = self.network.apply(params, _flatten_obs(tm["obs"], 2))

        actions = tm["action"][:-1]
        rewards = tm["reward"][1:]
        if cfg.reward_clip > 0:
            rewards = jnp.clip(rewards, -cfg.reward_clip, cfg.reward_clip)
        discounts = cfg.discount * (1.0 - tm["terminated"][1:].astype(jnp.float32))
        # x_t was a final observation: the env reset instead of taking a_t.
        valid = 1.0 - (tm["terminated"][:-1] | tm["truncated"][:-1]).astype(jnp.float32)

        target_logp = losses.categorical_log_prob(logits[:-1], actions)
        behaviour_logp = losses.categorical_log_prob(tm["logits"][:-1], actions)
        rhos = jnp.exp(target_logp - behaviour_logp) * valid

        vt = losses.vtrace(
            v_tm1=values[:-1],
            v_t=values[1:],
            r_t=rewards,
            discount_t=discounts,
            rho_tm1=rhos,
            lambda_=cfg.lambda_,
            clip_rho_threshold=cfg.clip_rho_threshold,
            clip_pg_rho_threshold=cfg.clip_pg_rho_threshold,
        )
        pg_loss = losses.policy_gradient_loss(logits[:-1], actions, vt.pg_advantages, valid)
        baseline_loss = losses.baseline_loss(values[:-1], vt.targets, valid)
        entropy_loss = losses.entropy_loss(logits[:-1], valid)
        total = pg_loss + cfg.baseline_cost * baseline_loss + cfg.entropy_cost * entropy_loss
        metrics = {
            "loss/total": total,
            "loss/policy": pg_loss,
            "loss/baseline": baseline_loss,
            "loss/entropy": entropy_loss,
            "rho/mean": jnp.sum(rhos * valid) / jnp.maximum(jnp.sum(valid), 1.0),
        }
        return total, metrics

    def update(self, state: LearnerState, batch: dict[str, jax.Array]):
        grads, metrics = jax.grad(self.loss, has_aux=True)(state.params, batch)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return LearnerState(params, opt_state, state.step + 1), metrics
