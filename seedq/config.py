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
import os
import time
import typing
from typing import Any

AGENTS = ("vtrace",)
ARCHITECTURES = ("seed",)
PRECISIONS = ("fp32",)


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Central inference server (dynamic batcher) settings."""

    # Largest number of env steps run through one inference call.
    max_batch_size: int = 256
    # How long the batcher waits for more streams once it holds a request.
    batch_timeout_ms: float = 0.5
    # Unrolls held between the server and the learner; when full, inference
    # waits for training (backpressure) instead of memory growing.
    queue_capacity_unrolls: int = 256
    # Handshakes declaring more envs are refused (bounds learner memory).
    max_envs_per_actor: int = 4096


@dataclasses.dataclass(frozen=True)
class VTraceConfig:
    """IMPALA / V-trace hyperparameters."""

    # Short unrolls and small batches mean many updates per frame, which is
    # what solves CartPole fastest (tuned with an in-process sweep: 16x10
    # needs ~0.35M frames, 32x20 did not solve within 1.5M).
    unroll_length: int = 10
    batch_size: int = 16  # unrolls per train step
    discount: float = 0.99
    lambda_: float = 1.0
    clip_rho_threshold: float = 1.0
    clip_pg_rho_threshold: float = 1.0
    baseline_cost: float = 0.5
    entropy_cost: float = 0.01
    learning_rate: float = 3e-3
    adam_eps: float = 1e-8
    max_grad_norm: float = 10.0
    # Rewards are clipped to [-reward_clip, reward_clip]; 0 disables clipping.
    reward_clip: float = 0.0
    hidden_sizes: tuple[int, ...] = (64, 64)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A whole training run (learner plus locally launched actors)."""

    agent: str = "vtrace"
    env: str = "CartPole-v1"
    architecture: str = "seed"
    precision: str = "fp32"
    seed: int = 0
    num_actors: int = 2
    envs_per_actor: int = 32
    # Stop conditions: whichever comes first. 0 disables a limit.
    target_return: float = 475.0
    max_seconds: float = 300.0
    max_frames: int = 0
    # Episodes averaged for `mean_return_last100` and the target check.
    return_window: int = 100
    logdir: str = ""  # default: runs/<agent>-<env>-<timestamp>
    # Address the learner listens on; default: a unix socket in the run dir.
    address: str = ""
    log_every_seconds: float = 2.0
    # The learner trains only once this many actors have connected (0: start
    # as they arrive); mostly for `seedq learner` with actors on other machines.
    min_actors: int = 0
    # Checkpoints in <logdir>/checkpoints: every `checkpoint_every_seconds`
    # and/or every `checkpoint_every_steps` train steps (0 disables a trigger)
    # and always at shutdown; only the newest `checkpoints_to_keep` are kept.
    checkpoint_every_seconds: float = 30.0
    checkpoint_every_steps: int = 0
    checkpoints_to_keep: int = 3
    # Evaluation on separate envs with greedy actions: `eval_episodes` episodes
    # (seeded from `eval_seed`) at the end of the run, recorded in summary.json
    # and TensorBoard, and every `eval_every_seconds` during it (0: only at the
    # end). `eval_episodes` 0 disables evaluation.
    eval_episodes: int = 10
    eval_every_seconds: float = 0.0
    eval_seed: int = 1000
    server: ServerConfig = ServerConfig()
    vtrace: VTraceConfig = VTraceConfig()

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
        positive = {
            "num_actors": self.num_actors,
            "envs_per_actor": self.envs_per_actor,
            "return_window": self.return_window,
            "server.max_batch_size": self.server.max_batch_size,
            "server.queue_capacity_unrolls": self.server.queue_capacity_unrolls,
            "vtrace.unroll_length": self.vtrace.unroll_length,
            "vtrace.batch_size": self.vtrace.batch_size,
            "vtrace.learning_rate": self.vtrace.learning_rate,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name}={value}: must be > 0")
        if self.server.queue_capacity_unrolls < self.vtrace.batch_size:
            raise ValueError(
                f"server.queue_capacity_unrolls={self.server.queue_capacity_unrolls} must be "
                f">= vtrace.batch_size={self.vtrace.batch_size}"
            )
        if not 0.0 <= self.vtrace.discount <= 1.0:
            raise ValueError(f"vtrace.discount={self.vtrace.discount}: must be in [0, 1]")
        if not 0.0 <= self.vtrace.lambda_ <= 1.0:
            raise ValueError(f"vtrace.lambda_={self.vtrace.lambda_}: must be in [0, 1]")
        if self.checkpoints_to_keep <= 0:
            raise ValueError(f"checkpoints_to_keep={self.checkpoints_to_keep}: must be > 0")
        for name in (
            "min_actors", "checkpoint_every_seconds", "checkpoint_every_steps",
            "eval_episodes", "eval_every_seconds",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 0")
        for name in ("max_seconds", "max_frames", "batch_timeout_ms"):
            section = self.server if name == "batch_timeout_ms" else self
            if getattr(section, name) < 0:
                raise ValueError(f"{name}={getattr(section, name)}: must be >= 0")

    def resolved(self) -> "TrainConfig":
        """Fills in defaults that depend on other fields (logdir)."""
        if self.logdir:
            return self
        stamp = time.strftime("%Y%m%d-%H%M%S")
        safe_env = self.env.replace("/", "_").replace(":", "_")
        return dataclasses.replace(
            self, logdir=os.path.join("runs", f"{self.agent}-{safe_env}-{stamp}-{os.getpid()}")
        )


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


def load(path: str) -> TrainConfig:
    with open(path) as f:
        return from_dict(TrainConfig, json.load(f))
