"""IMPALA mode: unroll assembly, parameter pulls, the push service, local runs, `seedq compare`.

Real components throughout: the learner's gRPC server on a unix socket in a
temporary directory, real `seedq` processes, real CartPole envs.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import pathlib
import queue
import subprocess
import sys
import time
import uuid

import grpc
import jax
import numpy as np
import pytest

from seedq.impala.actor import UnrollBuilder
from seedq.agents.vtrace.agent import VTraceAgent
from seedq.config import ServerConfig, TrainConfig, VTraceConfig
from seedq.quant.mode import InferencePrecision
from seedq.server.env_table import EnvTable, EpisodeLog
from seedq.server.inference import InferenceServer
from seedq.server.unrolls import UnrollQueue
from seedq.v1 import seed_pb2, seed_pb2_grpc
from seedq.impala import codec as impala_codec
from seedq.wire import codec
from seedq import schema
from seedq.bench.drain import drain_unrolls
from tests.serving import serve

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CARTPOLE = schema.EnvSpec("float32", (4,), num_actions=2)
REPO = pathlib.Path(__file__).resolve().parents[1]


def seedq(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "seedq.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


class CountingAgent(VTraceAgent):
    """V-trace plus a recurrent state (steps since the episode started) that
    `act` resets at `first`: checks that both architectures carry core state
    the same way and record each unroll's initial state."""

    def initial_core_state(self, n):
        return {"count": np.zeros(n, np.int32)}

    def act(self, params, rng, obs, first, core_state, inputs):
        actions, outputs, _, rng = super().act(params, rng, obs, first, core_state, inputs)
        count = jax.numpy.where(first, 0, core_state["count"]) + 1
        return actions, outputs, {"count": count}, rng


