"""Unit tests of seedq.wire.codec: encoding, decoding and validation of wire messages."""

import dataclasses

import numpy as np
import pytest

from seedq.v1 import seed_pb2
from seedq.wire import codec
from seedq.schema import EnvSpec
from seedq.wire.codec import ProtocolError
from seedq import schema

pytestmark = pytest.mark.unit

DISCRETE = EnvSpec("float32", (4,), num_actions=2)
BOX = EnvSpec(
    "float32", (3,), action_shape=(2,), action_low=(-1.0, -2.0), action_high=(1.0, 2.0)
)
IMAGE = EnvSpec("uint8", (2, 3, 4), num_actions=6)


def handshake(spec=DISCRETE, **overrides):
    kwargs = dict(actor_id="actor-1", run_id="run-1", num_envs=3, env_id="Test-v0")
    kwargs.update(overrides)
    return codec.encode_handshake(spec, **kwargs)


def raises_field(field):
    """pytest.raises for a ProtocolError naming exactly `field`."""

    class _Ctx:
        def __enter__(self):
            self._ctx = pytest.raises(ProtocolError)
            self.info = self._ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            suppressed = self._ctx.__exit__(*exc)
            assert self.info.value.field == field, str(self.info.value)
            assert str(self.info.value).startswith(field + ":")
            return suppressed

    return _Ctx()


# --- handshake ---------------------------------------------------------------


@pytest.mark.parametrize("spec", [DISCRETE, BOX, IMAGE], ids=["discrete", "box", "uint8-image"])
def test_handshake_round_trip(spec):
    message = handshake(spec, actor_id="a-7", run_id="r-42", num_envs=5, env_id="Foo-v1")
    # Through actual bytes, as on the wire.
    wire = seed_pb2.ActorMessage.FromString(message.SerializeToString())
    hs, decoded = codec.decode_handshake(wire)
    assert hs.protocol_version == codec.PROTOCOL_VERSION
    assert (hs.actor_id, hs.run_id, hs.num_envs, hs.env_id) == ("a-7", "r-42", 5, "Foo-v1")
    assert decoded.obs_dtype == spec.obs_dtype
    assert decoded.obs_shape == spec.obs_shape
    assert decoded.num_actions == spec.num_actions
    assert decoded.discrete == spec.discrete
    assert decoded.action_shape == spec.action_shape
    np.testing.assert_allclose(decoded.action_low, spec.action_low)
    np.testing.assert_allclose(decoded.action_high, spec.action_high)
    assert spec.describe_mismatch(decoded) is None
    assert decoded.describe_mismatch(spec) is None


def test_handshake_round_trip_box_is_continuous():
    _, decoded = codec.decode_handshake(handshake(BOX))
    assert not decoded.discrete
    assert decoded.action_dtype == np.dtype("<f4")
    _, decoded = codec.decode_handshake(handshake(DISCRETE))
    assert decoded.discrete
    assert decoded.action_dtype == np.dtype("<i4")


@pytest.mark.parametrize("version", [0, 2, codec.PROTOCOL_VERSION + 100])
def test_handshake_version_mismatch(version):
    message = handshake()
    message.handshake.protocol_version = version
    with raises_field("handshake.protocol_version") as info:
        codec.decode_handshake(message)
    assert str(version) in str(info.value)


def test_handshake_empty_actor_id():
    with raises_field("handshake.actor_id"):
        codec.decode_handshake(handshake(actor_id=""))


def test_handshake_empty_run_id():
    with raises_field("handshake.run_id"):
        codec.decode_handshake(handshake(run_id=""))


def test_handshake_zero_envs():
    with raises_field("handshake.num_envs"):
        codec.decode_handshake(handshake(num_envs=0))


def test_first_message_must_be_handshake():
    steps = codec.encode_steps([0], [0.0], [0], [0], np.zeros((1, 4), np.float32))
    with raises_field("handshake"):
        codec.decode_handshake(steps)
    with raises_field("handshake"):
        codec.decode_handshake(seed_pb2.ActorMessage())


def test_handshake_unknown_dtype():
    message = handshake()
    message.handshake.observation.dtype = "not-a-dtype"
    with raises_field("handshake.observation.dtype"):
        codec.decode_handshake(message)


@pytest.mark.parametrize("shape", [(0,), (4, -1), (-3,)])
def test_handshake_bad_observation_shape(shape):
    message = handshake()
    del message.handshake.observation.shape[:]
    message.handshake.observation.shape.extend(shape)
    with raises_field("handshake.observation.shape"):
        codec.decode_handshake(message)


def test_handshake_bad_action_space():
    message = handshake()
    message.handshake.action_space.discrete = 0
    # discrete = 0 is still the "discrete" member of the oneof once set.
    with raises_field("handshake.action_space.discrete"):
        codec.decode_handshake(message)
    message = handshake()
    message.handshake.ClearField("action_space")
    with raises_field("handshake.action_space"):
        codec.decode_handshake(message)


