"""Security and liveness of the actor <-> learner channel, both ends.

* Credentials: TLS (mutual when the learner has a client CA) through gRPC's
  own ssl credentials, and a bearer token sent as `authorization: Bearer
  <token>` call metadata on every RPC and checked by a server interceptor
  with a constant-time compare. The standard gRPC health service is exempt
  from the token: Kubernetes' gRPC probes cannot send metadata.
* The refusal rule: a learner that other hosts (or, for an abstract unix
  socket, other local users) can reach needs client authentication - a
  bearer token or mutual TLS (a client CA) - or an explicit `insecure`.
  Server-only TLS does not count: it proves the learner to the actor, not
  the actor to the learner. Path unix sockets need neither (mode 0600).
* Dead peers: gRPC keepalive pings on both ends (a connection that answers
  no ping within the timeout is closed) and, on the server, an idle deadline
  on every actor stream (`IdleWatchdog`), since a preempted VM sends no FIN.

Defaults and the reasoning behind them: docs/security.md.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import os
import secrets
import socket
import stat

import grpc

from seedq.process import exit_codes
from seedq.config import ActorChannelConfig, AuthConfig, TlsConfig, TrainConfig

log = logging.getLogger("seedq.server")

HEALTH_METHOD_PREFIX = "/grpc.health.v1.Health/"
# The RPC service whose health the learner reports (besides the overall "").
LEARNER_SERVICE = "seedq.v1.Learner"
# The health service's name for the run itself: SERVING while it goes on (also
# while the learner starts, or stops to be restarted), NOT_SERVING once it
# has ended for good (docs/wire.md).
RUN_SERVICE = "seedq.v1.Run"
# Status codes an actor does not retry: reconnecting cannot fix its credentials.
AUTH_FAILURE_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
# Markers gRPC puts in UNAVAILABLE details when our TLS handshake failed
# (an untrusted learner certificate, a name mismatch): definite refusals.
_TLS_FAILURE_MARKERS = ("Tls handshake failed", "Ssl handshake failed", "CERTIFICATE_VERIFY_FAILED",
                        "Custom verification check failed", "Hostname Verification Check failed")
# A learner that closes every new connection right away: with TLS, one that
# rejected our client certificate (TLS 1.3 lets the client finish first);
# without, one that speaks TLS. A learner going down can do it once, so only
# this many in a row count as a refusal.
SUSPECTED_REFUSALS_IN_A_ROW = 3
# Refusals are logged once per peer host; more distinct hosts than this are not remembered.
_MAX_LOGGED_PEERS = 4096


# --- files ---


def read_file(path: str, what: str) -> bytes:
    """The bytes of a credential file, or OSError with a one-line message."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise OSError(f"{what} {path}: {e.strerror or e}") from None
    if not data.strip():
        raise OSError(f"{what} {path}: the file is empty")
    return data


def read_token(path: str) -> str:
    """The token in `path` (surrounding whitespace stripped)."""
    token = read_file(path, "--auth.token-file").decode("utf-8", "replace").strip()
    if any(c.isspace() for c in token) or not token.isprintable():
        raise OSError(f"--auth.token-file {path}: the token must be one line of printable characters")
    return token


# --- the refusal rule ---


def is_loopback(address: str) -> bool:
    """True for path unix sockets and TCP addresses on a loopback interface:
    addresses only this host's users can reach. An abstract unix socket
    (`unix-abstract:`) has no file mode, so any local user can connect: it
    is not counted as loopback."""
    if address.startswith("unix:"):
        return True
    if address.startswith("unix-abstract:"):
        return False
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a hostname (may resolve to anything) or 0.0.0.0 / [::]-style wildcards


def authenticates_clients(*, client_ca: bool, token: bool) -> bool:
    """Whether the learner can tell its actors from anyone else who reaches
    the port: a bearer token or a client CA (mutual TLS). Server-only TLS
    encrypts but proves nothing about the peer."""
    return bool(client_ca or token)