def step_stream(num_envs, steps, seed=0):
    """What an actor would send: random observations and episode ends (both kinds)."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        yield (
            rng.normal(size=(num_envs, 4)).astype(np.float32),
            rng.normal(size=num_envs).astype(np.float32),
            rng.random(num_envs) < 0.1,
            rng.random(num_envs) < 0.05,
        )


@pytest.mark.parametrize("lookahead", [0, 3])
@pytest.mark.parametrize("agent_cls", [VTraceAgent, CountingAgent])
def test_impala_actor_builds_the_same_unrolls_as_the_seed_server(agent_cls, lookahead):
    num_envs = 8  # the server's smallest bucket: no padding, so both sample from the same key alike
    cfg = dataclasses.replace(VTraceConfig(), unroll_length=4, lookahead=lookahead)
    agent = agent_cls(CARTPOLE, cfg)
    params = agent.init(jax.random.PRNGKey(1)).params
    key = jax.random.PRNGKey(7)

    server_log = EpisodeLog()
    server = InferenceServer(agent, CARTPOLE, EnvTable(server_log), UnrollQueue(1024),
                             max_batch_size=num_envs, batch_timeout_ms=0.0, rng=key)
    server.publish(params, 3)
    entry, _ = server.connect("actor", "run", num_envs)
    builder = UnrollBuilder(agent, CARTPOLE, num_envs, key)

    server_unrolls, actor_unrolls = [], []
    for obs, rewards, terminated, truncated in step_stream(num_envs, 23):
        steps = codec.Steps(np.arange(num_envs, dtype=np.int32), rewards, terminated, truncated, obs)
        actions, _, unrolls = serve(server, entry, steps)
        actor_actions, actor_batch = builder.step(params, 3, obs, rewards, terminated, truncated)
        np.testing.assert_array_equal(actions, actor_actions)
        assert (unrolls is None) == (actor_batch is None)
        if unrolls is not None:
            server_unrolls.append(unrolls)
            actor_unrolls.append(actor_batch)

    # 23 steps: the first unroll at step 4 + lookahead + 1, then every 4.
    assert len(server_unrolls) == 1 + (23 - (4 + lookahead + 1)) // 4
    for ours, theirs in zip(actor_unrolls, server_unrolls):
        assert ours.keys() == theirs.keys()
        for name in theirs:
            np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    if agent_cls is CountingAgent:
        # The initial state of each unroll, not the state after it.
        assert actor_unrolls[-1]["core/count"].max() > 0
    # The actor books the same episodes and frames the server does.
    frames, returns, lengths = builder.take_progress()
    server_returns, server_lengths = server_log.window()
    assert frames == 23 * num_envs == server.table.frames
    np.testing.assert_allclose(returns, server_returns)
    assert lengths == server_lengths and len(lengths) > 0


@pytest.mark.parametrize("hidden", [(512, 512)])
def test_params_round_trip_fp32_and_int8_with_four_times_fewer_bytes(hidden):
    cfg = dataclasses.replace(VTraceConfig(), hidden_sizes=hidden)
    agent = VTraceAgent(CARTPOLE, cfg)
    state = agent.init(jax.random.PRNGKey(0))
    sizes = {}
    for precision in ("fp32", "int8"):
        mode = InferencePrecision(agent, CARTPOLE, precision)
        published = jax.device_get(mode.publish(agent.inference_params(state)))
        data = impala_codec.serialize_params(published)
        chunks = impala_codec.params_chunks(data, 12, precision, chunk_bytes=64 << 10)
        assert len(chunks) > 1 and all(c.ByteSize() < (65 << 10) for c in chunks)
        version, got_precision, joined = impala_codec.join_chunks(chunks)
        assert (version, got_precision) == (12, precision)
        restored = impala_codec.deserialize_params(joined)
        flat, tree = jax.tree_util.tree_flatten(published)
        flat_back, tree_back = jax.tree_util.tree_flatten(restored)
        assert tree == tree_back
        for a, b in zip(flat, flat_back):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
        sizes[precision] = len(data)
    assert sizes["fp32"] / sizes["int8"] > 3.5, sizes
    # Nothing newer: the header only.
    (head,) = impala_codec.params_chunks(None, 12, "fp32")
    assert impala_codec.join_chunks([head]) == (12, "fp32", None)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="actor_precision='bf16'"):
        TrainConfig(architecture="impala", actor_precision="bf16").validate()
    with pytest.raises(ValueError, match="architecture='impala' needs agent='vtrace'"):
        TrainConfig(architecture="impala", agent="r2d2").validate()
    with pytest.raises(ValueError, match="param_pull_every=0"):
        TrainConfig(architecture="impala", param_pull_every=0).validate()


# --- the learner's IMPALA service over a real socket ------------------------------------


@pytest.fixture(scope="module")
def impala_learner(tmp_path_factory):
    from seedq.learner.learner import Learner

    config = dataclasses.replace(
        TrainConfig(), env="CartPole-v1", architecture="impala", actor_precision="int8",
        vtrace=dataclasses.replace(VTraceConfig(), unroll_length=5, batch_size=4),
        server=dataclasses.replace(ServerConfig(), queue_capacity_unrolls=64),
    )
    learner = Learner(config, f"unix:{tmp_path_factory.mktemp('impala')}/learner.sock")
    address = learner.start(consume=drain_unrolls)
    yield learner, address
    learner.stop()


class PushStream:
    def __init__(self, address):
        self.channel = grpc.insecure_channel(address)
        self.stub = seed_pb2_grpc.LearnerStub(self.channel)
        self._requests = queue.Queue()
        self.call = self.stub.PushUnrolls(iter(self._requests.get, None), timeout=30)

    def send(self, message):
        self._requests.put(message)
        return next(self.call)

    def handshake(self, spec=CARTPOLE, num_envs=2):
        hello = codec.encode_handshake(spec, actor_id="a-" + uuid.uuid4().hex[:6],
                                       run_id=uuid.uuid4().hex, num_envs=num_envs)
        return self.send(seed_pb2.UnrollMessage(handshake=hello.handshake))

    def close(self):
        self._requests.put(None)
        self.channel.close()


def good_unrolls(learner, k=2):
    store = learner.inference.store
    return {
        name: np.zeros((k,) + (() if name in store.initial_only else (store.length,)) + f.shape, f.dtype)
        for name, f in store.fields.items()
    }


def refused(learner, address, unrolls, frames=0, returns=(), lengths=()):
    stream = PushStream(address)
    try:
        ack = stream.handshake()
        assert json.loads(ack.config_json)["architecture"] == "impala"
        with pytest.raises(grpc.RpcError) as e:
            stream.send(impala_codec.encode_unrolls(unrolls, frames, returns, lengths))
        return e.value
    finally:
        stream.close()


def test_push_accepts_a_good_batch_and_books_its_episodes(impala_learner):
    learner, address = impala_learner
    stream = PushStream(address)
    try:
        stream.handshake()
        frames_before, episodes_before = learner.table.frames, learner.episodes.snapshot()[0]
        ack = stream.send(impala_codec.encode_unrolls(good_unrolls(learner), 12, [9.0, 20.0], [9, 20]))
        assert ack.policy_version == learner.version
    finally:
        stream.close()
    assert learner.table.frames == frames_before + 12
    assert learner.episodes.snapshot()[0] == episodes_before + 2


@pytest.mark.parametrize("damage, field", [
    (lambda u: u.pop("logits"), "unrolls.fields: missing ['logits']"),
    (lambda u: u.update(extra=np.zeros((2, 6), np.float32)), "unknown ['extra']"),
    (lambda u: u.update(reward=u["reward"].astype(np.float64)), "unrolls.fields[reward].dtype"),
    (lambda u: u.update(obs=np.zeros((2, 6, 5), np.float32)), "unrolls.fields[obs].shape"),
    (lambda u: u.update(action=np.zeros((2, 5), np.int32)), "unrolls.fields[action].shape"),
    (lambda u: u.update(policy_version=np.full((2, 6), 10**6, np.int32)), "unrolls.fields[policy_version]"),
])
def test_bad_unroll_batches_are_refused_naming_the_field(impala_learner, damage, field):
    learner, address = impala_learner
    unrolls = good_unrolls(learner)
    damage(unrolls)
    error = refused(learner, address, unrolls)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in error.details()


def test_bad_counts_and_handshakes_are_refused(impala_learner):
    learner, address = impala_learner
    error = refused(learner, address, good_unrolls(learner), returns=[1.0], lengths=[])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "unrolls.episode_lengths" in error.details()
    error = refused(learner, address, good_unrolls(learner, k=3))  # 2 envs declared
    assert "unrolls.fields" in error.details() and "[1, 2]" in error.details()
    error = refused(learner, address, good_unrolls(learner), frames=10**6)
    assert "unrolls.frames" in error.details()
    stream = PushStream(address)
    try:
        with pytest.raises(grpc.RpcError) as e:
            stream.handshake(spec=schema.EnvSpec("float32", (5,), num_actions=2))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "handshake.observation.shape" in e.value.details()
    finally:
        stream.close()


def test_pull_serves_int8_params_and_seed_streams_are_told_to_use_impala_actors(impala_learner):
    learner, address = impala_learner
    with grpc.insecure_channel(address) as channel:
        stub = seed_pb2_grpc.LearnerStub(channel)
        chunks = list(stub.PullParams(seed_pb2.ParamsRequest(actor_id="x", have_version=-1), timeout=30))
        version, precision, data = impala_codec.join_chunks(chunks)
        assert (version, precision) == (learner.version, "int8")
        leaves = jax.tree_util.tree_leaves(impala_codec.deserialize_params(data))
        assert any(leaf.dtype == np.int8 for leaf in leaves)
        again = list(stub.PullParams(seed_pb2.ParamsRequest(actor_id="x", have_version=version), timeout=30))
        assert len(again) == 1 and not again[0].data
        hello = codec.encode_handshake(CARTPOLE, actor_id="s", run_id="r", num_envs=1)
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Stream(iter([hello]), timeout=30))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "seedq impala-actor" in e.value.details()


@pytest.fixture
def full_queue_learner(tmp_path):
    """An IMPALA learner that does not train, with room for 8 unrolls: a few pushes fill it."""
    from seedq.learner.learner import Learner

    config = dataclasses.replace(
        TrainConfig(), env="CartPole-v1", architecture="impala",
        vtrace=dataclasses.replace(VTraceConfig(), unroll_length=5, batch_size=4),
        server=dataclasses.replace(ServerConfig(), queue_capacity_unrolls=8),
    )
    learner = Learner(config, f"unix:{tmp_path}/learner.sock")
    address = learner.start(consume=lambda _queue: learner._stop.wait())  # nothing takes unrolls out
    yield learner, address
    learner.stop()


def _push_async(stream, learner):
    """Sends one batch without waiting for its ack (it waits while the queue is full)."""
    stream._requests.put(impala_codec.encode_unrolls(good_unrolls(learner), 0, [], []))


def test_pushes_waiting_on_a_full_queue_leave_parameter_pulls_served(full_queue_learner):
    """Streams held back by a full queue wait on the event loop, not in the
    executor threads that parameter pulls use: more waiting streams than the
    default executor has threads, and a pull still answers."""
    learner, address = full_queue_learner
    streams = [PushStream(address) for _ in range(36)]  # the default executor has at most 32 threads
    try:
        for stream in streams:
            stream.handshake()
        for stream in streams:
            _push_async(stream, learner)  # 4 of them fill the queue, the other 32 wait
        deadline = time.monotonic() + 20
        while len(learner.queue) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the other pushes reach the learner and wait
        with grpc.insecure_channel(address) as channel:
            stub = seed_pb2_grpc.LearnerStub(channel)
            chunks = list(stub.PullParams(seed_pb2.ParamsRequest(actor_id="x", have_version=-1), timeout=20))
        assert impala_codec.join_chunks(chunks)[0] == learner.version
    finally:
        for stream in streams:
            stream.close()


def test_a_superseded_impala_stream_is_aborted_at_its_next_push(full_queue_learner):
    """An actor that restarted (same id, new run) replaces its old stream: the
    old one's pushes are refused with ABORTED rather than still queued."""
    learner, address = full_queue_learner
    old, new = PushStream(address), PushStream(address)
    try:
        hello = codec.encode_handshake(CARTPOLE, actor_id="restarting", run_id="run-1", num_envs=2)
        old.send(seed_pb2.UnrollMessage(handshake=hello.handshake))
        hello = codec.encode_handshake(CARTPOLE, actor_id="restarting", run_id="run-2", num_envs=2)
        new.send(seed_pb2.UnrollMessage(handshake=hello.handshake))
        queued = len(learner.queue)
        with pytest.raises(grpc.RpcError) as e:
            old.send(impala_codec.encode_unrolls(good_unrolls(learner), 0, [], []))
        assert e.value.code() == grpc.StatusCode.ABORTED and "superseded" in e.value.details()
        assert len(learner.queue) == queued
    finally:
        old.close()
        new.close()


