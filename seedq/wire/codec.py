"""Encoding and validation of the seedq.v1 wire messages.

Arrays travel as raw little-endian bytes (one `np.frombuffer` to decode), with
the observation dtype/shape fixed once per stream by the handshake. Every
check raises `ProtocolError` naming the offending field, which the server
turns into gRPC INVALID_ARGUMENT for that stream only (`OutOfOrder`, a message
of the wrong kind for its place in the stream, into FAILED_PRECONDITION).
docs/wire.md is the contract these checks implement.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings

import numpy as np

from seedq.schema import EnvSpec
from seedq.v1 import seed_pb2

PROTOCOL_VERSION = 1

ENV_INDEX_DTYPE = np.dtype("<i4")
REWARD_DTYPE = np.dtype("<f4")
FLAG_DTYPE = np.dtype("u1")


# Observation dtypes the wire carries: booleans, integers and floats of these
# kinds, little-endian (or single-byte). Strings, bytes, structured, complex,
# object and datetime dtypes have no meaning to a network; big-endian ones
# would be misread by np.frombuffer on every learner (all are little-endian).
OBSERVATION_DTYPE_KINDS = frozenset("biuf")
# The learner's gRPC message limit (both directions; docs/wire.md). One env's
# observation must fit in one message.
MAX_MESSAGE_BYTES = 64 << 20
# How the details of a RESOURCE_EXHAUSTED that refuses a handshake begin when
# the learner's env-slot budget (server.max_envs) is full: unlike a message
# over the size limit, retrying later can succeed (docs/wire.md).
SLOT_BUDGET_MARKER = "env-slot budget full"
# How the details of the UNAVAILABLE that ends every stream of a learner that
# failed (stop_reason learner_error) begin: actors say so once and reconnect.
LEARNER_FAILED_MARKER = "learner failed"
# How the details of the UNAVAILABLE begin that ends the streams of clients
# without `reads_run_ended` when the run is over (the others get RunEnded).
RUN_ENDED_MARKER = "learner is shutting down: the run ended"
# Longest actor_id / run_id a handshake may carry (they are logged and keyed on).
MAX_ID_LENGTH = 128
MAX_OBSERVATION_BYTES = MAX_MESSAGE_BYTES
_LITTLE_ENDIAN_HOST = np.dtype("=i4").str == "<i4"


class ProtocolError(ValueError):
    """A message that violates the wire contract; `field` names the culprit."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class OutOfOrder(ProtocolError):
    """A well-formed message of the wrong kind for its place in the stream
    (a step before the handshake, a second handshake): FAILED_PRECONDITION."""


def _spellings(dtype: np.dtype) -> set[str]:
    """The names of `dtype` the wire accepts: 'float32', '<f4', 'f4', '=f4' (native
    order, little-endian hosts only: checked by the caller), and the one-letter code."""
    return {dtype.name, dtype.str, dtype.str[1:], "=" + dtype.str[1:], dtype.char}


