"""Run configuration: frozen dataclasses with defaults that work.

One `TrainConfig` describes a whole run. Nested sections (`server`, `vtrace`)
are frozen dataclasses too; the CLI derives one flag per field
(`--num-actors`, `--vtrace.learning-rate`, ...) from these definitions, so a
field added here is overridable without touching the CLI. Every run writes
the resolved config to `config.json` in its run directory.

Defaults are tuned for the 2-core development machine (CartPole-v1 solves in
well under a minute); larger machines raise `num_actors` / `envs_per_actor`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import typing
from typing import Any, Optional

AGENTS = ("vtrace", "r2d2")
ARCHITECTURES = ("seed", "impala")
PRECISIONS = ("fp32", "bf16", "int8")  # inference only; see seedq.quant
# Where the MLP torsos normalise their pre-activations (VTraceConfig.layer_norm).
LAYER_NORM_MODES = ("none", "first_layer", "all_layers")
NETWORK_CHOICES = ("auto", "mlp", "small_cnn", "nature_cnn", "impala_cnn")
# IMPALA mode: what actors pull and run (fp32, or int8 as in ActorQ).
ACTOR_PRECISIONS = ("fp32", "int8")
# The inference batcher's rules (seedq.server.batching).
BATCHING_RULES = ("auto", "wait", "greedy")


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Central inference server (dynamic batcher) settings."""

    # Largest number of env steps run through one inference call.
    max_batch_size: int = 256
    # How long the batcher waits for more streams once it holds a request
    # (under the `wait` rule).
    batch_timeout_ms: float = 0.5
    # The batcher's rule: `wait` for the streams the last batch answered (up to
    # batch_timeout_ms), `greedy` (run what is queued at once), or `auto`: the
    # one that measured more env steps/s in this run, re-measured every minute
    # and when actors come or go (seedq.server.batching).
    batching: str = "auto"
    # Unrolls held between the server and the learner; when full, inference
    # waits for training (backpressure) instead of memory growing. The last
    # inference batch's unrolls may take it past this by one batch (a strict
    # bound could deadlock: seedq.server.unrolls.UnrollQueue).
    queue_capacity_unrolls: int = 256
    # Handshakes declaring more envs are refused (bounds learner memory).
    max_envs_per_actor: int = 4096
    # Env slots of all actors together: a handshake that would pass it is
    # refused with RESOURCE_EXHAUSTED (its actor retries). 0: sized to the
    # learner's memory for the observation and unroll length (1024 to 65536).
    max_envs: int = 0
    # Dead-peer detection (docs/security.md): a keepalive ping goes to each
    # actor connection every this many seconds.
    keepalive_seconds: float = 10.0
    # A connection that answers no ping, or a stream on which the learner waited
    # this long for the actor's next message, is closed: its env slots are
    # freed and its partial unrolls dropped.
    peer_timeout_seconds: float = 30.0
    # Also serve the standard gRPC health service alone, in plaintext, on this
    # TCP port of every interface (0: off): Kubernetes' gRPC probes cannot speak
    # TLS, and this port answers health checks only (no training RPC).
    health_port: int = 0


@dataclasses.dataclass(frozen=True)
class TlsConfig:
    """The learner's TLS files (paths only; the files hold the key material)."""

    # PEM certificate chain the learner presents (with `key`: TLS on).
    cert: str = ""
    # PEM private key of `cert`.
    key: str = ""
    # PEM CA that actor certificates must chain to (given: mutual TLS, actors without one are refused).
    client_ca: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.cert or self.key)


@dataclasses.dataclass(frozen=True)
class AuthConfig:
    """Bearer-token authentication on the actor channel."""

    # File holding the token (one line); every RPC must carry `authorization: Bearer <token>`.
    token_file: str = ""


@dataclasses.dataclass(frozen=True)
class ActorTlsConfig:
    """An actor's TLS files (paths only)."""

    # PEM CA that the learner's certificate must chain to (given: the actor dials with TLS).
    ca: str = ""
    # PEM client certificate for a learner that requires mutual TLS (with `key`).
    cert: str = ""
    # PEM private key of `cert`.
    key: str = ""
    # Expect this name in the learner's certificate instead of the host dialled.
    server_name: str = ""


@dataclasses.dataclass(frozen=True)
class ActorChannelConfig:
    """Flags of `seedq actor` and `seedq impala-actor`: how the channel to the
    learner is secured and kept alive (`--auth.token-file` as in `AuthConfig`;
    docs/security.md)."""

    tls: ActorTlsConfig = ActorTlsConfig()
    auth: AuthConfig = AuthConfig()
    # A keepalive ping goes to the learner every this many seconds.
    keepalive_seconds: float = 10.0
    # A ping unanswered after peer_timeout_seconds - keepalive_seconds means the
    # learner is gone: the actor reconnects (with backoff) until it is back.
    peer_timeout_seconds: float = 30.0

    def validate(self) -> None:
        check_channel(self.keepalive_seconds, self.peer_timeout_seconds, "")
        if bool(self.tls.cert) != bool(self.tls.key):
            raise ValueError("--tls.cert and --tls.key go together (a client certificate needs its key)")
        if self.tls.cert and not self.tls.ca:
            raise ValueError("--tls.cert needs --tls.ca (the CA that signed the learner's certificate)")


