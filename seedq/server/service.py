"""The gRPC side of the learner: one bidirectional stream per actor.

Protocol errors (bad handshake, unknown env index, wrong byte length, spec
mismatch) end only the offending stream, with INVALID_ARGUMENT and a message
that names the field; every other stream keeps being served. Credentials,
the health service and dead-peer detection live in `seedq.channel`.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from seedq import channel
from seedq.config import AuthConfig, ServerConfig, TlsConfig
from seedq.server.inference import InferenceServer, RunSuperseded, ServerClosing
from seedq.v1 import seed_pb2, seed_pb2_grpc
from seedq.wire import codec

log = logging.getLogger("seedq.server")

MAX_MESSAGE_BYTES = 64 << 20


class LearnerService(seed_pb2_grpc.LearnerServicer):
    def __init__(self, inference: InferenceServer, learner_run: str, max_envs_per_actor: int = 4096,
                 peer_timeout_seconds: float = ServerConfig.peer_timeout_seconds):
        self.inference = inference
        self.learner_run = learner_run
        self.max_envs_per_actor = max_envs_per_actor
        self.idle = channel.IdleWatchdog(peer_timeout_seconds)

    async def read(self, context, task):
        """The actor's next message; the idle watchdog closes the stream if none comes in time."""
        self.idle.waiting(task, asyncio.get_running_loop().time())
        try:
            return await context.read()
        finally:
            self.idle.heard(task)

    @staticmethod
    async def _abort_superseded(context, entry) -> None:
        await context.abort(
            grpc.StatusCode.ABORTED,
            f"actor {entry.actor_id} run {entry.run_id} was superseded by a newer run",
        )

    def check_handshake(self, message: seed_pb2.ActorMessage):
        """The decoded handshake, or ProtocolError naming the field: the actor's
        spec must match the learner's and its env count fit the limit."""
        handshake, actor_spec = codec.decode_handshake(message)
        mismatch = self.inference.spec.describe_mismatch(actor_spec)
        if mismatch:
            field, detail = mismatch.split(":", 1)  # "observation.shape: actor sends ..."
            raise codec.ProtocolError("handshake." + field, detail.strip())
        if handshake.num_envs > self.max_envs_per_actor:
            raise codec.ProtocolError(
                "handshake.num_envs",
                f"{handshake.num_envs} envs exceeds this learner's limit of "
                f"{self.max_envs_per_actor} per actor (server.max_envs_per_actor)",
            )
        return handshake

    async def watched(self, context, serve) -> None:
        """Runs `serve(context, task)` under the idle watchdog. However the stream
        ends (the actor stopped, keepalive found its connection dead, the
        watchdog closed it), the serving function releases its env slots and
        partial unrolls; the progress line counts the actors still connected."""
        task = self.idle.register(context.peer())
        try:
            await serve(context, task)
        finally:
            log.info("%s disconnected: its env slots are freed", self.idle.name(task))
            self.idle.unregister(task)

    async def Stream(self, request_iterator, context: grpc.aio.ServicerContext):
        await self.watched(context, self._stream)

    async def _stream(self, context: grpc.aio.ServicerContext, task) -> None:
        message = await self.read(context, task)
        if message is grpc.aio.EOF:
            return
        try:
            handshake = self.check_handshake(message)
            entry, superseded = self.inference.connect(
                handshake.actor_id, handshake.run_id, handshake.num_envs
            )
        except (codec.ProtocolError, ValueError) as e:
            log.warning("refused a stream: %s", e)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            return
        if superseded is not None:
            log.info("actor %s restarted (run %s -> %s)", entry.actor_id, superseded.run_id, entry.run_id)
        log.info("actor %s connected: run %s, %d envs", entry.actor_id, entry.run_id, entry.num_envs)
        self.idle.rename(task, f"actor {entry.actor_id}")
        try:
            await context.write(
                seed_pb2.LearnerMessage(
                    ack=seed_pb2.HandshakeAck(
                        protocol_version=codec.PROTOCOL_VERSION, learner_run=self.learner_run
                    )
                )
            )
            while True:
                message = await self.read(context, task)
                if message is grpc.aio.EOF:
                    return
                if entry.closed:
                    await self._abort_superseded(context, entry)
                try:
                    steps = codec.decode_steps(message, self.inference.spec, entry.num_envs)
                except codec.ProtocolError as e:
                    log.warning("actor %s sent a bad message: %s", entry.actor_id, e)
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                try:
                    actions, version = await self.inference.submit(entry, steps)
                except ServerClosing:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "learner is shutting down")
                except RunSuperseded:
                    await self._abort_superseded(context, entry)
                await context.write(codec.encode_actions(actions, self.inference.spec, version))
        finally:
            # Stream over (clean end, error, or actor killed): drop its partial unrolls.
            self.inference.release(entry)


async def start_server(
    service: LearnerService, address: str, *, server_config: ServerConfig = ServerConfig(),
    tls: TlsConfig = TlsConfig(), auth: AuthConfig = AuthConfig(),
) -> tuple[grpc.aio.Server, str, object]:
    """Starts serving `address` (unix:/path, or host:port with port 0 for any free one)
    with the credentials and keepalive settings given, plus the gRPC health service.

    With `server_config.health_port`, the health service is also served alone,
    in plaintext, on that port (for probes that cannot speak TLS).

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
            ("grpc.so_reuseport", 0),
        ] + channel.server_options(server_config.keepalive_seconds, server_config.peer_timeout_seconds),
    )
    seed_pb2_grpc.add_LearnerServicer_to_server(service, server)
    servers = [server]
    if server_config.health_port:
        # A server of its own, so that the plaintext port can reach nothing but health checks.
        health_server = grpc.aio.server()
        if health_server.add_insecure_port(f"0.0.0.0:{server_config.health_port}") == 0:
            raise OSError(f"could not listen on health port {server_config.health_port} (server.health_port)")
        servers.append(health_server)
    set_serving = await channel.add_health_service(*servers)
    try:
        if credentials is not None:
            port = server.add_secure_port(address, credentials)
        elif address.startswith("unix:"):
            port = channel.listen_unix(server, address)
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
    return LearnerServers(servers), address, set_serving


class LearnerServers:
    """The learner's gRPC server and, with server.health_port, its health-only server: stopped together."""

    def __init__(self, servers: list[grpc.aio.Server]):
        self._servers = servers

    async def stop(self, grace: float | None) -> None:
        await asyncio.gather(*(server.stop(grace) for server in self._servers))