# --- real processes ---------------------------------------------------------------------


def impala_int8_run(logdir, *flags) -> dict:
    """`seedq train --architecture impala` with int8 actors: real learner and
    actor processes. Returns the summary, having checked what both actors
    measured of their pulls and pushes."""
    result = seedq(
        "train", "--architecture", "impala", "--actor-precision", "int8", "--env", "CartPole-v1",
        "--max-seconds", "0", "--eval-episodes", "2", "--logdir", str(logdir), "--quiet", *flags, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["architecture"] == "impala"
    assert summary["policy_lag_mean"] is not None and summary["policy_lag_mean"] >= 0
    for path in sorted((logdir / "actors").glob("actor-*.json")):
        stats = json.loads(path.read_text())
        assert stats["pulls"] > 0 and stats["unroll_batches"] > 0
        assert stats["bytes_sent"] > 0 and stats["bytes_received"] > 0
        assert stats["inference_seconds"] > 0 and stats["pull_seconds"] > 0
    assert len(list((logdir / "actors").glob("actor-*.json"))) == 2
    return summary


@pytest.mark.learning
def test_local_impala_int8_run_learns_cartpole(tmp_path):
    """A random policy scores ~22, the target of 150 needs learning. Bounded by
    frames, not seconds."""
    summary = impala_int8_run(tmp_path / "run", "--target-return", "150", "--max-frames", "1500000")
    assert summary["reached_target"], summary


def test_local_impala_int8_run_with_paced_pushes_trains_to_its_frame_budget(tmp_path):
    """`pace` (the pixel envs' rule) holds the pushes' acknowledgements
    (seedq.server.pacing.push_ack_backlog); the run still trains on to its
    budget."""
    summary = impala_int8_run(tmp_path / "run", "--server.queue-full", "pace", "--target-return", "none",
                              "--max-frames", "20000")
    assert summary["stop_reason"] == "max_frames" and summary["train_steps"] > 0, summary


def test_impala_actor_against_a_seed_learner_exits_with_a_clear_error(tmp_path):
    from seedq.learner.learner import Learner

    learner = Learner(TrainConfig(env="CartPole-v1"), f"unix:{tmp_path}/seed.sock")
    address = learner.start(consume=drain_unrolls)
    try:
        result = seedq("impala-actor", "--server", address, "--env", "CartPole-v1", "--num-envs", "2",
                       "--retry-max-seconds", "20", timeout=120)
    finally:
        learner.stop()
    assert result.returncode == 2, result.stdout + result.stderr
    assert "does not run architecture=impala" in result.stderr


def test_compare_writes_csv_and_plots(tmp_path):
    out = tmp_path / "cmp"
    args = (
        "compare", "--env", "CartPole-v1", "--configs", "seed-fp32,impala-int8", "--seeds", "1",
        "--max-frames", "12000", "--max-seconds", "0", "--target-return", "none", "--eval-episodes", "3",
        "--checkpoint-frames", "4000", "--actor-cores", "0", "--out", str(out),
    )
    result = seedq(*args, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["config"] for r in rows] == ["seed-fp32", "impala-int8"]
    assert (out / "runs" / "impala-int8-seed0.log").exists()  # each run's own output is kept
    seed_row, impala_row = rows
    assert (seed_row["architecture"], impala_row["architecture"]) == ("seed", "impala")
    assert impala_row["actor_precision"] == "int8"
    for row in rows:
        assert int(row["frames"]) > 0 and not os.path.isabs(row["logdir"])
        assert float(row["bytes_sent_per_frame"]) > 0 and float(row["bytes_received_per_frame"]) > 0
        assert float(row["learner_cpu_us_per_frame"]) > 0 and float(row["frames_per_actor_cpu_second"]) > 0
        assert float(row["energy_wh"]) > 0 and row["energy_source"] in ("rapl", "codecarbon", "cpu_seconds_model")
        assert float(row["env_us_per_frame"]) > 0 and float(row["inference_us_per_frame"]) > 0
        # Kept checkpoints (every 4000 new frames, and the final one) evaluated, final set against best.
        assert int(row["checkpoints_evaluated"]) >= 2 and int(row["eval_episodes"]) == 3
        assert row["final_normalized"] and 0 < float(row["final_over_best"]) <= 1
        assert row["actor_cores"] == "0"
        for stats in (out / row["logdir"] / "actors").glob("*.json"):  # every actor ran on core 0
            assert json.loads(stats.read_text())["cpu_cores"] == [0]
    # SEED actors pull no parameters: empty, not 0; IMPALA int8 pulls are measured.
    assert seed_row["param_pull_bytes_mean"] == "" and seed_row["param_pull_ms_mean"] == ""
    assert float(impala_row["param_pull_bytes_mean"]) > 0 and float(impala_row["param_pull_ms_mean"]) > 0
    assert float(impala_row["pull_us_per_frame"]) > 0 and float(seed_row["pull_us_per_frame"]) == 0
    for name in ("return_vs_frames", "return_vs_time", "frames_per_second", "time_split", "evaluations"):
        assert (out / f"{name}.png").stat().st_size > 1000
    with open(out / "evaluations.csv") as f:  # one point per evaluated checkpoint
        assert len(list(csv.DictReader(f))) == sum(int(r["checkpoints_evaluated"]) for r in rows)
    summary = (out / "summary.md").read_text()
    assert "| seed-fp32 |" in summary and "no pulls" in summary
    # The plots are regenerated from the CSVs alone.
    (out / "time_split.png").unlink()
    assert seedq("compare", "--plot-only", "--out", str(out)).returncode == 0
    assert (out / "time_split.png").exists()

    # A rerun skips the finished runs; one stopped before its end continues from its checkpoint.
    summary_path = out / "runs" / "impala-int8-seed0" / "summary.json"
    stopped = json.loads(summary_path.read_text())
    summary_path.write_text(json.dumps({**stopped, "stop_reason": "terminated"}))
    again = seedq(*args, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "seed-fp32 seed 0: finished before, skipped" in again.stdout
    assert "impala-int8 seed 0: continuing an unfinished earlier attempt" in again.stdout
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["config"], r["segments"]) for r in rows] == [("seed-fp32", "1"), ("impala-int8", "2")]


