"""Two machines on one host (issue 14): the learner and two actors in separate
Linux network namespaces joined by a veth pair, over TCP with mutual TLS and
a token. The run trains to its frame budget; in the middle of it the veth
link goes down (no FIN reaches anyone, as with a preempted VM) and comes
back: the learner frees the actors' slots by keepalive, and the actors
reconnect by themselves and train on."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from seedq.transport import certs as certs_lib
from seedq.local import stop_processes

pytestmark = pytest.mark.e2e

LEARNER_IP = "10.231.7.1"
ACTOR_IP = "10.231.7.2"
PORT = 50051
# Short dead-peer settings so the outage fits a lean test (defaults: 10 s / 30 s).
KEEPALIVE = ["1", "3"]  # keepalive seconds, peer timeout seconds
PEER_TIMEOUT = float(KEEPALIVE[1])
# The run's budget: the outage comes after 30k frames (a few progress lines
# later at most), so the actors train on for >100k frames once back.
MAX_FRAMES = 150_000


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)


@pytest.fixture
def namespaces():
    """(learner namespace, actor namespace, actor-side device); removed afterwards."""
    if sys.platform != "linux" or shutil.which("ip") is None:
        pytest.skip("network namespaces need Linux and iproute2's `ip`")
    tag = uuid.uuid4().hex[:6]
    learner_ns, actor_ns = f"seedq-l-{tag}", f"seedq-a-{tag}"
    learner_dev, actor_dev = f"sqL{tag}", f"sqA{tag}"  # at most 15 characters
    steps = [
        ("netns", "add", learner_ns),
        ("netns", "add", actor_ns),
        ("link", "add", learner_dev, "netns", learner_ns, "type", "veth", "peer", "name", actor_dev,
         "netns", actor_ns),
        ("-n", learner_ns, "addr", "add", f"{LEARNER_IP}/24", "dev", learner_dev),
        ("-n", actor_ns, "addr", "add", f"{ACTOR_IP}/24", "dev", actor_dev),
        ("-n", learner_ns, "link", "set", learner_dev, "up"),
        ("-n", actor_ns, "link", "set", actor_dev, "up"),
        ("-n", learner_ns, "link", "set", "lo", "up"),
        ("-n", actor_ns, "link", "set", "lo", "up"),
    ]
    try:
        for step in steps:
            result = _ip(*step)
            if result.returncode != 0:
                pytest.skip(f"cannot make network namespaces here (`ip {' '.join(step)}`: "
                            f"{result.stderr.strip()})")
        yield learner_ns, actor_ns, actor_dev
    finally:
        for ns in (learner_ns, actor_ns):  # deleting a namespace deletes its veth end
            _ip("netns", "del", ns)


def _progress(log) -> tuple[int, int]:
    """(frames, connected actors) of the learner's newest progress line."""
    text = log.read_text() if log.exists() else ""
    # The line writes frames as 94,112 below 100k, then 150k, 12.3M (seedq.reporting.sinks.short_count).
    lines = re.findall(r"\] ([\d,.]+)([kMG]?) fr .*?\| (\d+) actors", text)
    if not lines:
        return 0, 0
    number, unit, actors = lines[-1]
    return int(float(number.replace(",", "")) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}[unit]), int(actors)


def _wait(predicate, timeout: float, what: str, learner, log) -> float:
    """Seconds until `predicate()`; fails with the learner's log after `timeout`."""
    started = time.monotonic()
    while not predicate():
        if learner.poll() is not None:
            raise AssertionError(f"learner exited ({learner.returncode}) waiting for {what}:\n{log.read_text()}")
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()}")
        time.sleep(0.1)
    return time.monotonic() - started


def test_two_namespaces_tls_token_link_outage_and_training_on(namespaces, tmp_path):
    learner_ns, actor_ns, actor_dev = namespaces
    pki = certs_lib.make(str(tmp_path / "pki"), hosts=(LEARNER_IP,))
    token = ["--auth.token-file", pki["token"]]
    run, log = tmp_path / "run", tmp_path / "learner.log"
    python = [sys.executable, "-m", "seedq.cli"]
    learner = subprocess.Popen(
        ["ip", "netns", "exec", learner_ns, *python, "learner", "--address", f"{LEARNER_IP}:{PORT}",
         "--logdir", str(run), "--tls.cert", pki["server.pem"], "--tls.key", pki["server-key.pem"],
         "--tls.client-ca", pki["ca.pem"], *token, "--server.keepalive-seconds", KEEPALIVE[0],
         "--server.peer-timeout-seconds", KEEPALIVE[1], "--min-actors", "2",
         "--max-frames", str(MAX_FRAMES), "--max-seconds", "0", "--target-return", "none",
         "--eval-episodes", "0",
         "--log-every-seconds", "0.25"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT,
    )
    actors = [
        subprocess.Popen(
            ["ip", "netns", "exec", actor_ns, *python, "actor", "--server", f"{LEARNER_IP}:{PORT}",
             "--env", "CartPole-v1", "--num-envs", "32", "--actor-id", f"remote-{i}",
             "--tls.ca", pki["ca.pem"], "--tls.cert", pki["client.pem"], "--tls.key", pki["client-key.pem"],
             *token, "--keepalive-seconds", KEEPALIVE[0], "--peer-timeout-seconds", KEEPALIVE[1],
             "--stats-file", str(tmp_path / f"actor-{i}.json")],
            stdout=open(tmp_path / f"actor-{i}.log", "w"), stderr=subprocess.STDOUT,
        )
        for i in range(2)
    ]
    try:
        _wait(lambda: _progress(log)[0] > 30_000 and _progress(log)[1] == 2, 120,
              "both actors training", learner, log)

        # The cable is pulled: nothing tells the learner, keepalive has to find out.
        assert _ip("-n", actor_ns, "link", "set", actor_dev, "down").returncode == 0
        freed_after = _wait(lambda: _progress(log)[1] == 0, 3 * PEER_TIMEOUT,
                            "the learner to free the vanished actors' slots", learner, log)
        frames_down = _progress(log)[0]
        print(f"slots freed {freed_after:.1f}s after the link went down (peer timeout {PEER_TIMEOUT}s)")

        assert _ip("-n", actor_ns, "link", "set", actor_dev, "up").returncode == 0
        back_after = _wait(lambda: _progress(log)[1] == 2 and _progress(log)[0] > frames_down, 60,
                           "the actors to reconnect and train", learner, log)
        print(f"actors back and training {back_after:.1f}s after the link came up")
        assert all(a.poll() is None for a in actors)  # the same processes: reconnected by themselves

        learner.wait(timeout=300)
    finally:
        stop_processes([learner, *actors], timeout=30)
    assert learner.returncode == 0, log.read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "max_frames" and summary["frames"] >= MAX_FRAMES > frames_down, summary
    stats = [json.loads((tmp_path / f"actor-{i}.json").read_text()) for i in range(2)]
    assert all(s["connections"] >= 2 for s in stats), stats
    assert os.path.isdir(summary["checkpoint"])