def unauthenticated_exposure(where: str, how_to_fix: str) -> str:
    """The one-line refusal shared by the learner and the launchers."""
    return (
        f"refusing to serve {where} without client authentication: anyone who reaches it could feed "
        f"training data and take the model; {how_to_fix} (server-only TLS authenticates nobody), "
        "or --insecure to serve it anyway"
    )


def check_exposure(config: TrainConfig, address: str) -> None:
    """ValueError (one line) when the learner would serve an address others
    can reach without authenticating them (no token, no client CA) and
    without `--insecure`. A token over plaintext is allowed (private
    networks) with one warning line that it travels in clear."""
    if is_loopback(address) or config.insecure:
        return
    if not authenticates_clients(client_ca=bool(config.tls.client_ca), token=bool(config.auth.token_file)):
        raise exit_codes.UsageError(unauthenticated_exposure(
            address, "give a client CA (--tls.client-ca, mutual TLS) and/or a token (--auth.token-file) "
            "(`seedq certs` makes a CA and certificates)"))
    if config.auth.token_file and not config.tls.enabled:
        log.warning("the bearer token travels in clear on %s (no TLS): any host on the path can read "
                    "and replay it; use it on a private network only, or add --tls.cert/--tls.key", address)


# --- server side ---


def server_options(keepalive_seconds: float, peer_timeout_seconds: float) -> list[tuple[str, int]]:
    """Keepalive settings of the learner's gRPC server."""
    return [
        ("grpc.keepalive_time_ms", int(keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", int((peer_timeout_seconds - keepalive_seconds) * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        # Actors ping on their own schedule (their --keepalive-seconds): accept
        # pings of any frequency instead of answering "too many pings" with GOAWAY.
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 0),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials | None:
    """TLS credentials for the learner (None: plaintext)."""
    if not tls.enabled:
        return None
    key = read_file(tls.key, "--tls.key")
    cert = read_file(tls.cert, "--tls.cert")
    client_ca = read_file(tls.client_ca, "--tls.client-ca") if tls.client_ca else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def _peer_host(peer: str) -> str:
    """'ipv4:10.0.0.2:41234' -> 'ipv4:10.0.0.2' (a reconnecting actor keeps its host)."""
    return peer.rsplit(":", 1)[0] if peer.startswith(("ipv4:", "ipv6:")) else peer


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every RPC (health checks excepted) that lacks `authorization:
    Bearer <token>` with UNAUTHENTICATED, logging the first refusal per peer host."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()
        self._logged_peers: set[str] = set()

    def _authorized(self, metadata) -> bool:
        for key, value in metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(given, self._expected)
        return False

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(HEALTH_METHOD_PREFIX):
            return handler
        if self._authorized(handler_call_details.invocation_metadata):
            return handler
        return self._refusing(handler, method)

    def _refusing(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """A handler that aborts at once, before reading any request: it takes
        its requests as a stream (which it never reads) whatever the method's
        shape, so an unauthenticated peer's message is never received and
        decoded (a unary handler would take up to the size limit first)."""

        async def refuse(request_iterator, context):
            peer = _peer_host(context.peer())
            if peer not in self._logged_peers and len(self._logged_peers) < _MAX_LOGGED_PEERS:
                self._logged_peers.add(peer)
                log.warning("refused %s from %s: missing or wrong bearer token", method, peer)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        make = grpc.stream_stream_rpc_method_handler if handler.response_streaming else grpc.stream_unary_rpc_method_handler
        return make(refuse, request_deserializer=_never_decoded, response_serializer=handler.response_serializer)


def _never_decoded(data: bytes):
    raise AssertionError("a refused call's request is never read")


def server_interceptors(auth: AuthConfig) -> list[grpc.aio.ServerInterceptor]:
    return [TokenInterceptor(read_token(auth.token_file))] if auth.token_file else []


# The health service takes no token, so it must hold little for anyone:
# requests of at most this many bytes (a real one is a service name; the
# server's own limit, 64 MiB, is for actors' batches) ...
MAX_HEALTH_REQUEST_BYTES = 64 << 10
# ... and at most this many Watch streams open at once over every port (a
# kubelet probe uses Check; a Watch holds a task and a waiter for its life).
MAX_HEALTH_WATCHES = 32


async def add_health_service(*servers: grpc.aio.Server):
    """Adds one standard gRPC health service to `servers`; returns a coroutine
    function `set_serving(bool, run_ended=False)` that updates the status of ""
    and the Learner service (and with `run_ended`, marks RUN_SERVICE NOT_SERVING)."""
    from grpc_health.v1 import health, health_pb2

    servicer = health.aio.HealthServicer()
    handler = _bounded_health_handler(servicer)
    for server in servers:
        server.add_generic_rpc_handlers((handler,))

    async def set_serving(serving: bool, *, run_ended: bool = False) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", LEARNER_SERVICE):
            await servicer.set(service, status)
        if run_ended:
            await servicer.set(RUN_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)

    await set_serving(False)
    await servicer.set(RUN_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    return set_serving


def _bounded_health_handler(servicer) -> grpc.GenericRpcHandler:
    """grpc.health.v1.Health served by `servicer` (grpcio's own), with the
    bounds above: the request arrives as bytes (no deserializer), so a
    request over MAX_HEALTH_REQUEST_BYTES is refused with RESOURCE_EXHAUSTED
    before it is decoded, as is a Watch beyond MAX_HEALTH_WATCHES."""
    from grpc_health.v1 import health_pb2

    watches = [0]

    async def request(data: bytes, context):
        if len(data) > MAX_HEALTH_REQUEST_BYTES:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"health request of {len(data)} bytes: at most {MAX_HEALTH_REQUEST_BYTES} are taken",
            )
        try:
            return health_pb2.HealthCheckRequest.FromString(data)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError, whatever its module
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "not a HealthCheckRequest")

    async def check(data: bytes, context):
        return await servicer.Check(await request(data, context), context)

    async def watch(data: bytes, context):
        checked = await request(data, context)
        if watches[0] >= MAX_HEALTH_WATCHES:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{MAX_HEALTH_WATCHES} health Watch streams are open already (use Check)",
            )
        watches[0] += 1
        try:
            await servicer.Watch(checked, context)
        finally:
            watches[0] -= 1

    serialize = health_pb2.HealthCheckResponse.SerializeToString
    return grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
        "Check": grpc.unary_unary_rpc_method_handler(check, response_serializer=serialize),
        "Watch": grpc.unary_stream_rpc_method_handler(watch, response_serializer=serialize),
    })