def test_impala_vs_seed_notebook_executes(tmp_path, monkeypatch, run_notebook):
    # One env, one config (IMPALA with int8 actors: the one with parameter pulls) and a
    # tiny budget for the notebook's own comparison: a run of each config and their
    # columns side by side are the CLI's (test_compare_writes_csv_and_plots); then
    # the committed sittings, which hold every config.
    monkeypatch.setenv("SEEDQ_COMPARE_ENV", "MinAtar/Breakout-v1")
    monkeypatch.setenv("SEEDQ_COMPARE_FRAMES", "6000")
    monkeypatch.setenv("SEEDQ_COMPARE_CONFIGS", "impala-int8")
    committed = REPO / "docs" / "impala_vs_seed"
    sittings = sorted(p.parent.name for p in committed.glob("*/results.csv"))
    assert {"throughput-minatar", "throughput-pong"} <= set(sittings)
    monkeypatch.setenv("SEEDQ_COMPARE_RESULTS", str(committed))
    before = {p: p.read_bytes() for p in committed.glob("*/*") if p.is_file()}
    outputs, text = run_notebook("impala_vs_seed.ipynb")
    # The small run's 5 plots (its checkpoints are evaluated), then 3 for each committed sitting,
    # redrawn from copies, and a fourth, the evaluated checkpoints, for each learning-parity sitting.
    parity = [name for name in sittings if (committed / name / "evaluations.csv").exists()]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 5 + 3 * len(sittings) + len(parity)
    for name in sittings:
        assert f"\n{name}:\n" in text
    # The small run's table and each committed MinAtar sitting's; Pong's sittings.
    minatar = [name for name in sittings if "MinAtar/Breakout-v1" in (committed / name / "results.csv").read_text()]
    assert text.count("**MinAtar/Breakout-v1**") == 1 + len(minatar) and text.count("**ALE/Pong-v5**") >= 1
    # The committed folders are read, not rewritten (their plots are redrawn from copies).
    assert {p: p.read_bytes() for p in committed.glob("*/*") if p.is_file()} == before
    assert "| impala-int8 |" in text and "| seed-fp32 |" in text and "no pulls" in text
    with open(tmp_path / "compare-small" / "MinAtar_Breakout-v1" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["config"] for r in rows] == ["impala-int8"]
    assert rows[0]["final_normalized"] and rows[0]["energy_source"] and float(rows[0]["param_pull_bytes_mean"]) > 0


