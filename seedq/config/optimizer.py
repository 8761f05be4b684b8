"""The optimizer's fields, which both agents' sections have (`vtrace.*` and
`r2d2.*` inherit them), and the one resolution of the anneal's -1 horizon."""

from __future__ import annotations

import dataclasses

from seedq.config.checks import check_positive

# The anneal's horizon (learning_rate_decay_frames -1) for a run without
# max_frames: twice the suite's longest non-Atari budget (5M). Past it the
# rate is 0, so a longer run needs --max-frames (or an explicit horizon) to
# keep learning.
DEFAULT_DECAY_FRAMES = 10_000_000


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """Gradients clipped to a global norm, then Adam at an annealed rate
    (seedq.agents.optimizer builds it for either agent)."""

    # Adam's learning rate (the start of the anneal below).
    learning_rate: float = 1e-3
    # > 0: the learning rate falls linearly from learning_rate to 0 over this
    # many new env frames (a train step counts V-trace's batch_size x
    # unroll_length / reuse of them, R2D2's batch_size x trace_length /
    # replay_ratio), then stays 0; 0: constant; -1: over the run's budget,
    # max_frames, or DEFAULT_DECAY_FRAMES when the run has none. Annealing
    # keeps a solved run from unlearning.
    learning_rate_decay_frames: int = -1
    adam_eps: float = 1e-8  # Adam's epsilon
    max_grad_norm: float = 10.0  # gradients are clipped to this global norm

    def check_optimizer(self, section: str) -> None:
        """ValueError naming the first optimizer field of `section` ("vtrace") out of range."""
        check_positive({f"{section}.learning_rate": self.learning_rate})
        if self.learning_rate_decay_frames < -1:
            raise ValueError(f"{section}.learning_rate_decay_frames={self.learning_rate_decay_frames}: "
                             "must be >= 0, or -1 (over the run's max_frames)")

    def decay_frames_for(self, max_frames: int) -> int:
        """The anneal's horizon in env frames (0: a constant rate) for a run of
        `max_frames` (0: no budget): -1 resolved, the only place that does."""
        if self.learning_rate_decay_frames != -1:
            return self.learning_rate_decay_frames
        return max_frames or DEFAULT_DECAY_FRAMES