def wire_dtype(text: str, field: str) -> np.dtype:
    """The NumPy dtype a wire dtype string names, or ProtocolError naming `field`.

    Accepted: a NumPy name or array-protocol string of a bool/int/uint/float
    type ("float32", "uint8", "<f4", "|u1", "f4"), never big-endian (">f4").
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated aliases still parse
            dtype = np.dtype(text)
    except Exception:  # NumPy raises TypeError, ValueError or SyntaxError here
        raise ProtocolError(field, f"unknown dtype {text!r}") from None
    if dtype.kind not in OBSERVATION_DTYPE_KINDS or dtype.fields or dtype.subdtype:
        raise ProtocolError(
            field, f"dtype {text!r} ({dtype}) is not a bool, integer or floating type"
        )
    # NumPy also reads odd spellings ("\x00" is bool, padded strings parse):
    # only the dtype's own names are part of the contract.
    if text not in _spellings(dtype):
        raise ProtocolError(field, f"unknown dtype {text!r} (write it as {dtype.name!r} or {dtype.str!r})")
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and not _LITTLE_ENDIAN_HOST):
        raise ProtocolError(field, f"dtype {text!r} is big-endian; the wire is little-endian")
    return dtype


# --- handshake -------------------------------------------------------------


def spec_to_proto(spec: EnvSpec) -> tuple[seed_pb2.TensorSpec, seed_pb2.ActionSpace]:
    """(observation, action_space) messages describing `spec`."""
    action_space = seed_pb2.ActionSpace()
    if spec.discrete:
        action_space.discrete = spec.num_actions
    else:
        action_space.box.shape.extend(spec.action_shape)
        action_space.box.low.extend(spec.action_low)
        action_space.box.high.extend(spec.action_high)
    observation = seed_pb2.TensorSpec(dtype=spec.obs_dtype, shape=spec.obs_shape)
    return observation, action_space


def spec_from_proto(
    observation: seed_pb2.TensorSpec, action_space: seed_pb2.ActionSpace, prefix: str
) -> EnvSpec:
    """Validates an (observation, action_space) pair; errors name `prefix`.field."""
    obs_dtype = wire_dtype(observation.dtype, f"{prefix}.observation.dtype")
    shape = tuple(int(d) for d in observation.shape)
    if any(d <= 0 for d in shape):
        raise ProtocolError(
            f"{prefix}.observation.shape", f"dimensions must be > 0, got {list(shape)}"
        )
    # Python ints: no overflow however large the dimensions.
    if obs_dtype.itemsize * math.prod(shape) > MAX_OBSERVATION_BYTES:
        raise ProtocolError(
            f"{prefix}.observation.shape",
            f"{list(shape)} x {obs_dtype.name} is over {MAX_OBSERVATION_BYTES} bytes per env",
        )
    obs = dict(obs_dtype=obs_dtype.name, obs_shape=shape)
    kind = action_space.WhichOneof("kind")
    if kind == "discrete":
        if action_space.discrete <= 0:
            raise ProtocolError(f"{prefix}.action_space.discrete", "must be > 0")
        return EnvSpec(**obs, num_actions=int(action_space.discrete))
    if kind != "box":
        raise ProtocolError(f"{prefix}.action_space", "must be discrete or box")
    box = action_space.box
    where = f"{prefix}.action_space.box"
    action_shape = tuple(int(d) for d in box.shape)
    if any(d <= 0 for d in action_shape) or math.prod(action_shape) > 1 << 20:
        raise ProtocolError(
            where + ".shape", f"dimensions must be > 0 (at most 2^20 in all), got {list(action_shape)}"
        )
    size = math.prod(action_shape)
    low, high = np.asarray(box.low, np.float64), np.asarray(box.high, np.float64)
    for name, bound in (("low", low), ("high", high)):
        if len(bound) != size:
            raise ProtocolError(f"{where}.{name}", f"{len(bound)} values for shape {list(action_shape)}")
        if np.isnan(bound).any():
            raise ProtocolError(f"{where}.{name}", "must not be NaN")
    if (low > high).any():
        raise ProtocolError(f"{where}.low", "must be <= high")
    return EnvSpec(
        **obs, action_shape=action_shape,
        action_low=tuple(float(x) for x in low), action_high=tuple(float(x) for x in high),
    )


def encode_handshake(
    spec: EnvSpec, *, actor_id: str, run_id: str, num_envs: int, env_id: str = "",
    reads_run_ended: bool = False,
) -> seed_pb2.ActorMessage:
    observation, action_space = spec_to_proto(spec)
    return seed_pb2.ActorMessage(
        handshake=seed_pb2.Handshake(
            protocol_version=PROTOCOL_VERSION,
            actor_id=actor_id,
            run_id=run_id,
            num_envs=num_envs,
            observation=observation,
            action_space=action_space,
            env_id=env_id,
            reads_run_ended=reads_run_ended,
        )
    )


def decode_handshake(message: seed_pb2.ActorMessage) -> tuple[seed_pb2.Handshake, EnvSpec]:
    """Validates the first message of a stream and returns it with the actor's spec."""
    kind = message.WhichOneof("kind")
    if kind == "steps":
        raise OutOfOrder("handshake", "the first message of a stream must be a handshake, got steps")
    if kind != "handshake":
        raise ProtocolError("handshake", "the first message of a stream must be a handshake")
    hs = message.handshake
    if hs.protocol_version != PROTOCOL_VERSION:
        raise ProtocolError(
            "handshake.protocol_version",
            f"actor speaks version {hs.protocol_version}, learner speaks {PROTOCOL_VERSION}",
        )
    for field, value in (("actor_id", hs.actor_id), ("run_id", hs.run_id)):
        check_id(f"handshake.{field}", value)
    if hs.num_envs <= 0:
        raise ProtocolError("handshake.num_envs", f"must be > 0, got {hs.num_envs}")
    return hs, spec_from_proto(hs.observation, hs.action_space, "handshake")


