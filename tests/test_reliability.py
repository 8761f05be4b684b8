"""Reliability under faults: a short chaos soak of real learner and actor
processes (`seedq bench soak`), and R2D2's replay carried through a
checkpoint into the first update of a resumed learner."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from seedq.bench.drain import drain_unrolls
from seedq.config import R2D2Config, TrainConfig
from seedq import checkpoint
from seedq import schema
from seedq.learner.learner import Learner
from seedq.reporting.reporter import RunReporter

# --- the soak (docs/reliability.md has the 300 s figures) ---


@pytest.mark.e2e
def test_soak_with_actor_kills_and_a_learner_kill(tmp_path):
    """20 s of training while an actor is SIGKILLed every 3 s and the learner
    once (resumed from its checkpoint; the soak waits for the resumed learner's first step). Timing figures are the benchmark's
    business; here: the faults happened and nothing leaked or went backwards."""
    result = subprocess.run(
        [sys.executable, "-m", "seedq.cli", "bench", "soak", "--seconds", "20", "--kill-every", "3",
         "--kill-learner-at", "8", "--checkpoint-every-seconds", "3", "--workdir", str(tmp_path),
         "--json"],
        capture_output=True, text=True, timeout=480,  # the resumed learner may start up for 300 s
    )
    assert result.returncode == 0, result.stdout + result.stderr
    r = json.loads(result.stdout)
    assert r["actor_kills"] >= 2 and r["learner_kills"] == 1, r
    assert r["orphan_env_entries"] == 0, r["orphans"]
    assert r["counters_monotonic"], r["counter_violations"]
    # The surviving actor processes found the resumed learner by themselves.
    assert r["actors_reconnected_by_themselves"], r
    assert r["resumed_from_train_step"] > 0 and r["train_steps"] > r["resumed_from_train_step"]
    # Killed actors' partial unrolls were dropped and counted; the learner's last
    # frames before its kill were beyond its checkpoint.
    assert r["frames_dropped"] > 0 and r["frames_lost_to_learner_restart"] > 0, r
    # The resumed learner wrote stats.json from its own process, with the actors it serves.
    stats = json.loads((tmp_path / "run" / "stats.json").read_text())
    assert stats["segment"] == 2 and stats["resumed_from"] == r["resumed_from"]
    assert "Traceback" not in "".join(p.read_text() for p in tmp_path.glob("learner-*.log"))


@pytest.mark.unit
def test_monotonic_check_catches_a_counter_going_back_and_a_resume_below_its_checkpoint():
    from seedq.bench.soak import COUNTERS, MonotonicCheck

    def sample(pid, value, **overrides):
        return {"pid": pid, **{k: value for k in COUNTERS}, **overrides}

    check = MonotonicCheck()
    for value in (1, 5, 5, 9):
        check.add(sample(10, value))
    check.resumed(sample(None, 5))  # the checkpoint the next process resumed from
    check.add(sample(11, 5))
    check.add(sample(11, 7))
    assert check.ok, check.violations
    check.add(sample(11, 8, episodes=6))  # episodes went back within one process
    assert not check.ok and check.violations == ["episodes 7 -> 6 (pid 11)"]

    below = MonotonicCheck()
    below.resumed(sample(None, 100))
    below.add(sample(12, 99))  # a resumed learner starting below its checkpoint
    assert not below.ok and len(below.violations) == len(COUNTERS)


# --- R2D2 replay in checkpoints ---

MARKER = 1000.0  # obs of sequence i are MARKER + i: a sampled sequence names its origin


def _r2d2_config(logdir, **r2d2) -> TrainConfig:
    small = dict(replay_capacity=64, min_replay_size=16, batch_size=8, replay_ratio=4.0)
    return TrainConfig(
        agent="r2d2", env="CartPole-v1", num_actors=1, envs_per_actor=4, logdir=str(logdir),
        eval_episodes=0, checkpoint_every_seconds=0, stats_every_seconds=0, r2d2=R2D2Config(**{**small, **r2d2}),
    )


def _marked_sequences(learner: Learner, first: int, count: int) -> dict[str, np.ndarray]:
    """`count` sequences shaped like the server's, obs filled with MARKER + index."""
    fields = schema.stored_sequence_shapes(learner.agent, learner.spec)
    chunk = {name: np.zeros((count, *f.shape), f.dtype) for name, f in fields.items()}
    chunk["obs"][:] = (MARKER + first + np.arange(count, dtype=np.float32))[:, None, None]
    return chunk


def _fill(learner: Learner, count: int) -> dict:
    """Puts `count` marked sequences through the learner's own queue and batch
    source (insert, one sample, new priorities), as training would."""
    learner.queue.put(_marked_sequences(learner, 0, count))
    source = learner.batches
    batch = source.next_batch(threading.Event())
    rng = np.random.default_rng(1)
    source.after_update(batch, {"priorities": rng.uniform(0.1, 5.0, len(batch["indices"]))})
    return batch


def _save(config: TrainConfig, learner: Learner, train_steps: int, *, final: bool) -> str:
    learner.train_steps = train_steps
    reporter = RunReporter(config, learner, time.monotonic(), quiet=True)
    path = reporter.checkpoint(final=final)
    reporter.close()
    return path


@pytest.mark.e2e
def test_replay_is_saved_with_the_newest_checkpoint_only(tmp_path):
    config = _r2d2_config(tmp_path / "run")
    learner = Learner(config, "unix:unused")
    _fill(learner, 40)
    old = _save(config, learner, 1, final=False)
    new = _save(config, learner, 2, final=True)
    assert not os.path.exists(os.path.join(old, checkpoint.REPLAY_ITEM))
    assert os.path.isdir(os.path.join(new, checkpoint.REPLAY_ITEM))
    # The older checkpoint keeps its parameters: it still restores (without a replay).
    snapshot, step_dir = checkpoint.restore(old, learner.state, learner.inference.rng, with_replay=True)
    assert step_dir == old and snapshot.replay is None and snapshot.step == 1


@pytest.mark.e2e
def test_resumed_r2d2_learner_samples_its_first_update_from_the_restored_replay(tmp_path):
    config = _r2d2_config(tmp_path / "run")
    saved = Learner(config, "unix:unused")
    _fill(saved, 40)
    _save(config, saved, 5, final=True)
    saved_arrays, saved_scalars = saved.batches.replay.state_dict()
    # What the saved learner would sample next (its RNG and sum tree continue).
    expected = saved.batches.next_batch(threading.Event())

    resumed = Learner(config, f"unix:{tmp_path}/learner.sock")
    snapshot, _ = checkpoint.restore(
        str(tmp_path / "run"), resumed.state, resumed.inference.rng, with_replay=True
    )
    resumed.restore(snapshot)
    arrays, scalars = resumed.batches.replay.state_dict()
    assert scalars == saved_scalars
    for got, want in zip(arrays["data"], saved_arrays["data"]):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(arrays["priority"], saved_arrays["priority"])

    # The resumed learner trains with no actor connected at all: its first
    # update can only come from the restored sequences.
    first_batches = []
    next_batch = resumed.batches.next_batch

    def recording_next_batch(stop):
        batch = next_batch(stop)
        if batch is not None:
            first_batches.append(batch)
        return batch

    resumed.batches.next_batch = recording_next_batch
    resumed.start()
    try:
        deadline = time.monotonic() + 120
        while resumed.train_steps <= 5 and resumed.error is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        resumed.stop()
    assert resumed.error is None and resumed.train_steps > 5, resumed.error
    assert resumed.table.frames == snapshot.counters["frames"]  # no actor ever sent a step
    first = first_batches[0]
    np.testing.assert_array_equal(first["indices"], expected["indices"])
    np.testing.assert_array_equal(first["obs"], expected["obs"])
    markers = first["obs"][:, 0, 0] - MARKER
    assert set(markers.astype(int)) <= set(range(40))


@pytest.mark.e2e
def test_replay_that_does_not_fit_the_config_is_refused_in_one_line(tmp_path):
    config = _r2d2_config(tmp_path / "run")
    learner = Learner(config, "unix:unused")
    _fill(learner, 20)
    _save(config, learner, 3, final=True)
    other = Learner(dataclasses.replace(config, r2d2=dataclasses.replace(config.r2d2, replay_capacity=128)),
                    "unix:unused")
    snapshot, _ = checkpoint.restore(config.logdir, other.state, other.inference.rng, with_replay=True)
    with pytest.raises(checkpoint.CheckpointError) as err:
        other.restore(snapshot)
    message = str(err.value)
    assert "\n" not in message and "replay capacity is 64 in the checkpoint, 128 in this config" in message
    assert "--r2d2.checkpoint-replay false" in message


@pytest.mark.e2e
def test_a_checkpoint_before_the_first_sequence_has_no_replay(tmp_path):
    config = _r2d2_config(tmp_path / "run")
    learner = Learner(config, "unix:unused")
    path = _save(config, learner, 0, final=True)  # the learner's first periodic checkpoint
    assert not os.path.exists(os.path.join(path, checkpoint.REPLAY_ITEM))
    snapshot, _ = checkpoint.restore(path, learner.state, learner.inference.rng, with_replay=True)
    assert snapshot.replay is None


@pytest.mark.e2e
def test_checkpoint_replay_false_saves_no_replay(tmp_path):
    config = _r2d2_config(tmp_path / "run", checkpoint_replay=False)
    learner = Learner(config, "unix:unused")
    _fill(learner, 20)
    path = _save(config, learner, 3, final=True)
    assert not os.path.exists(os.path.join(path, checkpoint.REPLAY_ITEM))
    meta, _ = checkpoint.read_meta(path)
    assert "replay" not in meta


# --- a silent actor's stream ---


@pytest.mark.e2e
def test_a_stream_closed_for_silence_tells_its_actor_unavailable():
    """The learner's idle watchdog closes the stream of an actor that sent
    nothing for server.peer_timeout_seconds while its connection stayed up (a
    process whose Python thread is stuck while gRPC's threads still answer
    keepalive pings; or a whole host paused and resumed). The actor must be
    told, with a status it reconnects on: gRPC sends none for a cancelled
    handler, and an actor left waiting on its read never comes back."""
    import asyncio
    import uuid

    import grpc

    from seedq.config import ServerConfig
    from seedq.envs import env_spec
    from seedq.local import default_address
    from seedq.v1 import seed_pb2_grpc
    from seedq.wire import codec

    config = TrainConfig(env="CartPole-v1", num_actors=1, envs_per_actor=4,
                         server=ServerConfig(keepalive_seconds=1.0, peer_timeout_seconds=2.0))
    config.validate()
    learner = Learner(config, default_address())
    learner.start(consume=drain_unrolls)
    spec = env_spec("CartPole-v1")

    async def silent_actor():
        async with grpc.aio.insecure_channel(learner.address) as channel:
            call = seed_pb2_grpc.LearnerStub(channel).Stream()
            await call.write(codec.encode_handshake(spec, actor_id="silent", run_id=uuid.uuid4().hex,
                                                    num_envs=4, env_id="CartPole-v1"))
            assert (await call.read()).WhichOneof("kind") == "ack"
            try:  # nothing sent from here on; the watchdog closes the stream after ~2-3 s
                await asyncio.wait_for(call.read(), timeout=30)
            except grpc.aio.AioRpcError as e:
                return e.code(), e.details()
            return None, "the stream was not ended"

    try:
        code, details = asyncio.run(silent_actor())
    finally:
        learner.stop()
    assert code == grpc.StatusCode.UNAVAILABLE, details
    assert "nothing received for 2s" in details and "actor silent" in details


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_stop_waits_for_a_train_step_still_in_flight(tmp_path, monkeypatch):
    """A stop that comes while the first update still compiles (minutes on a
    busy machine) returns only once the training thread has ended: a daemon
    thread inside XLA when the interpreter exits aborts the process
    ("FATAL: exception not rethrown", exit -6)."""
    compiling = threading.Event()

    def slow_warm_up(self):
        compiling.set()
        time.sleep(12)  # longer than stop()'s first 10 s wait

    monkeypatch.setattr(Learner, "_warm_up", slow_warm_up)
    learner = Learner(TrainConfig(env="CartPole-v1"), f"unix:{tmp_path}/seed.sock")
    learner.start()
    assert compiling.wait(30)
    learner.stop()
    assert not learner.training


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_local_actors_wait_for_a_learner_slow_to_start(tmp_path, monkeypatch):
    """Local actors start before their learner listens and retry; a learner
    whose start-up outlasts the actors' retry limit (the first compile on a
    loaded machine took over 30 s) must still get its actors: while it lives
    they keep waiting, and the run trains to its budget."""
    from seedq import local

    original_start = Learner.start

    def slow_start(self, *args, **kwargs):
        time.sleep(6)  # six times the actors' retry limit below
        return original_start(self, *args, **kwargs)

    monkeypatch.setattr(local, "LOCAL_ACTOR_RETRY_SECONDS", 1.0)
    monkeypatch.setattr(Learner, "start", slow_start)
    config = TrainConfig(env="CartPole-v1", max_frames=3000, target_return=None,
                         logdir=str(tmp_path / "run"), num_actors=1, envs_per_actor=8)
    summary = local.train(config, quiet=True)
    assert summary["stop_reason"] == "max_frames"
    assert summary["frames"] >= 3000


@pytest.mark.unit
def test_a_local_actor_gives_up_only_once_its_learner_process_is_gone(tmp_path):
    """`--parent-pid` names the local learner: while it is the actor's parent
    the actor keeps retrying past `retry_max_seconds`; once it is not (it
    died and the actor was re-parented), the actor gives up at the limit."""
    import asyncio

    from seedq.actor.seed_actor import run_actor

    address = f"unix:{tmp_path}/nobody-listens.sock"

    async def attempt(parent_pid: int, seconds: float):
        return await asyncio.wait_for(
            run_actor(address, "CartPole-v1", 2, actor_id="orphan", retry_max_seconds=0.5, parent_pid=parent_pid),
            timeout=seconds,
        )

    with pytest.raises(ConnectionError, match="giving up"):
        asyncio.run(attempt(os.getpid(), 60))  # not this process's parent: as if the learner had died
    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(attempt(os.getppid(), 5))  # the parent lives: still retrying at 10x the limit


@pytest.mark.unit
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux only")
def test_a_child_that_asked_to_die_with_its_parent_gets_the_signal_when_the_parent_is_sigkilled(tmp_path):
    """`lifetime.die_with_parent`: a parent that ends by SIGKILL passes nothing
    on, yet its child gets the signal it asked for (here SIGTERM, which it
    records) from the kernel; a child that did not ask lives on."""
    child_code = (
        "import os, pathlib, signal, sys, time\n"
        "from seedq.process import lifetime\n"
        "out = pathlib.Path(sys.argv[1])\n"
        "signal.signal(signal.SIGTERM, lambda *a: (out.write_text('SIGTERM'), sys.exit(0)))\n"
        "if sys.argv[2] == 'ask':\n"
        "    assert lifetime.die_with_parent(os.getppid(), signal.SIGTERM)\n"
        "tmp = out.parent / (out.name + '.tmp')\n"
        "tmp.write_text(str(os.getpid()))\n"
        "tmp.rename(out.parent / (out.name + '.ready'))  # whole, or not there\n"
        "time.sleep(60)\n"
    )
    parent_code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2], sys.argv[3]])\n"
        "time.sleep(60)\n"
    )
    outcomes = {}
    for mode in ("ask", "do-not-ask"):
        out = tmp_path / mode
        parent = subprocess.Popen([sys.executable, "-c", parent_code, child_code, str(out), mode])
        ready = tmp_path / (mode + ".ready")
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        child_pid = int(ready.read_text())
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + (10 if mode == "ask" else 3)  # the kernel signals at once
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        outcomes[mode] = out.read_text() if out.exists() else "running"
        if not out.exists():
            os.kill(child_pid, signal.SIGKILL)
    assert outcomes == {"ask": "SIGTERM", "do-not-ask": "running"}


