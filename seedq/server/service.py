"""The gRPC side of the learner: one bidirectional stream per actor.

Errors end only the offending stream, with a status a client can act on
(docs/wire.md): protocol errors (bad handshake, unknown env index, wrong byte
length, non-finite values, spec mismatch) with INVALID_ARGUMENT, messages out
of order with FAILED_PRECONDITION, both naming the field; a superseded run
with ABORTED, shutdown with UNAVAILABLE, and anything unexpected with
INTERNAL after logging its traceback. Every other stream keeps being served;
no input ends in gRPC's UNKNOWN. Credentials, the health service and
dead-peer detection live in `seedq.transport.channel`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING

import grpc
from google.protobuf.message import DecodeError

from seedq.transport import channel
from seedq.config import AuthConfig, ServerConfig, TlsConfig
from seedq.server.env_table import SlotBudgetExhausted
from seedq.server.errors import LearnerFailed, RunEnded, RunSuperseded, ServerClosing
from seedq.v1 import seed_pb2, seed_pb2_grpc
from seedq.wire import codec
from seedq import schema

if TYPE_CHECKING:
    from seedq.server.inference import InferenceServer

log = logging.getLogger("seedq.server")

MAX_MESSAGE_BYTES = codec.MAX_MESSAGE_BYTES


class LearnerService(seed_pb2_grpc.LearnerServicer):
    """SEED mode: every actor stream's steps go to the batching inference server."""

    def __init__(self, inference: InferenceServer | None, learner_run: str,
                 max_envs_per_actor: int = 4096,
                 peer_timeout_seconds: float = ServerConfig.peer_timeout_seconds, *,
                 spec: schema.EnvSpec | None = None, env_id: str = ""):
        self.inference = inference
        self.spec = spec if spec is not None else inference.spec
        self.learner_run = learner_run
        self.env_id = env_id  # the learner's env, named in a mismatch refusal
        # The stop reason once the run is over for good (set by the server thread
        # before it stops): streams are told so (docs/wire.md "The end of a run").
        self.run_ended: str | None = None
        self.max_envs_per_actor = max_envs_per_actor
        self.idle = channel.IdleWatchdog(peer_timeout_seconds)

    async def read(self, context, task):
        """The actor's next message; the idle watchdog closes the stream if none comes in time."""
        self.idle.waiting(task, asyncio.get_running_loop().time())
        try:
            return await context.read()
        finally:
            self.idle.heard(task)

    async def watched(self, context, serve) -> None:
        """Runs `serve(context, task)` under the idle watchdog. However the stream
        ends (the actor stopped, keepalive found its connection dead, the
        watchdog closed it), the serving function releases its env slots and
        partial unrolls; the progress line counts the actors still connected."""
        task = self.idle.register(context.peer())
        try:
            await serve(context, task)
        except asyncio.CancelledError:
            if not self.idle.closed(task):
                raise  # the client went away, or the server stops
            # gRPC sends no status for a handler cancelled on the server side
            # (grpc/grpc#29248): the actor would wait on this stream forever, a
            # run that never ends. UNAVAILABLE makes it reconnect.
            if hasattr(task, "uncancel"):  # Python >= 3.11: the task is not cancelling any more
                task.uncancel()
            context.set_code(grpc.StatusCode.UNAVAILABLE)
            context.set_details(
                f"learner closed the stream of {self.idle.name(task)}: nothing received for "
                f"{self.idle.timeout:g}s (server.peer_timeout_seconds)"
            )
        finally:
            log.info("%s disconnected: its env slots are freed", self.idle.name(task))
            self.idle.unregister(task)

    def check_handshake(self, message: seed_pb2.ActorMessage):
        """The decoded handshake, or ProtocolError naming the field: the actor's
        spec must match the learner's and its env count fit the limit."""
        handshake, actor_spec = codec.decode_handshake(message)
        expected = self.spec
        mismatch = expected.describe_mismatch(actor_spec)
        if mismatch:
            field, detail = mismatch.split(":", 1)  # "observation.shape: actor sends ..."
            raise codec.ProtocolError(
                "handshake." + field,
                f"{detail.strip()} ({other_env(handshake.env_id, self.env_id)}learner expects {describe_spec(expected)})",
            )
        if handshake.num_envs > self.max_envs_per_actor:
            raise codec.ProtocolError(
                "handshake.num_envs",
                f"{handshake.num_envs} envs exceeds this learner's limit of "
                f"{self.max_envs_per_actor} per actor (server.max_envs_per_actor)",
            )
        return handshake

    async def connect(self, handshake):
        """Registers the stream's actor; the duplicate-run refusal names the field.
        (A coroutine: in an ingress process the env table is in the learner's
        process, asked over `seedq.server.ingress`'s link.)"""
        try:
            registered = self.inference.connect(handshake.actor_id, handshake.run_id, handshake.num_envs)
            return await registered if asyncio.iscoroutine(registered) else registered
        except ValueError as e:  # "actor ... run ... is already connected"
            raise codec.ProtocolError("handshake.run_id", str(e)) from None

    async def Stream(self, request_iterator, context: grpc.aio.ServicerContext):
        await self.watched(context, self._stream)

    async def _stream(self, context: grpc.aio.ServicerContext, task) -> None:
        guard = StreamGuard(context, self.learner_run)
        entry = None
        async with guard:
            message = await self.read(context, task)
            if message is grpc.aio.EOF:
                return
            handshake = self.check_handshake(message)
            guard.reads_run_ended = handshake.reads_run_ended
            if self.run_ended:  # an actor (re)connecting while the run's end is being told
                raise RunEnded(self.run_ended)
            entry, superseded = await self.connect(handshake)
        if entry is None:  # the guard answered the handshake with the run's end (RunEnded): the stream ends OK
            return
        guard.who = f"actor {entry.actor_id} run {entry.run_id}"
        if superseded is not None:
            log.info("actor %s restarted (run %s -> %s)", entry.actor_id, superseded.run_id, entry.run_id)
        log.info("actor %s connected: run %s, %d envs", entry.actor_id, entry.run_id, entry.num_envs)
        self.idle.rename(task, f"actor {entry.actor_id}")
        try:
            async with guard:
                await context.write(codec.encode_handshake_ack(self.spec, self.learner_run))
                while True:
                    message = await self.read(context, task)
                    if message is grpc.aio.EOF:
                        return
                    if entry.closed:
                        raise RunSuperseded()
                    steps = codec.decode_steps(message, self.spec, entry.num_envs)
                    actions, version = await self.inference.submit(entry, steps)
                    await context.write(codec.encode_actions(actions, self.spec, version))
        finally:
            # Stream over (clean end, error, or actor killed): drop its partial unrolls.
            self.inference.release(entry)

    # The IMPALA RPCs, at a SEED learner (ImpalaLearnerService overrides both):
    # UNIMPLEMENTED, as gRPC's default would say, but with a hint and without
    # the default's traceback in the learner log.

    async def PullParams(self, request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, WRONG_ARCHITECTURE)
        yield  # an async generator, like the real one

    async def PushUnrolls(self, request_iterator, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, WRONG_ARCHITECTURE)