def check_batching_rule(rule: str) -> None:
    """ValueError unless `rule` is one of BATCHING_RULES (the config and the batcher both check)."""
    if rule not in BATCHING_RULES:
        raise ValueError(f"server.batching={rule!r}: choose one of {', '.join(BATCHING_RULES)}")


def check_channel(keepalive_seconds: float, peer_timeout_seconds: float, prefix: str) -> None:
    """ValueError unless 0 < keepalive < peer timeout (a ping must fit in the timeout)."""
    if keepalive_seconds <= 0:
        raise ValueError(f"{prefix}keepalive_seconds={keepalive_seconds}: must be > 0")
    if peer_timeout_seconds <= keepalive_seconds:
        raise ValueError(
            f"{prefix}peer_timeout_seconds={peer_timeout_seconds}: must be > "
            f"{prefix}keepalive_seconds={keepalive_seconds} (a ping needs time to be answered)"
        )


@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """int8 inference (precision=int8): which layers run in int8.

    By default the learner times every quantizable layer in fp32 and int8 at
    each padded batch size of the server at start-up and keeps a layer in
    int8 only where int8 was faster (seedq.quant.plan); the progress line and
    summary.json report the share of multiply-accumulates that run in int8.
    """

    # Every quantizable layer in int8 at every batch size, measured or not
    # (tests and comparisons).
    force_int8: bool = False


@dataclasses.dataclass(frozen=True)
class AtariConfig:
    """Preprocessing of ALE/* envs (ale_py's vector env, in the actor) and their rewards.

    Actors send one grey screen_size x screen_size uint8 frame per step; the
    learner stacks `frame_stack` of them (see TrainConfig.frame_stack).
    """

    # Each action is repeated this many emulator frames (1: no repeat).
    frame_skip: int = 4
    # Observe the max of the last two emulator frames of a repeat (removes sprite flicker).
    max_pool: bool = True
    # Up to this many no-op actions after a reset (random start states).
    noop_max: int = 30
    # End the episode (for learning) when a life is lost; returns still count whole games.
    terminal_on_life_loss: bool = False
    # Sticky actions: probability that the emulator repeats the previous action.
    repeat_action_probability: float = 0.25
    screen_size: int = 84
    # All 18 actions instead of the game's minimal set.
    full_action_space: bool = False
    # Episodes are truncated after this many emulator frames (30 min of play).
    max_episode_frames: int = 108_000
    # Clip training rewards to [-1, 1] on the learner (reported returns stay unclipped).
    clip_rewards: bool = True


@dataclasses.dataclass(frozen=True)
class DmcConfig:
    """DeepMind Control suite envs (dmc:<domain>-<task>)."""

    # Each action is applied for this many control steps, their rewards summed
    # (the usual DMC agent setting; episodes keep their 1000-step return scale).
    action_repeat: int = 1


@dataclasses.dataclass(frozen=True)
class EnvOptions:
    """Everything besides the id that decides what an env observes; the learner and
    every actor must agree on it (TrainConfig.env_options)."""

    atari: AtariConfig = AtariConfig()
    dmc: DmcConfig = DmcConfig()


