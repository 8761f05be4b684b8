"""The learner's gRPC side in IMPALA mode: parameter pulls and unroll pushes.

IMPALA actors act with their own copy of the policy, so the learner serves
no inference: it publishes serialized parameters (fp32 or int8, ActorQ) on
request and takes finished unrolls into the same queue that the SEED
server's unroll store fills, in the same layout, so training is unchanged.

Errors end only the offending stream, with the statuses of the SEED service
(`StreamGuard`): a bad handshake or batch with INVALID_ARGUMENT naming the
field, a batch before the handshake or a SEED actor dialling an IMPALA learner
with FAILED_PRECONDITION.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import grpc
import jax
import numpy as np

from seedq.schema import BEHAVIOUR_VERSION, sequence_fields
from seedq.server.inference import LearnerFailed, RunEnded, RunSuperseded, ServerClosing
from seedq.server.service import LearnerService, StreamGuard, Undecodable
from seedq.server.pacing import push_ack_backlog
from seedq.server.unrolls import QueueClosed, poll_until, put_when_room
from seedq.v1 import seed_pb2
from seedq.impala import codec as impala_codec
from seedq.wire import codec

log = logging.getLogger("seedq.server")


class ParamsPublisher:
    """Serialized actor parameters of the newest policy version, made on demand.

    `snapshot()` -> (learner state, ..., version) as `Learner.snapshot`;
    the agent's inference parameters published at the actors' precision
    (`seedq.quant.mode.InferencePrecision`; int8 as in ActorQ) are what actors
    run. Serialization happens at most once per version, however many actors
    pull it.
    """

    def __init__(self, agent, precision, snapshot):
        self.agent = agent
        self.mode = precision
        self.precision = precision.precision
        self.snapshot = snapshot
        self._lock = threading.Lock()
        self._cached: tuple[int, bytes] | None = None

    def latest(self) -> tuple[int, bytes]:
        """(version, msgpack bytes); thread-safe, blocking (call off the event loop)."""
        state, _, _, version = self.snapshot()
        with self._lock:
            if self._cached is None or self._cached[0] != version:
                params = jax.device_get(self.mode.publish(self.agent.inference_params(state)))
                self._cached = (version, impala_codec.serialize_params(params))
            return self._cached


class ImpalaLearnerService(LearnerService):
    """IMPALA mode: no inference here; actors' unrolls go straight to `queue`."""

    def __init__(self, agent, spec, table, queue, learner_run: str, max_envs_per_actor: int, *,
                 publisher: ParamsPublisher, config_json: str, current_version, fail, pace: bool = False,
                 **kwargs):
        """`fail(error)`: stops the learner with stop_reason learner_error."""
        super().__init__(None, learner_run, max_envs_per_actor, spec=spec, **kwargs)
        self.fail = fail
        self.table, self.queue = table, queue
        # server.queue_full pace: acknowledgements held while the learner
        # drains the queue (seedq.server.pacing.push_ack_backlog).
        self.pace = pace
        self.publisher = publisher
        self.config_json = config_json
        self.current_version = current_version  # () -> the learner's policy version
        self.fields, self.initial_only = sequence_fields(agent, spec)
        self.length = agent.sequence_spec().length

    async def Stream(self, request_iterator, context):
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            "this learner runs architecture=impala: start actors with `seedq impala-actor`",
        )

    async def PullParams(self, request, context):
        if isinstance(request, Undecodable):
            log.warning("refused a parameter pull from %s: %s", context.peer(), request.error)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.refusal())
        have = request.have_version
        try:
            version, data = await asyncio.get_running_loop().run_in_executor(None, self.publisher.latest)
            chunks = impala_codec.params_chunks(
                None if have == version else data, version, self.publisher.precision
            )
        except Exception as e:  # a learner bug: every later pull would fail alike
            log.exception("publishing parameters to actors failed; the learner stops")
            self.fail(e)
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(LearnerFailed(e)))
        for chunk in chunks:
            yield chunk

    async def PushUnrolls(self, request_iterator, context):
        await self.watched(context, self._push_unrolls)

    async def _push_unrolls(self, context, task) -> None:
        guard = StreamGuard(context, self.learner_run, ended_message=lambda reason: seed_pb2.UnrollAck(
            policy_version=self.current_version(), learner_run=self.learner_run, run_ended=reason))
        entry = None
        async with guard:
            message = await self.read(context, task)
            if message is grpc.aio.EOF:
                return
            kind = message.WhichOneof("kind")
            if kind == "unrolls":
                raise codec.OutOfOrder("handshake", "the first message of a stream must be a handshake")
            if kind != "handshake":
                raise codec.ProtocolError("handshake", "the first message of a stream must be a handshake")
            handshake = self.check_handshake(seed_pb2.ActorMessage(handshake=message.handshake))
            guard.reads_run_ended = handshake.reads_run_ended
            if self.run_ended:  # an actor (re)connecting while the run's end is being told
                raise RunEnded(self.run_ended)
            # Registered like a SEED actor: counts as connected (--min-actors).
            entry, _ = self.connect_actor(handshake)
        if entry is None:  # the guard answered the handshake with the run's end (RunEnded): the stream ends OK
            return
        guard.who = f"impala actor {entry.actor_id} run {entry.run_id}"
        log.info("impala actor %s connected: run %s, %d envs", entry.actor_id, entry.run_id, entry.num_envs)
        self.idle.rename(task, f"actor {entry.actor_id}")
        table, queue = self.table, self.queue
        try:
            async with guard:
                await context.write(seed_pb2.UnrollAck(
                    policy_version=self.current_version(), learner_run=self.learner_run,
                    config_json=self.config_json,
                ))
                while True:
                    message = await self.read(context, task)
                    if message is grpc.aio.EOF:
                        return
                    if message.WhichOneof("kind") == "handshake":
                        raise codec.OutOfOrder("unrolls", "a second handshake on one stream")
                    if entry.closed:  # a newer run of this actor took its place
                        raise RunSuperseded()
                    unrolls, frames, returns, lengths = impala_codec.decode_unrolls(
                        message, self.fields, self.length, self.initial_only, entry.num_envs,
                        num_actions=self.spec.num_actions,
                    )
                    self.check_versions(unrolls[BEHAVIOUR_VERSION])
                    try:
                        # Full: this stream waits (and so does its actor) for training.
                        if not await put_when_room(queue, unrolls, give_up=lambda: entry.closed):
                            raise RunSuperseded()
                    except QueueClosed:
                        raise (RunEnded(self.run_ended) if self.run_ended else ServerClosing()) from None
                    table.book_episodes(frames, returns, lengths)
                    if self.pace:
                        await self._hold_until_drained(queue, len(unrolls[BEHAVIOUR_VERSION]), entry)
                    await context.write(seed_pb2.UnrollAck(policy_version=self.current_version()))
        finally:
            table.release(entry)

    @staticmethod
    async def _hold_until_drained(queue, pushed: int, entry) -> None:
        """Holds a push's acknowledgement (and so its actor) until the
        learner has drained the queue to `push_ack_backlog`."""
        drained = lambda: queue.closed or len(queue) <= push_ack_backlog(pushed, queue.pace_target())
        if not await poll_until(drained, give_up=lambda: entry.closed):
            raise RunSuperseded()

    def connect_actor(self, handshake):
        """Registers an IMPALA actor in the env table (no inference slots of its own)."""
        try:
            return self.table.connect(handshake.actor_id, handshake.run_id, handshake.num_envs)
        except ValueError as e:  # "actor ... run ... is already connected"
            raise codec.ProtocolError("handshake.run_id", str(e)) from None

    def check_versions(self, versions: np.ndarray) -> None:
        """Behaviour versions must be ones this learner published: in [0, current]."""
        where = f"unrolls.fields[{BEHAVIOUR_VERSION}]"
        newest, current = int(versions.max()), self.current_version()
        if newest > current:
            raise codec.ProtocolError(where, f"version {newest} is newer than the learner's {current}")
        if versions.min() < 0:
            raise codec.ProtocolError(where, f"version {int(versions.min())} is negative")