# --- steps -------------------------------------------------------------------


def make_steps(n=3, spec=DISCRETE, indices=None, seed=0):
    rng = np.random.default_rng(seed)
    indices = np.arange(n, dtype=np.int32) if indices is None else np.asarray(indices, np.int32)
    n = len(indices)
    rewards = rng.normal(size=n).astype(np.float32)
    terminated = rng.integers(0, 2, n).astype(bool)
    truncated = rng.integers(0, 2, n).astype(bool)
    if np.dtype(spec.obs_dtype).kind == "u":
        obs = rng.integers(0, 255, (n, *spec.obs_shape)).astype(spec.obs_dtype)
    else:
        obs = rng.normal(size=(n, *spec.obs_shape)).astype(spec.obs_dtype)
    return indices, rewards, terminated, truncated, obs


@pytest.mark.parametrize("spec", [DISCRETE, BOX, IMAGE], ids=["discrete", "box", "uint8-image"])
def test_steps_round_trip(spec):
    indices, rewards, terminated, truncated, obs = make_steps(4, spec, indices=[3, 0, 5, 2])
    message = codec.encode_steps(indices, rewards, terminated, truncated, obs)
    wire = seed_pb2.ActorMessage.FromString(message.SerializeToString())
    steps = codec.decode_steps(wire, spec, num_envs=6)
    assert len(steps) == 4
    np.testing.assert_array_equal(steps.env_indices, indices)
    np.testing.assert_array_equal(steps.rewards, rewards)
    np.testing.assert_array_equal(steps.terminated, terminated)
    np.testing.assert_array_equal(steps.truncated, truncated)
    np.testing.assert_array_equal(steps.observations, obs)
    assert steps.terminated.dtype == bool and steps.truncated.dtype == bool
    assert steps.observations.dtype == np.dtype(spec.obs_dtype)
    assert steps.observations.shape == (4, *spec.obs_shape)
    assert steps.rewards.dtype == np.float32
    assert steps.env_indices.dtype == np.int32


def test_steps_encode_converts_dtypes():
    # int64 indices / float64 rewards / bool flags are converted to the wire dtypes.
    message = codec.encode_steps(
        np.array([1, 0], np.int64), np.array([0.5, -2.0]), np.array([True, False]),
        np.array([False, True]), np.zeros((2, 4), np.float32),
    )
    assert len(message.steps.env_indices) == 8
    assert len(message.steps.rewards) == 8
    assert len(message.steps.terminated) == 2
    steps = codec.decode_steps(message, DISCRETE, num_envs=2)
    np.testing.assert_array_equal(steps.env_indices, [1, 0])
    np.testing.assert_array_equal(steps.rewards, [0.5, -2.0])
    np.testing.assert_array_equal(steps.terminated, [True, False])
    np.testing.assert_array_equal(steps.truncated, [False, True])


@pytest.mark.parametrize("bad", [-1, 3, 4, 1000, -(2**31)])
def test_steps_unknown_env_index(bad):
    message = codec.encode_steps(*make_steps(indices=[0, bad, 1]))
    with raises_field("steps.env_indices") as info:
        codec.decode_steps(message, DISCRETE, num_envs=3)
    assert str(bad) in str(info.value)


def test_steps_duplicate_env_index():
    message = codec.encode_steps(*make_steps(indices=[0, 2, 0]))
    with raises_field("steps.env_indices") as info:
        codec.decode_steps(message, DISCRETE, num_envs=3)
    assert "twice" in str(info.value)


def test_steps_empty_batch():
    message = codec.encode_steps(*make_steps(indices=[]))
    with raises_field("steps.env_indices"):
        codec.decode_steps(message, DISCRETE, num_envs=3)


def test_steps_env_indices_not_whole_int32():
    message = codec.encode_steps(*make_steps(n=2))
    message.steps.env_indices = message.steps.env_indices[:-1]
    with raises_field("steps.env_indices"):
        codec.decode_steps(message, DISCRETE, num_envs=3)


@pytest.mark.parametrize("field", ["rewards", "terminated", "truncated", "observations"])
@pytest.mark.parametrize("delta", [-1, 1])
def test_steps_wrong_byte_length(field, delta):
    message = codec.encode_steps(*make_steps(n=3))
    data = getattr(message.steps, field)
    setattr(message.steps, field, data[:-1] if delta < 0 else data + b"\0")
    with raises_field("steps." + field):
        codec.decode_steps(message, DISCRETE, num_envs=3)


