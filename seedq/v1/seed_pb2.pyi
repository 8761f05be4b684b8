from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorSpec(_message.Message):
    __slots__ = ("dtype", "shape")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class ActionSpace(_message.Message):
    __slots__ = ("discrete", "box")
    DISCRETE_FIELD_NUMBER: _ClassVar[int]
    BOX_FIELD_NUMBER: _ClassVar[int]
    discrete: int
    box: BoxSpace
    def __init__(self, discrete: _Optional[int] = ..., box: _Optional[_Union[BoxSpace, _Mapping]] = ...) -> None: ...

class BoxSpace(_message.Message):
    __slots__ = ("shape", "low", "high")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    low: _containers.RepeatedScalarFieldContainer[float]
    high: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., low: _Optional[_Iterable[float]] = ..., high: _Optional[_Iterable[float]] = ...) -> None: ...

class Handshake(_message.Message):
    __slots__ = ("protocol_version", "actor_id", "run_id", "num_envs", "observation", "action_space", "env_id", "reads_run_ended")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    READS_RUN_ENDED_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    actor_id: str
    run_id: str
    num_envs: int
    observation: TensorSpec
    action_space: ActionSpace
    env_id: str
    reads_run_ended: bool
    def __init__(self, protocol_version: _Optional[int] = ..., actor_id: _Optional[str] = ..., run_id: _Optional[str] = ..., num_envs: _Optional[int] = ..., observation: _Optional[_Union[TensorSpec, _Mapping]] = ..., action_space: _Optional[_Union[ActionSpace, _Mapping]] = ..., env_id: _Optional[str] = ..., reads_run_ended: _Optional[bool] = ...) -> None: ...

class StepBatch(_message.Message):
    __slots__ = ("env_indices", "rewards", "terminated", "truncated", "observations")
    ENV_INDICES_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    env_indices: bytes
    rewards: bytes
    terminated: bytes
    truncated: bytes
    observations: bytes
    def __init__(self, env_indices: _Optional[bytes] = ..., rewards: _Optional[bytes] = ..., terminated: _Optional[bytes] = ..., truncated: _Optional[bytes] = ..., observations: _Optional[bytes] = ...) -> None: ...

class ActorMessage(_message.Message):
    __slots__ = ("handshake", "steps")
    HANDSHAKE_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    handshake: Handshake
    steps: StepBatch
    def __init__(self, handshake: _Optional[_Union[Handshake, _Mapping]] = ..., steps: _Optional[_Union[StepBatch, _Mapping]] = ...) -> None: ...

class HandshakeAck(_message.Message):
    __slots__ = ("protocol_version", "learner_run", "observation", "action_space")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEARNER_RUN_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    learner_run: str
    observation: TensorSpec
    action_space: ActionSpace
    def __init__(self, protocol_version: _Optional[int] = ..., learner_run: _Optional[str] = ..., observation: _Optional[_Union[TensorSpec, _Mapping]] = ..., action_space: _Optional[_Union[ActionSpace, _Mapping]] = ...) -> None: ...

class ActionBatch(_message.Message):
    __slots__ = ("actions", "policy_version")
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    actions: bytes
    policy_version: int
    def __init__(self, actions: _Optional[bytes] = ..., policy_version: _Optional[int] = ...) -> None: ...

class RunEnded(_message.Message):
    __slots__ = ("stop_reason", "learner_run")
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    LEARNER_RUN_FIELD_NUMBER: _ClassVar[int]
    stop_reason: str
    learner_run: str
    def __init__(self, stop_reason: _Optional[str] = ..., learner_run: _Optional[str] = ...) -> None: ...

class LearnerMessage(_message.Message):
    __slots__ = ("ack", "actions", "run_ended")
    ACK_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    RUN_ENDED_FIELD_NUMBER: _ClassVar[int]
    ack: HandshakeAck
    actions: ActionBatch
    run_ended: RunEnded
    def __init__(self, ack: _Optional[_Union[HandshakeAck, _Mapping]] = ..., actions: _Optional[_Union[ActionBatch, _Mapping]] = ..., run_ended: _Optional[_Union[RunEnded, _Mapping]] = ...) -> None: ...

class ParamsRequest(_message.Message):
    __slots__ = ("actor_id", "have_version")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    HAVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    have_version: int
    def __init__(self, actor_id: _Optional[str] = ..., have_version: _Optional[int] = ...) -> None: ...

class ParamsChunk(_message.Message):
    __slots__ = ("policy_version", "precision", "total_bytes", "data")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    precision: str
    total_bytes: int
    data: bytes
    def __init__(self, policy_version: _Optional[int] = ..., precision: _Optional[str] = ..., total_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class NamedArray(_message.Message):
    __slots__ = ("name", "dtype", "shape", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class UnrollBatch(_message.Message):
    __slots__ = ("fields", "frames", "episode_returns", "episode_lengths")
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    EPISODE_RETURNS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.RepeatedCompositeFieldContainer[NamedArray]
    frames: int
    episode_returns: bytes
    episode_lengths: bytes
    def __init__(self, fields: _Optional[_Iterable[_Union[NamedArray, _Mapping]]] = ..., frames: _Optional[int] = ..., episode_returns: _Optional[bytes] = ..., episode_lengths: _Optional[bytes] = ...) -> None: ...

class UnrollMessage(_message.Message):
    __slots__ = ("handshake", "unrolls")
    HANDSHAKE_FIELD_NUMBER: _ClassVar[int]
    UNROLLS_FIELD_NUMBER: _ClassVar[int]
    handshake: Handshake
    unrolls: UnrollBatch
    def __init__(self, handshake: _Optional[_Union[Handshake, _Mapping]] = ..., unrolls: _Optional[_Union[UnrollBatch, _Mapping]] = ...) -> None: ...

class UnrollAck(_message.Message):
    __slots__ = ("policy_version", "learner_run", "config_json", "run_ended")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEARNER_RUN_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    RUN_ENDED_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    learner_run: str
    config_json: str
    run_ended: str
    def __init__(self, policy_version: _Optional[int] = ..., learner_run: _Optional[str] = ..., config_json: _Optional[str] = ..., run_ended: _Optional[str] = ...) -> None: ...
