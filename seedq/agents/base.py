"""The one small interface through which an agent plugs into the learner.

The acting core (`seedq.acting.core`: the SEED server, IMPALA actors,
evaluation) calls `act` (batched, jitted, padded) at the inference precision
(`seedq.quant.mode`: agents only ever see fp32 code), keeps the agent's
recurrent `core_state` per env, and stores what `act` returns per step in the
sequence under construction. Finished sequences go to the agent's
`BatchSource` (a FIFO for V-trace, prioritized replay for R2D2), the learner
calls `update` on the batches it yields, and publishes `inference_params(state)`
(at the server's precision) after every step.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from seedq.schema import SequenceSpec, StepFieldSpec

Params = Any
ArrayTree = Any


class BatchSource(Protocol):
    """Between the server's sequence queue and the training step."""

    def next_batch(self, stop) -> Any | None:
        """The next training batch, or None once `stop` (threading.Event) is set."""

    def after_update(self, batch, metrics) -> None:
        """Feedback from the update (e.g. new priorities)."""


class Agent(Protocol):
    """Optional hooks the acting core and learner look for with getattr:

    * `store_mask(slots) -> bool [n]`: False for env slots whose steps are not
      recorded into sequences at all (R2D2's evaluation envs); default: all.
    * `report_mask(slots) -> bool [n]`: False for env slots whose episodes do
      not count in the run's return (R2D2's most exploring envs); default: all.
    * `greedy_actions(outputs)`: the greedy policy from `act`'s outputs
      (evaluation; an agent without it can only be evaluated with sampling).
    * on the batch source: `example_batch()` (compiles the update before data
      arrives) and `stats()` (extra TensorBoard scalars, e.g. replay size).
    """

    def init(self, rng) -> Any:
        """Learner state (parameters, optimiser state, counters)."""

    def inference_params(self, learner_state) -> Params:
        """The fp32 parameters `act` runs on (the precision mode publishes them)."""

    def sequence_spec(self) -> SequenceSpec: ...

    def act_outputs(self) -> dict[str, StepFieldSpec]:
        """Extra per-step arrays `act` returns for the learner (e.g. behaviour logits)."""

    def initial_core_state(self, n: int) -> dict[str, np.ndarray]:
        """Recurrent state of `n` fresh envs ({} for feed-forward agents)."""

    def actor_inputs(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Per-env constants `act` needs (e.g. R2D2's per-env epsilon), by env slot."""

    def act(self, params, rng, obs, first, core_state, inputs):
        """Pure, jittable, batched over N envs.

        (params, rng, obs [N, *obs], first [N] bool, core_state {k: [N, ...]},
        inputs {k: [N, ...]}) -> (actions [N, ...], outputs {k: [N, ...]},
        new core_state, new rng). `first` marks the first step of an episode:
        recurrent agents reset their state there.
        """

    def update(self, learner_state, batch) -> tuple[Any, dict[str, Any]]:
        """Pure, jittable: one optimiser step on a training batch."""

    # `batch_size`: sequences per batch when not the config's (a multi-host
    # learner's process takes its share of the global batch).
    def make_batch_source(self, queue, batch_size: int | None = None) -> BatchSource: ...


class FifoBatches:
    """On-policy batch source: sequences are trained on in arrival order, each
    batch `reuse` times in a row (1: once)."""

    def __init__(self, queue, batch_size: int, reuse: int = 1):
        if reuse < 1:
            raise ValueError(f"reuse must be >= 1, got {reuse}")
        self.queue = queue
        self.batch_size = batch_size
        self.reuse = reuse
        self._last = None
        self._uses_left = 0

    def next_batch(self, stop):
        if self._uses_left:
            self._uses_left -= 1
            return self._last
        while not stop.is_set():
            batch = self.queue.get(self.batch_size, timeout=0.2)
            if batch is not None:
                if self.reuse > 1:
                    self._last, self._uses_left = batch, self.reuse - 1
                return batch
        return None

    def after_update(self, batch, metrics) -> None:
        pass
