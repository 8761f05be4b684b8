"""seedq.process.grpc_setup: gRPC's poller setting and the event loop (see its docstring)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from seedq.process import grpc_setup

pytestmark = pytest.mark.e2e

# Imports seedq, then grpc; opens a server and a channel on a unix socket so
# that gRPC core parses its settings; prints what the process ended up with.
PROBE = r"""
import asyncio, json, os, sys, tempfile
import seedq
from seedq.process import grpc_setup
import grpc

async def main():
    server = grpc.aio.server()
    path = os.path.join(tempfile.mkdtemp(), "probe.sock")
    server.add_insecure_port("unix:" + path)
    await server.start()
    async with grpc.aio.insecure_channel("unix:" + path) as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
    await server.stop(None)
    return type(asyncio.get_running_loop()).__module__

loop_module = grpc_setup.run(main())
print(json.dumps({"experiments": os.environ.get("GRPC_EXPERIMENTS"), "loop": loop_module}))
"""


def _probe(**env_overrides) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GRPC_EXPERIMENTS", "SEEDQ_GRPC_TUNING")}
    env.update(env_overrides)
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def test_default_uses_the_legacy_poller_and_uvloop_and_grpc_accepts_the_names():
    out, stderr = _probe()
    # A gRPC release that no longer knows one of the names logs "Unknown
    # experiment": re-measure it (docs/benchmarks.md, issue 2) before adding
    # it to MEASURED_GRPC_VERSIONS.
    assert "Unknown experiment" not in stderr, stderr
    if grpc_setup._grpc_version() in grpc_setup.MEASURED_GRPC_VERSIONS:
        assert out["experiments"] == ",".join("-" + n for n in grpc_setup.EVENT_ENGINE_EXPERIMENTS)
    else:
        assert out["experiments"] is None
    pytest.importorskip("uvloop")
    assert out["loop"].startswith("uvloop"), out


def test_tuning_off_keeps_grpc_and_asyncio_defaults():
    out, _ = _probe(SEEDQ_GRPC_TUNING="0")
    assert out == {"experiments": None, "loop": "asyncio.unix_events"}


def test_a_users_grpc_experiments_are_kept():
    out, _ = _probe(GRPC_EXPERIMENTS="-event_engine_dns")
    assert out["experiments"] == "-event_engine_dns"
