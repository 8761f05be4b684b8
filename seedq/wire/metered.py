"""A `Learner` client stub that counts the bytes it actually sends and receives.

The counts are the lengths of the serialized protobuf messages handed to and
received from gRPC (its own 5-byte message prefix and HTTP/2 framing are not
included), so bytes per env frame are measured on the real messages in both
architectures rather than computed from array sizes.
"""

from __future__ import annotations

import functools

from seedq.v1 import seed_pb2

_SERVICE = "/seedq.v1.Learner/"


class ByteCounter:
    def __init__(self):
        self.sent = 0
        self.received = 0

    def serializer(self, message) -> bytes:
        data = message.SerializeToString()
        self.sent += len(data)
        return data

    def deserializer(self, cls):
        def parse(data: bytes):
            self.received += len(data)
            return cls.FromString(data)

        return parse


class MeteredStub:
    """The same calls as `seed_pb2_grpc.LearnerStub`, with byte counting;
    `metadata` (the bearer token) goes with every call."""

    def __init__(self, channel, counter: ByteCounter, metadata=None):
        self.counter = counter
        send = counter.serializer
        self.Stream = channel.stream_stream(
            _SERVICE + "Stream", request_serializer=send,
            response_deserializer=counter.deserializer(seed_pb2.LearnerMessage),
        )
        self.PullParams = channel.unary_stream(
            _SERVICE + "PullParams", request_serializer=send,
            response_deserializer=counter.deserializer(seed_pb2.ParamsChunk),
        )
        self.PushUnrolls = channel.stream_stream(
            _SERVICE + "PushUnrolls", request_serializer=send,
            response_deserializer=counter.deserializer(seed_pb2.UnrollAck),
        )
        if metadata:
            for name in ("Stream", "PullParams", "PushUnrolls"):
                setattr(self, name, functools.partial(getattr(self, name), metadata=metadata))