def check_id(field: str, value: str) -> None:
    """Ids are logged and used as keys: non-empty, at most MAX_ID_LENGTH
    printable characters (no control characters to forge log lines with)."""
    if not value:
        raise ProtocolError(field, "must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise ProtocolError(field, f"{len(value)} characters, at most {MAX_ID_LENGTH}")
    if not value.isprintable():
        raise ProtocolError(field, "must be printable characters only")


def encode_handshake_ack(spec: EnvSpec, learner_run: str) -> seed_pb2.LearnerMessage:
    """The learner's reply to an accepted handshake: its run and expected spec."""
    observation, action_space = spec_to_proto(spec)
    return seed_pb2.LearnerMessage(
        ack=seed_pb2.HandshakeAck(
            protocol_version=PROTOCOL_VERSION, learner_run=learner_run,
            observation=observation, action_space=action_space,
        )
    )


def decode_handshake_ack(message: seed_pb2.LearnerMessage) -> tuple[seed_pb2.HandshakeAck, EnvSpec | None]:
    """(ack, the learner's expected spec; None from a learner that sends none)."""
    if message.WhichOneof("kind") != "ack":
        raise ProtocolError("ack", f"expected a HandshakeAck, got {message.WhichOneof('kind')}")
    ack = message.ack
    if not ack.HasField("observation"):
        return ack, None
    return ack, spec_from_proto(ack.observation, ack.action_space, "ack")


# --- steps -----------------------------------------------------------------


@dataclasses.dataclass
class Steps:
    """One decoded StepBatch; n = len(env_indices)."""

    env_indices: np.ndarray  # int32 [n]
    rewards: np.ndarray  # float32 [n]
    terminated: np.ndarray  # bool [n]
    truncated: np.ndarray  # bool [n]
    observations: np.ndarray  # obs dtype [n, *obs_shape]

    def __len__(self) -> int:
        return len(self.env_indices)


def encode_steps(
    env_indices: np.ndarray,
    rewards: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    observations: np.ndarray,
) -> seed_pb2.ActorMessage:
    return seed_pb2.ActorMessage(
        steps=seed_pb2.StepBatch(
            env_indices=np.asarray(env_indices, ENV_INDEX_DTYPE).tobytes(),
            rewards=np.asarray(rewards, REWARD_DTYPE).tobytes(),
            terminated=np.asarray(terminated, FLAG_DTYPE).tobytes(),
            truncated=np.asarray(truncated, FLAG_DTYPE).tobytes(),
            observations=np.ascontiguousarray(observations).tobytes(),
        )
    )


def _array(field: str, data: bytes, dtype: np.dtype, count: int) -> np.ndarray:
    if len(data) != count * dtype.itemsize:
        raise ProtocolError(
            field,
            f"expected {count * dtype.itemsize} bytes ({count} x {dtype.name}), got {len(data)}",
        )
    return np.frombuffer(data, dtype)


def _finite(field: str, values: np.ndarray) -> np.ndarray:
    """Refuses NaN/inf in a floating array: nothing non-finite may reach training."""
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        bad = np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(axis=1))
        raise ProtocolError(field, f"non-finite value (NaN or inf) at entry {int(bad[0])}")
    return values


def _flags(field: str, data: bytes, count: int) -> np.ndarray:
    """uint8 0/1 on the wire -> bool; any other byte is refused."""
    values = _array(field, data, FLAG_DTYPE, count)
    if data.translate(None, b"\x00\x01"):  # bytes left after deleting the 0s and 1s (no NumPy call)
        raise ProtocolError(field, f"flags must be 0 or 1, got {int(values.max())}")
    return values.view(bool)


@functools.lru_cache(maxsize=64)
def _every_env_in_order(num_envs: int) -> bytes:
    """The env_indices bytes of a step of all `num_envs` envs, 0..n-1 (what actors send)."""
    return np.arange(num_envs, dtype=ENV_INDEX_DTYPE).tobytes()


