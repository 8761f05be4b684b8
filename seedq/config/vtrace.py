"""The V-trace agent's section, its defaults for Box actions, and its checks."""

from __future__ import annotations

import dataclasses
import typing
import math

from seedq.config.checks import (
    NETWORK_CHOICES, check_choice, check_non_negative, check_positive, check_unit_interval,
)
from seedq.config.optimizer import OptimizerConfig


# Where the MLP torsos normalise their pre-activations (VTraceConfig.layer_norm).
LAYER_NORM_MODES = ("none", "first_layer", "all_layers")


@dataclasses.dataclass(frozen=True)
class VTraceConfig(OptimizerConfig):
    """IMPALA / V-trace hyperparameters (and the optimizer's, `OptimizerConfig`)."""

    # The fields that set the learner's work per frame (benchmarks echo them).
    WORK_PER_FRAME_FIELDS: typing.ClassVar[tuple[str, ...]] = ("batch_size", "unroll_length", "lookahead", "reuse")

    # Env steps per unroll trained on. Short unrolls and small batches give
    # many updates per frame.
    unroll_length: int = 10
    batch_size: int = 16  # unrolls per train step
    # > 0: every unroll carries this many more steps, whose rewards and values
    # lengthen V-trace's targets for the unroll_length trained steps (they are
    # trained on in the next unrolls): returns that reach past the unroll's
    # end without longer unrolls. The updates per frame and unrolls per batch
    # stay; the learner runs lookahead more forward passes per unroll (no
    # backward pass: they only set the targets), and the trained steps
    # reach the learner `lookahead` steps later (staler). 0 for Box actions.
    lookahead: int = 30
    # true: the targets' reach past the unroll grows from 0 to `lookahead`
    # steps as the learning rate anneals (the same horizon; the whole
    # lookahead when the rate is constant): short returns while the policy
    # learns fast, long ones as it settles. The learner's compute per update is
    # that of the whole lookahead from the start.
    grow_lookahead: bool = True
    discount: float = 0.99  # reward discount per step (gamma)
    lambda_: float = 1.0  # V-trace's lambda: 1 is the paper's targets, lower trades variance for bias
    clip_rho_threshold: float = 1.0  # importance weights of the value targets are clipped at this (rho bar)
    clip_pg_rho_threshold: float = 1.0  # importance weights of the policy gradient are clipped at this
    baseline_cost: float = 0.5  # weight of the value loss
    entropy_cost: float = 0.01  # weight of the entropy bonus
    # true: the entropy bonus falls to 0 with the learning rate (the same
    # linear anneal over learning_rate_decay_frames): it explores early and
    # lets the sampled policy, which the returns are measured on, sharpen as
    # learning ends.
    anneal_entropy_cost: bool = True
    # Training rewards are clipped to [-reward_clip, reward_clip] where the
    # learner records them (the acting core; returns are reported unclipped);
    # 0: no clipping, except Atari's [-1, 1] (atari.clip_rewards).
    reward_clip: float = 0.0
    # Rewards are multiplied by this (after clipping): keeps value targets, and
    # so the value loss's share of the clipped gradient norm, moderate on
    # dense-reward tasks, where large targets would saturate the shared tanh
    # torso (returns are reported unscaled).
    reward_scale: float = 0.1
    # Divide the training rewards (after reward_clip and reward_scale) by the
    # running root mean square of the discounted return (the V-trace targets,
    # in reward units), so value targets stay near unit scale on any env; the
    # statistics live in the parameters ("return_stats").
    normalize_returns: bool = False
    # Standardise the policy-gradient advantages over the batch's valid steps
    # (PPO's (A - mean) / std), so the policy's step size (and the entropy
    # bonus's share of it) does not depend on the reward scale.
    normalize_advantages: bool = False
    # Each batch of unrolls is trained on this many times in a row (sample
    # reuse: more updates per env frame, at that many times the learner's
    # compute per frame); ppo_clip bounds how far the passes move the policy.
    # 8 for Box actions, with reuse_pool (CONTINUOUS_VTRACE).
    reuse: int = 4
    # > 1: reuse as PPO's epochs: take this many batches' worth of unrolls at
    # once and make the `reuse` passes over them in shuffled batches of
    # batch_size unrolls, instead of `reuse` steps in a row on one batch. Same
    # updates per frame; the policy lags by up to pool x reuse updates. 1: off;
    # 4 with reuse 8 for Box actions (CONTINUOUS_VTRACE). The run's seed
    # orders the passes.
    reuse_pool: int = 1
    # > 0: the policy loss is PPO's clipped surrogate with this clip range, on
    # the ratio pi/mu to the behaviour policy and V-trace's advantages (APPO,
    # as in Sample Factory), instead of V-trace's policy gradient; it bounds
    # how far the repeated passes of `reuse` move the policy. 0: off.
    ppo_clip: float = 0.2
    # Torso: auto (mlp for vectors; for images [H, W, C] small_cnn below 36
    # pixels a side, as MinAtar's 10x10, else nature_cnn), mlp, small_cnn,
    # nature_cnn or impala_cnn.
    network: str = "auto"
    # Sizes of the MLP torso's layers.
    hidden_sizes: tuple[int, ...] = (64, 64)
    # An LSTM between torso and heads (state kept per env by the server).
    use_lstm: bool = False
    lstm_size: int = 256  # LSTM cells of the recurrent core
    # Continuous actions: initial log standard deviation of the Gaussian policy.
    initial_log_std: float = -0.5
    # Continuous actions: a floor under the Gaussian's std, in action units as
    # initial_log_std. The std is min_std + exp(log_std parameter), so it
    # slows towards the floor instead of collapsing. 0: no floor.
    min_std: float = 0.0
    # false: the value head gets a torso of its own (common for continuous
    # control), so value regression does not shape the policy's features.
    shared_torso: bool = True
    # Sizes of the value torso's layers when shared_torso is false (empty: as
    # hidden_sizes). A wider value MLP than the policy's is the on-policy
    # study's advice (Andrychowicz et al. 2020); 256,256 for Box actions
    # (CONTINUOUS_VTRACE).
    value_hidden_sizes: tuple[int, ...] = ()
    # Normalise vector observations by their running mean and std (learner-side
    # statistics, published with the parameters).
    normalize_observations: bool = False
    # LayerNorm in the MLP torsos (not the CNNs), before the tanh: none,
    # first_layer (where the observation comes in) or all_layers. Inputs of
    # different spreads (walker-walk's joint velocities beside its height,
    # LunarLander's positions beside its leg contacts) then neither saturate
    # the torso nor need statistics that move as the policy learns. The CNNs
    # (MinAtar, Atari) have none.
    layer_norm: str = "all_layers"
    # The Nature CNN's conv outputs normalised per channel over their
    # positions before the ReLU (NatureCNN.channel_norm), so that no channel
    # can go dark on every position of a frame. The other torsos have no such
    # layer and ignore it (on for pixel envs, which may pick impala_cnn).
    cnn_channel_norm: bool = False

    @property
    def new_frames_per_train_step(self) -> float:
        """New env frames one train step consumes: batch_size x unroll_length,
        each batch counted once however often `reuse` trains on it."""
        return self.batch_size * self.unroll_length / self.reuse

    def validate(self) -> None:
        check_choice("vtrace.layer_norm", self.layer_norm, LAYER_NORM_MODES)
        if not 0.0 <= self.min_std < math.exp(self.initial_log_std):
            raise ValueError(
                f"vtrace.min_std={self.min_std}: needs 0 <= min_std < exp(vtrace.initial_log_std) "
                f"= {math.exp(self.initial_log_std):.3g}, the std the policy starts at"
            )
        check_positive({
            "vtrace.unroll_length": self.unroll_length,
            "vtrace.batch_size": self.batch_size,
            "vtrace.lstm_size": self.lstm_size,
        })
        self.check_optimizer("vtrace")
        if self.reuse < 1:
            raise ValueError(f"vtrace.reuse={self.reuse}: must be >= 1")
        if self.reuse_pool < 1:
            raise ValueError(f"vtrace.reuse_pool={self.reuse_pool}: must be >= 1 (1: off)")
        if not 0.0 <= self.ppo_clip < 1.0:
            raise ValueError(f"vtrace.ppo_clip={self.ppo_clip}: must be in [0, 1) (0: off)")
        check_unit_interval({"vtrace.discount": self.discount, "vtrace.lambda_": self.lambda_})
        check_choice("vtrace.network", self.network, NETWORK_CHOICES)
        if self.use_lstm and not self.shared_torso:
            raise ValueError("vtrace.shared_torso=false needs vtrace.use_lstm=false (one LSTM state per env)")
        if self.value_hidden_sizes and self.shared_torso:
            raise ValueError(
                "vtrace.value_hidden_sizes needs vtrace.shared_torso=false (a shared torso has one set of sizes)"
            )
        check_non_negative({"vtrace.lookahead": self.lookahead})