@dataclasses.dataclass(frozen=True)
class VTraceConfig:
    """IMPALA / V-trace hyperparameters."""

    # Short unrolls and small batches mean many updates per frame, which is
    # what solves CartPole fastest (tuned with an in-process sweep: 16x10
    # needs ~0.35M frames, 32x20 did not solve within 1.5M).
    unroll_length: int = 10
    batch_size: int = 16  # unrolls per train step
    # > 0: every unroll carries this many more steps, whose rewards and values
    # lengthen V-trace's targets for the unroll_length trained steps (they are
    # trained on in the next unrolls): returns that reach past the unroll's
    # end without longer unrolls. The updates per frame and unrolls per batch
    # stay; the learner's network passes cover unroll_length + lookahead + 1
    # steps per unroll instead of unroll_length + 1, and the trained steps
    # reach the learner `lookahead` steps later (staler). 30 (growing, below)
    # since stop 40: LunarLander pays its +100 only after 25 still steps on the
    # pad, beyond a 10-step return's reach, and its runs learned to land, then
    # kept firing there; with it 6 of 6 ended at >= 0.95 of their best (stop
    # 39's defaults 3 of 6; docs/learning.md, stop 40). 0 for Box actions.
    lookahead: int = 30
    # true: the targets' reach past the unroll grows from 0 to `lookahead`
    # steps as the learning rate anneals (the same horizon; the whole
    # lookahead when the rate is constant): short returns while the policy
    # learns fast, long ones as it settles. The learner's compute per update is
    # that of the whole lookahead from the start. On since stop 40: the whole
    # lookahead from the start took CartPole to 475 in a median 224k frames
    # and 21.4 s instead of 85k and 13.8 s; growing, 92k and 10.2 s.
    grow_lookahead: bool = True
    discount: float = 0.99
    lambda_: float = 1.0
    clip_rho_threshold: float = 1.0
    clip_pg_rho_threshold: float = 1.0
    baseline_cost: float = 0.5
    entropy_cost: float = 0.01
    # true: the entropy bonus falls to 0 with the learning rate (the same
    # linear anneal over learning_rate_decay_frames): it explores early and
    # lets the sampled policy, which the returns are measured on, sharpen as
    # learning ends. Since stop 38: MinAtar SpaceInvaders' best 100-episode
    # mean 2.3-2.5x and Breakout's 2.3-4x the constant bonus's within 5M
    # frames (two seeds each); LunarLander, CartPole and Acrobot pass as
    # before (docs/learning.md, stop 38).
    anneal_entropy_cost: bool = True
    # 3e-3 solved CartPole in fewer frames but let solved runs collapse to a
    # constant action when trained on (docs/learning.md, "No unlearning").
    learning_rate: float = 1e-3
    # > 0: the learning rate falls linearly from learning_rate to 0 over this many
    # trained env frames (train steps x batch_size x unroll_length / reuse), then
    # stays 0; 0: constant; -1: over the run's budget, max_frames, or
    # DEFAULT_DECAY_FRAMES when the run has none. Annealing is what keeps a
    # solved run solved (docs/learning.md).
    learning_rate_decay_frames: int = -1
    adam_eps: float = 1e-8
    max_grad_norm: float = 10.0
    # Training rewards are clipped to [-reward_clip, reward_clip] where the
    # learner records them (the acting core; returns are reported unclipped);
    # 0: no clipping, except Atari's [-1, 1] (atari.clip_rewards).
    reward_clip: float = 0.0
    # Rewards are multiplied by this (after clipping): keeps value targets, and
    # so the value loss's share of the clipped gradient norm, moderate on
    # dense-reward tasks (returns are reported unscaled). At 1, CartPole's and
    # Acrobot's targets of about +-100 saturate the shared tanh torso and the
    # policy stops depending on the state (docs/learning.md).
    reward_scale: float = 0.1
    # Divide the training rewards (after reward_clip and reward_scale) by the
    # running root mean square of the discounted return (the V-trace targets,
    # in reward units), so value targets stay near unit scale on any env
    # (docs/learning.md); the statistics live in the parameters ("return_stats").
    normalize_returns: bool = False
    # Standardise the policy-gradient advantages over the batch's valid steps
    # (PPO's (A - mean) / std), so the policy's step size (and the entropy
    # bonus's share of it) does not depend on the reward scale. Off: it sped
    # up Acrobot but collapsed CartPole at every learning rate tried
    # (docs/learning.md).
    normalize_advantages: bool = False
    # Each batch of unrolls is trained on this many times in a row (sample
    # reuse: fewer env frames per update). 4, with ppo_clip: the updates per
    # frame that Pendulum, cartpole-swingup and LunarLander need (at 2 they
    # stayed at 0.2-0.7 of their references; docs/learning.md, stop 22), and
    # CartPole in 125k frames instead of 276k without reuse. It costs the
    # learner 4x the compute per frame. Without ppo_clip, reuse 2 collapsed a
    # CartPole seed. 8 for Box actions, with reuse_pool (CONTINUOUS_VTRACE).
    reuse: int = 4
    # > 1: reuse as PPO's epochs: take this many batches' worth of unrolls at
    # once and make the `reuse` passes over them in shuffled batches of
    # batch_size unrolls, instead of `reuse` steps in a row on one batch. Same
    # updates per frame; the policy lags by up to pool x reuse updates. 1: off
    # for Discrete actions; 4 with reuse 8 for Box actions (CONTINUOUS_VTRACE,
    # stop 33; alone it passed walker-walk in 3 of 6 seeds, with the wide
    # value torso below 3 of 3; docs/learning.md). The run's seed orders the passes.
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
    lstm_size: int = 256
    # Continuous actions: initial log standard deviation of the Gaussian policy.
    initial_log_std: float = -0.5
    # Continuous actions: a floor under the Gaussian's std, in action units as
    # initial_log_std. The std is min_std + exp(log_std parameter), so it
    # slows towards the floor instead of collapsing. 0 (no floor) stays the
    # default: 0.35 kept walker-walk's std at 0.43-0.50, yet 4 of 5 seeds
    # still stalled at 0.54-0.69 of the reference (docs/learning.md, stop 29).
    min_std: float = 0.0
    # false: the value head gets a torso of its own (common for continuous
    # control), so value regression does not shape the policy's features.
    shared_torso: bool = True
    # Sizes of the value torso's layers when shared_torso is false (empty: as
    # hidden_sizes). A wider value MLP than the policy's is the on-policy
    # study's advice (Andrychowicz et al. 2020). 256,256 for Box actions
    # (CONTINUOUS_VTRACE, stop 33): alone on the earlier Box defaults
    # walker-walk 2 of 3 but cartpole-swingup 1 of 3; with reuse_pool 4,
    # reuse 8 and learning_rate 3e-4 swingup 6 of 6, walker-walk 3 of 3
    # (docs/learning.md, stops 32-33).
    value_hidden_sizes: tuple[int, ...] = ()
    # Normalise vector observations by their running mean and std (learner-side
    # statistics, published with the parameters); common for continuous control.
    # Off for Box actions too: it took dmc:walker-walk from 0.68 to past its
    # reference but held cartpole-swingup at 0.40 (docs/learning.md, stop 23).
    normalize_observations: bool = False
    # LayerNorm in the MLP torsos (not the CNNs), before the tanh: none,
    # first_layer (where the observation comes in) or all_layers. Inputs of
    # different spreads (walker-walk's joint velocities beside its height,
    # LunarLander's positions beside its leg contacts) then neither saturate
    # the torso nor need statistics that move as the policy learns. Box
    # actions since stop 24: walker-walk 0.68 -> 1.22 of its reference.
    # Discrete actions since stop 37: LunarLander past 0.9 of its reference
    # in 8 of 9 seeds over three sittings (without: 5 of 12), CartPole and
    # Acrobot 3 of 3 as before; MinAtar's and Atari's CNNs have none
    # (docs/learning.md, stop 37).
    layer_norm: str = "all_layers"


