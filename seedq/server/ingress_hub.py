"""The learner's side of server.ingress_processes > 1: starts the ingress
processes (`seedq.server.ingress`) on the learner's TCP port and serves their
requests on the server thread's event loop: handshakes into the env table
(its slot budgets), steps into the batching `InferenceServer`, actions back.

An ingress process that ends while the learner serves is a learner failure
(stop reason learner_error), as a failed inference batch is: its actors'
streams are gone with it, and the kernel would keep sending new connections
to the others only, so the run would go on at a fraction of its ingress
without saying so.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import socket
import time

from seedq.server import ingress
from seedq.server.errors import ServerClosing
from seedq.wire.codec import Steps

log = logging.getLogger("seedq.server")

# How long an ingress process may take to start serving (it imports gRPC and
# seedq's server modules, and loads the TLS files).
START_SECONDS = 120.0


def reserve_port(address: str) -> tuple[socket.socket, str]:
    """A bound (not listening) SO_REUSEPORT socket on `address`'s host and port
    (a free one for port 0), held while the ingress processes bind the same
    port; returns it and the address with the port filled in."""
    host, port = address.rsplit(":", 1)
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host.strip("[]") or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        reserved = socket.socket(family, kind, proto)
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        reserved.bind(sockaddr)
    except (OSError, ValueError) as e:
        raise OSError(f"could not listen on {address} ({e})") from None
    return reserved, f"{host}:{reserved.getsockname()[1]}"


class IngressHub:
    """Serves `processes` ingress processes' requests from `inference`."""

    def __init__(self, inference, config, learner_run: str, spec):
        self._inference = inference
        self._config = config
        self._learner_run = learner_run
        self._spec = spec
        self.processes: list[multiprocessing.Process] = []
        # Env steps answered per ingress process (the bench's per-process share).
        self.frames: list[int] = []
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: list[asyncio.Task] = []
        self._open: dict[int, dict] = {}  # per process: handle -> env table entry
        self._stopping = False

    @property
    def open_streams(self) -> int:
        return sum(len(entries) for entries in self._open.values())

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    async def start(self, address: str) -> str:
        """Starts every ingress process serving `address`; returns the address actors dial."""
        count = self._config.server.ingress_processes
        self._config.server.check_address(address)
        reserved, address = reserve_port(address)
        ctx = multiprocessing.get_context("spawn")  # never fork a process that imported JAX
        links = []
        try:
            for index in range(count):
                mine, theirs = socket.socketpair()
                process = ctx.Process(
                    target=ingress.serve, name=f"seedq-ingress-{index}", daemon=True,
                    args=(index, self._config, address, self._learner_run, self._spec, theirs))
                process.start()
                theirs.close()
                self.processes.append(process)
                links.append(await asyncio.open_unix_connection(sock=mine))
            for index, (reader, _) in enumerate(links):
                await self._wait_ready(index, reader)
        except BaseException:
            self.kill()
            raise
        finally:
            reserved.close()
        self.frames = [0] * count
        for index, (reader, writer) in enumerate(links):
            self._writers.append(writer)
            self._open[index] = {}
            self._tasks.append(asyncio.create_task(self._serve(index, reader, writer)))
        return address

    async def _wait_ready(self, index: int, reader) -> None:
        try:
            message = await asyncio.wait_for(ingress.receive(reader, self._spec), START_SECONDS)
        except (asyncio.IncompleteReadError, ConnectionError):
            raise RuntimeError(f"ingress process {index} ended while starting "
                               f"(exit code {self._exit_code(index)})") from None
        except asyncio.TimeoutError:
            raise RuntimeError(f"ingress process {index} did not start serving within {START_SECONDS:g}s") from None
        if message[0] == "failed":
            raise OSError(message[1])

    def _exit_code(self, index: int):
        process = self.processes[index]
        process.join(timeout=1)  # its link is closed: it has ended or is ending
        return process.exitcode

    def _broadcast(self, message: tuple) -> None:
        for writer in self._writers:
            if not writer.is_closing():
                ingress.send(writer, message)

    async def set_serving(self, serving: bool, run_ended: str | None = None) -> None:
        """The health status every ingress process reports; stopping (with the
        run's stop reason when it is over) is told to every stream they serve."""
        if not serving:
            self._stopping = True
        self._broadcast(("serving", True) if serving else ("stopping", run_ended))

    async def stop(self, grace_seconds: float = 5.0) -> None:
        """Stops every ingress process (after `set_serving(False)`)."""
        self._stopping = True
        self._broadcast(("stop",))
        deadline = time.monotonic() + grace_seconds
        while any(p.is_alive() for p in self.processes) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.kill()
        for task in self._tasks:
            task.cancel()

    def kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=5)

    async def _serve(self, index: int, reader, writer) -> None:
        entries = self._open[index]
        try:
            while True:
                message = await ingress.receive(reader, self._spec)
                kind = message[0]
                if kind == "steps":
                    self._take_steps(index, writer, entries, *message[1:])
                elif kind == "connect":
                    self._connect(writer, entries, *message[1:])
                elif kind == "release":
                    entry = entries.pop(message[1], None)
                    if entry is not None:
                        self._inference.release(entry)
        except (asyncio.IncompleteReadError, ConnectionError):
            if not self._stopping:
                self._ended(index)
        finally:
            for entry in entries.values():
                self._inference.release(entry)
            entries.clear()

    def _ended(self, index: int) -> None:
        error = RuntimeError(f"ingress process {index} (pid {self.processes[index].pid}) ended with exit code "
                             f"{self._exit_code(index)} while serving")
        log.error("%s; the learner stops", error)
        self._inference.fail(error)

    def _connect(self, writer, entries: dict, request_id: int, actor_id: str, run_id: str, num_envs: int) -> None:
        try:
            entry, superseded = self._inference.connect(actor_id, run_id, num_envs)
        except Exception as e:  # noqa: BLE001 - answered to the stream, as the service would
            ingress.send(writer, ("reply", request_id, False, ingress.error_reply(e)))
            return
        handle = id(entry)
        entries[handle] = entry
        ingress.send(writer, ("reply", request_id, True,
                              (handle, superseded.run_id if superseded is not None else None)))

    def _take_steps(self, index: int, writer, entries: dict, request_id: int, handle: int, steps: Steps) -> None:
        """Queues a step for the batcher; its future's callback answers it."""
        entry = entries.get(handle)
        try:
            if entry is None or entry.closed:
                raise ingress.RunSuperseded()
            future = self._inference.enqueue(entry, steps)
        except Exception as e:  # noqa: BLE001 - answered to the stream, as the service would
            self._answer_error(writer, request_id, e)
            return
        future.add_done_callback(functools.partial(self._answer_steps, index, writer, request_id, len(steps)))

    def _answer_steps(self, index: int, writer, request_id: int, num_steps: int, future: asyncio.Future) -> None:
        error = ServerClosing() if future.cancelled() else future.exception()
        if error is not None:
            self._answer_error(writer, request_id, error)
            return
        actions, version = future.result()
        self.frames[index] += num_steps
        if not writer.is_closing():
            ingress.send_actions(writer, request_id, actions, version)

    def _answer_error(self, writer, request_id: int, error: BaseException) -> None:
        if not writer.is_closing():
            ingress.send(writer, ("reply", request_id, False, ingress.error_reply(error)))
