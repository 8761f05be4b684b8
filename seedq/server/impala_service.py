"""The learner's gRPC side in IMPALA mode: parameter pulls and unroll pushes.

IMPALA actors act with their own copy of the policy, so the learner serves
no inference: it publishes serialized parameters (fp32 or int8, ActorQ) on
request and takes finished unrolls into the same queue that the SEED
server's unroll store fills, in the same layout, so training is unchanged.

Errors end only the offending stream: a bad handshake or batch with
INVALID_ARGUMENT naming the field, a SEED actor dialling an IMPALA learner
with FAILED_PRECONDITION.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import grpc
import jax
import numpy as np

from seedq.server.inference import BEHAVIOUR_VERSION
from seedq.server.service import LearnerService
from seedq.server.unrolls import QueueClosed
from seedq.v1 import seed_pb2
from seedq.wire import codec, impala_codec

log = logging.getLogger("seedq.server")


class ParamsPublisher:
    """Serialized actor parameters of the newest policy version, made on demand.

    `snapshot()` -> (learner state, ..., version) as `Learner.snapshot`;
    `agent.inference_params(state)` gives the pytree actors run (quantized
    when the agent's precision is int8). Serialization happens at most once
    per version, however many actors pull it.
    """

    def __init__(self, agent, snapshot, precision: str):
        self.agent = agent
        self.snapshot = snapshot
        self.precision = precision
        self._lock = threading.Lock()
        self._cached: tuple[int, bytes] | None = None
        self.serialize_seconds = 0.0

    def latest(self) -> tuple[int, bytes]:
        """(version, msgpack bytes); thread-safe, blocking (call off the event loop)."""
        state, _, _, version = self.snapshot()
        with self._lock:
            if self._cached is None or self._cached[0] != version:
                started = time.perf_counter()
                params = jax.device_get(self.agent.inference_params(state))
                self._cached = (version, impala_codec.serialize_params(params))
                self.serialize_seconds += time.perf_counter() - started
            return self._cached


class ImpalaLearnerService(LearnerService):
    def __init__(self, inference, learner_run: str, max_envs_per_actor: int, *,
                 publisher: ParamsPublisher, config_json: str, current_version, **kwargs):
        super().__init__(inference, learner_run, max_envs_per_actor, **kwargs)
        self.publisher = publisher
        self.config_json = config_json
        self.current_version = current_version  # () -> the learner's policy version
        store = inference.store
        self.fields, self.length, self.initial_only = store.fields, store.length, store.initial_only

    async def Stream(self, request_iterator, context):
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            "this learner runs architecture=impala: start actors with `seedq impala-actor`",
        )

    async def PullParams(self, request, context):
        have = request.have_version
        version, data = await asyncio.get_running_loop().run_in_executor(None, self.publisher.latest)
        chunks = impala_codec.params_chunks(
            None if have == version else data, version, self.publisher.precision
        )
        for chunk in chunks:
            yield chunk

    async def PushUnrolls(self, request_iterator, context):
        await self.watched(context, self._push_unrolls)

    async def _push_unrolls(self, context, task) -> None:
        message = await self.read(context, task)
        if message is grpc.aio.EOF:
            return
        try:
            if message.WhichOneof("kind") != "handshake":
                raise codec.ProtocolError("handshake", "the first message of a stream must be a handshake")
            handshake = self.check_handshake(seed_pb2.ActorMessage(handshake=message.handshake))
            # Registered like a SEED actor: counts as connected (--min-actors).
            entry, _ = self.inference.table.connect(handshake.actor_id, handshake.run_id, handshake.num_envs)
        except (codec.ProtocolError, ValueError) as e:
            log.warning("refused an unroll stream: %s", e)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            return
        log.info("impala actor %s connected: run %s, %d envs", entry.actor_id, entry.run_id, entry.num_envs)
        self.idle.rename(task, f"actor {entry.actor_id}")
        table, queue = self.inference.table, self.inference.queue
        try:
            await context.write(seed_pb2.UnrollAck(
                policy_version=self.current_version(), learner_run=self.learner_run,
                config_json=self.config_json,
            ))
            while True:
                message = await self.read(context, task)
                if message is grpc.aio.EOF:
                    return
                try:
                    unrolls, frames, returns, lengths = impala_codec.decode_unrolls(
                        message, self.fields, self.length, self.initial_only, entry.num_envs
                    )
                    newest = int(unrolls[BEHAVIOUR_VERSION].max())
                    if newest > self.current_version():
                        raise codec.ProtocolError(
                            f"unrolls.fields[{BEHAVIOUR_VERSION}]",
                            f"version {newest} is newer than the learner's {self.current_version()}",
                        )
                except codec.ProtocolError as e:
                    log.warning("actor %s sent a bad unroll batch: %s", entry.actor_id, e)
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                clip = self.inference.reward_clip  # learner-side, as in SEED mode (Atari)
                if clip > 0:
                    unrolls["reward"] = np.clip(unrolls["reward"], -clip, clip)
                try:
                    if not queue.try_put(unrolls):
                        # Full: this stream waits (and so does its actor) for training.
                        await asyncio.get_running_loop().run_in_executor(None, queue.put, unrolls)
                except QueueClosed:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "learner is shutting down")
                table.book_episodes(frames, returns, lengths)
                await context.write(seed_pb2.UnrollAck(policy_version=self.current_version()))
        finally:
            table.release(entry)