# V-trace defaults for Box (continuous) action spaces: longer unrolls with
# lambda 0.95, no lookahead, a smaller learning rate, the 8 passes as shuffled
# epochs over 4 batches, a separate and wider value torso, and no entropy
# bonus (as in PPO's continuous-control setups: on the state-independent
# log-std a bonus outweighs the small advantages). Both action families share
# the reward scale, the LayerNorm in every MLP torso layer
# (VTraceConfig.layer_norm) and the anneal.
CONTINUOUS_VTRACE = VTraceConfig(
    unroll_length=20,
    lookahead=0,
    lambda_=0.95,
    learning_rate=3e-4,
    reuse=8,
    reuse_pool=4,
    value_hidden_sizes=(256, 256),
    entropy_cost=0.0,
    reward_scale=0.1,
    shared_torso=False,
)


# V-trace defaults for pixel observations (Atari's 84x84 frames), where the
# network, not the env, is the cost of a frame: one pass over each batch and
# no lookahead, as IMPALA and SEED train Atari. Rewards are Atari's clipped
# +-1 unscaled: under Adam a 0.1 reward scale acts as a 10x entropy bonus.
# Adam's epsilon at CleanRL's Atari 1e-5: a smaller one lets Adam scale the
# first convolution's small gradients up to full steps, which drive its
# channels dark. The Nature CNN's channels are normalised over each frame
# (cnn_channel_norm), so that no channel goes dark on a flat background such
# as Pong's and the value keeps varying across states; with that norm the
# rate can be twice CleanRL's 2.5e-4, which matters because the linear
# anneal halves the rate's mean over the run. Batches of 4 unrolls:
# four times the updates per frame of a batch of 16 at no extra learner time
# on a CPU, where the small batch is cheaper per frame. The measurements
# behind each: docs/training.md, "The defaults and their evidence".
PIXEL_VTRACE = VTraceConfig(
    reuse=1, lookahead=0, reward_scale=1.0, learning_rate=5e-4, adam_eps=1e-5,
    cnn_channel_norm=True, batch_size=4,
)