def test_steps_observations_of_other_shape_rejected():
    # Right dtype, wrong per-env shape (5 floats instead of 4).
    indices, rewards, terminated, truncated, _ = make_steps(n=2)
    message = codec.encode_steps(indices, rewards, terminated, truncated, np.zeros((2, 5), np.float32))
    with raises_field("steps.observations"):
        codec.decode_steps(message, DISCRETE, num_envs=2)
    # float64 observations for a float32 spec: twice the bytes.
    message = codec.encode_steps(indices, rewards, terminated, truncated, np.zeros((2, 4), np.float64))
    with raises_field("steps.observations"):
        codec.decode_steps(message, DISCRETE, num_envs=2)


def test_steps_rejects_handshake_message():
    with raises_field("steps"):
        codec.decode_steps(handshake(), DISCRETE, num_envs=3)


# --- spec comparison -----------------------------------------------------------


def test_describe_mismatch_none_for_equal_specs():
    assert DISCRETE.describe_mismatch(EnvSpec("float32", (4,), num_actions=2)) is None
    # dtype spelled differently but equal.
    assert DISCRETE.describe_mismatch(EnvSpec("<f4", (4,), num_actions=2)) is None
    # Box bounds are not part of the comparison; shapes are.
    assert BOX.describe_mismatch(dataclasses.replace(BOX, action_low=(0.0, 0.0))) is None


def test_describe_mismatch_dtype():
    text = DISCRETE.describe_mismatch(EnvSpec("float64", (4,), num_actions=2))
    assert text is not None and text.startswith("observation.dtype")
    assert "float64" in text and "float32" in text


def test_describe_mismatch_shape():
    text = DISCRETE.describe_mismatch(EnvSpec("float32", (5,), num_actions=2))
    assert text is not None and text.startswith("observation.shape")
    assert "[5]" in text and "[4]" in text
    text = DISCRETE.describe_mismatch(EnvSpec("float32", (4, 1), num_actions=2))
    assert text is not None and text.startswith("observation.shape")


def test_describe_mismatch_dtype_reported_before_shape():
    text = DISCRETE.describe_mismatch(EnvSpec("uint8", (5,), num_actions=2))
    assert text.startswith("observation.dtype")


def test_describe_mismatch_action_space():
    text = DISCRETE.describe_mismatch(EnvSpec("float32", (4,), num_actions=3))
    assert text is not None and text.startswith("action_space")
    assert "Discrete(3)" in text and "Discrete(2)" in text
    # Discrete learner, Box actor.
    text = DISCRETE.describe_mismatch(EnvSpec("float32", (4,), action_shape=(2,)))
    assert text is not None and text.startswith("action_space")
    # Box learner, Discrete actor.
    box4 = dataclasses.replace(BOX, obs_shape=(4,))
    assert box4.describe_mismatch(DISCRETE).startswith("action_space")
    # Both Box, other shape.
    text = BOX.describe_mismatch(dataclasses.replace(BOX, action_shape=(3,)))
    assert text is not None and text.startswith("action_space.box.shape")


def test_obs_nbytes():
    assert DISCRETE.obs_nbytes == 16
    assert IMAGE.obs_nbytes == 24
    assert EnvSpec("float64", (2, 5), num_actions=1).obs_nbytes == 80


def test_spec_from_spaces():
    import gymnasium as gym

    spec = schema.spec_from_spaces(
        gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(3)
    )
    assert spec == EnvSpec("float32", (4,), num_actions=3)
    spec = schema.spec_from_spaces(
        gym.spaces.Box(0, 255, (2, 2), np.uint8),
        gym.spaces.Box(np.array([-1.0, -2.0]), np.array([1.0, 2.0]), dtype=np.float32),
    )
    assert spec.obs_dtype == "uint8" and spec.obs_shape == (2, 2)
    assert spec.action_shape == (2,) and spec.action_low == (-1.0, -2.0)
    with pytest.raises(ValueError):
        schema.spec_from_spaces(gym.spaces.Discrete(4), gym.spaces.Discrete(2))
    with pytest.raises(ValueError):
        schema.spec_from_spaces(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2, start=1))


# --- actions -------------------------------------------------------------------


def test_actions_round_trip_discrete():
    actions = np.array([1, 0, 1, 1], np.int64)
    message = codec.encode_actions(actions, DISCRETE, policy_version=17)
    wire = seed_pb2.LearnerMessage.FromString(message.SerializeToString())
    assert wire.actions.policy_version == 17
    decoded = codec.decode_actions(wire, DISCRETE, 4)
    assert decoded.dtype == np.int32 and decoded.shape == (4,)
    np.testing.assert_array_equal(decoded, actions)


def test_actions_round_trip_box():
    actions = np.arange(6, dtype=np.float64).reshape(3, 2) / 7
    message = codec.encode_actions(actions, BOX, policy_version=0)
    decoded = codec.decode_actions(message, BOX, 3)
    assert decoded.dtype == np.float32 and decoded.shape == (3, 2)
    np.testing.assert_allclose(decoded, actions, rtol=1e-6)


