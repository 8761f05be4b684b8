"""A user-space TCP proxy that delays each direction by a fixed time: a
network between hosts, emulated on one machine.

Every byte read from one side is written to the other `one_way_ms` later
(round trip: twice that), in order, without holding back the bytes read
meanwhile: the delay adds latency, not a bandwidth cap, as a long link does.
Kernels without netem (`tc qdisc ... netem`) cannot emulate this below user
space; no maintained Python package delays a TCP stream (toxiproxy is a Go
server of its own), so this is written by hand on asyncio streams.

`DelayProxy` runs in a thread of the caller's process (tests); benchmarks
run `start_process`, so that its CPU is not the learner's.
"""

from __future__ import annotations

import asyncio
import collections
import multiprocessing
import threading

# Bytes read per chunk: one HTTP/2 frame of a large message or many small ones.
READ_BYTES = 1 << 16
# Bytes held per direction before the proxy stops reading (TCP's flow
# control then holds the sender back, as a full link would).
MAX_HELD_BYTES = 64 << 20


async def _delayed_pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copies `reader` to `writer`, each chunk `delay` seconds after it was read."""
    loop = asyncio.get_running_loop()
    chunks: collections.deque[tuple[float, bytes]] = collections.deque()
    ready, room = asyncio.Event(), asyncio.Event()
    held = [0]

    async def deliver() -> None:
        while True:
            while not chunks:
                ready.clear()
                await ready.wait()
            due, data = chunks.popleft()
            held[0] -= len(data)
            room.set()
            if not data:  # the reading side closed: close ours once its bytes are out
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    delivering = asyncio.create_task(deliver())
    try:
        while True:
            while held[0] > MAX_HELD_BYTES:
                room.clear()
                await room.wait()
            data = await reader.read(READ_BYTES)
            held[0] += len(data)
            chunks.append((loop.time() + delay, data))
            ready.set()
            if not data:
                break
        await delivering
    except (ConnectionError, OSError):
        pass
    finally:
        delivering.cancel()
        writer.close()


class DelayProxy:
    """Listens on `listen_host`:port (0: any free port) and forwards every
    connection to `target` ("host:port"), each direction delayed by
    `one_way_ms` milliseconds. `start()` returns the address to dial."""

    def __init__(self, target: str, one_way_ms: float, listen_host: str = "127.0.0.1", port: int = 0):
        if one_way_ms < 0:
            raise ValueError(f"one_way_ms: {one_way_ms} is negative")
        self.target_host, _, target_port = target.rpartition(":")
        self.target_port = int(target_port)
        self.delay = one_way_ms / 1000.0
        self.listen_host = listen_host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()

    async def _handle(self, client_reader, client_writer) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            _delayed_pipe(client_reader, upstream_writer, self.delay),
            _delayed_pipe(upstream_reader, client_writer, self.delay),
        )

    async def serve(self, on_ready=None) -> None:
        """Serves until `stop()`; `on_ready(address)` once listening."""
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        server = await asyncio.start_server(self._handle, self.listen_host, self.port)
        self.port = server.sockets[0].getsockname()[1]
        if on_ready is not None:
            on_ready(self.address)
        async with server:
            await self._stopped.wait()

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.port}"

    def start(self) -> str:
        """Serves from a daemon thread; returns the address to dial."""
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self.serve(lambda _: self._ready.set())), name="seedq-delay-proxy",
            daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise OSError(f"delay proxy to {self.target_host}:{self.target_port} did not start")
        return self.address

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(timeout=5)


def _proxy_process(target: str, one_way_ms: float, addresses) -> None:
    proxy = DelayProxy(target, one_way_ms)
    asyncio.run(proxy.serve(addresses.put))


def start_process(target: str, one_way_ms: float, timeout: float = 30.0):
    """A DelayProxy in a process of its own; returns (process, address to dial).
    Stop it with process.terminate()."""
    ctx = multiprocessing.get_context("spawn")
    addresses = ctx.Queue()
    process = ctx.Process(target=_proxy_process, args=(target, one_way_ms, addresses), daemon=True)
    process.start()
    return process, addresses.get(timeout=timeout)
