"""The shared data types: what an env looks like, and what one step and one
training sequence hold.

A leaf module (NumPy only): the wire codec, the agents, the acting core, the
unroll store and the replay all describe data with these types, so none of
them imports another for its field list. The step schema is defined once
here (`step_fields`, `step_record`), which is why SEED and IMPALA unrolls are
identical field for field.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import numpy as np

DISCRETE_ACTION_DTYPE = np.dtype("<i4")
CONTINUOUS_ACTION_DTYPE = np.dtype("<f4")

# Per-step field: the policy version that chose the step's action (policy lag).
BEHAVIOUR_VERSION = "policy_version"
# Prefix of the recurrent-state fields a sequence carries for its first step.
CORE_PREFIX = "core/"


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Observation and action spaces as both ends of a stream agree on them."""

    obs_dtype: str
    obs_shape: tuple[int, ...]
    # Discrete action spaces: number of actions. 0 for continuous (Box) spaces.
    num_actions: int = 0
    action_shape: tuple[int, ...] = ()
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()

    @property
    def discrete(self) -> bool:
        return self.num_actions > 0

    @property
    def action_dtype(self) -> np.dtype:
        return DISCRETE_ACTION_DTYPE if self.discrete else CONTINUOUS_ACTION_DTYPE

    @functools.cached_property
    def obs_nbytes(self) -> int:
        # Cached: checked for every message on the hot path.
        return int(np.dtype(self.obs_dtype).itemsize * np.prod(self.obs_shape, dtype=np.int64))

    @functools.cached_property
    def obs_np_dtype(self) -> np.dtype:
        return np.dtype(self.obs_dtype)

    def describe_mismatch(self, other: "EnvSpec") -> str | None:
        """Names the first field where `other` (the actor's) differs from this
        spec (the learner's), or None; the text gives both sides."""
        if np.dtype(other.obs_dtype) != np.dtype(self.obs_dtype):
            return f"observation.dtype: actor sends {other.obs_dtype}, learner expects {self.obs_dtype}"
        if tuple(other.obs_shape) != tuple(self.obs_shape):
            return (
                f"observation.shape: actor sends {list(other.obs_shape)}, "
                f"learner expects {list(self.obs_shape)}"
            )
        if other.num_actions != self.num_actions:
            return (
                f"action_space: actor has {other.action_text()}, learner expects {self.action_text()}"
            )
        if not self.discrete and tuple(other.action_shape) != tuple(self.action_shape):
            return (
                f"action_space.box.shape: actor has {list(other.action_shape)}, "
                f"learner expects {list(self.action_shape)}"
            )
        return None

    def action_text(self) -> str:
        if self.discrete:
            return f"Discrete({self.num_actions})"
        return f"Box(shape={list(self.action_shape)})"


def spec_from_spaces(observation_space, action_space) -> EnvSpec:
    """EnvSpec of single-env gymnasium spaces (Box observations; Discrete or Box actions)."""
    import gymnasium as gym

    if not isinstance(observation_space, gym.spaces.Box):
        raise ValueError(
            f"observation space {observation_space} is not supported: seedq needs a Box "
            "observation (flatten dict observations with a gymnasium wrapper)"
        )
    obs = dict(
        obs_dtype=np.dtype(observation_space.dtype).name,
        obs_shape=tuple(int(d) for d in observation_space.shape),
    )
    if isinstance(action_space, gym.spaces.Discrete):
        if int(action_space.start) != 0:
            raise ValueError(f"action space {action_space}: Discrete spaces must start at 0")
        return EnvSpec(**obs, num_actions=int(action_space.n))
    if isinstance(action_space, gym.spaces.Box):
        return EnvSpec(
            **obs,
            action_shape=tuple(int(d) for d in action_space.shape),
            action_low=tuple(float(x) for x in np.ravel(action_space.low)),
            action_high=tuple(float(x) for x in np.ravel(action_space.high)),
        )
    raise ValueError(f"action space {action_space} is not supported (Discrete or Box only)")


class StepFieldSpec(NamedTuple):
    """Shape (per env) and dtype of one per-step array the server records."""

    shape: tuple[int, ...]
    dtype: Any


@dataclasses.dataclass(frozen=True)
class SequenceSpec:
    """How each env's stream of steps is cut into training sequences.

    Consecutive sequences share `overlap` steps: 1 for V-trace (the bootstrap
    observation), burn-in + n-step for R2D2, so that every step is trained on.
    """

    length: int
    overlap: int

    def __post_init__(self):
        if not 0 <= self.overlap < self.length:
            raise ValueError(f"sequence overlap {self.overlap} must be in [0, length={self.length})")


def step_fields(spec: EnvSpec, act_outputs: dict[str, StepFieldSpec]) -> dict[str, StepFieldSpec]:
    """Everything recorded per env step: what the actor sent, what `act` chose
    and returned (`act_outputs`), and the policy version that chose it."""
    return {
        "obs": StepFieldSpec(tuple(spec.obs_shape), np.dtype(spec.obs_dtype)),
        "reward": StepFieldSpec((), np.float32),
        "terminated": StepFieldSpec((), bool),
        "truncated": StepFieldSpec((), bool),
        "first": StepFieldSpec((), bool),
        "action": StepFieldSpec(tuple(spec.action_shape), spec.action_dtype),
        BEHAVIOUR_VERSION: StepFieldSpec((), np.int32),
        **act_outputs,
    }


def sequence_fields(agent, spec: EnvSpec) -> tuple[dict[str, StepFieldSpec], frozenset[str]]:
    """(fields, initial_only) of the sequences the learner trains on: the
    per-step fields plus the recurrent state at a sequence's first step
    ("core/<name>", the `initial_only` ones)."""
    core = {
        CORE_PREFIX + k: StepFieldSpec(np.shape(v)[1:], np.asarray(v).dtype)
        for k, v in agent.initial_core_state(1).items()
    }
    return {**step_fields(spec, agent.act_outputs()), **core}, frozenset(core)


def stored_sequence_shapes(agent, spec: EnvSpec) -> dict[str, StepFieldSpec]:
    """Shape/dtype of one whole sequence, field by field: [length, ...] for the
    per-step fields, [...] for the initial-only ones (what replay stores)."""
    fields, initial_only = sequence_fields(agent, spec)
    length = agent.sequence_spec().length
    return {
        name: f if name in initial_only else StepFieldSpec((length, *f.shape), f.dtype)
        for name, f in fields.items()
    }


def sequence_bytes(agent, spec: EnvSpec) -> int:
    """Bytes of one whole stored sequence (`stored_sequence_shapes`, all fields)."""
    return sum(int(np.prod(f.shape)) * np.dtype(f.dtype).itemsize
               for f in stored_sequence_shapes(agent, spec).values())


def step_record(obs, rewards, terminated, truncated, first, actions, version: int,
                outputs: dict, core_before: dict) -> dict[str, np.ndarray]:
    """One step of n envs as `sequence_fields` describe it: what the actor
    sent, what `act` chose and returned, the policy version, and the core
    state the step was acted from (as "core/<name>")."""
    return {
        "obs": obs,
        "reward": rewards,
        "terminated": terminated,
        "truncated": truncated,
        "first": first,
        "action": actions,
        BEHAVIOUR_VERSION: np.full(len(actions), version, np.int32),
        **outputs,
        **{CORE_PREFIX + name: value for name, value in core_before.items()},
    }
