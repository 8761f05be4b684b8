"""`TrainConfig`: a whole run, its sections and the checks across them."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Optional, Sequence

from seedq.process.affinity import parse_cores
from seedq.config.checks import NETWORK_CHOICES, check_choice, check_non_negative, check_positive
from seedq.config.devices import DevicesConfig, DistributedConfig
from seedq.config.env_options import AtariConfig, DmcConfig, EnvOptions
from seedq.config.r2d2 import R2D2Config
from seedq.config.server import AuthConfig, ServerConfig, TlsConfig
from seedq.config.tracking import WandbConfig
from seedq.config.vtrace import CONTINUOUS_VTRACE, PIXEL_VTRACE, VTraceConfig


AGENTS = ("vtrace", "r2d2")
ARCHITECTURES = ("seed", "impala")
PRECISIONS = ("fp32", "bf16", "int8")  # inference only; see seedq.quant


# IMPALA mode: what actors pull and run (fp32, or int8 as in ActorQ).
ACTOR_PRECISIONS = ("fp32", "int8")


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
class TrainConfig:
    """A whole training run (learner plus locally launched actors)."""

    agent: str = "vtrace"  # the learning algorithm: V-trace actor-critic or R2D2 (recurrent Q-learning)
    env: str = "CartPole-v1"  # a gymnasium id, ALE/<Game>-v5, MinAtar/<Game>-v1 or dmc:<domain>-<task>
    architecture: str = "seed"  # seed: inference on the learner; impala: actors hold a policy copy
    # Inference precision of the learner's server (fp32, bf16 or int8), for
    # any agent; training stays fp32.
    precision: str = "fp32"
    seed: int = 0  # seeds the parameters, the envs and the actors' sampling (docs/training.md: what it fixes)
    num_actors: int = 2  # actor processes (one CPU core each is the rule of thumb)
    envs_per_actor: int = 32  # envs each actor steps as one vector env
    # Local actor processes are pinned to these CPU cores ("0", "0-1", "0,2";
    # Linux); empty: not pinned. Comparisons give every configuration the same cores.
    actor_cores: str = ""
    # Each actor's envs form this many groups, one stream each, that take
    # turns: one group steps while the others' actions are on their way, which
    # hides a network's round trip (docs/wire.md "Actor groups"). 0: the actor
    # chooses (1 on a unix socket, under `deterministic`, and below a 2 ms
    # round trip; otherwise from the round trip, the learner's serve time and
    # its env step time).
    actor_groups: int = 0
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
    max_frames: int = 0  # env frames to train on (all actors together)
    # Episodes averaged for `mean_return_last100` and the target check.
    return_window: int = 100
    logdir: str = ""  # default: runs/<agent>-<env>-<timestamp>
    # Address the learner listens on; default: a unix socket in the run dir.
    # Port 0 (a free port, printed once bound) only without local actors
    # (`seedq learner`): `seedq train` starts its actors with the address.
    address: str = ""
    # Serve a non-loopback TCP address with neither TLS nor a token (anyone
    # who reaches the port can feed training data); refused without it.
    insecure: bool = False
    log_every_seconds: float = 2.0  # seconds between progress lines and TensorBoard scalars
    # Rewrite <logdir>/stats.json (counters, train-step timing, connected
    # actors; atomically) every this many seconds; 0: never.
    stats_every_seconds: float = 1.0
    # Training starts once this many actors are connected (0: start as they
    # arrive); mostly for `seedq learner` with actors on other machines.
    min_actors: int = 0
    # Checkpoint (<logdir>/checkpoints) every this many seconds; 0: only at shutdown.
    checkpoint_every_seconds: float = 30.0
    # Also checkpoint at every multiple of this many train steps (a resumed
    # run keeps the spacing); 0: no step trigger.
    checkpoint_every_steps: int = 0
    # Only the newest checkpoints are kept.
    checkpoints_to_keep: int = 3
    # Greedy-policy episodes on separate envs at the end of the run (summary.json
    # `eval`, TensorBoard eval/*); 0 disables evaluation.
    eval_episodes: int = 10
    # Also evaluate every this many seconds during training; 0: only at the end.
    eval_every_seconds: float = 0.0
    # Eval env i (of up to 64) is reset with seed eval_seed + i; `seedq eval` reproduces the numbers.
    eval_seed: int = 1000
    # IMPALA mode (architecture=impala): each actor pulls the policy parameters
    # after every this many unrolls (all of an actor's envs finish one together).
    param_pull_every: int = 1
    # IMPALA mode: precision of the parameters actors pull and of their local
    # inference: fp32, or int8 (ActorQ; 4x fewer bytes per pull). SEED mode uses `precision`.
    actor_precision: str = "fp32"
    # Two runs with the same seed and config give the same curves.csv (but its
    # wall_seconds) and the same parameters: one actor, and inference waits after
    # every finished unroll until the learner has trained on all full batches, so
    # batches and the policy acting are the same whatever the machine's speed
    # (slower; docs/training.md). The command line's default num_actors is 1 with it.
    deterministic: bool = False
    # Informational: the code the run's machines installed, as `seedq launch`
    # records it ("seedq 0.1.0, wheel of commit <sha>"); "" when not launched so.
    code_source: str = ""
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
    wandb: WandbConfig = WandbConfig()

    def validate(self) -> None:
        """Raises ValueError naming the first field that is out of range: each
        section checks its own fields, this method what spans sections."""
        check_choice("agent", self.agent, AGENTS)
        check_choice("architecture", self.architecture, ARCHITECTURES)
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("actor_precision", self.actor_precision, ACTOR_PRECISIONS)
        if self.architecture == "impala" and self.agent != "vtrace":
            raise ValueError(
                f"architecture='impala' needs agent='vtrace' (got agent={self.agent!r}): "
                "IMPALA actors send on-policy unrolls for V-trace"
            )
        self.vtrace.validate()
        if self.actor_cores:
            parse_cores(self.actor_cores)
        if self.quant.force_int8 and self.precision != "int8":
            raise ValueError(
                f"quant.force_int8 applies to precision='int8' (got precision={self.precision!r})"
            )
        check_positive({
            "num_actors": self.num_actors,
            "envs_per_actor": self.envs_per_actor,
            "return_window": self.return_window,
            "frame_stack": self.frame_stack,
            "param_pull_every": self.param_pull_every,
            "checkpoints_to_keep": self.checkpoints_to_keep,
        })
        self.server.validate()
        self.tls.validate()
        self.env_options.validate()
        self._validate_queue()
        check_choice("r2d2.network", self.r2d2.network, NETWORK_CHOICES)
        if self.agent == "r2d2":
            self.r2d2.validate(num_envs=self.num_actors * self.envs_per_actor)
        self._validate_devices()
        self._validate_deterministic()
        check_non_negative({
            "min_actors": self.min_actors,
            "checkpoint_every_seconds": self.checkpoint_every_seconds,
            "checkpoint_every_steps": self.checkpoint_every_steps,
            "eval_episodes": self.eval_episodes,
            "eval_every_seconds": self.eval_every_seconds,
            "stats_every_seconds": self.stats_every_seconds,
            "max_seconds": self.max_seconds,
            "max_frames": self.max_frames,
            "actor_groups": self.actor_groups,
        })
        if self.actor_groups > self.envs_per_actor:
            raise ValueError(f"actor_groups={self.actor_groups} exceeds envs_per_actor={self.envs_per_actor} "
                             "(every group steps at least one env)")
        if self.server.ingress_processes > 1 and self.architecture == "impala":
            raise ValueError("server.ingress_processes > 1 serves architecture=seed learners only "
                             "(IMPALA actors push unrolls to one process)")
        if self.actor_groups > 1 and self.architecture == "impala":
            raise ValueError("actor_groups applies to architecture=seed (IMPALA actors stream unrolls, not steps)")

    def _validate_queue(self) -> None:
        """The server's unroll queue holds what one train step takes."""
        capacity = self.server.queue_capacity_unrolls
        if capacity < self.vtrace.batch_size:
            raise ValueError(
                f"server.queue_capacity_unrolls={capacity} must be >= vtrace.batch_size={self.vtrace.batch_size}"
            )
        if capacity < self.vtrace.batch_size * self.vtrace.reuse_pool:
            raise ValueError(
                f"vtrace.reuse_pool={self.vtrace.reuse_pool}: needs server.queue_capacity_unrolls="
                f"{capacity} >= batch_size x reuse_pool = {self.vtrace.batch_size * self.vtrace.reuse_pool}"
            )

    def _validate_deterministic(self) -> None:
        """A deterministic run has one order of batches: one actor, V-trace on SEED actors, one process."""
        if not self.deterministic:
            return
        for name, value, needed in (("num_actors", self.num_actors, 1), ("agent", self.agent, "vtrace"),
                                    ("architecture", self.architecture, "seed"),
                                    ("eval_every_seconds", self.eval_every_seconds, 0.0)):
            if value != needed:
                raise ValueError(f"deterministic=true needs {name}={needed!r} (got {value!r})")
        if self.distributed.explicit or self.distributed.num_processes > 1:
            raise ValueError("deterministic=true runs on one learner process (no distributed.*)")
        if self.actor_groups > 1:
            raise ValueError(f"deterministic=true needs actor_groups 0 or 1 (got {self.actor_groups}): "
                             "groups answered in varying order would change the batches")

    def _validate_devices(self) -> None:
        """The training batch splits evenly over the devices and the processes."""
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

    @property
    def training_batch(self) -> tuple[str, int]:
        """(field name, size) of the batch one update trains on: sequences of the agent's section."""
        return f"{self.agent}.batch_size", self.agent_section.batch_size

    @property
    def agent_section(self) -> "VTraceConfig | R2D2Config":
        """The section of the agent the run trains (`vtrace` or `r2d2`): the
        one place that asks which agent a run has."""
        return self.r2d2 if self.agent == "r2d2" else self.vtrace

    @property
    def new_frames_per_unroll(self) -> int:
        """New env frames in one stored sequence (the steps it shares with the
        next one counted there): V-trace's unroll_length, R2D2's trace_length."""
        return self.r2d2.trace_length if self.agent == "r2d2" else self.vtrace.unroll_length

    @property
    def new_frames_per_train_step(self) -> float:
        """New env frames one train step of the run's agent consumes."""
        return self.agent_section.new_frames_per_train_step

    @property
    def checkpoints_replay(self) -> bool:
        """Whether checkpoints carry the replay (R2D2 with r2d2.checkpoint_replay)."""
        return self.agent == "r2d2" and self.r2d2.checkpoint_replay

    def without_replay_checkpoints(self) -> "TrainConfig":
        """This config with replay left out of checkpoints (a learner group:
        each process has its own replay, and orbax would keep only process 0's)."""
        return dataclasses.replace(self, r2d2=dataclasses.replace(self.r2d2, checkpoint_replay=False))

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


