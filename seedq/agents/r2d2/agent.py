"""R2D2 agent: recurrent Q-network, per-env epsilon-greedy acting on the
server, and n-step double Q-learning on prioritized sequence replay.

Sequence layout (from the server's unroll store), batch-major [B, L, ...]
with L = burn_in + trace_length + n_step (`sequence_spec`):

    steps  0 .. burn_in-1                 burn-in: only warm up the LSTM state
    steps  burn_in .. burn_in+trace-1     loss region: transitions trained on
    steps  burn_in+trace .. L-1           the last n: bootstrap targets only

Consecutive sequences of one env overlap by burn_in + n_step steps, so the
next sequence's loss region starts exactly where this one's ends: every step
is in the loss region of exactly one sequence, has its full burn-in before it
and its full n steps after it. The LSTM state the server acted from at step 0
is stored with each sequence ("core/c", "core/h", [B, H]) and is where both
the online and the target network start unrolling.

Step t holds x_t, the reward/flags that arrived *with* x_t (produced by
a_{t-1}) and a_t. Transition t (x_t --a_t--> x_{t+1}) has reward[t+1],
discount 0 if terminated[t+1], and stops n-step sums there or if
truncated[t+1] (bootstrapping from the final observation x_{t+1}). When x_t is
itself a final observation the env ignored a_t and reset: that transition is
out of the loss (and out of the priority). `first[t]` resets the LSTM.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from seedq import schema
from seedq.schema import EnvSpec, SequenceSpec, StepFieldSpec
from seedq.agents.base import Agent
from seedq.agents.frames import frame_stacker
from seedq.agents.networks import choose_network
from seedq.agents.optimizer import Optimizer
from seedq.agents.r2d2 import losses
from seedq.agents.r2d2.networks import RecurrentQNetwork
from seedq.config import R2D2Config
from seedq.process.host_memory import memory_available_bytes
from seedq.replay import check_replay_fits
from seedq.replay.prioritized import PrioritizedBatches, PrioritizedReplay

STEP_FIELDS = ("obs", "reward", "terminated", "truncated", "first", "action")


class LearnerState(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any
    step: jax.Array


def exploration_epsilons(
    slots: np.ndarray, num_envs: int, config: R2D2Config
) -> np.ndarray:
    """Per-slot epsilon: eval_epsilon for the first `eval_envs` slots, else Ape-X's spread.

    Slot s is env k = s mod num_envs. Training env j = k - eval_envs of
    M = num_envs - eval_envs gets base^(1 + alpha * j / (M - 1)) (base when M == 1):
    from 0.4 down to 0.4^8 ~ 0.00066 with the defaults.
    """
    k = np.asarray(slots, np.int64) % num_envs
    train = num_envs - config.eval_envs
    j = k - config.eval_envs
    exponent = 1.0 + config.epsilon_alpha * j / max(train - 1, 1)
    eps = np.power(config.epsilon_base, exponent)
    return np.where(j < 0, config.eval_epsilon, eps).astype(np.float32)


class R2D2Agent(Agent):
    """Plugs R2D2 into the learner through `seedq.agents.base.Agent`."""

    samples_replay = True
    q_network = True
    # Its behaviour is epsilon-greedy: there is no softmax to sample.
    evaluation_modes = ("greedy", "eps")

    def __init__(self, spec: EnvSpec, config: R2D2Config, num_envs: int, seed: int = 0,
                 frame_stack: int = 4, max_frames: int = 0):
        """`max_frames`: the run's budget (0: none), the anneal's horizon by default."""
        if not spec.discrete:
            raise ValueError(
                f"the r2d2 agent needs a Discrete action space; this env has {spec.action_text()}"
            )
        if num_envs <= config.eval_envs:
            raise ValueError(f"{num_envs} envs but r2d2.eval_envs={config.eval_envs}")
        self.spec = spec
        self.config = config
        self.num_envs = int(num_envs)
        self.seed = seed
        # Pixel envs: the last frame_stack - 1 frames are core state (stacked on the learner).
        self.frames = frame_stacker(spec.obs_shape, spec.obs_dtype, frame_stack)
        self.obs_shape = self.frames.stacked_shape if self.frames else tuple(spec.obs_shape)
        self.network_name = choose_network(config.network, self.obs_shape)
        self.network = RecurrentQNetwork(
            torso=self.network_name,
            num_actions=spec.num_actions,
            hidden_sizes=tuple(config.hidden_sizes),
            lstm_size=config.lstm_size,
            head_hidden_size=config.head_hidden_size,
            use_lstm=config.use_lstm,
        )
        self.optimizer = Optimizer(config, config.new_frames_per_train_step, max_frames)
        self.learning_rate = self.optimizer.learning_rate

    # --- acting (inference server) ---

    def sequence_spec(self) -> SequenceSpec:
        cfg = self.config
        return SequenceSpec(
            length=cfg.burn_in + cfg.trace_length + cfg.n_step, overlap=cfg.burn_in + cfg.n_step
        )

    def act_outputs(self) -> dict[str, StepFieldSpec]:
        # The greedy action (argmax Q), recorded per step; evaluation acts with it.
        return {"greedy_action": StepFieldSpec((), np.int32)}

    def initial_core_state(self, n: int) -> dict[str, np.ndarray]:
        core = self.frames.initial_core_state(n) if self.frames else {}
        if self.config.use_lstm:
            zeros = np.zeros((n, self.config.lstm_size), np.float32)
            core.update(c=zeros, h=zeros.copy())
        return core

    def actor_inputs(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        return {"epsilon": exploration_epsilons(slots, self.num_envs, self.config)}

    def report_mask(self, slots: np.ndarray) -> np.ndarray:
        """True for env slots whose episodes count in the run's return: those acting
        with epsilon <= r2d2.report_epsilon, or the least-exploring env's when none does."""
        every_env = exploration_epsilons(np.arange(self.num_envs), self.num_envs, self.config)
        cut = max(np.float32(self.config.report_epsilon), every_env.min())
        return exploration_epsilons(slots, self.num_envs, self.config) <= cut

    def store_mask(self, slots: np.ndarray) -> np.ndarray:
        """False for evaluation envs: the server does not record their steps."""
        return (np.asarray(slots, np.int64) % self.num_envs) >= self.config.eval_envs

    def act(self, params, rng, obs, first, core_state, inputs):
        """Epsilon-greedy on Q: (obs [N, ...], first [N], {c, h} [N, H], {epsilon [N]})
        -> (actions int32 [N], {"greedy_action": [N]}, new {c, h}, new rng)."""
        if self.frames:
            obs, core_state = self.frames.act(core_state, obs, first)
        carry = (core_state["c"], core_state["h"]) if self.config.use_lstm else None
        q, carry = self.network.apply(params, obs[None], first[None], carry)
        greedy = jnp.argmax(q[0], axis=-1).astype(jnp.int32)
        rng, explore_rng, action_rng = jax.random.split(rng, 3)
        n = obs.shape[0]
        explore = jax.random.uniform(explore_rng, (n,)) < inputs["epsilon"]
        random_actions = jax.random.randint(action_rng, (n,), 0, self.spec.num_actions, jnp.int32)
        actions = jnp.where(explore, random_actions, greedy)
        new_core = {**core_state, "c": carry[0], "h": carry[1]} if self.config.use_lstm else core_state
        return actions, {"greedy_action": greedy}, new_core, rng

    def greedy_actions(self, outputs: dict[str, jax.Array]) -> jax.Array:
        """The greedy policy (evaluation): argmax Q, whatever the env's epsilon."""
        return outputs["greedy_action"]

    # --- replay ---

    def check_host_memory(self) -> None:
        """ValueError when the replay and its checkpoint copy cannot fit in memory."""
        cfg = self.config
        check_replay_fits(cfg.replay_capacity, schema.sequence_bytes(self, self.spec),
                          2 if cfg.checkpoint_replay else 1, memory_available_bytes())

    def make_batch_source(self, queue, batch_size: int | None = None) -> PrioritizedBatches:
        cfg = self.config
        self.check_host_memory()
        replay = PrioritizedReplay(
            cfg.replay_capacity,
            schema.stored_sequence_shapes(self, self.spec),
            priority_exponent=cfg.priority_exponent,
            importance_exponent=cfg.importance_exponent,
            seed=self.seed,
        )
        return PrioritizedBatches(
            queue,
            replay,
            batch_size=batch_size or cfg.batch_size,
            min_size=cfg.min_replay_size,
            replay_ratio=cfg.replay_ratio,
        )

    # --- learning ---

    def init(self, rng: jax.Array) -> LearnerState:
        obs = jnp.zeros((1, 1, *self.obs_shape), self.spec.obs_dtype)
        first = jnp.ones((1, 1), bool)
        params = self.network.init(rng, obs, first, self.network.initial_carry(1))
        return LearnerState(
            params=params,
            target_params=jax.tree.map(jnp.copy, params),
            opt_state=self.optimizer.init(params),
            step=jnp.zeros((), jnp.int32),
        )

    def inference_params(self, state: LearnerState):
        return state.params

    def _initial_carry(self, batch):
        if not self.config.use_lstm:
            return None
        return batch["core/c"], batch["core/h"]

    def _online_q(self, params, obs, first, carry):
        """The online network's Q-values [trace + n, B, A] for steps burn_in .. L-1
        of time-major `obs` [L, B, ...], `first` [L, B].

        Only the loss region's Q-values (the first `trace`) take a gradient:
        the last n steps' Q-values only select the bootstrap actions (a
        stop-gradient in the target), so they, like the burn-in, run as a
        forward pass on frozen parameters, and the backward pass covers
        trace_length of the L steps (the same gradient as through all of them).
        """
        burn_in, trace = self.config.burn_in, self.config.trace_length
        frozen_params = jax.lax.stop_gradient(params)
        if burn_in:
            _, carry = self.network.apply(frozen_params, obs[:burn_in], first[:burn_in], carry)
        carry = jax.lax.stop_gradient(carry)
        end = burn_in + trace
        q_trained, carry = self.network.apply(params, obs[burn_in:end], first[burn_in:end], carry)
        q_selectors, _ = self.network.apply(frozen_params, obs[end:], first[end:], jax.lax.stop_gradient(carry))
        return jnp.concatenate([q_trained, q_selectors], axis=0)

    def loss(self, params, target_params, batch):
        """Importance-weighted R2D2 loss on batch-major sequences [B, L, ...].

        Returns (loss, (metrics, priorities [B])).
        """
        cfg = self.config
        burn_in, trace = cfg.burn_in, cfg.trace_length
        tm = {k: jnp.swapaxes(batch[k], 0, 1) for k in STEP_FIELDS}  # [L, B, ...]
        if self.frames:
            tm["obs"] = jnp.swapaxes(self.frames.unroll(batch), 0, 1)
        carry = self._initial_carry(batch)

        q_online = self._online_q(params, tm["obs"], tm["first"], carry)
        q_target, _ = self.network.apply(
            target_params, tm["obs"], tm["first"], self._initial_carry(batch)
        )
        q_target = q_target[burn_in:]  # [trace + n, B, A]

        # Transitions burn_in .. L-2 (trace + n - 1 of them); the first `trace` are trained on.
        reward = tm["reward"][burn_in + 1 :].astype(jnp.float32)
        terminated = tm["terminated"][burn_in + 1 :]
        ended = terminated | tm["truncated"][burn_in + 1 :]
        discount = cfg.discount * (1.0 - terminated.astype(jnp.float32))
        out = losses.transformed_n_step_double_q(
            q_tm1=q_online[:-1],
            a_tm1=tm["action"][burn_in:-1].astype(jnp.int32),
            selector_q_t=q_online[1:],
            target_q_t=q_target[1:],
            r_t=reward,
            discount_t=discount,
            stop_t=ended,
            n=cfg.n_step,
            eps=cfg.value_rescaling_eps,
        )
        td = out.td_error[:trace]
        final = tm["terminated"][burn_in : burn_in + trace] | tm["truncated"][burn_in : burn_in + trace]
        valid = 1.0 - final.astype(jnp.float32)  # x_t final: the env reset instead of a_t
        loss = losses.weighted_sequence_loss(td, valid, batch["weights"])
        abs_td = jnp.abs(jax.lax.stop_gradient(td))
        priorities = losses.sequence_priorities(abs_td, valid, cfg.priority_eta)
        count = jnp.maximum(jnp.sum(valid), 1.0)
        q_taken = out.target[:trace] - td
        metrics = {
            "loss/total": loss,
            "td/abs_mean": jnp.sum(abs_td * valid) / count,
            "td/abs_max": jnp.max(abs_td * valid),
            "q/mean": jnp.sum(q_taken * valid) / count,
            "q/target_mean": jnp.sum(out.target[:trace] * valid) / count,
            "priority/batch_mean": jnp.mean(priorities),
            "is_weight/batch_mean": jnp.mean(batch["weights"]),
        }
        return loss, (metrics, priorities)

    def update(self, state: LearnerState, batch):
        grads, (metrics, priorities) = jax.grad(self.loss, has_aux=True)(
            state.params, state.target_params, batch
        )
        updates, opt_state, learning_rate = self.optimizer.update(grads, state.opt_state, state.params, state.step)
        params = optax.apply_updates(state.params, updates)
        step = state.step + 1
        target_params = optax.periodic_update(
            params, state.target_params, step, self.config.target_update_period
        )
        metrics["grad_norm"] = optax.tree.norm(grads)
        metrics["learning_rate"] = learning_rate
        # Non-scalar: consumed (and removed) by PrioritizedBatches.after_update.
        metrics["priorities"] = priorities
        return LearnerState(params, target_params, opt_state, step), metrics