@pytest.mark.parametrize("spec,n_encoded,n_expected", [
    (DISCRETE, 3, 4), (DISCRETE, 4, 3), (BOX, 2, 3), (BOX, 3, 1),
])
def test_decode_actions_length_check(spec, n_encoded, n_expected):
    shape = (n_encoded, *spec.action_shape)
    message = codec.encode_actions(np.zeros(shape), spec, policy_version=1)
    with raises_field("actions.actions") as info:
        codec.decode_actions(message, spec, n_expected)
    expected_bytes = n_expected * int(np.prod(spec.action_shape)) * 4
    assert str(expected_bytes) in str(info.value)


@pytest.mark.parametrize("actions,bad", [([0, 1, 2, 1], "env 2's action 2"), ([1, -1, 0, 0], "env 1's action -1")])
def test_decode_actions_refuses_a_discrete_action_outside_the_space(actions, bad):
    """The actor checks what the learner sends before its env acts on it."""
    message = codec.encode_actions(np.array(actions), DISCRETE, policy_version=1)
    with raises_field("actions.actions") as info:
        codec.decode_actions(message, DISCRETE, 4)
    assert bad in str(info.value) and "Discrete(2)" in str(info.value)


def test_decode_actions_refuses_non_finite_box_actions():
    message = codec.encode_actions(np.array([[0.0, np.nan]]), BOX, policy_version=1)
    with raises_field("actions.actions"):
        codec.decode_actions(message, BOX, 1)


def test_decode_actions_needs_action_batch():
    ack = seed_pb2.LearnerMessage(ack=seed_pb2.HandshakeAck(protocol_version=1))
    with raises_field("actions"):
        codec.decode_actions(ack, DISCRETE, 1)


def test_protocol_error_is_value_error():
    e = ProtocolError("steps.rewards", "bad")
    assert isinstance(e, ValueError)
    assert e.field == "steps.rewards"
    assert str(e) == "steps.rewards: bad"


@pytest.mark.parametrize("dtype", ["S16", "U4", "V16", "f4,", ">f4", ">i8", "c8", "O", "M8", "(2,)f4", "\x00", "i4 "])
def test_handshake_dtype_not_carried_by_the_wire(dtype):
    """Unreadable once renamed (S16, U4, V16, f4,) or misread (big-endian): refused."""
    message = handshake()
    message.handshake.observation.dtype = dtype
    with raises_field("handshake.observation.dtype") as info:
        codec.decode_handshake(message)
    assert repr(dtype) in str(info.value)


@pytest.mark.parametrize("dtype,name", [("<f4", "float32"), ("|u1", "uint8"), ("?", "bool"), ("=i8", "int64")])
def test_handshake_dtype_spellings_decode_to_canonical_names(dtype, name):
    message = handshake()
    message.handshake.observation.dtype = dtype
    assert codec.decode_handshake(message)[1].obs_dtype == name


def test_handshake_ack_carries_the_expected_spec():
    for spec in (DISCRETE, BOX, IMAGE):
        wire = seed_pb2.LearnerMessage.FromString(codec.encode_handshake_ack(spec, "run-7").SerializeToString())
        ack, expected = codec.decode_handshake_ack(wire)
        assert ack.protocol_version == codec.PROTOCOL_VERSION and ack.learner_run == "run-7"
        assert expected == spec
    # A learner that sends no spec (older revision): None, not an error.
    ack, expected = codec.decode_handshake_ack(seed_pb2.LearnerMessage(ack=seed_pb2.HandshakeAck()))
    assert expected is None


@pytest.mark.parametrize("field", ["rewards", "observations"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_steps_non_finite_values_refused(field, value):
    indices, rewards, terminated, truncated, obs = make_steps(n=3)
    (rewards if field == "rewards" else obs)[1] = value
    message = codec.encode_steps(indices, rewards, terminated, truncated, obs)
    with raises_field("steps." + field) as info:
        codec.decode_steps(message, DISCRETE, num_envs=3)
    assert "entry 1" in str(info.value)


@pytest.mark.parametrize("field", ["terminated", "truncated"])
def test_steps_flags_must_be_zero_or_one(field):
    message = codec.encode_steps(*make_steps(n=2))
    setattr(message.steps, field, b"\x00\x02")
    with raises_field("steps." + field):
        codec.decode_steps(message, DISCRETE, num_envs=3)


def test_second_handshake_is_out_of_order():
    with pytest.raises(codec.OutOfOrder) as info:
        codec.decode_steps(handshake(), DISCRETE, num_envs=3)
    assert info.value.field == "steps"