@pytest.mark.e2e
def test_an_inference_failure_ends_the_run_with_learner_error_and_exit_1(tmp_path, monkeypatch, capsys):
    """A batch that fails once would fail again: the learner stops rather than
    answering INTERNAL for ever; summary.json names the error; exit 1."""
    from seedq import cli
    from seedq.process import exit_codes
    from seedq.server.inference import InferenceServer

    real_infer = InferenceServer._infer
    batches, failed_at = [0], []

    def infer(self, batch, greedy=False):
        batches[0] += 1
        if batches[0] == 200:
            failed_at.append(time.monotonic())
            raise FloatingPointError("injected: the inference device failed")
        return real_infer(self, batch, greedy)

    monkeypatch.setattr(InferenceServer, "_infer", infer)
    run = tmp_path / "run"
    code = cli.main(["train", "--env", "CartPole-v1", "--logdir", str(run), "--max-seconds", "300",
                     "--target-return", "none", "--eval-episodes", "0", "--log-every-seconds", "0.5", "--quiet"])
    ended = time.monotonic()
    summary = json.loads((run / "summary.json").read_text())
    assert code == exit_codes.RUNTIME_FAILURE == 1
    assert summary["stop_reason"] == "learner_error"
    assert summary["error"] == "FloatingPointError: injected: the inference device failed"
    assert "learner failed: FloatingPointError" in capsys.readouterr().err
    print(f"inference failure -> exit {code}, stop_reason {summary['stop_reason']}, "
          f"{ended - failed_at[0]:.1f}s from the failure to the learner's exit")


