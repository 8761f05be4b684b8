"""Encoding and validation of the IMPALA-mode messages (PullParams, PushUnrolls).

Parameters travel as flax.serialization msgpack of the published pytree
(fp32, or int8 kernels with fp32 scales), cut into chunks below gRPC's
message limit. Unrolls travel as named raw-byte arrays in exactly the layout
the SEED server's unroll store emits, and are checked field by field against
the learner's own sequence definition; every check raises `ProtocolError`
naming the field (the service answers INVALID_ARGUMENT).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
from flax import serialization

from seedq.schema import StepFieldSpec
from seedq.v1 import seed_pb2
from seedq.wire.codec import ProtocolError

# Well below gRPC's default 4 MiB receive limit.
PARAMS_CHUNK_BYTES = 1 << 20
EPISODE_RETURN_DTYPE = np.dtype("<f8")
EPISODE_LENGTH_DTYPE = np.dtype("<i8")


# --- parameters --------------------------------------------------------------


def serialize_params(params) -> bytes:
    """Host pytree of arrays -> msgpack bytes (dtypes kept: int8 stays 1 byte)."""
    return serialization.msgpack_serialize(_to_numpy(params))


def deserialize_params(data: bytes):
    """Inverse of `serialize_params`: nested dicts of NumPy arrays."""
    return serialization.msgpack_restore(data)


def _to_numpy(tree):
    if isinstance(tree, Mapping):
        return {k: _to_numpy(v) for k, v in tree.items()}
    return np.asarray(tree)


def params_chunks(
    data: bytes | None, version: int, precision: str, chunk_bytes: int = PARAMS_CHUNK_BYTES
) -> list[seed_pb2.ParamsChunk]:
    """The PullParams reply: a header chunk (with the first data), then data chunks.

    `data` None: the header only (the actor already holds `version`).
    """
    total = 0 if data is None else len(data)
    first = seed_pb2.ParamsChunk(policy_version=version, precision=precision, total_bytes=total)
    if not total:
        return [first]
    view = memoryview(data)
    first.data = bytes(view[:chunk_bytes])
    return [first] + [
        seed_pb2.ParamsChunk(data=bytes(view[i : i + chunk_bytes]))
        for i in range(chunk_bytes, total, chunk_bytes)
    ]


def join_chunks(chunks: Iterable[seed_pb2.ParamsChunk]) -> tuple[int, str, bytes | None]:
    """(policy version, precision, data or None when the header said nothing new)."""
    chunks = list(chunks)
    if not chunks:
        raise ProtocolError("params", "the learner sent no chunk")
    head = chunks[0]
    if not head.total_bytes:
        return head.policy_version, head.precision, None
    data = b"".join(c.data for c in chunks)
    if len(data) != head.total_bytes:
        raise ProtocolError("params.total_bytes", f"header says {head.total_bytes} bytes, got {len(data)}")
    return head.policy_version, head.precision, data


# --- unrolls -----------------------------------------------------------------


def encode_unrolls(
    unrolls: Mapping[str, np.ndarray], frames: int, returns=(), lengths=()
) -> seed_pb2.UnrollMessage:
    """k finished unrolls {name: [k, ...]} plus the frames/episodes since the last batch."""
    fields = [
        seed_pb2.NamedArray(
            name=name, dtype=np.dtype(a.dtype).name, shape=a.shape,
            data=np.ascontiguousarray(a).tobytes(),
        )
        for name, a in ((n, np.asarray(v)) for n, v in unrolls.items())
    ]
    return seed_pb2.UnrollMessage(
        unrolls=seed_pb2.UnrollBatch(
            fields=fields,
            frames=frames,
            episode_returns=np.asarray(returns, EPISODE_RETURN_DTYPE).tobytes(),
            episode_lengths=np.asarray(lengths, EPISODE_LENGTH_DTYPE).tobytes(),
        )
    )


def decode_unrolls(
    message: seed_pb2.UnrollMessage,
    fields: Mapping[str, StepFieldSpec],
    length: int,
    initial_only: frozenset[str],
    max_unrolls: int,
    num_actions: int = 0,
) -> tuple[dict[str, np.ndarray], int, np.ndarray, np.ndarray]:
    """Validates an UnrollBatch against the learner's sequence definition.

    Floating fields must be finite, bool fields 0/1 bytes and, for a discrete
    action space (`num_actions` > 0), the "action" field in [0, num_actions).
    Returns ({name: [k, length, *shape] or [k, *shape] for `initial_only`},
    frames, episode returns float64 [m], episode lengths int64 [m]).
    """
    if message.WhichOneof("kind") != "unrolls":
        raise ProtocolError(
            "unrolls", f"expected an UnrollBatch after the handshake, got {message.WhichOneof('kind')}"
        )
    msg = message.unrolls
    names = [f.name for f in msg.fields]
    if len(set(names)) != len(names):
        raise ProtocolError("unrolls.fields", "a field name appears twice")
    missing = sorted(set(fields) - set(names))
    unknown = sorted(set(names) - set(fields))
    if missing or unknown:
        raise ProtocolError(
            "unrolls.fields",
            f"missing {missing or 'none'}, unknown {unknown or 'none'} (learner expects {sorted(fields)})",
        )
    out, count = {}, None
    for f in msg.fields:
        where = f"unrolls.fields[{f.name}]"
        spec = fields[f.name]
        dtype = np.dtype(spec.dtype)
        if f.dtype != dtype.name:
            raise ProtocolError(where + ".dtype", f"{f.dtype!r}, learner expects {dtype.name!r}")
        shape = tuple(int(d) for d in f.shape)
        if count is None:
            count = shape[0] if shape else 0
            # Checked before any size arithmetic: a bogus count cannot overflow it.
            if not 0 < count <= max_unrolls:
                raise ProtocolError(
                    where + ".shape", f"{count} unrolls in one batch; must be in [1, {max_unrolls}]"
                )
        step_axes = () if f.name in initial_only else (length,)
        expected = (count, *step_axes, *spec.shape)
        if shape != expected:
            raise ProtocolError(where + ".shape", f"{list(shape)}, learner expects {list(expected)}")
        nbytes = dtype.itemsize * math.prod(shape)
        if len(f.data) != nbytes:
            raise ProtocolError(where + ".data", f"expected {nbytes} bytes, got {len(f.data)}")
        out[f.name] = _valid_values(where + ".data", np.frombuffer(f.data, dtype).reshape(shape))
    action = out.get("action")
    if num_actions > 0 and action is not None and ((action < 0) | (action >= num_actions)).any():
        bad = action[(action < 0) | (action >= num_actions)].flat[0]
        raise ProtocolError(
            "unrolls.fields[action].data", f"action {int(bad)} is outside [0, {num_actions})"
        )
    returns = _flat("unrolls.episode_returns", msg.episode_returns, EPISODE_RETURN_DTYPE)
    if not np.isfinite(returns).all():
        raise ProtocolError("unrolls.episode_returns", "non-finite value (NaN or inf)")
    lengths = _flat("unrolls.episode_lengths", msg.episode_lengths, EPISODE_LENGTH_DTYPE)
    if len(returns) != len(lengths):
        raise ProtocolError(
            "unrolls.episode_lengths", f"{len(lengths)} lengths for {len(returns)} episode returns"
        )
    if len(lengths) and lengths.min() < 0:
        raise ProtocolError("unrolls.episode_lengths", "must be >= 0")
    # At most one step per env and unroll step is new: bounds a bogus count.
    if msg.frames > count * length:
        raise ProtocolError("unrolls.frames", f"{msg.frames} frames in {count} unrolls of {length} steps")
    return out, int(msg.frames), returns, lengths


def _valid_values(field: str, values: np.ndarray) -> np.ndarray:
    """Floats finite and bools 0/1: nothing else may reach a train step."""
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        raise ProtocolError(field, "non-finite value (NaN or inf)")
    if values.dtype == bool and (values.view(np.uint8) > 1).any():
        raise ProtocolError(field, "bool bytes must be 0 or 1")
    return values


def _flat(field: str, data: bytes, dtype: np.dtype) -> np.ndarray:
    if len(data) % dtype.itemsize:
        raise ProtocolError(field, f"{len(data)} bytes is not {dtype.name}[m]")
    return np.frombuffer(data, dtype)
