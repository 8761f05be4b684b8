"""The R2D2 agent's section and its checks."""

from __future__ import annotations

import dataclasses
import typing

from seedq.config.checks import (
    NETWORK_CHOICES, check_choice, check_non_negative, check_positive, check_unit_interval,
)
from seedq.config.optimizer import OptimizerConfig


@dataclasses.dataclass(frozen=True)
class R2D2Config(OptimizerConfig):
    """R2D2 (recurrent Q-learning, prioritized sequence replay) hyperparameters
    (and the optimizer's, `OptimizerConfig`).

    Sequences are burn_in + trace_length + n_step steps long and overlap by
    burn_in + n_step, so every step is in exactly one sequence's loss region.
    """

    # The fields that set the learner's work per frame (benchmarks echo them).
    WORK_PER_FRAME_FIELDS: typing.ClassVar[tuple[str, ...]] = (
        "batch_size", "burn_in", "trace_length", "n_step", "replay_ratio")
    # No clip of its own: R2D2 trains on the env's rewards (Atari's [-1, 1]
    # clip aside) through its value rescaling.
    reward_clip: typing.ClassVar[float] = 0.0

    # Steps that only warm up the LSTM state (no loss, no gradient) before the loss region.
    burn_in: int = 10
    # Steps per sequence trained on (the loss region).
    trace_length: int = 20
    # Steps summed before bootstrapping (n-step double Q-learning).
    n_step: int = 5
    discount: float = 0.99  # reward discount per step (gamma)
    # Sequences per train step.
    batch_size: int = 16
    # Online parameters are copied to the target network every this many updates.
    target_update_period: int = 200
    # Torso: auto (mlp for vectors; for images [H, W, C] small_cnn below 36
    # pixels a side, as MinAtar's 10x10, else nature_cnn), mlp, small_cnn,
    # nature_cnn or impala_cnn.
    network: str = "auto"
    # Sizes of the MLP torso's layers (before the LSTM).
    hidden_sizes: tuple[int, ...] = (64,)
    lstm_size: int = 64  # LSTM cells of the recurrent core
    # Width of the dueling head's value and advantage layers.
    head_hidden_size: int = 64
    # false replaces the LSTM by a dense layer of the same width (feed-forward control).
    use_lstm: bool = True
    # Epsilon of the value rescaling h(x) = sign(x)(sqrt(|x|+1)-1) + eps x.
    value_rescaling_eps: float = 1e-3
    # Replay capacity in sequences; the oldest are evicted beyond it (FIFO).
    # A small replay fills with the successful episodes of a solved run only,
    # which it then unlearns from. Full, it holds 20000 x (burn_in + trace_length + n_step) observations:
    # ~0.3 GB of MinAtar's 10x10x4, ~5 GB of Atari's 84x84 frames.
    replay_capacity: int = 20000
    # Training starts once replay holds this many sequences.
    min_replay_size: int = 200
    # Sampling probability is proportional to priority ** priority_exponent.
    priority_exponent: float = 0.9
    # Importance weights (N P(i)) ** -importance_exponent, divided by the batch max.
    importance_exponent: float = 0.6
    # Sequence priority = eta * max|td| + (1 - eta) * mean|td|.
    priority_eta: float = 0.9
    # Average number of times each sequence is sampled (0: no control; the
    # learner samples as fast as it can and every sequence is inserted).
    replay_ratio: float = 8.0
    # Per-env exploration epsilon_i = base ** (1 + alpha * i / (N - 1)) over the
    # N = num_actors * envs_per_actor - eval_envs training envs (Ape-X / R2D2).
    epsilon_base: float = 0.4
    epsilon_alpha: float = 7.0  # the alpha of the per-env epsilon above
    # The first `eval_envs` env slots act with `eval_epsilon` and their steps
    # are not stored in replay (their episodes still count in the returns).
    eval_envs: int = 0
    eval_epsilon: float = 0.001  # the epsilon of the eval_envs slots
    # The run's return and episode count (progress line, --target-return, summary, curves)
    # counts the episodes of the envs acting with epsilon <= this (those of the
    # least-exploring env when none does), so it measures the near-greedy
    # policy, as DQN's evaluation epsilons of 0.001-0.05 do; the spread's most
    # exploring envs end the most episodes and would dominate a mean over all.
    # 1: every env.
    report_epsilon: float = 0.01
    # Save the replay (sequences, priorities, counters) with the newest
    # checkpoint and restore it on --resume; false: a resumed run refills an
    # empty replay (and nothing of it is saved).
    checkpoint_replay: bool = True

    @property
    def new_frames_per_train_step(self) -> float:
        """New env frames one train step consumes: each sequence's loss region
        of trace_length frames is sampled replay_ratio times."""
        return self.batch_size * self.trace_length / (self.replay_ratio or 1.0)

    def validate(self, num_envs: int) -> None:
        """`num_envs`: the run's envs (num_actors x envs_per_actor), of which eval_envs evaluate."""
        check_positive({f"r2d2.{name}": getattr(self, name) for name in (
            "trace_length", "n_step", "batch_size", "target_update_period",
            "lstm_size", "head_hidden_size", "replay_capacity", "min_replay_size",
        )})
        check_non_negative({f"r2d2.{name}": getattr(self, name) for name in (
            "burn_in", "replay_ratio", "priority_exponent", "importance_exponent", "value_rescaling_eps",
            "eval_envs",
        )})
        check_unit_interval({f"r2d2.{name}": getattr(self, name) for name in (
            "discount", "priority_eta", "epsilon_base", "eval_epsilon", "report_epsilon",
        )})
        self.check_optimizer("r2d2")
        check_choice("r2d2.network", self.network, NETWORK_CHOICES)
        if self.min_replay_size > self.replay_capacity:
            raise ValueError(
                f"r2d2.min_replay_size={self.min_replay_size} must be <= r2d2.replay_capacity={self.replay_capacity}"
            )
        if self.eval_envs >= num_envs:
            raise ValueError(
                f"r2d2.eval_envs={self.eval_envs} must be < num_actors * envs_per_actor "
                f"= {num_envs} (training envs are needed)"
            )
