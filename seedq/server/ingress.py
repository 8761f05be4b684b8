"""An ingress process: serves actor streams on the learner's TCP port and hands
each decoded step to the learner's process (server.ingress_processes > 1).

Each ingress process runs the real gRPC server of `seedq.server.service`
(credentials, the health service, keepalive and the idle watchdog, the
handshake's checks, decoding and validating every message) on the same port
as the others, with SO_REUSEPORT: the kernel spreads the actors' connections
over them. What needs the learner's state (the env table with its slot
budgets, batching, the acting core and the unroll store) stays in the
learner's process (`seedq.server.ingress_hub`), which this process asks over
a unix socket pair: `DeviceLink` stands in for the `InferenceServer` that the
service calls.

The link carries frames: a header (the body's length and a tag) and a body.
asyncio has no message framing, and `multiprocessing.Connection` blocks the
event loop. The hot pair, one of each per actor message, goes as raw arrays
whose dtypes and shapes both ends take from the run's EnvSpec: a step
(`send_steps`) and the actions that answer it (`send_actions`); a pickle of
a step's five arrays costs several times their copy. The rest (handshakes,
errors, the learner's orders) goes as pickles (protocol 5). A Pong frame
(7 KB) crosses the link as two copies through the kernel; fixed-size
shared-memory slots would save those at the price of hand-written
synchronisation between the processes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import struct

import numpy as np

from seedq.server.env_table import SlotBudgetExhausted
from seedq.server.errors import LearnerFailed, RunEnded, RunSuperseded, ServerClosing
from seedq.wire.codec import ENV_INDEX_DTYPE, REWARD_DTYPE, Steps

log = logging.getLogger("seedq.server")

# Every frame: the body's length, then its tag.
_HEADER = struct.Struct("<IB")
PICKLE, STEPS, ACTIONS = 0, 1, 2
_STEPS = struct.Struct("<QQI")  # request id, env table handle, n
_ACTIONS = struct.Struct("<QQ")  # request id, policy version


def _write(writer: asyncio.StreamWriter, tag: int, parts) -> None:
    """Queues one frame in one write. No drain: each stream has at most one
    request in flight, so what is queued is bounded by the streams served."""
    length = sum(memoryview(part).nbytes for part in parts)
    writer.write(b"".join((_HEADER.pack(length, tag), *parts)))


def send(writer: asyncio.StreamWriter, message: tuple) -> None:
    """Queues a message other than a step or its actions, as a pickle."""
    _write(writer, PICKLE, (pickle.dumps(message, protocol=5),))


def send_steps(writer: asyncio.StreamWriter, request_id: int, handle: int, steps) -> None:
    """Queues one decoded step (`seedq.wire.codec.Steps`, its arrays in the wire's dtypes)."""
    _write(writer, STEPS, (_STEPS.pack(request_id, handle, len(steps.env_indices)),
                           *map(np.ascontiguousarray, (steps.env_indices, steps.rewards, steps.terminated,
                                                      steps.truncated, steps.observations))))


def send_actions(writer: asyncio.StreamWriter, request_id: int, actions: np.ndarray, version: int) -> None:
    """Queues the actions [n, *action_shape] (the spec's action dtype) that answer a step."""
    _write(writer, ACTIONS, (_ACTIONS.pack(request_id, version), np.ascontiguousarray(actions)))


def _steps_message(body: bytes, spec) -> tuple:
    """("steps", request id, handle, Steps), the arrays views of `body`."""
    request_id, handle, n = _STEPS.unpack_from(body)
    offset = _STEPS.size
    arrays = []
    for dtype in (ENV_INDEX_DTYPE, REWARD_DTYPE, np.dtype(bool), np.dtype(bool)):
        arrays.append(np.frombuffer(body, dtype, n, offset))
        offset += n * dtype.itemsize
    observations = np.frombuffer(body, spec.obs_np_dtype, offset=offset).reshape((n, *spec.obs_shape))
    return ("steps", request_id, handle, Steps(*arrays, observations))


def _actions_message(body: bytes, spec) -> tuple:
    """("reply", request id, True, (actions, version)), as a pickled reply reads."""
    request_id, version = _ACTIONS.unpack_from(body)
    actions = np.frombuffer(body, spec.action_dtype, offset=_ACTIONS.size).reshape((-1, *spec.action_shape))
    return ("reply", request_id, True, (actions, version))


async def receive(reader: asyncio.StreamReader, spec) -> tuple:
    """The next message, as a tuple whose first item names its kind;
    asyncio.IncompleteReadError once the peer is gone."""
    length, tag = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    body = await reader.readexactly(length)
    if tag == STEPS:
        return _steps_message(body, spec)
    if tag == ACTIONS:
        return _actions_message(body, spec)
    return pickle.loads(body)


def error_reply(error: BaseException) -> tuple[str, str]:
    """(kind, text) of an error the learner's process answers a request with
    (the exceptions' own pickling would lose RunEnded's stop reason)."""
    if isinstance(error, RunEnded):
        return "run_ended", error.stop_reason
    if isinstance(error, LearnerFailed):
        return "failed", str(error)
    if isinstance(error, ServerClosing):
        return "closing", ""
    if isinstance(error, RunSuperseded):
        return "superseded", ""
    if isinstance(error, SlotBudgetExhausted):
        return "budget", str(error)
    if isinstance(error, ValueError):  # the env table's duplicate-run refusal
        return "refused", str(error)
    return "internal", f"{type(error).__name__}: {error}"


def rebuilt_error(kind: str, text: str) -> Exception:
    """The exception `error_reply` described, as the service's StreamGuard maps it to a status."""
    if kind == "run_ended":
        return RunEnded(text)
    if kind == "failed":
        error = LearnerFailed.__new__(LearnerFailed)
        Exception.__init__(error, text)
        error.cause = None
        return error
    if kind == "closing":
        return ServerClosing()
    if kind == "superseded":
        return RunSuperseded()
    if kind == "budget":
        return SlotBudgetExhausted(text)
    if kind == "refused":
        return ValueError(text)
    return RuntimeError(f"the learner's process failed on this stream's request: {text}")


class RemoteEntry:
    """An actor's registration in the learner's env table, seen from an ingress process."""

    closed = False  # the learner's process answers a superseded entry's steps with RunSuperseded

    def __init__(self, handle: int, actor_id: str, run_id: str, num_envs: int):
        self.handle = handle
        self.actor_id = actor_id
        self.run_id = run_id
        self.num_envs = num_envs


class SupersededRun:
    def __init__(self, run_id: str):
        self.run_id = run_id


class DeviceLink:
    """The `InferenceServer` calls the service makes (connect, submit,
    release), forwarded to the learner's process."""

    def __init__(self, writer: asyncio.StreamWriter):
        self._writer = writer
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future] = {}
        self._closed: Exception | None = None

    async def _request(self, send_request):
        """`send_request(request_id)` queues the request; resolves to its answer."""
        if self._closed is not None:
            raise self._closed
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        send_request(request_id)
        try:
            return await future
        finally:
            self._waiting.pop(request_id, None)

    async def connect(self, actor_id: str, run_id: str, num_envs: int):
        handle, superseded_run = await self._request(
            lambda request_id: send(self._writer, ("connect", request_id, actor_id, run_id, num_envs)))
        superseded = SupersededRun(superseded_run) if superseded_run is not None else None
        return RemoteEntry(handle, actor_id, run_id, num_envs), superseded

    async def submit(self, entry: RemoteEntry, steps):
        return await self._request(lambda request_id: send_steps(self._writer, request_id, entry.handle, steps))

    def release(self, entry: RemoteEntry) -> None:
        if self._closed is None:
            send(self._writer, ("release", entry.handle))

    def answer(self, request_id: int, ok: bool, value) -> None:
        future = self._waiting.get(request_id)
        if future is None or future.done():
            return  # its stream ended while it waited
        if ok:
            future.set_result(value)
        else:
            future.set_exception(rebuilt_error(*value))

    def close(self, error: Exception) -> None:
        """Fails every waiting and later request with `error` (the learner's process is gone)."""
        self._closed = error
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(error)