WRONG_ARCHITECTURE = "this learner runs architecture=seed: start actors with `seedq actor`"


@dataclasses.dataclass(frozen=True)
class Undecodable:
    """A unary request whose bytes parse as no message of its type."""

    error: str

    def refusal(self) -> str:
        return f"message: not a valid protobuf encoding ({self.error})"


def _tolerant(parse):
    def deserialize(data: bytes):
        try:
            return parse(data)
        except DecodeError as e:
            return Undecodable(str(e))

    return deserialize


def add_learner_service(service: LearnerService, server: grpc.aio.Server) -> None:
    """Registers `service` as the generated add_LearnerServicer_to_server does,
    except that a unary request that does not parse reaches the handler as
    `Undecodable` (refused with INVALID_ARGUMENT) instead of failing inside
    gRPC, which would answer UNKNOWN and log a traceback. (Streams read their
    messages inside the handler, where StreamGuard catches a DecodeError.)"""
    handlers = {
        "Stream": grpc.stream_stream_rpc_method_handler(
            service.Stream,
            request_deserializer=seed_pb2.ActorMessage.FromString,
            response_serializer=seed_pb2.LearnerMessage.SerializeToString,
        ),
        "PullParams": grpc.unary_stream_rpc_method_handler(
            service.PullParams,
            request_deserializer=_tolerant(seed_pb2.ParamsRequest.FromString),
            response_serializer=seed_pb2.ParamsChunk.SerializeToString,
        ),
        "PushUnrolls": grpc.stream_stream_rpc_method_handler(
            service.PushUnrolls,
            request_deserializer=seed_pb2.UnrollMessage.FromString,
            response_serializer=seed_pb2.UnrollAck.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


SERVICE_NAME = seed_pb2.DESCRIPTOR.services_by_name["Learner"].full_name


def other_env(actor_env: str, learner_env: str) -> str:
    """The two env ids of a mismatching handshake, when they differ (else nothing):
    users recognise `Acrobot-v1` and `CartPole-v1` sooner than two shapes."""
    if not actor_env or not learner_env or actor_env == learner_env:
        return ""
    return f"the actor steps {actor_env}, this learner trains {learner_env}; "


def describe_spec(spec: schema.EnvSpec) -> str:
    """One line: observation dtype[shape] and the action space."""
    return f"observation {spec.obs_dtype}{list(spec.obs_shape)}, action_space {spec.action_text()}"


class StreamGuard:
    """`async with guard:` ends the stream with the status its error deserves.

    ProtocolError -> INVALID_ARGUMENT (OutOfOrder -> FAILED_PRECONDITION),
    the text naming the field; undecodable bytes -> INVALID_ARGUMENT; a full
    env-slot budget -> RESOURCE_EXHAUSTED; RunSuperseded -> ABORTED; ServerClosing ->
    UNAVAILABLE; anything else -> INTERNAL, logged with its traceback first
    (never gRPC's silent UNKNOWN). `who` names the stream in logs and details.
    """

    def __init__(self, context, learner_run: str = "", ended_message=None):
        self.context = context
        self.who = f"a new stream from {context.peer()}"
        self.learner_run = learner_run
        # stop_reason -> the stream's last message when the run is over (its RPC's response type).
        self.ended_message = ended_message or (lambda reason: codec.encode_run_ended(reason, learner_run))
        # The handshake's reads_run_ended: the run's end is told by a RunEnded message.
        self.reads_run_ended = False

    async def __aenter__(self):
        return self

    async def __aexit__(self, kind, error, tb):
        if error is None or not isinstance(error, Exception):
            return False  # clean exit, or cancellation (the client went away)
        if isinstance(error, grpc.aio.AbortError):
            return False  # already aborted with its status
        if isinstance(error, RunEnded) and self.reads_run_ended:
            # The last message; the stream then ends with OK.
            await self.context.write(self.ended_message(error.stop_reason))
            return True
        code, details = self.status_of(error)
        await self.context.abort(code, details)

    def status_of(self, error: Exception) -> tuple[grpc.StatusCode, str]:
        if isinstance(error, codec.ProtocolError):
            log.warning("refused %s: %s", self.who, error)
            code = (
                grpc.StatusCode.FAILED_PRECONDITION
                if isinstance(error, codec.OutOfOrder)
                else grpc.StatusCode.INVALID_ARGUMENT
            )
            return code, str(error)
        if isinstance(error, DecodeError):  # bytes that are no message of the RPC's type
            log.warning("refused %s: undecodable message: %s", self.who, error)
            return grpc.StatusCode.INVALID_ARGUMENT, f"message: not a valid protobuf encoding ({error})"
        if isinstance(error, SlotBudgetExhausted):
            log.info("refused %s: %s", self.who, error)
            return grpc.StatusCode.RESOURCE_EXHAUSTED, str(error)
        if isinstance(error, RunSuperseded):
            return grpc.StatusCode.ABORTED, f"{self.who}: this run was superseded by a newer run"
        if isinstance(error, (LearnerFailed, RunEnded)):
            return grpc.StatusCode.UNAVAILABLE, str(error)
        if isinstance(error, ServerClosing):
            return grpc.StatusCode.UNAVAILABLE, "learner is shutting down"
        log.error("internal error serving %s", self.who, exc_info=error)
        return (
            grpc.StatusCode.INTERNAL,
            f"learner error {type(error).__name__}: {error} (its traceback is in the learner log)",
        )


async def start_server(
    service: LearnerService, address: str, *, server_config: ServerConfig = ServerConfig(),
    tls: TlsConfig = TlsConfig(), auth: AuthConfig = AuthConfig(), reuse_port: bool = False,
) -> tuple[grpc.aio.Server, str, object]:
    """Starts serving `address` (unix:/path, or host:port with port 0 for any free one)
    with the credentials and keepalive settings given, plus the gRPC health service.

    With `server_config.health_port`, the health service is also served alone,
    in plaintext, on that port (for probes that cannot speak TLS).

    `reuse_port`: share the TCP port with the learner's other ingress
    processes (SO_REUSEPORT); otherwise a port in use is refused.

    Returns the running servers (`stop(grace)`), the address actors should
    dial, and the coroutine function `set_serving(bool)` of its health status
    (NOT_SERVING until the caller says otherwise).
    """
    credentials = channel.server_credentials(tls)
    server = grpc.aio.server(
        interceptors=channel.server_interceptors(auth),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", int(reuse_port)),
        ] + channel.server_options(server_config.keepalive_seconds, server_config.peer_timeout_seconds),
    )
    add_learner_service(service, server)
    servers = [server]
    if server_config.health_port:
        # A server of its own, so that the plaintext port can reach nothing but health checks;
        # there gRPC itself refuses a larger request before taking it in.
        health_server = grpc.aio.server(
            options=[("grpc.max_receive_message_length", channel.MAX_HEALTH_REQUEST_BYTES)])
        if health_server.add_insecure_port(f"{channel.health_host(address)}:{server_config.health_port}") == 0:
            raise OSError(f"could not listen on health port {server_config.health_port} (server.health_port)")
        servers.append(health_server)
    set_serving = await channel.add_health_service(*servers)
    unix_socket = None
    try:
        if address.startswith("unix:"):
            port, unix_socket = channel.bind_unix(server, address, credentials)
        elif credentials is not None:
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError:  # gRPC's "Failed to bind" (its details go to the gRPC log)
        port = 0
    if port == 0:
        raise OSError(f"could not listen on {address} (in use, or not an address of this host)")
    for each in servers:
        await each.start()
    if not address.startswith("unix"):
        address = f"{address.rsplit(':', 1)[0]}:{port}"
    return LearnerServers(servers, unix_socket), address, set_serving


class LearnerServers:
    """The learner's gRPC server and, with server.health_port, its health-only
    server: stopped together. Stopping removes the unix socket it bound, if
    that path still holds it."""

    def __init__(self, servers: list[grpc.aio.Server], unix_socket: tuple[str, str] | None = None):
        self._servers = servers
        self._unix_socket = unix_socket

    async def stop(self, grace: float | None) -> None:
        await asyncio.gather(*(server.stop(grace) for server in self._servers))
        if self._unix_socket is not None:
            channel.remove_unix_socket(*self._unix_socket)
            self._unix_socket = None
