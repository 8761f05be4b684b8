"""The fuzzed wire: generated handshakes, step batches and IMPALA unroll pushes.

Most cases are mutated-valid: hypothesis builds a valid message, then breaks
exactly one thing (a truncated or oversized byte field, a wrong dtype, shape,
env index or count, a duplicated index, NaN/inf, an out-of-range action or
flag, a message out of order), so the refusal's status and field are known
in advance. The rest are random messages, which must either decode into
values that satisfy the contract or be refused naming a field of their
message. The decode functions take the bulk (cheap); a share goes through
real learners on unix sockets, one of them training with a real actor beside
the fuzz, whose unrolls must keep arriving throughout while nothing
non-finite ever enters the training queue and the learner logs no
unhandled exception.

Total (the max_examples below): 10,000 decode-level cases plus 800 through
the servers (400 SEED streams, 200 IMPALA pushes, 200 requests of random
bytes); derandomized for a stable CI.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import subprocess
import sys
import time
import uuid

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seedq.bench.drain import drain_unrolls
from seedq.config import ServerConfig, TrainConfig, VTraceConfig
from seedq.learner.learner import Learner
from seedq.server.service import MAX_MESSAGE_BYTES
from seedq.v1 import seed_pb2, seed_pb2_grpc
from seedq.impala import codec as impala_codec
from seedq.wire import codec
from seedq.schema import EnvSpec
from seedq.wire.codec import OutOfOrder, ProtocolError

from tests.queue_tap import QueueTap

pytestmark = pytest.mark.timeout(300)

INVALID, PRECONDITION = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
CARTPOLE = EnvSpec("float32", (4,), num_actions=2)
GOOD_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
               "float16", "float32", "float64", "<f4", "|u1", "f4", "<i8", "=f8", "?"]
BAD_DTYPES = ["S16", "U4", "V16", "f4,", ">f4", ">i2", ">f8", ">u4", "c8", "complex128", "O",
              "object", "M8", "m8[s]", "(2,)f4", "f4,i4", "", "not-a-dtype", "float33", "<U8",
              "a5", "[('a', '<f4')]", "i4 ", "\x00", "f4\x00", "datetime64[ns]", "str", "bytes"]


def fuzz(max_examples: int):
    return settings(
        max_examples=max_examples, deadline=None, derandomize=True, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@dataclasses.dataclass
class Case:
    """A message sequence and the refusal it must get (field None: accepted)."""

    messages: list
    field: str | None
    error: type = ProtocolError

    @property
    def code(self):
        return PRECONDITION if self.error is OutOfOrder else INVALID

    def check(self, call, label=""):
        """Runs the decode `call`; asserts the expected refusal (or acceptance)."""
        if self.field is None:
            return call()
        with pytest.raises(ProtocolError) as info:
            call()
        assert info.value.field == self.field, (label, str(info.value))
        assert str(info.value).startswith(self.field + ":")
        assert type(info.value) is self.error, (label, type(info.value))
        return None


# --- strategies: handshakes -----------------------------------------------------------


box_shapes = st.lists(st.integers(1, 4), min_size=1, max_size=2).map(tuple)


@st.composite
def specs(draw):
    dtype = draw(st.sampled_from(GOOD_DTYPES))
    obs_shape = tuple(draw(st.lists(st.integers(1, 8), min_size=1, max_size=3)))
    if draw(st.booleans()):
        return EnvSpec(np.dtype(dtype).name, obs_shape, num_actions=draw(st.integers(1, 18)))
    shape = draw(box_shapes)
    size = math.prod(shape)
    low = draw(st.lists(st.floats(-10, 0, width=32), min_size=size, max_size=size))
    return EnvSpec(np.dtype(dtype).name, obs_shape, action_shape=shape, action_low=tuple(low),
                   action_high=tuple(x + 1.0 for x in low))


def handshake_of(spec=CARTPOLE, num_envs=2):
    return codec.encode_handshake(spec, actor_id="fuzz-" + uuid.uuid4().hex[:8],
                                  run_id=uuid.uuid4().hex, num_envs=num_envs)


def _set_shape(repeated, values):
    del repeated[:]
    repeated.extend(values)


@st.composite
def broken_handshakes(draw, spec_strategy=specs()):
    """(a valid handshake with exactly one defect, its field and error class)."""
    spec = draw(spec_strategy)
    message = handshake_of(spec, num_envs=draw(st.integers(1, 64)))
    hs = message.handshake
    kind = draw(st.sampled_from([
        "version", "actor_id", "run_id", "num_envs", "dtype", "shape", "huge_shape",
        "discrete", "no_action_space", "box_shape", "box_low_count", "box_high_count",
        "box_nan", "box_order", "steps_first", "empty",
    ]))
    box = not spec.discrete
    if kind.startswith("box") and not box:
        kind = "discrete"
    if kind == "version":
        hs.protocol_version = draw(st.integers(0, 2**32 - 1).filter(lambda v: v != 1))
        return Case([message], "handshake.protocol_version")
    if kind in ("actor_id", "run_id"):
        setattr(hs, kind, "")
        return Case([message], "handshake." + kind)
    if kind == "num_envs":
        hs.num_envs = 0
        return Case([message], "handshake.num_envs")
    if kind == "dtype":
        hs.observation.dtype = draw(st.sampled_from(BAD_DTYPES))
        return Case([message], "handshake.observation.dtype")
    if kind == "shape":
        shape = list(hs.observation.shape)
        shape[draw(st.integers(0, len(shape) - 1))] = draw(st.integers(-(2**63), 0))
        _set_shape(hs.observation.shape, shape)
        return Case([message], "handshake.observation.shape")
    if kind == "huge_shape":
        _set_shape(hs.observation.shape, draw(st.lists(st.integers(2**14, 2**62), min_size=2, max_size=4)))
        return Case([message], "handshake.observation.shape")
    if kind == "discrete":
        hs.action_space.discrete = draw(st.integers(-(2**63), 0))
        return Case([message], "handshake.action_space.discrete")
    if kind == "no_action_space":
        hs.ClearField("action_space")
        return Case([message], "handshake.action_space")
    b = hs.action_space.box
    if kind == "box_shape":
        _set_shape(b.shape, [*b.shape[:-1], draw(st.integers(-(2**63), 0))])
        return Case([message], "handshake.action_space.box.shape")
    if kind in ("box_low_count", "box_high_count"):
        bound = b.low if kind == "box_low_count" else b.high
        if draw(st.booleans()):
            bound.append(0.0)
        else:
            del bound[-1]
        return Case([message], "handshake.action_space.box." + kind.split("_")[1])
    if kind == "box_nan":
        b.low[draw(st.integers(0, len(b.low) - 1))] = math.nan
        return Case([message], "handshake.action_space.box.low")
    if kind == "box_order":
        i = draw(st.integers(0, len(b.low) - 1))
        b.low[i] = b.high[i] + 1.0
        return Case([message], "handshake.action_space.box.low")
    if kind == "steps_first":
        n = 1
        return Case([codec.encode_steps([0], [0.0], [0], [0], np.zeros((n, *spec.obs_shape), spec.obs_dtype))],
                    "handshake", OutOfOrder)
    return Case([seed_pb2.ActorMessage()], "handshake")


@st.composite
def mismatched_handshakes(draw):
    """Valid handshakes that a CartPole learner must refuse: another spec or too many envs."""
    kind = draw(st.sampled_from(["dtype", "shape", "actions", "box", "num_envs"]))
    if kind == "dtype":
        dtype = draw(st.sampled_from([d for d in GOOD_DTYPES if np.dtype(d) != np.float32]))
        return Case([handshake_of(dataclasses.replace(CARTPOLE, obs_dtype=dtype))], "handshake.observation.dtype")
    if kind == "shape":
        shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3).filter(lambda s: s != [4])))
        return Case([handshake_of(dataclasses.replace(CARTPOLE, obs_shape=shape))], "handshake.observation.shape")
    if kind == "actions":
        n = draw(st.integers(1, 2**62).filter(lambda n: n != 2))
        return Case([handshake_of(dataclasses.replace(CARTPOLE, num_actions=n))], "handshake.action_space")
    if kind == "box":
        spec = EnvSpec("float32", (4,), action_shape=(1,), action_low=(-1.0,), action_high=(1.0,))
        return Case([handshake_of(spec)], "handshake.action_space")
    return Case([handshake_of(num_envs=draw(st.integers(4097, 2**32 - 1)))], "handshake.num_envs")


random_handshakes = st.builds(
    lambda version, actor, run, n, dtype, shape, discrete, box, which: seed_pb2.ActorMessage(
        handshake=seed_pb2.Handshake(
            protocol_version=version, actor_id=actor, run_id=run, num_envs=n,
            observation=seed_pb2.TensorSpec(dtype=dtype, shape=shape),
            action_space=(seed_pb2.ActionSpace(discrete=discrete) if which == 0 else
                          seed_pb2.ActionSpace(box=box) if which == 1 else seed_pb2.ActionSpace()),
        )
    ),
    st.sampled_from([1, 1, 1, 0, 2]), st.text(max_size=4), st.text(max_size=4),
    st.integers(0, 2**32 - 1), st.sampled_from(GOOD_DTYPES + BAD_DTYPES) | st.text(max_size=6),
    st.lists(st.integers(-3, 2**40), max_size=4), st.integers(-(2**63), 2**63 - 1),
    st.builds(seed_pb2.BoxSpace, shape=st.lists(st.integers(-2, 3), max_size=2),
              low=st.lists(st.floats(width=32), max_size=4), high=st.lists(st.floats(width=32), max_size=4)),
    st.integers(0, 2),
)


# --- strategies: step batches ------------------------------------------------------------


@st.composite
def valid_steps(draw, spec, num_envs):
    """A valid StepBatch (message, n) for `spec` and `num_envs`."""
    order = draw(st.permutations(range(num_envs)))
    n = draw(st.integers(1, num_envs))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    obs = rng.normal(size=(n, *spec.obs_shape)) * 3
    message = codec.encode_steps(
        order[:n], rng.normal(size=n), rng.integers(0, 2, n), rng.integers(0, 2, n),
        obs.astype(spec.obs_dtype),
    )
    return message, n


def _resize(data: bytes, delta: int) -> bytes:
    return data[:delta] if delta < 0 else data + bytes(delta)


@st.composite
def broken_steps(draw, spec_strategy=specs(), envs=st.integers(1, 8)):
    """(spec, num_envs, a valid StepBatch with exactly one defect -> Case)."""
    spec, num_envs = draw(spec_strategy), draw(envs)
    message, n = draw(valid_steps(spec, num_envs))
    steps = message.steps
    float_obs = np.dtype(spec.obs_dtype).kind == "f"
    kind = draw(st.sampled_from([
        "indices_bytes", "indices_empty", "index_range", "index_twice", "rewards_bytes",
        "rewards_nonfinite", "terminated_bytes", "truncated_bytes", "terminated_value",
        "truncated_value", "obs_bytes", "obs_nonfinite", "handshake_again", "empty",
    ]))
    if kind == "index_twice" and n < 2:
        kind = "index_range"
    if kind == "obs_nonfinite" and not float_obs:
        kind = "obs_bytes"
    indices = np.frombuffer(steps.env_indices, "<i4").copy()
    case = lambda field, error=ProtocolError: (spec, num_envs, Case([message], field, error))  # noqa: E731
    if kind == "indices_bytes":
        steps.env_indices = _resize(steps.env_indices, draw(st.sampled_from([-3, -2, -1, 1, 2, 3])))
        return case("steps.env_indices")
    if kind == "indices_empty":
        for name in ("env_indices", "rewards", "terminated", "truncated", "observations"):
            setattr(steps, name, b"")
        return case("steps.env_indices")
    if kind == "index_range":
        indices[draw(st.integers(0, n - 1))] = draw(
            st.integers(-(2**31), -1) | st.integers(num_envs, 2**31 - 1))
        steps.env_indices = indices.tobytes()
        return case("steps.env_indices")
    if kind == "index_twice":
        i, j = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True))
        indices[j] = indices[i]
        steps.env_indices = indices.tobytes()
        return case("steps.env_indices")
    if kind.endswith("_bytes"):
        name = {"rewards_bytes": "rewards", "terminated_bytes": "terminated",
                "truncated_bytes": "truncated", "obs_bytes": "observations"}[kind]
        data = getattr(steps, name)
        delta = draw(st.integers(-len(data), 64).filter(lambda d: d != 0))
        setattr(steps, name, _resize(data, delta))
        return case("steps." + name)
    if kind == "rewards_nonfinite":
        rewards = np.frombuffer(steps.rewards, "<f4").copy()
        rewards[draw(st.integers(0, n - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        steps.rewards = rewards.tobytes()
        return case("steps.rewards")
    if kind.endswith("_value"):
        name = kind.split("_")[0]
        flags = bytearray(getattr(steps, name))
        flags[draw(st.integers(0, n - 1))] = draw(st.integers(2, 255))
        setattr(steps, name, bytes(flags))
        return case("steps." + name)
    if kind == "obs_nonfinite":
        obs = np.frombuffer(steps.observations, spec.obs_dtype).copy()
        obs[draw(st.integers(0, len(obs) - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        steps.observations = obs.tobytes()
        return case("steps.observations")
    if kind == "handshake_again":
        return spec, num_envs, Case([handshake_of(spec)], "steps", OutOfOrder)
    return spec, num_envs, Case([seed_pb2.ActorMessage()], "steps")


random_steps = st.builds(
    lambda i, r, te, tr, o: seed_pb2.ActorMessage(steps=seed_pb2.StepBatch(
        env_indices=i, rewards=r, terminated=te, truncated=tr, observations=o)),
    st.binary(max_size=24), st.binary(max_size=24), st.binary(max_size=6),
    st.binary(max_size=6), st.binary(max_size=96),
)


def assert_valid_steps(steps, spec, num_envs):
    """What the contract promises about every accepted StepBatch."""
    n = len(steps)
    assert n >= 1
    assert ((steps.env_indices >= 0) & (steps.env_indices < num_envs)).all()
    assert len(set(steps.env_indices.tolist())) == n
    assert np.isfinite(steps.rewards).all() and steps.rewards.shape == (n,)
    assert steps.terminated.dtype == bool and steps.truncated.dtype == bool
    assert set(steps.terminated.view(np.uint8).tolist()) <= {0, 1}
    assert set(steps.truncated.view(np.uint8).tolist()) <= {0, 1}
    assert steps.observations.shape == (n, *spec.obs_shape)
    if steps.observations.dtype.kind == "f":
        assert np.isfinite(steps.observations).all()


# --- strategies: IMPALA unroll batches ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class UnrollLayout:
    """The learner's sequence definition that unroll batches are checked against."""

    fields: dict
    length: int
    initial_only: frozenset
    max_unrolls: int
    num_actions: int

    def decode(self, message):
        return impala_codec.decode_unrolls(
            message, self.fields, self.length, self.initial_only, self.max_unrolls,
            num_actions=self.num_actions,
        )