def test_impala_actor_acts_with_the_learners_policy_on_box_actions():
    """The actor's vector env clips actions, so its own spec has unbounded Box
    actions; its local network must still squash the Gaussian's mean into the
    env's bounds exactly as the learner's network does."""
    from seedq.impala.actor import acting_for
    from seedq.config import defaults_for
    from seedq.envs import env_spec, make_vector_env

    config = dataclasses.replace(defaults_for(True), env="Pendulum-v1")
    learner_agent = VTraceAgent(env_spec("Pendulum-v1"), config.vtrace)
    env = make_vector_env("Pendulum-v1", 4)
    try:
        assert np.isinf(env.single_action_space.high).all()  # what made the actor's spec unbounded
        obs, _ = env.reset(seed=0)
    finally:
        env.close()
    actor_agent, _ = acting_for(config)
    params = learner_agent.init(jax.random.PRNGKey(0)).params
    # Large weights push the unsquashed mean far outside Pendulum's [-2, 2].
    params = jax.tree_util.tree_map(lambda x: x * 30.0, params)
    first = np.ones(4, bool)
    rng = jax.random.PRNGKey(1)
    _, learner_dist, _, _ = learner_agent.act(params, rng, obs, first, {}, {})
    _, actor_dist, _, _ = actor_agent.act(params, rng, obs, first, {}, {})
    assert np.abs(np.asarray(learner_dist["mean"])).max() <= 2.0
    np.testing.assert_allclose(actor_dist["mean"], learner_dist["mean"], rtol=1e-6)


