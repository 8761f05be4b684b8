"""The learner's server thread: an asyncio loop running the gRPC server and
the dynamic batcher (all per-env state lives on it)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Callable

from seedq.process import grpc_setup
from seedq.config import TrainConfig
from seedq.server.inference import InferenceServer
from seedq.server.service import start_server

log = logging.getLogger("seedq.server")


class ServerThread:
    """Serves `make_service()` on `address` from a thread of its own until `stop`."""

    def __init__(self, make_service: Callable, inference: InferenceServer, address: str, config: TrainConfig):
        self._make_service = make_service
        self._inference = inference
        self._requested_address = address
        self._config = config
        self.address: str | None = None
        self.thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._run_ended: str | None = None
        self._run_end_least_seconds = 0.0
        self._service = None
        # server.ingress_processes > 1: the ingress processes' hub (seedq.server.ingress_hub).
        self.hub = None

    def start(self) -> str:
        """Starts the thread; returns the address once serving (the start-up's error, raised, otherwise)."""
        self.thread = threading.Thread(target=self._serve, name="seedq-server", daemon=True)
        self.thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self.address

    def stop(self, run_ended: str | None = None, least_seconds: float = 0.0) -> None:
        """Asks the server to stop (the caller joins `thread`); with `run_ended`
        (a stop reason), telling the actors that the run is over first, serving
        at least `least_seconds` for those reconnecting meanwhile."""
        self.mark_run_ended(run_ended)
        self._run_end_least_seconds = least_seconds
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._shutdown_event.set)

    def mark_run_ended(self, run_ended: str | None) -> None:
        """Records that the run is over (before the learner's queue closes, so
        that a stream ended by the closing queue already tells its actor)."""
        self._run_ended = run_ended
        if run_ended and self._service is not None:
            self._service.run_ended = run_ended

    def cpu_seconds(self) -> float | None:
        """CPU seconds the thread (gRPC, batching, inference) has used so far;
        None before start() or where the OS has no per-thread CPU clock."""
        thread = self.thread
        if thread is None or not thread.is_alive():
            return None
        # Linux: the thread's own /proc entry, which fails cleanly once the
        # thread is gone. A clock id of an ended (detached) thread's pthread
        # handle is undefined behaviour: the stats reader runs until the end
        # of a run, and that crashed a process that read it during shutdown.
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        except (OSError, ValueError, IndexError):
            pass
        if not hasattr(time, "pthread_getcpuclockid") or thread.ident is None:
            return None
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except OSError:  # the thread has ended
            return None

    def _batcher_ended(self, task: asyncio.Task) -> None:
        """The batch loop runs until cancelled: ending any other way is a
        failure, which stops the learner (stop_reason learner_error) rather
        than leaving every stream waiting for a batch that never comes."""
        if task.cancelled():
            return
        error = task.exception() or RuntimeError("the inference batch loop ended")
        log.error("the inference batch loop failed; the learner stops", exc_info=error)
        self._inference.fail(error)

    def _serve(self) -> None:
        grpc_setup.run(self._serve_async())

    async def _serve_async(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._shutdown_event = asyncio.Event()
        service = self._service = self._make_service()
        try:
            if self._config.server.ingress_processes > 1:
                serving, open_streams, stop_front = await self._start_ingress_hub(service)
            else:
                serving, open_streams, stop_front = await self._start_grpc_server(service)
        except BaseException as e:  # reported to start()
            self._error = e
            self._ready.set()
            return
        batcher = asyncio.create_task(self._inference.run())
        batcher.add_done_callback(self._batcher_ended)
        await serving(True)
        self._ready.set()
        try:
            await self._shutdown_event.wait()
        finally:
            run_ended = self._run_ended
            await serving(False, run_ended)
            # Answer every waiting stream with UNAVAILABLE (actors reconnect
            # or exit), or with the run's end, before the server stops taking messages.
            self._inference.close(run_ended)
            if run_ended:
                await wait_for_streams_to_end(open_streams, RUN_END_NOTICE_SECONDS, self._run_end_least_seconds)
            await stop_front()
            batcher.cancel()

    async def _start_grpc_server(self, service):
        """Serves the actors' streams from this thread's gRPC server: its
        `serving(on, run_ended)`, open-stream count and stop."""
        server, self.address, set_serving = await start_server(
            service, self._requested_address, server_config=self._config.server,
            tls=self._config.tls, auth=self._config.auth,
        )

        async def serving(on: bool, run_ended: str | None = None) -> None:
            if not on:
                service.run_ended = run_ended
            await set_serving(on, run_ended=bool(run_ended))

        async def stop() -> None:
            service.idle.close()
            await server.stop(grace=1.0)

        return serving, lambda: service.idle.open_streams, stop

    async def _start_ingress_hub(self, service):
        """Serves the actors' streams from ingress processes (server.ingress_processes
        > 1) through their hub: its `serving(on, run_ended)`, open-stream count and stop."""
        from seedq.server.ingress_hub import IngressHub
        from seedq.server.service import LearnerService

        if type(service) is not LearnerService:
            raise ValueError("server.ingress_processes > 1 serves architecture=seed learners only")
        hub = self.hub = IngressHub(self._inference, self._config, service.learner_run, service.spec)
        self.address = await hub.start(self._requested_address)
        return hub.set_serving, lambda: hub.open_streams, hub.stop


# How long a learner whose run is over keeps serving so that every connected
# actor hears so at its next step (an actor's step is milliseconds; an actor
# still starting or between reconnects gets the notice if it comes in time).
RUN_END_NOTICE_SECONDS = 5.0
# What a learner serving remote actors keeps serving at least: actors between
# two reconnects (seedq's retry at most every second) hear it too, e.g. of a
# resumed run whose restored return window already meets its target.
RUN_END_RECONNECT_SECONDS = 2.5


async def wait_for_streams_to_end(open_streams: Callable[[], int], timeout: float, least: float = 0.0) -> None:
    """Until no actor stream is open (and `least` seconds have passed), or `timeout` seconds."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while loop.time() < start + timeout and (open_streams() or loop.time() < start + least):
        await asyncio.sleep(0.05)