def _train_until_the_injected_failure(run, failed_at, *flags):
    """`seedq train` on CartPole (this process is the learner) until an injected
    failure ends it; returns (exit code, summary.json, seconds from the failure to the exit)."""
    from seedq import cli

    code = cli.main(["train", "--env", "CartPole-v1", "--logdir", str(run), "--max-seconds", "120",
                     "--num-actors", "1", "--target-return", "none", "--eval-episodes", "0",
                     "--log-every-seconds", "0.5", "--quiet", *flags])
    ended = time.monotonic()
    summary = json.loads((run / "summary.json").read_text())
    assert failed_at, f"the failure was never injected (stop_reason {summary.get('stop_reason')})"
    return code, summary, ended - failed_at[0]


def _failing_on_call(n, error, failed_at, real):
    """`real`, raising `error` on its n-th call (and recording when)."""
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            failed_at.append(time.monotonic())
            raise error
        return real(*args, **kwargs)

    return wrapper


@pytest.mark.e2e
def test_a_failure_recording_answered_steps_ends_the_run_with_learner_error(tmp_path, monkeypatch):
    """Steps that cannot be recorded would be lost from every batch on: the run stops, exit 1."""
    from seedq.process import exit_codes
    from seedq.rollout.core import ActingCore

    failed_at = []
    monkeypatch.setattr(ActingCore, "record", _failing_on_call(
        100, IndexError("injected: recording failed"), failed_at, ActingCore.record))
    code, summary, seconds = _train_until_the_injected_failure(tmp_path / "run", failed_at)
    assert (code, summary["stop_reason"]) == (exit_codes.RUNTIME_FAILURE, "learner_error")
    assert summary["error"] == "IndexError: injected: recording failed"
    print(f"record failure -> exit {code} {seconds:.1f}s after it")