# --- what a learner's handshake reply can make an actor do ------------------------------


class _FakeImpalaLearner(seed_pb2_grpc.LearnerServicer):
    """Answers a PushUnrolls handshake with the config it is given, then waits."""

    def __init__(self, config: dict):
        self.config_json = json.dumps(config)

    async def PushUnrolls(self, request_iterator, context):
        await request_iterator.__anext__()
        yield seed_pb2.UnrollAck(policy_version=0, learner_run="fake", config_json=self.config_json)
        async for _ in request_iterator:
            pass


def _connect_to_fake_learner(tmp_path, config: dict):
    """Runs one IMPALA actor connection (CartPole-v1, 2 envs) against a fake
    learner; returns the FatalActorError it ends with, or None."""
    import asyncio

    from seedq.actor.seed_actor import ActorStats, FatalActorError
    from seedq.envs import make_vector_env
    from seedq.impala.actor import serve_connection

    async def main():
        server = grpc.aio.server()
        seed_pb2_grpc.add_LearnerServicer_to_server(_FakeImpalaLearner(config), server)
        address = f"unix:{tmp_path}/fake.sock"
        server.add_insecure_port(address)
        await server.start()
        env = make_vector_env("CartPole-v1", 2)
        spec = schema.spec_from_spaces(env.single_observation_space, env.single_action_space)
        try:
            async with grpc.aio.insecure_channel(address) as ch:
                await asyncio.wait_for(serve_connection(
                    seed_pb2_grpc.LearnerStub(ch), env, spec, actor_id="a", num_envs=2, env_id="CartPole-v1",
                    seed=0, stats=ActorStats()), timeout=60)
        except FatalActorError as e:
            return e
        finally:
            env.close()
            await server.stop(None)

    return asyncio.run(main())


