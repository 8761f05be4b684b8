"""R2D2's recurrent Q-network (flax linen): torso -> LSTM -> dueling head.

One module serves acting (a single step for N envs, T = 1) and learning
(T steps for B sequences): inputs are time-major [T, B, ...]. The torso and
the head run on all T*B steps at once; only the LSTM is scanned over time
(`nn.scan`). The recurrent state is reset to zeros at every step whose
`first` flag is set, before that step is processed, both when acting and when
unrolling stored sequences, so the state never carries across episodes.

With `use_lstm=False` the LSTM is replaced by a dense layer of the same width
(the feed-forward control for the partially observable check environment);
the network then has no recurrent state (carry None).

Every layer is an `nn.Dense` (the LSTM computes its four gates with a single
one), like the other networks in `seedq.agents.networks`.
"""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from seedq.agents.networks import (
    Carry, DuelingHead, ScannedLSTM, make_torso, merge_time_batch, split_time_batch,
)

class RecurrentQNetwork(nn.Module):
    """(obs [T, B, *obs], first [T, B], carry) -> (Q [T, B, A], carry after step T-1)."""

    num_actions: int
    hidden_sizes: tuple[int, ...] = (64,)
    lstm_size: int = 64
    head_hidden_size: int = 64
    use_lstm: bool = True
    torso: str = "mlp"

    @nn.compact
    def __call__(self, obs: jax.Array, first: jax.Array, carry: Optional[Carry]):
        T, B = obs.shape[:2]
        x = make_torso(self.torso, self.hidden_sizes)(merge_time_batch(obs))
        if self.use_lstm:
            carry, y = ScannedLSTM(self.lstm_size, name="lstm")(
                carry, (split_time_batch(x, T, B), first)
            )
            y = merge_time_batch(y)
        else:
            y = nn.relu(nn.Dense(self.lstm_size, name="feedforward")(x))
        q = DuelingHead(self.num_actions, self.head_hidden_size)(y)
        return split_time_batch(q, T, B), carry

    def initial_carry(self, batch_size: int) -> Optional[Carry]:
        if not self.use_lstm:
            return None
        zeros = jnp.zeros((batch_size, self.lstm_size), jnp.float32)
        return zeros, zeros