@dataclasses.dataclass(frozen=True)
class R2D2Config:
    """R2D2 (recurrent Q-learning, prioritized sequence replay) hyperparameters.

    Sequences are burn_in + trace_length + n_step steps long and overlap by
    burn_in + n_step, so every step is in exactly one sequence's loss region.
    The defaults reach CartPole-v1's 475 and Acrobot-v1's -100 in 3 of 3
    seeds within 500k frames (docs/learning.md, "R2D2").
    """

    # Steps that only warm up the LSTM state (no loss, no gradient) before the loss region.
    burn_in: int = 10
    # Steps per sequence trained on (the loss region).
    trace_length: int = 20
    # Steps summed before bootstrapping (n-step double Q-learning).
    n_step: int = 5
    discount: float = 0.99
    # Sequences per train step. 16 at replay_ratio 8 gives as many updates per
    # frame as 32 at 16 for about a third of the CPU time on MinAtar's CNN.
    batch_size: int = 16
    learning_rate: float = 1e-3
    # As vtrace.learning_rate_decay_frames: linear to 0 over this many env
    # frames (a train step counts batch_size x trace_length / replay_ratio of
    # them), 0: constant, -1: over the run's budget (DEFAULT_DECAY_FRAMES
    # without one). A constant rate let solved CartPole runs fall back (docs/learning.md, "R2D2").
    learning_rate_decay_frames: int = -1
    adam_eps: float = 1e-8
    # Gradients are clipped to this global norm.
    max_grad_norm: float = 10.0
    # Online parameters are copied to the target network every this many updates.
    target_update_period: int = 200
    # Torso: auto (mlp for vectors; for images [H, W, C] small_cnn below 36
    # pixels a side, as MinAtar's 10x10, else nature_cnn), mlp, small_cnn,
    # nature_cnn or impala_cnn.
    network: str = "auto"
    # Sizes of the MLP torso's layers (before the LSTM).
    hidden_sizes: tuple[int, ...] = (64,)
    lstm_size: int = 64
    # Width of the dueling head's value and advantage layers.
    head_hidden_size: int = 64
    # false replaces the LSTM by a dense layer of the same width (feed-forward control).
    use_lstm: bool = True
    # Epsilon of the value rescaling h(x) = sign(x)(sqrt(|x|+1)-1) + eps x.
    value_rescaling_eps: float = 1e-3
    # Replay capacity in sequences; the oldest are evicted beyond it (FIFO).
    # At 4000 (80k steps) a solved CartPole run's replay held only successful
    # episodes and 1 seed of 3 fell back from 500 (docs/learning.md, "R2D2").
    # Full, it holds 20000 x (burn_in + trace_length + n_step) observations:
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
    # learner samples as fast as it can and every sequence is inserted). At 4,
    # 500k frames were ~3k updates and CartPole reached 475 in 1 seed of 3.
    replay_ratio: float = 8.0
    # Per-env exploration epsilon_i = base ** (1 + alpha * i / (N - 1)) over the
    # N = num_actors * envs_per_actor - eval_envs training envs (Ape-X / R2D2).
    epsilon_base: float = 0.4
    epsilon_alpha: float = 7.0
    # The first `eval_envs` env slots act with `eval_epsilon` and their steps
    # are not stored in replay (their episodes still count in the returns).
    eval_envs: int = 0
    eval_epsilon: float = 0.001
    # The run's return and episode count (progress line, --target-return, summary, curves)
    # counts the episodes of the envs acting with epsilon <= this (those of the
    # least-exploring env when none does), so it measures the near-greedy
    # policy, as DQN's evaluation epsilons of 0.001-0.05 do; the spread's most
    # exploring envs end the most episodes and would dominate a mean over all.
    # 1: every env. With 64 envs, 27 report (docs/learning.md, "R2D2").
    report_epsilon: float = 0.01
    # Save the replay (sequences, priorities, counters) with the newest
    # checkpoint and restore it on --resume; false: a resumed run refills an
    # empty replay (and nothing of it is saved).
    checkpoint_replay: bool = True