def test_a_learner_naming_a_factory_env_makes_the_impala_actor_import_or_call_nothing(tmp_path, monkeypatch):
    import importlib
    import os

    import seedq.envs

    calls = []
    monkeypatch.setattr(os, "abort", lambda: calls.append("os.abort"))
    monkeypatch.setattr(seedq.envs, "_factory", lambda env_id: calls.append(env_id))
    real_import = importlib.import_module
    monkeypatch.setattr(importlib, "import_module",
                        lambda name, *a: calls.append(name) if name == "os" else real_import(name, *a))
    config = {**json.loads(json.dumps(dataclasses.asdict(TrainConfig(architecture="impala")))),
              "env": "factory:os:abort"}
    refused = _connect_to_fake_learner(tmp_path, config)
    assert calls == []
    assert refused is not None and "'factory:os:abort'" in str(refused) and "--env" in str(refused)


def test_a_newer_learners_unknown_config_fields_are_left_out_not_fatal():
    from seedq.impala.actor import learner_config

    config = dataclasses.asdict(TrainConfig(architecture="impala", env="CartPole-v1"))
    config["a_field_from_the_future"] = 1
    config["vtrace"]["another_one"] = "x"
    assert learner_config(json.dumps(config), "CartPole-v1").env == "CartPole-v1"