def decode_steps(message: seed_pb2.ActorMessage, spec: EnvSpec, num_envs: int) -> Steps:
    """Validates a StepBatch against the stream's handshake and decodes it."""
    kind = message.WhichOneof("kind")
    if kind == "handshake":
        raise OutOfOrder("steps", "a second handshake on one stream (open a new stream instead)")
    if kind != "steps":
        raise ProtocolError("steps", f"expected a StepBatch after the handshake, got {kind}")
    msg = message.steps
    if len(msg.env_indices) % ENV_INDEX_DTYPE.itemsize:
        raise ProtocolError("steps.env_indices", f"{len(msg.env_indices)} bytes is not int32[n]")
    n = len(msg.env_indices) // ENV_INDEX_DTYPE.itemsize
    if n == 0:
        raise ProtocolError("steps.env_indices", "must name at least one env")
    env_indices = np.frombuffer(msg.env_indices, ENV_INDEX_DTYPE)
    # Every env in order is the usual message: valid by a comparison of bytes.
    if msg.env_indices != _every_env_in_order(num_envs):
        bad = (env_indices < 0) | (env_indices >= num_envs)
        if bad.any():
            raise ProtocolError(
                "steps.env_indices",
                f"unknown env index {int(env_indices[bad][0])} (handshake declared {num_envs} envs)",
            )
        if n > 1 and np.bincount(env_indices, minlength=num_envs).max() > 1:
            raise ProtocolError("steps.env_indices", "an env index appears twice in one batch")
    rewards = _finite("steps.rewards", _array("steps.rewards", msg.rewards, REWARD_DTYPE, n))
    terminated = _flags("steps.terminated", msg.terminated, n)
    truncated = _flags("steps.truncated", msg.truncated, n)
    obs_dtype = spec.obs_np_dtype
    if len(msg.observations) != n * spec.obs_nbytes:
        raise ProtocolError(
            "steps.observations",
            f"expected {n * spec.obs_nbytes} bytes ({n} x {obs_dtype.name}{list(spec.obs_shape)}), "
            f"got {len(msg.observations)}",
        )
    observations = np.frombuffer(msg.observations, obs_dtype).reshape((n, *spec.obs_shape))
    _finite("steps.observations", observations)
    return Steps(env_indices, rewards, terminated, truncated, observations)


# --- actions ---------------------------------------------------------------


def encode_actions(actions: np.ndarray, spec: EnvSpec, policy_version: int) -> seed_pb2.LearnerMessage:
    return seed_pb2.LearnerMessage(
        actions=seed_pb2.ActionBatch(
            actions=np.asarray(actions, spec.action_dtype).tobytes(),
            policy_version=policy_version,
        )
    )


def encode_run_ended(stop_reason: str, learner_run: str) -> seed_pb2.LearnerMessage:
    return seed_pb2.LearnerMessage(run_ended=seed_pb2.RunEnded(stop_reason=stop_reason, learner_run=learner_run))


class RunEnded(Exception):
    """The learner said its run is over (LearnerMessage.run_ended): the actor stops for good."""

    def __init__(self, stop_reason: str, learner_run: str = ""):
        super().__init__(f"the run {learner_run or ''} ended ({stop_reason or 'no reason given'})".replace("  ", " "))
        self.stop_reason = stop_reason
        self.learner_run = learner_run


def raise_if_run_ended(message: seed_pb2.LearnerMessage) -> None:
    """RunEnded if `message` is the learner's end-of-run notice."""
    if message.WhichOneof("kind") == "run_ended":
        raise RunEnded(message.run_ended.stop_reason, message.run_ended.learner_run)


def decode_actions(message: seed_pb2.LearnerMessage, spec: EnvSpec, n: int) -> np.ndarray:
    if message.WhichOneof("kind") != "actions":
        raise ProtocolError("actions", f"expected an ActionBatch, got {message.WhichOneof('kind')}")
    count = n * int(np.prod(spec.action_shape, dtype=np.int64))
    flat = _finite("actions.actions", _array("actions.actions", message.actions.actions, spec.action_dtype, count))
    if spec.discrete and len(flat) and (flat.min() < 0 or flat.max() >= spec.num_actions):
        # An env given an action outside its space fails somewhere deep inside
        # it (or, worse, acts on it): the learner's reply is refused here instead.
        bad = int(np.flatnonzero((flat < 0) | (flat >= spec.num_actions))[0])
        raise ProtocolError("actions.actions", f"env {bad}'s action {int(flat[bad])} is outside "
                            f"{spec.action_text()} (a learner bug, or a learner for another env)")
    return flat.reshape((n, *spec.action_shape))
