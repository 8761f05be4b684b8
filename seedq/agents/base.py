"""The one small interface through which an agent plugs into the learner.

The acting core (`seedq.rollout.core`: the SEED server, IMPALA actors,
evaluation) calls `act` (batched, jitted, padded) at the inference precision
(`seedq.quant.mode`: agents only ever see fp32 code), keeps the agent's
recurrent `core_state` per env, and stores what `act` returns per step in the
sequence under construction. Finished sequences go to the agent's
`BatchSource` (a FIFO for V-trace, prioritized replay for R2D2), the learner
calls `update` on the batches it yields, and publishes `inference_params(state)`
(at the server's precision) after every step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seedq.schema import SequenceSpec, StepFieldSpec

Params = Any


class BatchSource:
    """Between the server's sequence queue and the training step. Subclasses
    implement `next_batch`; the other hooks have defaults here."""

    batch_size: int  # sequences per batch

    def next_batch(self, stop) -> Any | None:
        """The next training batch, or None once `stop` (threading.Event) is set."""
        raise NotImplementedError

    def after_update(self, batch, metrics) -> None:
        """Feedback from the update (e.g. new priorities); default: none."""

    def example_batch(self) -> dict[str, np.ndarray] | None:
        """A batch of the update's shapes, to compile the update before data
        arrives; None (default): the learner makes one of zeros."""
        return None

    def stats(self) -> dict[str, Any]:
        """Extra TensorBoard scalars (e.g. the replay's size); default: none."""
        return {}


class Agent:
    """The interface every agent implements. The methods without a body here
    are the agent's own; the optional hooks have their defaults here, so the
    acting core and the learner call every hook without asking what the
    agent is."""

    # The network's torso (reports and benchmarks name it).
    network_name: str = ""
    # Whether the batches carry replay's importance weights and indices
    # ("weights", "indices"), which the update reads.
    samples_replay: bool = False
    # Whether the network is a recurrent Q-network, whose outputs are
    # (Q-values, carry), rather than a policy whose outputs hold "logits".
    q_network: bool = False
    # The action choices an evaluation of the policy can make: greedy, sampled
    # from the policy, epsilon-greedy.
    evaluation_modes: tuple[str, ...] = ("greedy", "sample", "eps")

    def init(self, rng) -> Any:
        """Learner state (parameters, optimiser state, counters)."""
        raise NotImplementedError

    def inference_params(self, learner_state) -> Params:
        """The fp32 parameters `act` runs on (the precision mode publishes them)."""
        raise NotImplementedError

    def sequence_spec(self) -> SequenceSpec:
        raise NotImplementedError

    def act_outputs(self) -> dict[str, StepFieldSpec]:
        """Extra per-step arrays `act` returns for the learner (e.g. behaviour logits)."""
        raise NotImplementedError

    def initial_core_state(self, n: int) -> dict[str, np.ndarray]:
        """Recurrent state of `n` fresh envs ({} for feed-forward agents)."""
        raise NotImplementedError

    def actor_inputs(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Per-env constants `act` needs (e.g. R2D2's per-env epsilon), by env slot."""
        raise NotImplementedError

    def act(self, params, rng, obs, first, core_state, inputs):
        """Pure, jittable, batched over N envs.

        (params, rng, obs [N, *obs], first [N] bool, core_state {k: [N, ...]},
        inputs {k: [N, ...]}) -> (actions [N, ...], outputs {k: [N, ...]},
        new core_state, new rng). `first` marks the first step of an episode:
        recurrent agents reset their state there.
        """
        raise NotImplementedError

    def update(self, learner_state, batch) -> tuple[Any, dict[str, Any]]:
        """Pure, jittable: one optimiser step on a training batch."""
        raise NotImplementedError

    def greedy_actions(self, outputs: dict[str, Any]):
        """The greedy policy's actions from `act`'s outputs (evaluation)."""
        raise NotImplementedError

    def make_batch_source(self, queue, batch_size: int | None = None) -> BatchSource:
        """`batch_size`: sequences per batch when not the config's (a multi-host
        learner's process takes its share of the global batch)."""
        raise NotImplementedError

    # --- optional hooks ---

    def store_mask(self, slots: np.ndarray) -> np.ndarray | None:
        """bool [n]: False for env slots whose steps are not recorded into
        sequences at all (R2D2's evaluation envs); None (default): all are."""
        return None

    def report_mask(self, slots: np.ndarray) -> np.ndarray | None:
        """bool [n]: False for env slots whose episodes do not count in the
        run's return (R2D2's most exploring envs); None (default): all do."""
        return None

    def check_host_memory(self) -> None:
        """ValueError (one line) when what the agent will hold in host memory
        (R2D2's replay) cannot fit; `seedq train` calls it before any actor
        process starts. Default: nothing to check."""


class FifoBatches(BatchSource):
    """On-policy batch source: sequences are trained on in arrival order, each
    batch `reuse` times (1: once).

    `pool` > 1 trains as PPO's epochs do: it takes `pool` batches' worth of
    sequences at once, then makes `reuse` passes over them, each pass in
    `pool` batches of `batch_size` sequences drawn in a new random order, so a
    sequence's repeated uses are spread over other data instead of coming in a
    row. The updates per frame are the same as with `pool` 1.
    """

    def __init__(self, queue, batch_size: int, reuse: int = 1, pool: int = 1, seed: int = 0):
        if reuse < 1:
            raise ValueError(f"reuse must be >= 1, got {reuse}")
        if pool < 1:
            raise ValueError(f"pool must be >= 1, got {pool}")
        self.queue = queue
        self.batch_size = batch_size
        self.reuse = reuse
        self.pool = pool
        self._rng = np.random.default_rng(seed)
        self._pending: list = []  # batches still to train on, next last

    def next_batch(self, stop):
        if self._pending:
            return self._pending.pop()
        while not stop.is_set():
            sequences = self.queue.get(self.batch_size * self.pool, timeout=0.2)
            if sequences is not None:
                self._pending = self._schedule(sequences)
                return self._pending.pop()
        return None

    def _schedule(self, sequences: dict) -> list:
        """The batches to train on from `sequences` ([pool * batch_size, ...]
        per field), in reverse order of use."""
        if self.pool == 1:
            return [sequences] * self.reuse
        batches = []
        for _ in range(self.reuse):
            order = self._rng.permutation(self.batch_size * self.pool)
            for part in np.split(order, self.pool):
                batches.append({name: array[part] for name, array in sequences.items()})
        return batches[::-1]

    def after_update(self, batch, metrics) -> None:
        pass