# Longest unix socket path the kernel takes (sockaddr_un.sun_path, less its NUL).
_MAX_UNIX_PATH = 107


def claim_unix_path(path: str) -> None:
    """Makes `path` free for a new socket: removes a stale one (nobody
    listens on it: a crashed learner's), and raises OSError (one line) for
    anything else there - a file that is not a socket, or the socket of a
    learner that is still serving."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not (stat.S_ISSOCK(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise OSError(f"{path}: exists and is not a socket; refusing to replace it (choose another --address)")
    if stat.S_ISLNK(st.st_mode) and os.path.exists(path) and not stat.S_ISSOCK(os.stat(path).st_mode):
        raise OSError(f"{path}: a link to something that is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)  # (through a learner's link to its socket)
    except (ConnectionRefusedError, FileNotFoundError):
        # Stale: a crashed learner's socket, or its link to one (and that socket).
        if stat.S_ISLNK(st.st_mode):
            target = os.path.join(os.path.dirname(path), os.readlink(path))
            if os.path.exists(target) and stat.S_ISSOCK(os.lstat(target).st_mode):
                os.unlink(target)
        os.unlink(path)
        return
    finally:
        probe.close()
    raise OSError(f"{path}: another process is serving on this socket (another learner?)")


def _private_path(path: str) -> str | None:
    """Where a learner's gRPC server binds for `path`: beside it, a name of
    its own (None when that would pass the kernel's length limit)."""
    private = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{secrets.token_hex(4)}")
    return private if len(private.encode()) <= _MAX_UNIX_PATH else None


def bind_unix(server: grpc.aio.Server, address: str, credentials=None) -> tuple[int, tuple[str, str] | None]:
    """Binds `address` (unix:PATH) for the learner, mode 0600 (its owner
    only); returns (gRPC's port, what `remove_unix_socket` takes).

    gRPC itself unlinks a unix socket's path when its server goes, whoever
    holds that path by then. So the server binds a path of this process's
    own beside PATH, and PATH becomes a symbolic link to it (clients connect
    through it): at exit each learner removes its own link only, never a
    later learner's socket at PATH."""
    path = address[len("unix:"):]
    claim_unix_path(path)
    private = _private_path(path)
    target = private or path
    # The umask makes the socket 0600 from its creation on (no window where
    # another local user could connect); the learner has no other threads
    # creating files yet while it starts serving.
    previous = os.umask(0o177)
    try:
        bound = f"unix:{target}"
        port = server.add_secure_port(bound, credentials) if credentials else server.add_insecure_port(bound)
    finally:
        os.umask(previous)
    if not port:
        return port, None
    os.chmod(target, 0o600)
    if not private:
        return port, None
    link = f"{private}.link"
    os.symlink(os.path.basename(private), link)  # relative: the pair can move together
    os.replace(link, path)
    return port, (path, os.path.basename(private))


def remove_unix_socket(path: str, private: str) -> None:
    """Removes the link at `path` if it is still this learner's (points to
    `private`); a later learner's socket or link there stays."""
    try:
        if os.path.islink(path) and os.readlink(path) == private:
            os.unlink(path)
    except FileNotFoundError:
        pass


def health_host(address: str) -> str:
    """Where the plaintext health port listens: the learner's own interface
    for a TCP address (all of them for a wildcard), loopback for a unix
    socket, so probes reach no further than the learner itself does."""
    if address.startswith(("unix:", "unix-abstract:")):
        return "127.0.0.1"
    return address.rsplit(":", 1)[0]


class IdleWatchdog:
    """Closes streams whose actor sent nothing for `timeout` seconds while the
    learner waited for it (a vanished peer: no FIN, no message).

    Streams call `waiting()` before awaiting the actor and `heard()` after; time
    the learner itself spends (inference, backpressure) never counts. One
    periodic check for all streams instead of a timer per message, which would
    cost the SEED loop a task per round trip. A closed stream's task is
    cancelled, and `closed(task)` tells that cancellation from the others (the
    client went away, the server stops): the stream must still send the actor
    a status itself, as gRPC sends none for a cancelled handler.
    """

    def __init__(self, timeout: float):
        self.timeout = timeout
        self._waiting: dict[asyncio.Task, float] = {}
        self._names: dict[asyncio.Task, str] = {}
        self._closed: set[asyncio.Task] = set()
        self._checker: asyncio.Task | None = None

    def register(self, name: str) -> asyncio.Task:
        task = asyncio.current_task()
        self._names[task] = name
        if self._checker is None:
            self._checker = asyncio.get_running_loop().create_task(self._check_forever())
        return task

    def rename(self, task: asyncio.Task, name: str) -> None:
        self._names[task] = name

    def name(self, task: asyncio.Task) -> str:
        return self._names.get(task, "an actor")

    def unregister(self, task: asyncio.Task) -> None:
        self._waiting.pop(task, None)
        self._names.pop(task, None)
        self._closed.discard(task)

    @property
    def open_streams(self) -> int:
        """Streams registered and not yet ended."""
        return len(self._names)

    def closed(self, task: asyncio.Task) -> bool:
        """Whether this watchdog cancelled `task` (its actor was silent too long)."""
        return task in self._closed

    def waiting(self, task: asyncio.Task, now: float) -> None:
        self._waiting[task] = now

    def heard(self, task: asyncio.Task) -> None:
        self._waiting.pop(task, None)

    async def _check_forever(self) -> None:
        loop = asyncio.get_running_loop()
        period = min(1.0, self.timeout / 4)
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            for task, since in list(self._waiting.items()):
                if now - since > self.timeout:
                    log.warning("closing the stream of %s: nothing received for %.1fs (peer gone?)",
                                self.name(task), now - since)
                    self._waiting.pop(task, None)
                    self._closed.add(task)
                    task.cancel()

    def close(self) -> None:
        if self._checker is not None:
            self._checker.cancel()


# --- actor side ---


def channel_options(config: ActorChannelConfig) -> list[tuple[str, object]]:
    """Keepalive and reconnect settings of an actor's channel."""
    ping_timeout_ms = int((config.peer_timeout_seconds - config.keepalive_seconds) * 1000)
    options: list[tuple[str, object]] = [
        ("grpc.keepalive_time_ms", int(config.keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", ping_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # The actor's own loop retries with backoff (seed_actor.MAX_BACKOFF_SECONDS);
        # keep gRPC's reconnect backoff as short, so a learner that is back is
        # dialled within a second, and bound each connection attempt by the ping timeout.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        ("grpc.min_reconnect_backoff_ms", max(1000, ping_timeout_ms)),
    ]
    if config.tls.server_name:
        options.append(("grpc.ssl_target_name_override", config.tls.server_name))
    return options


def channel_credentials(config: ActorChannelConfig) -> grpc.ChannelCredentials | None:
    """TLS credentials for an actor's channel (None: plaintext)."""
    tls = config.tls
    if not tls.ca:
        return None
    ca = read_file(tls.ca, "--tls.ca")
    key = read_file(tls.key, "--tls.key") if tls.key else None
    cert = read_file(tls.cert, "--tls.cert") if tls.cert else None
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def call_metadata(config: ActorChannelConfig) -> tuple[tuple[str, str], ...] | None:
    """The metadata every actor RPC carries (the bearer token), or None."""
    if not config.auth.token_file:
        return None
    return (("authorization", f"Bearer {read_token(config.auth.token_file)}"),)


def open_channel(target: str, config: ActorChannelConfig, extra_options=()) -> grpc.aio.Channel:
    """An actor's channel to `target`: TLS when a CA is configured, keepalive always."""
    options = channel_options(config) + list(extra_options)
    credentials = channel_credentials(config)
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, credentials, options=options)


def auth_failure(error: grpc.aio.AioRpcError) -> str | None:
    """A one-line reason when `error` is a definite refusal of our credentials
    (token or certificate) rather than a learner that is away; None otherwise."""
    code, details = error.code(), error.details() or ""
    if code in AUTH_FAILURE_CODES:
        return f"{code.name}: {details}"
    if code == grpc.StatusCode.UNAVAILABLE and any(m in details for m in _TLS_FAILURE_MARKERS):
        return (f"UNAUTHENTICATED: the TLS handshake failed (the learner's certificate is not "
                f"signed by --tls.ca or does not name the host dialled): {details}")
    return None


def suspected_refusal(error: grpc.aio.AioRpcError, tls: bool) -> str | None:
    """A one-line reason when the learner closed a new connection at once
    (see SUSPECTED_REFUSALS_IN_A_ROW); None for any other error."""
    details = error.details() or ""
    if error.code() != grpc.StatusCode.UNAVAILABLE or "failed to connect" not in details:
        return None
    if tls and "Secure read failed" in details:
        return ("UNAUTHENTICATED: the learner closes every TLS connection at once; it requires a "
                f"client certificate signed by its CA (--tls.cert/--tls.key): {details}")
    if not tls and details.rstrip().endswith("Socket closed"):
        return ("UNAUTHENTICATED: the learner closes every plaintext connection at once; it "
                f"probably serves TLS (give --tls.ca): {details}")
    return None