@pytest.mark.e2e
def test_the_batch_loop_dying_ends_the_run_with_learner_error(tmp_path, monkeypatch):
    """A failure outside a batch's own try (here: taking the next batch) ends
    the batcher task; the server thread notices and the run stops, exit 1."""
    from seedq.process import exit_codes
    from seedq.server.inference import InferenceServer

    failed_at = []
    monkeypatch.setattr(InferenceServer, "_take_batch", _failing_on_call(
        100, KeyError("injected: the batch loop failed"), failed_at, InferenceServer._take_batch))
    code, summary, seconds = _train_until_the_injected_failure(tmp_path / "run", failed_at)
    assert (code, summary["stop_reason"]) == (exit_codes.RUNTIME_FAILURE, "learner_error")
    assert summary["error"] == "KeyError: 'injected: the batch loop failed'"
    print(f"batch loop failure -> exit {code} {seconds:.1f}s after it")


@pytest.mark.e2e
def test_an_impala_parameter_pull_failure_ends_the_run_with_learner_error(tmp_path, monkeypatch):
    """A failing PullParams would fail every actor's pull from then on: the run stops, exit 1."""
    from seedq.process import exit_codes
    from seedq.impala.service import ParamsPublisher

    failed_at = []
    monkeypatch.setattr(ParamsPublisher, "latest", _failing_on_call(
        3, MemoryError("injected: serializing parameters failed"), failed_at, ParamsPublisher.latest))
    code, summary, seconds = _train_until_the_injected_failure(
        tmp_path / "run", failed_at, "--architecture", "impala")
    assert (code, summary["stop_reason"]) == (exit_codes.RUNTIME_FAILURE, "learner_error")
    assert summary["error"] == "MemoryError: injected: serializing parameters failed"
    print(f"PullParams failure -> exit {code} {seconds:.1f}s after it")
