"""Inference precision as a mode of whoever runs an agent's acting function.

`InferencePrecision(agent, spec, precision)` wraps *any* agent: it finds the
Dense/Conv layers the agent's `act` applies (by tracing `act` once,
`find_layers_in`), turns the learner's fp32 inference parameters into the
published form (`publish`: bf16 casts, int8 kernels) and runs `act` with every
such layer at the chosen precision (`act`: method interception, see
`seedq.quant.intercept`). The agents themselves only ever see fp32 code: the
V-trace MLP/CNN/LSTM networks and R2D2's LSTM and dueling head are covered by
the same rule. The SEED server, the IMPALA actors (and the learner's
parameter publisher for them) and evaluation all act through this one object.

int8 "where it pays": `plan_int8` measures per padded batch size which layers
int8 speeds up (`seedq.quant.plan`) and fixes that plan; until then (and with
`force`) every quantizable layer runs in int8.
"""

from __future__ import annotations

import jax
import numpy as np

from seedq.quant import layers as ql
from seedq.quant.intercept import run_at_precision
from seedq.quant import plan as qplan
from seedq.quant import quantize as qz


def example_act_args(agent, spec, n: int = 1):
    """Abstract (params, rng, obs, first, core, inputs) of one `act` call on n envs."""
    params = jax.eval_shape(
        lambda key: agent.inference_params(agent.init(key)), jax.ShapeDtypeStruct((2,), np.uint32)
    )
    obs = np.zeros((n, *spec.obs_shape), spec.obs_dtype)
    return (params, jax.random.PRNGKey(0), obs, np.ones(n, bool),
            agent.initial_core_state(n), agent.actor_inputs(np.arange(n)))


class InferencePrecision:
    def __init__(self, agent, spec, precision: str = "fp32"):
        if precision not in qz.PRECISIONS:
            raise ValueError(f"precision={precision!r}: choose one of {', '.join(qz.PRECISIONS)}")
        self.agent = agent
        self.spec = spec
        self.precision = precision
        self.layers = ql.find_layers_in(agent.act, *example_act_args(agent, spec))
        self.plan: qplan.Int8Plan | None = None
        self._set_publish(ql.quantizable_paths(self.layers))

    def _set_publish(self, layers) -> None:
        precision = self.precision
        self._publish = jax.jit(lambda params: qz.publish(params, precision, layers))

    def plan_int8(self, params, batch_sizes, *, force: bool = False) -> qplan.Int8Plan | None:
        """int8 only: measures which layers int8 speeds up at each batch size
        (`force`: every quantizable layer) and publishes and runs that plan from
        now on. `params`: the agent's fp32 inference parameters. None otherwise."""
        if self.precision != "int8":
            return None
        self.plan = qplan.make_plan(self.layers, params, batch_sizes, force=force)
        self._set_publish(self.plan.publish_layers())
        return self.plan

    def publish(self, params):
        """The agent's fp32 inference parameters -> what `act` runs on."""
        if self.precision == "fp32":
            return params
        return self._publish(params)

    def act(self, params, rng, obs, first, core_state, inputs):
        """`agent.act` at this precision on published `params`. Pure and jittable;
        the int8 plan's layer set is chosen by the (static) batch size."""
        int8_layers = None if self.plan is None else self.plan.layers_for(obs.shape[0])
        return run_at_precision(
            self.agent.act, self.precision, params, rng, obs, first, core_state, inputs,
            int8_layers=int8_layers,
        )

    def greedy_act(self, params, rng, obs, first, core_state, inputs):
        """`act` with the agent's greedy actions (evaluation). Pure and jittable."""
        actions, outputs, core_state, rng = self.act(params, rng, obs, first, core_state, inputs)
        return self.agent.greedy_actions(outputs).astype(actions.dtype), outputs, core_state, rng