def valid_unrolls(layout: UnrollLayout, k: int, rng) -> dict[str, np.ndarray]:
    out = {}
    for name, spec in layout.fields.items():
        shape = (k, *(() if name in layout.initial_only else (layout.length,)), *spec.shape)
        dtype = np.dtype(spec.dtype)
        if name == "action":
            out[name] = rng.integers(0, layout.num_actions, shape).astype(dtype)
        elif name == "policy_version":
            out[name] = np.zeros(shape, dtype)
        elif dtype == bool:
            out[name] = rng.integers(0, 2, shape).astype(bool)
        elif dtype.kind == "f":
            out[name] = rng.normal(size=shape).astype(dtype)
        else:
            out[name] = rng.integers(0, 3, shape).astype(dtype)
    return out


@st.composite
def broken_unrolls(draw, layout: UnrollLayout):
    """A valid UnrollBatch with exactly one defect -> Case."""
    k = draw(st.integers(1, layout.max_unrolls))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    unrolls = valid_unrolls(layout, k, rng)
    episodes = draw(st.integers(0, 3))
    returns, lengths = rng.normal(size=episodes) * 10, rng.integers(1, 500, episodes)
    frames = draw(st.integers(0, k * layout.length))
    message = impala_codec.encode_unrolls(unrolls, frames, returns, lengths)
    batch = message.unrolls
    names = [f.name for f in batch.fields]
    i = draw(st.integers(0, len(names) - 1))
    target, where = batch.fields[i], f"unrolls.fields[{names[i]}]"
    dtype = np.dtype(layout.fields[names[i]].dtype)
    kind = draw(st.sampled_from([
        "dtype", "shape", "data", "nonfinite", "bool_byte", "action_range", "duplicate", "missing",
        "unknown", "too_many", "returns_bytes", "returns_nonfinite", "lengths_count",
        "lengths_negative", "frames",
    ]))
    if kind == "nonfinite" and dtype.kind != "f":
        kind = "data"
    if kind == "bool_byte" and dtype != bool:
        kind = "shape"
    if kind == "dtype":
        other = draw(st.sampled_from(["float32", "float64", "int32", "int64", "bool", "uint8", "<f4",
                                      ">f4", "S16", ""]).filter(lambda d: d != dtype.name))
        target.dtype = other
        return Case([message], where + ".dtype")
    if kind == "shape":
        shape = list(target.shape)
        axis = draw(st.integers(1 if i == 0 else 0, len(shape) - 1)) if len(shape) > (1 if i == 0 else 0) else None
        if axis is None:  # a 1-D first field: add an axis instead
            shape.append(1)
        else:
            shape[axis] = draw(st.integers(-3, 64).filter(lambda d, old=shape[axis]: d != old))
        _set_shape(target.shape, shape)
        return Case([message], where + ".shape")
    if kind == "data":
        target.data = _resize(target.data, draw(st.integers(-len(target.data), 64).filter(lambda d: d != 0)))
        return Case([message], where + ".data")
    if kind == "nonfinite":
        values = np.frombuffer(target.data, dtype).copy()
        values[draw(st.integers(0, len(values) - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        target.data = values.tobytes()
        return Case([message], where + ".data")
    if kind == "bool_byte":
        data = bytearray(target.data)
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(2, 255))
        target.data = bytes(data)
        return Case([message], where + ".data")
    if kind == "action_range":
        action = next(f for f in batch.fields if f.name == "action")
        values = np.frombuffer(action.data, "<i4").copy()
        values[draw(st.integers(0, len(values) - 1))] = draw(
            st.integers(-(2**31), -1) | st.integers(layout.num_actions, 2**31 - 1))
        action.data = values.tobytes()
        return Case([message], "unrolls.fields[action].data")
    if kind == "duplicate":
        batch.fields.append(batch.fields[i])
        return Case([message], "unrolls.fields")
    if kind == "missing":
        del batch.fields[i]
        return Case([message], "unrolls.fields")
    if kind == "unknown":
        batch.fields.append(seed_pb2.NamedArray(name=draw(st.text(min_size=1, max_size=8).filter(
            lambda s: s not in layout.fields)), dtype="float32"))
        return Case([message], "unrolls.fields")
    if kind == "too_many":
        many = valid_unrolls(layout, layout.max_unrolls + draw(st.integers(1, 3)), rng)
        return Case([impala_codec.encode_unrolls(many, 0)], f"unrolls.fields[{next(iter(many))}].shape")
    if kind == "returns_bytes":
        batch.episode_returns += bytes(draw(st.integers(1, 7)))
        return Case([message], "unrolls.episode_returns")
    if kind == "returns_nonfinite":
        values = np.append(returns, draw(st.sampled_from([np.nan, np.inf, -np.inf])))
        batch.episode_returns = values.astype("<f8").tobytes()
        batch.episode_lengths = np.append(lengths, 1).astype("<i8").tobytes()
        return Case([message], "unrolls.episode_returns")
    if kind == "lengths_count":
        batch.episode_lengths = np.append(lengths, 1).astype("<i8").tobytes()
        return Case([message], "unrolls.episode_lengths")
    if kind == "lengths_negative":
        batch.episode_returns = np.append(returns, 0.0).astype("<f8").tobytes()
        batch.episode_lengths = np.append(lengths, draw(st.integers(-(2**63), -1))).astype("<i8").tobytes()
        return Case([message], "unrolls.episode_lengths")
    batch.frames = draw(st.integers(k * layout.length + 1, 2**64 - 1))
    return Case([message], "unrolls.frames")


@st.composite
def random_unrolls(draw, layout: UnrollLayout):
    names = sorted(layout.fields)
    fields = [
        seed_pb2.NamedArray(
            name=draw(st.sampled_from(names) | st.text(max_size=3)),
            dtype=draw(st.sampled_from(["float32", "int32", "bool", "float64", "x"])),
            shape=draw(st.lists(st.integers(-1, 4), max_size=3)),
            data=draw(st.binary(max_size=64)),
        )
        for _ in range(draw(st.integers(0, len(names) + 1)))
    ]
    return seed_pb2.UnrollMessage(unrolls=seed_pb2.UnrollBatch(
        fields=fields, frames=draw(st.integers(0, 2**64 - 1)),
        episode_returns=draw(st.binary(max_size=24)), episode_lengths=draw(st.binary(max_size=24)),
    ))


# --- decode-level fuzz (10,000 cases) ----------------------------------------------------


def run_fuzz(strategy, max_examples, body):
    """Runs `body(example)` on `max_examples` generated examples; returns the count."""
    seen = []

    @fuzz(max_examples)
    @given(strategy)
    def check(example):
        body(example)
        seen.append(None)

    check()
    assert len(seen) >= max_examples  # every generated case was run
    return len(seen)


@pytest.mark.unit
def test_fuzzed_handshakes_are_refused_naming_the_broken_field():
    run_fuzz(broken_handshakes(), 2500,
             lambda case: case.check(lambda: codec.decode_handshake(case.messages[0])))


@pytest.mark.unit
def test_random_handshakes_decode_to_a_sound_spec_or_are_refused():
    def body(message):
        try:
            hs, spec = codec.decode_handshake(message)
        except ProtocolError as e:
            assert e.field.startswith("handshake"), str(e)
            return
        dtype = np.dtype(spec.obs_dtype)
        assert dtype.kind in "biuf" and dtype.byteorder != ">"
        assert hs.protocol_version == 1 and hs.actor_id and hs.run_id and hs.num_envs > 0
        assert all(d > 0 for d in spec.obs_shape) and spec.obs_nbytes <= codec.MAX_OBSERVATION_BYTES
        assert spec.num_actions > 0 or len(spec.action_low) == math.prod(spec.action_shape)

    run_fuzz(random_handshakes, 1000, body)


@pytest.mark.unit
def test_fuzzed_step_batches_are_refused_naming_the_broken_field():
    def body(example):
        spec, num_envs, case = example
        case.check(lambda: codec.decode_steps(case.messages[0], spec, num_envs))

    run_fuzz(broken_steps(), 3000, body)


@pytest.mark.unit
def test_random_step_batches_decode_to_valid_steps_or_are_refused():
    spec = EnvSpec("float32", (2,), num_actions=2)
    fields = {f"steps.{n}" for n in ("env_indices", "rewards", "terminated", "truncated", "observations")}

    def body(message):
        try:
            steps = codec.decode_steps(message, spec, 3)
        except ProtocolError as e:
            assert e.field in fields, str(e)
            return
        assert_valid_steps(steps, spec, 3)

    run_fuzz(random_steps, 1000, body)


@pytest.mark.unit
def test_valid_step_batches_decode_to_what_was_sent():
    @st.composite
    def example(draw):
        spec, num_envs = draw(specs()), draw(st.integers(1, 8))
        return spec, num_envs, draw(valid_steps(spec, num_envs))

    def body(example):
        spec, num_envs, (message, n) = example
        wire = seed_pb2.ActorMessage.FromString(message.SerializeToString())
        steps = codec.decode_steps(wire, spec, num_envs)
        assert len(steps) == n
        assert_valid_steps(steps, spec, num_envs)
        assert steps.observations.tobytes() == message.steps.observations

    run_fuzz(example(), 500, body)


def impala_layout() -> UnrollLayout:
    """The CartPole V-trace learner's unroll definition, as an IMPALA learner checks it."""
    from seedq.agents import make_agent
    from seedq.schema import sequence_fields

    config = dataclasses.replace(TrainConfig(), env="CartPole-v1",
                                 vtrace=dataclasses.replace(VTraceConfig(), unroll_length=5))
    agent = make_agent(config, CARTPOLE)
    fields, initial_only = sequence_fields(agent, CARTPOLE)
    return UnrollLayout(fields, agent.sequence_spec().length, initial_only, 4, CARTPOLE.num_actions)


@pytest.mark.unit
def test_fuzzed_unroll_batches_are_refused_naming_the_broken_field():
    layout = impala_layout()
    run_fuzz(broken_unrolls(layout), 1500, lambda case: case.check(lambda: layout.decode(case.messages[0])))


@pytest.mark.unit
def test_random_unroll_batches_decode_soundly_or_are_refused():
    layout = impala_layout()

    def body(message):
        try:
            unrolls, frames, returns, lengths = layout.decode(message)
        except ProtocolError as e:
            assert e.field.startswith("unrolls"), str(e)
            return
        for value in unrolls.values():  # pragma: no cover - random bytes rarely form a batch
            assert value.dtype.kind != "f" or np.isfinite(value).all()

    run_fuzz(random_unrolls(layout), 500, body)


# --- through real servers ------------------------------------------------------------------


SERVER_CONFIG = dataclasses.replace(
    TrainConfig(), env="CartPole-v1",
    vtrace=dataclasses.replace(VTraceConfig(), unroll_length=5, batch_size=4),
    server=dataclasses.replace(ServerConfig(), queue_capacity_unrolls=64, max_batch_size=16),
)


class LogWatch(logging.Handler):
    """Collects the learner's log records that signal a bug: errors and tracebacks."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.bad: list[str] = []

    def emit(self, record):
        if record.exc_info or record.levelno >= logging.ERROR:
            self.bad.append(self.format(record))


class FiniteTap(QueueTap):
    """Counts the unrolls entering a learner's queue; every float in them must be finite."""

    def __init__(self, queue):
        self.non_finite = []
        super().__init__(queue)

    def record(self, chunk):
        for name, value in chunk.items():
            value = np.asarray(value)
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                self.non_finite.append(name)


def wait_until(predicate, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def log_watch():
    watch = LogWatch()
    logger = logging.getLogger("seedq")
    logger.addHandler(watch)
    grpc_logger = logging.getLogger("grpc")
    grpc_logger.addHandler(watch)
    yield watch
    logger.removeHandler(watch)
    grpc_logger.removeHandler(watch)


@pytest.fixture(scope="module")
def seed_cluster(tmp_path_factory, log_watch):
    """A training learner with one real actor process (4 CartPole envs)."""
    workdir = tmp_path_factory.mktemp("fuzz")
    learner = Learner(SERVER_CONFIG, f"unix:{workdir}/learner.sock")
    tap = FiniteTap(learner.queue)
    actor = None
    try:
        address = learner.start()
        log = open(workdir / "actor.log", "wb")
        actor = subprocess.Popen(
            [sys.executable, "-m", "seedq.cli", "actor", "--server", address, "--env", "CartPole-v1",
             "--num-envs", "4", "--actor-id", "real-1"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        wait_until(lambda: learner.train_steps > 0 or learner.error is not None, "the first train step")
        assert learner.error is None, learner.error
        yield learner, address, actor, tap
    finally:
        if actor is not None:
            actor.kill()
            actor.wait(timeout=10)
        learner.stop()


def call_stream(stub_method, messages, timeout=20.0):
    """Sends `messages`, reads until the stream ends: (replies, RpcError or None)."""
    replies = []
    try:
        for reply in stub_method(iter(messages), timeout=timeout):
            replies.append(reply)
    except grpc.RpcError as e:
        return replies, e
    return replies, None


def assert_refused(error, code, field, label):
    assert error is not None, f"{label}: accepted"
    assert error.code() == code, (label, error.code(), error.details())
    assert error.details().startswith(field + ":"), (label, field, error.details())


@st.composite
def server_seed_cases(draw):
    """Streams a CartPole learner must refuse: (messages, code, field, acks expected)."""
    which = draw(st.sampled_from(["handshake", "mismatch", "steps"]))
    if which == "handshake":
        case = draw(broken_handshakes(st.just(CARTPOLE)))
        return case.messages, case.code, case.field, 0
    if which == "mismatch":
        case = draw(mismatched_handshakes())
        return case.messages, case.code, case.field, 0
    num_envs = draw(st.integers(1, 8))
    _, _, case = draw(broken_steps(st.just(CARTPOLE), st.just(num_envs)))
    return [handshake_of(num_envs=num_envs), *case.messages], case.code, case.field, 1


@pytest.mark.e2e
def test_fuzzed_streams_through_a_training_learner(seed_cluster, log_watch):
    """400 generated bad streams, each answered with its status and field, while
    the real actor beside them trains and nothing non-finite reaches training."""
    learner, address, actor, tap = seed_cluster
    channel = grpc.insecure_channel(address)
    stub = seed_pb2_grpc.LearnerStub(channel)
    progress = []

    def body(example):
        messages, code, field, acks = example
        replies, error = call_stream(stub.Stream, messages)
        assert [r.WhichOneof("kind") for r in replies] == ["ack"] * acks
        assert_refused(error, code, field, messages[-1])
        progress.append(None)
        if len(progress) % 100 == 0:  # the real actor's unrolls keep arriving throughout
            before, steps = tap.unrolls, learner.train_steps
            wait_until(lambda: tap.unrolls > before and learner.train_steps > steps, "training to go on")

    try:
        run_fuzz(server_seed_cases(), 400, body)
    finally:
        channel.close()
    assert actor.poll() is None, "the real actor exited"
    assert learner.error is None
    assert tap.non_finite == []
    assert log_watch.bad == []
    wait_until(lambda: learner.table.num_connected == 1, "the fuzz streams to be released")


@pytest.mark.e2e
def test_oversized_undecodable_and_wrong_rpc_messages(seed_cluster, log_watch):
    learner, address, actor, tap = seed_cluster
    with grpc.insecure_channel(address) as channel:
        stub = seed_pb2_grpc.LearnerStub(channel)
        # Over the learner's message limit: gRPC refuses it before the service reads it.
        obs = np.zeros((MAX_MESSAGE_BYTES // 16 + 1, 4), np.float32)
        zeros = np.zeros(len(obs))
        big = codec.encode_steps(np.arange(len(obs)) % 2, zeros, zeros, zeros, obs)
        replies, error = call_stream(stub.Stream, [handshake_of(num_envs=2), big])
        assert error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
        # Bytes that are no ActorMessage at all.
        raw = channel.stream_stream("/seedq.v1.Learner/Stream")
        replies, error = call_stream(raw, [b"\xff\xff\xff\x07garbage"])
        assert_refused(error, INVALID, "message", "undecodable")
        # IMPALA's RPC at this SEED learner.
        replies, error = call_stream(stub.PushUnrolls, [seed_pb2.UnrollMessage()])
        assert error is not None and error.code() == grpc.StatusCode.UNIMPLEMENTED, error
        assert "architecture=seed" in error.details()
    before = tap.unrolls
    wait_until(lambda: tap.unrolls > before, "the real actor's unrolls")
    assert actor.poll() is None
    assert log_watch.bad == []


@pytest.fixture(scope="module")
def impala_learner(tmp_path_factory, log_watch):
    config = dataclasses.replace(SERVER_CONFIG, architecture="impala")
    learner = Learner(config, f"unix:{tmp_path_factory.mktemp('fuzz-impala')}/learner.sock")
    tap = FiniteTap(learner.queue)
    address = learner.start(consume=drain_unrolls)
    yield learner, address, tap
    learner.stop()


@st.composite
def server_impala_cases(draw, layout):
    """(messages, code, field) of PushUnrolls streams an IMPALA learner must refuse."""
    which = draw(st.sampled_from(["handshake", "unrolls", "order", "version"]))
    hello = seed_pb2.UnrollMessage(handshake=handshake_of(num_envs=layout.max_unrolls).handshake)
    if which == "handshake":
        case = draw(broken_handshakes(st.just(CARTPOLE)))
        message = case.messages[0]
        if message.WhichOneof("kind") == "steps":
            return [seed_pb2.UnrollMessage(unrolls=seed_pb2.UnrollBatch())], PRECONDITION, "handshake"
        if message.WhichOneof("kind") is None:
            return [seed_pb2.UnrollMessage()], INVALID, "handshake"
        return [seed_pb2.UnrollMessage(handshake=message.handshake)], case.code, case.field
    if which == "order":
        return [hello, hello], PRECONDITION, "unrolls"
    if which == "version":
        unrolls = valid_unrolls(layout, 1, np.random.default_rng(draw(st.integers(0, 2**16))))
        unrolls["policy_version"][0, draw(st.integers(0, layout.length - 1))] = draw(
            st.integers(-(2**31), -1) | st.integers(10**6, 2**31 - 1))
        return [hello, impala_codec.encode_unrolls(unrolls, 0)], INVALID, "unrolls.fields[policy_version]"
    case = draw(broken_unrolls(layout))
    return [hello, *case.messages], case.code, case.field


@pytest.mark.e2e
def test_fuzzed_pushes_through_an_impala_learner(impala_learner, log_watch):
    learner, address, tap = impala_learner
    store = learner.inference.store
    layout = UnrollLayout(store.fields, store.length, store.initial_only, 4, CARTPOLE.num_actions)
    with grpc.insecure_channel(address) as channel:
        stub = seed_pb2_grpc.LearnerStub(channel)

        def body(example):
            messages, code, field = example
            replies, error = call_stream(stub.PushUnrolls, messages)
            assert_refused(error, code, field, messages[-1])

        run_fuzz(server_impala_cases(layout), 200, body)
    assert tap.unrolls == 0  # no refused batch was queued
    assert log_watch.bad == []
    wait_until(lambda: learner.table.num_connected == 0, "the fuzz streams to be released")


@pytest.mark.e2e
def test_random_bytes_through_both_learners(seed_cluster, impala_learner, log_watch):
    """Arbitrary bytes as the request of each RPC: refused naming a field (or, when
    they happen to parse, answered like the message they parse as); never
    UNKNOWN or INTERNAL."""
    learner, seed_address, actor, tap = seed_cluster
    _, impala_address, _ = impala_learner
    fields = ("message", "handshake", "steps", "unrolls")
    with grpc.insecure_channel(seed_address) as seed_channel, \
            grpc.insecure_channel(impala_address) as impala_channel:
        stream = seed_channel.stream_stream("/seedq.v1.Learner/Stream")
        push = impala_channel.stream_stream("/seedq.v1.Learner/PushUnrolls")
        pull = impala_channel.unary_stream("/seedq.v1.Learner/PullParams")

        def body(example):
            rpc, data = example
            if rpc == "pull":
                try:
                    chunks = [seed_pb2.ParamsChunk.FromString(c) for c in pull(data, timeout=20)]
                except grpc.RpcError as e:
                    assert_refused(e, INVALID, "message", data)
                    return
                assert chunks and chunks[0].precision == "fp32"  # it parsed: a real pull
                return
            replies, error = call_stream(stream if rpc == "stream" else push, [data])
            assert error is not None, data  # no valid handshake is this short
            assert error.code() in (INVALID, PRECONDITION), (data, error.code(), error.details())
            assert error.details().split(":")[0].split(".")[0] in fields, error.details()

        run_fuzz(st.tuples(st.sampled_from(["stream", "push", "pull"]), st.binary(max_size=40)), 200, body)
    assert actor.poll() is None
    assert log_watch.bad == []