@dataclasses.dataclass(frozen=True)
class DevicesConfig:
    """Which of this host's JAX devices run inference and which train
    (seedq.devices; docs/devices.md). 0 means auto: on one device both share
    it; on more, 1 device infers and training takes the largest count of the
    others that divides the training batch (in a multi-host learner: that
    divides this host's share of it; docs/devices.md)."""

    # Devices that run the inference server's batches (0: auto).
    inference: int = 0
    # Devices the update runs data-parallel over; must divide the training
    # batch (vtrace.batch_size or r2d2.batch_size) (0: auto).
    training: int = 0

    def validate(self, batch_size: int, batch_name: str) -> None:
        """ValueError unless the counts are >= 0 and an explicit training count divides the batch."""
        for name in ("inference", "training"):
            if getattr(self, name) < 0:
                raise ValueError(f"devices.{name}={getattr(self, name)}: must be >= 0 (0: auto)")
        if self.training and batch_size % self.training:
            raise ValueError(
                f"devices.training={self.training} does not divide the training batch "
                f"{batch_name}={batch_size} (each training device takes an equal share)"
            )


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """A learner of several processes (hosts) training one model together
    (jax.distributed; docs/devices.md "Multi-host"). All three of coordinator,
    num_processes and process_id, or none: then Cloud TPU VMs and GKE TPU
    pods are detected by JAX (`auto_detect`) and anything else runs as one
    process."""

    # HOST:PORT of the coordination service, which process 0 starts (the same on every process).
    coordinator: str = ""
    # Learner processes in the group (0: one, or what auto-detection finds).
    num_processes: int = 0
    # This process's index, 0 .. num_processes - 1 (-1: unset).
    process_id: int = -1
    # Without a coordinator, ask JAX's cluster detection (Cloud TPU VM metadata,
    # GKE TPU worker variables); false: one process.
    auto_detect: bool = True
    # A process that has sent no heartbeat for this long is dead: the others
    # stop with one line naming it (a dead coordinator is noticed at once).
    heartbeat_timeout_seconds: int = 10
    # How long start-up waits for every process to join the coordinator.
    initialization_timeout_seconds: int = 300
    # How long a finished process waits for the others at the exit barrier
    # (process 0 evaluates before it gets there).
    shutdown_timeout_seconds: int = 300

    @property
    def explicit(self) -> bool:
        """Whether the group was given on the command line (coordinator, size and index)."""
        return bool(self.coordinator)

    def validate(self) -> None:
        given = {"coordinator": bool(self.coordinator), "num_processes": self.num_processes > 0,
                 "process_id": self.process_id >= 0}
        if any(given.values()) and not all(given.values()):
            missing = ", ".join(f"distributed.{k}" for k, v in given.items() if not v)
            raise ValueError(
                f"distributed.coordinator, distributed.num_processes and distributed.process_id go "
                f"together (missing: {missing})"
            )
        if self.coordinator and (":" not in self.coordinator or not self.coordinator.rsplit(":", 1)[1].isdigit()):
            raise ValueError(f"distributed.coordinator={self.coordinator!r}: expected HOST:PORT")
        if self.num_processes < 0:
            raise ValueError(f"distributed.num_processes={self.num_processes}: must be >= 0")
        if self.coordinator and not 0 <= self.process_id < self.num_processes:
            raise ValueError(
                f"distributed.process_id={self.process_id}: must be in 0..{self.num_processes - 1} "
                f"(distributed.num_processes={self.num_processes})"
            )
        for name in ("heartbeat_timeout_seconds", "initialization_timeout_seconds", "shutdown_timeout_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"distributed.{name}={getattr(self, name)}: must be > 0")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A whole training run (learner plus locally launched actors)."""

    agent: str = "vtrace"
    env: str = "CartPole-v1"
    architecture: str = "seed"
    # Inference precision of the learner's server (fp32, bf16 or int8), for
    # any agent; training stays fp32.
    precision: str = "fp32"
    seed: int = 0
    num_actors: int = 2
    envs_per_actor: int = 32
    # Pixel observations (uint8 [H, W] frames) are stacked on the learner,
    # this many per network input; actors send single frames. 1: no stacking.
    frame_stack: int = 4
    # Stop conditions: whichever comes first. The run stops once the mean return
    # (return_window episodes) reaches target_return; none (null): no target.
    # The command line's default is the env's registered reward_threshold
    # (gymnasium: CartPole-v1 475, Acrobot-v1 -100), none where it has none.
    target_return: Optional[float] = None
    # 0 disables a limit.
    max_seconds: float = 300.0
    max_frames: int = 0
    # Episodes averaged for `mean_return_last100` and the target check.
    return_window: int = 100
    logdir: str = ""  # default: runs/<agent>-<env>-<timestamp>
    # Address the learner listens on; default: a unix socket in the run dir.
    address: str = ""
    # Serve a non-loopback TCP address with neither TLS nor a token (anyone
    # who reaches the port can feed training data); refused without it.
    insecure: bool = False
    log_every_seconds: float = 2.0
    # Rewrite <logdir>/stats.json (counters, train-step timing, connected
    # actors; atomically) every this many seconds; 0: never.
    stats_every_seconds: float = 1.0
    # Training starts once this many actors are connected (0: start as they
    # arrive); mostly for `seedq learner` with actors on other machines.
    min_actors: int = 0
    # Checkpoint (<logdir>/checkpoints) every this many seconds; 0: only at shutdown.
    checkpoint_every_seconds: float = 30.0
    # Also checkpoint every this many train steps; 0: no step trigger.
    checkpoint_every_steps: int = 0
    # Only the newest checkpoints are kept.
    checkpoints_to_keep: int = 3
    # Greedy-policy episodes on separate envs at the end of the run (summary.json
    # `eval`, TensorBoard eval/*); 0 disables evaluation.
    eval_episodes: int = 10
    # Also evaluate every this many seconds during training; 0: only at the end.
    eval_every_seconds: float = 0.0
    # Eval env i is reset with seed eval_seed + i; `seedq eval` reproduces the numbers.
    eval_seed: int = 1000
    # IMPALA mode (architecture=impala): each actor pulls the policy parameters
    # after every this many unrolls (all of an actor's envs finish one together).
    param_pull_every: int = 1
    # IMPALA mode: precision of the parameters actors pull and of their local
    # inference: fp32, or int8 (ActorQ; 4x fewer bytes per pull). SEED mode uses `precision`.
    actor_precision: str = "fp32"
    server: ServerConfig = ServerConfig()
    tls: TlsConfig = TlsConfig()
    auth: AuthConfig = AuthConfig()
    quant: QuantConfig = QuantConfig()
    atari: AtariConfig = AtariConfig()
    dmc: DmcConfig = DmcConfig()
    vtrace: VTraceConfig = VTraceConfig()
    r2d2: R2D2Config = R2D2Config()
    devices: DevicesConfig = DevicesConfig()
    distributed: DistributedConfig = DistributedConfig()

    def validate(self) -> None:
        """Raises ValueError naming the first field that is out of range."""
        if self.agent not in AGENTS:
            raise ValueError(f"agent={self.agent!r}: choose one of {', '.join(AGENTS)}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"architecture={self.architecture!r}: choose one of {', '.join(ARCHITECTURES)}"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"precision={self.precision!r}: choose one of {', '.join(PRECISIONS)}"
            )
        if self.actor_precision not in ACTOR_PRECISIONS:
            raise ValueError(
                f"actor_precision={self.actor_precision!r}: choose one of {', '.join(ACTOR_PRECISIONS)}"
            )
        if self.architecture == "impala" and self.agent != "vtrace":
            raise ValueError(
                f"architecture='impala' needs agent='vtrace' (got agent={self.agent!r}): "
                "IMPALA actors send on-policy unrolls for V-trace"
            )
        if self.vtrace.layer_norm not in LAYER_NORM_MODES:
            raise ValueError(
                f"vtrace.layer_norm={self.vtrace.layer_norm!r}: choose one of {', '.join(LAYER_NORM_MODES)}"
            )
        if not 0.0 <= self.vtrace.min_std < math.exp(self.vtrace.initial_log_std):
            raise ValueError(
                f"vtrace.min_std={self.vtrace.min_std}: needs 0 <= min_std < exp(vtrace.initial_log_std) "
                f"= {math.exp(self.vtrace.initial_log_std):.3g}, the std the policy starts at"
            )
        if self.quant.force_int8 and self.precision != "int8":
            raise ValueError(
                f"quant.force_int8 applies to precision='int8' (got precision={self.precision!r})"
            )
        positive = {
            "num_actors": self.num_actors,
            "envs_per_actor": self.envs_per_actor,
            "return_window": self.return_window,
            "server.max_batch_size": self.server.max_batch_size,
            "server.queue_capacity_unrolls": self.server.queue_capacity_unrolls,
            "vtrace.unroll_length": self.vtrace.unroll_length,
            "vtrace.batch_size": self.vtrace.batch_size,
            "vtrace.learning_rate": self.vtrace.learning_rate,
            "vtrace.lstm_size": self.vtrace.lstm_size,
            "frame_stack": self.frame_stack,
            "atari.frame_skip": self.atari.frame_skip,
            "atari.screen_size": self.atari.screen_size,
            "atari.max_episode_frames": self.atari.max_episode_frames,
            "dmc.action_repeat": self.dmc.action_repeat,
            "param_pull_every": self.param_pull_every,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name}={value}: must be > 0")
        if self.server.max_envs < 0:
            raise ValueError(f"server.max_envs={self.server.max_envs}: must be >= 0 (0: sized to memory)")
        check_channel(self.server.keepalive_seconds, self.server.peer_timeout_seconds, "server.")
        check_batching_rule(self.server.batching)
        if bool(self.tls.cert) != bool(self.tls.key):
            raise ValueError("tls.cert and tls.key go together (the learner's certificate and its key)")
        if self.tls.client_ca and not self.tls.enabled:
            raise ValueError("tls.client_ca needs tls.cert and tls.key (mutual TLS is TLS first)")
        if self.server.queue_capacity_unrolls < self.vtrace.batch_size:
            raise ValueError(
                f"server.queue_capacity_unrolls={self.server.queue_capacity_unrolls} must be "
                f">= vtrace.batch_size={self.vtrace.batch_size}"
            )
        _check_decay_frames("vtrace", self.vtrace.learning_rate_decay_frames)
        if self.vtrace.reuse < 1:
            raise ValueError(f"vtrace.reuse={self.vtrace.reuse}: must be >= 1")
        if self.vtrace.reuse_pool < 1:
            raise ValueError(f"vtrace.reuse_pool={self.vtrace.reuse_pool}: must be >= 1 (1: off)")
        if self.server.queue_capacity_unrolls < self.vtrace.batch_size * self.vtrace.reuse_pool:
            raise ValueError(
                f"vtrace.reuse_pool={self.vtrace.reuse_pool}: needs server.queue_capacity_unrolls="
                f"{self.server.queue_capacity_unrolls} >= batch_size x reuse_pool = "
                f"{self.vtrace.batch_size * self.vtrace.reuse_pool}"
            )
        if not 0.0 <= self.vtrace.ppo_clip < 1.0:
            raise ValueError(f"vtrace.ppo_clip={self.vtrace.ppo_clip}: must be in [0, 1) (0: off)")
        if not 0.0 <= self.vtrace.discount <= 1.0:
            raise ValueError(f"vtrace.discount={self.vtrace.discount}: must be in [0, 1]")
        if not 0.0 <= self.vtrace.lambda_ <= 1.0:
            raise ValueError(f"vtrace.lambda_={self.vtrace.lambda_}: must be in [0, 1]")
        if not 0.0 <= self.atari.repeat_action_probability <= 1.0:
            raise ValueError(
                f"atari.repeat_action_probability={self.atari.repeat_action_probability}: must be in [0, 1]"
            )
        for section in ("vtrace", "r2d2"):
            network = getattr(self, section).network
            if network not in NETWORK_CHOICES:
                raise ValueError(
                    f"{section}.network={network!r}: choose one of {', '.join(NETWORK_CHOICES)}"
                )
        if self.vtrace.use_lstm and not self.vtrace.shared_torso:
            raise ValueError("vtrace.shared_torso=false needs vtrace.use_lstm=false (one LSTM state per env)")
        if self.vtrace.value_hidden_sizes and self.vtrace.shared_torso:
            raise ValueError(
                "vtrace.value_hidden_sizes needs vtrace.shared_torso=false (a shared torso has one set of sizes)"
            )
        if self.agent == "r2d2":
            self._validate_r2d2()
        batch_name, batch_size = self.training_batch
        self.devices.validate(batch_size, batch_name)
        self.distributed.validate()
        if self.distributed.num_processes > 1 and batch_size % self.distributed.num_processes:
            raise ValueError(
                f"distributed.num_processes={self.distributed.num_processes} does not divide the "
                f"training batch {batch_name}={batch_size} (each process contributes an equal share)"
            )
        if self.distributed.explicit and self.architecture == "impala":
            raise ValueError("distributed.* needs architecture='seed' (the multi-host learner serves SEED actors)")
        if self.checkpoints_to_keep <= 0:
            raise ValueError(f"checkpoints_to_keep={self.checkpoints_to_keep}: must be > 0")
        non_negative = {
            "vtrace.lookahead": self.vtrace.lookahead,
            "min_actors": self.min_actors,
            "checkpoint_every_seconds": self.checkpoint_every_seconds,
            "checkpoint_every_steps": self.checkpoint_every_steps,
            "eval_episodes": self.eval_episodes,
            "eval_every_seconds": self.eval_every_seconds,
            "stats_every_seconds": self.stats_every_seconds,
            "max_seconds": self.max_seconds,
            "max_frames": self.max_frames,
            "server.batch_timeout_ms": self.server.batch_timeout_ms,
            "server.health_port": self.server.health_port,
            "atari.noop_max": self.atari.noop_max,
        }
        for name, value in non_negative.items():
            if value < 0:
                raise ValueError(f"{name}={value}: must be >= 0")

    def _validate_r2d2(self) -> None:
        r = self.r2d2
        positive = {
            "trace_length": r.trace_length, "n_step": r.n_step, "batch_size": r.batch_size,
            "learning_rate": r.learning_rate, "target_update_period": r.target_update_period,
            "lstm_size": r.lstm_size, "head_hidden_size": r.head_hidden_size,
            "replay_capacity": r.replay_capacity, "min_replay_size": r.min_replay_size,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"r2d2.{name}={value}: must be > 0")
        for name in ("burn_in", "replay_ratio", "priority_exponent", "importance_exponent",
                     "value_rescaling_eps", "eval_envs"):
            if getattr(r, name) < 0:
                raise ValueError(f"r2d2.{name}={getattr(r, name)}: must be >= 0")
        for name in ("discount", "priority_eta", "epsilon_base", "eval_epsilon", "report_epsilon"):
            if not 0.0 <= getattr(r, name) <= 1.0:
                raise ValueError(f"r2d2.{name}={getattr(r, name)}: must be in [0, 1]")
        _check_decay_frames("r2d2", r.learning_rate_decay_frames)
        if r.min_replay_size > r.replay_capacity:
            raise ValueError(
                f"r2d2.min_replay_size={r.min_replay_size} must be <= r2d2.replay_capacity={r.replay_capacity}"
            )
        if r.eval_envs >= self.num_actors * self.envs_per_actor:
            raise ValueError(
                f"r2d2.eval_envs={r.eval_envs} must be < num_actors * envs_per_actor "
                f"= {self.num_actors * self.envs_per_actor} (training envs are needed)"
            )

    @property
    def training_batch(self) -> tuple[str, int]:
        """(field name, size) of the batch one update trains on: sequences of the agent's section."""
        name = "r2d2.batch_size" if self.agent == "r2d2" else "vtrace.batch_size"
        return name, getattr(self, self.agent).batch_size

    @property
    def env_options(self) -> EnvOptions:
        return EnvOptions(self.atari, self.dmc)

    def resolved(self) -> "TrainConfig":
        """Fills in defaults that depend on other fields (logdir)."""
        if self.logdir:
            return self
        stamp = time.strftime("%Y%m%d-%H%M%S")
        safe_env = self.env.replace("/", "_").replace(":", "_")
        return dataclasses.replace(
            self, logdir=os.path.join("runs", f"{self.agent}-{safe_env}-{stamp}-{os.getpid()}")
        )


def _check_decay_frames(section: str, frames: int) -> None:
    """ValueError unless an anneal horizon is >= 0 or -1 (the run's budget)."""
    if frames < -1:
        raise ValueError(f"{section}.learning_rate_decay_frames={frames}: must be >= 0, or -1 (over the run's max_frames)")


# The learning rate's anneal horizon (vtrace.learning_rate_decay_frames -1)
# for a run without max_frames: twice the suite's longest non-Atari budget
# (5M). Past it the rate is 0, so a longer run needs --max-frames (or an
# explicit horizon) to keep learning.
DEFAULT_DECAY_FRAMES = 10_000_000


def agent_config_for_run(config: "TrainConfig") -> "VTraceConfig | R2D2Config":
    """The run's agent section (config.vtrace or config.r2d2) with the anneal
    horizon -1 resolved against the run's budget."""
    section = getattr(config, config.agent)
    if section.learning_rate_decay_frames != -1:
        return section
    horizon = config.max_frames or DEFAULT_DECAY_FRAMES
    return dataclasses.replace(section, learning_rate_decay_frames=horizon)


# V-trace defaults for Box (continuous) action spaces, measured on
# dmc:cartpole-swingup (docs/benchmarks.md, issue 3): longer unrolls with
# lambda 0.95, a smaller learning rate, and a separate value torso. No entropy
# bonus (as in PPO's continuous-control setups): on the state-independent
# log-std even 0.001 outweighed the small advantages, so walker-walk's
# entropy rose from 5.5 to 7.3 while it learned, and cartpole-swingup reached
# 0.71-1.13 of its reference instead of 1.14-1.27 (docs/learning.md, stop 22).
# Both action families share the reward scale, the LayerNorm in every MLP
# torso layer (VTraceConfig.layer_norm) and the anneal.
CONTINUOUS_VTRACE = VTraceConfig(
    unroll_length=20,
    # Not measured with a lookahead (the Box suite passes without one).
    lookahead=0,
    lambda_=0.95,
    # Stop 33 (docs/learning.md): the value torso at 256 x 256 beside the
    # policy's 64 x 64, the 8 passes as shuffled epochs over 4 batches, and
    # 3e-4 (was 5e-4, reuse 4, one torso size): walker-walk 3 of 3, swingup
    # 6 of 6 over two sittings, Pendulum 3 of 3; before: 4 of 6 and 3 of 6.
    learning_rate=3e-4,
    reuse=8,
    reuse_pool=4,
    value_hidden_sizes=(256, 256),
    entropy_cost=0.0,
    reward_scale=0.1,
    shared_torso=False,
)


def defaults_for(continuous_actions: bool, target_return: Optional[float] = None) -> TrainConfig:
    """The default run config for an env with Discrete or Box actions and the
    env's registered target return (command-line flags are applied on top of it)."""
    base = TrainConfig(target_return=target_return)
    if continuous_actions:
        return dataclasses.replace(base, vtrace=CONTINUOUS_VTRACE)
    return base


def to_dict(config: Any) -> dict:
    return dataclasses.asdict(config)


def save(config: TrainConfig, path: str) -> None:
    with open(path, "w") as f:
        json.dump(to_dict(config), f, indent=2, sort_keys=True)
        f.write("\n")


def from_dict(cls: type, data: dict) -> Any:
    """Builds a (nested) config dataclass from `data`; unknown keys are errors."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(
            f"unknown {cls.__name__} field(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}"
        )
    kwargs = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = from_dict(hint, value)
        elif typing.get_origin(hint) is tuple:
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


def updated(config: Any, data: dict, where: str = "") -> Any:
    """`config` with the (possibly partial, nested) fields in `data` replaced;
    an unknown key is a ValueError naming it."""
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'config'}: expected a JSON object, got {type(data).__name__}")
    cls = type(config)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(
            f"unknown field(s) {', '.join(where + k for k in unknown)}; "
            f"valid{' in ' + where.rstrip('.') if where else ''}: {', '.join(sorted(names))}"
        )
    changes = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            changes[name] = updated(getattr(config, name), value, f"{where}{name}.")
        elif typing.get_origin(hint) is tuple:
            changes[name] = tuple(value)
        else:
            changes[name] = value
    return dataclasses.replace(config, **changes)


def read_json(path: str) -> dict:
    """A run config file's JSON object; OSError / ValueError with a one-line message."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise OSError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of config fields")
    return data


# Fields a saved config may lack because it was written before they existed,
# and the value that then meant what that run did (where today's default
# differs from it): a run from before stop 24 had no LayerNorm, one from
# before stop 38 a constant entropy bonus, one from before stop 40 targets
# cut at the unroll's end.
FORMER_DEFAULTS = {
    ("vtrace", "layer_norm"): "none",
    ("vtrace", "anneal_entropy_cost"): False,
    ("vtrace", "lookahead"): 0,
    ("vtrace", "grow_lookahead"): False,
}


def from_saved(data: dict) -> TrainConfig:
    """The TrainConfig of a saved config.json (or a checkpoint's config); ValueError as from_dict."""
    data = dict(data)
    for (section, name), value in FORMER_DEFAULTS.items():
        if isinstance(data.get(section), dict) and name not in data[section]:
            data[section] = {**data[section], name: value}
    return from_dict(TrainConfig, data)


def load(path: str) -> TrainConfig:
    with open(path) as f:
        return from_saved(json.load(f))