# Observations count as pixels from this side up (uint8 frames): the Nature
# CNN's smallest input. MinAtar's 10x10 grids keep the small-env defaults.
PIXEL_MIN_SIDE = 36


def is_pixel_observation(obs_shape: Sequence[int], obs_dtype) -> bool:
    """Whether an env observes pixel frames: [H, W] or [H, W, C] uint8 with sides >= PIXEL_MIN_SIDE."""
    import numpy as np

    shape = tuple(obs_shape)
    return np.dtype(obs_dtype) == np.uint8 and len(shape) in (2, 3) and min(shape[:2]) >= PIXEL_MIN_SIDE


# Pixel envs' server: training, not the env, is what the actors wait for, so
# the batch loop paces itself to the learner (seedq.server.pacing) instead of
# holding a batch for a whole train step once the queue is full.
PIXEL_SERVER = ServerConfig(queue_full="pace")


def defaults_for(continuous_actions: bool, target_return: Optional[float] = None,
                 pixels: bool = False) -> TrainConfig:
    """The default run config for an env with Discrete or Box actions, pixel
    observations or not, and the env's registered target return
    (command-line flags are applied on top of it)."""
    base = TrainConfig(target_return=target_return)
    if continuous_actions:
        return dataclasses.replace(base, vtrace=CONTINUOUS_VTRACE)
    if pixels:
        return dataclasses.replace(base, vtrace=PIXEL_VTRACE, server=PIXEL_SERVER)
    return base
