"""The one small interface through which an agent plugs into the learner.

The server calls `act` (batched, jitted, padded) for every inference batch and
stores what it returns per step in the unroll under construction; the learner
calls `update` on batches of finished unrolls and publishes
`inference_params(state)` to the server after every step.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import numpy as np

Params = Any
ArrayTree = Any


class StepFieldSpec(NamedTuple):
    """Shape (per env) and dtype of one per-step array the server records."""

    shape: tuple[int, ...]
    dtype: Any


class Agent(Protocol):
    def init(self, rng) -> Any:
        """Learner state (parameters, optimiser state, counters)."""

    def inference_params(self, learner_state) -> Params:
        """The parameters the inference server uses (e.g. quantised)."""

    def act_outputs(self) -> dict[str, StepFieldSpec]:
        """Extra per-step arrays `act` returns for the learner (e.g. behaviour logits)."""

    def act(self, params, rng, obs, first) -> tuple[Any, dict[str, Any], Any]:
        """Pure, jittable: [N, *obs] observations -> (actions [N, ...], outputs, new rng)."""

    def update(self, learner_state, batch: dict[str, np.ndarray]) -> tuple[Any, dict[str, Any]]:
        """Pure, jittable: one optimiser step on a batch of unrolls [B, T+1, ...]."""