def serve(index: int, config, address: str, learner_run: str, spec, sock) -> None:
    """An ingress process's main: serves `address` until the learner's process
    says stop or is gone (`sock`: its end of the link)."""
    from seedq.process import grpc_setup

    logging.basicConfig(level=logging.WARNING, format=f"ingress {index}: %(levelname)s %(message)s")
    grpc_setup.run(_serve(config, address, learner_run, spec, sock))


async def _serve(config, address: str, learner_run: str, spec, sock) -> None:
    from seedq.server.service import LearnerService, start_server

    reader, writer = await asyncio.open_unix_connection(sock=sock)
    link = DeviceLink(writer)
    service = LearnerService(link, learner_run, config.server.max_envs_per_actor,
                             config.server.peer_timeout_seconds, spec=spec, env_id=config.env)
    try:
        server, bound, set_serving = await start_server(
            service, address, server_config=config.server, tls=config.tls, auth=config.auth, reuse_port=True)
    except OSError as e:
        send(writer, ("failed", str(e)))
        await writer.drain()
        return
    send(writer, ("ready", bound))
    try:
        await _follow(reader, spec, link, service, set_serving)
    finally:
        service.idle.close()
        await server.stop(grace=1.0)
        writer.close()


async def _follow(reader, spec, link: DeviceLink, service, set_serving) -> None:
    """Answers requests and follows the learner's process's orders until it says stop or is gone."""
    while True:
        try:
            message = await receive(reader, spec)
        except (asyncio.IncompleteReadError, ConnectionError):
            link.close(ServerClosing())
            return
        kind = message[0]
        if kind == "reply":
            link.answer(*message[1:])
        elif kind == "serving":
            await set_serving(True)
        elif kind == "stopping":  # the learner stops: the run's end (if over) is told to the streams
            service.run_ended = message[1]
            await set_serving(False, run_ended=bool(message[1]))
        elif kind == "stop":
            link.close(ServerClosing())
            return
