"""Prioritized sequence replay: sampling frequencies, importance
weights, capacity, replay-ratio control, and the server -> replay path when
actors restart mid-sequence."""

from __future__ import annotations

import dataclasses
import threading

import jax
import numpy as np
import pytest
from scipy import stats

from seedq.schema import StepFieldSpec
from seedq.agents.r2d2.agent import R2D2Agent
from seedq.config import R2D2Config
from seedq.envs import env_spec
from seedq.replay.prioritized import PrioritizedBatches, PrioritizedReplay
from seedq.server.env_table import EnvTable, EpisodeLog
from seedq.server.inference import InferenceServer
from seedq.server.unrolls import UnrollQueue
from seedq.wire import codec
from tests.serving import held_steps, serve

pytestmark = pytest.mark.unit

L = 5
FIELDS = {
    "obs": StepFieldSpec((L, 2), np.float32),
    "reward": StepFieldSpec((L,), np.float32),
    "core/h": StepFieldSpec((3,), np.float32),
}


def sequences(ids):
    """Sequences whose every field encodes their id."""
    ids = np.asarray(ids, np.float32)
    return {
        "obs": np.broadcast_to(ids[:, None, None], (len(ids), L, 2)).copy(),
        "reward": np.broadcast_to(ids[:, None], (len(ids), L)).copy(),
        "core/h": np.broadcast_to(ids[:, None], (len(ids), 3)).copy(),
    }


def test_sampling_frequencies_match_priorities_chi_square():
    """200k draws (fixed seed): counts agree with p_i^alpha / sum p^alpha."""
    priorities = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 0.5, 10.0, 7.0, 0.1, 5.0, 2.5])
    alpha = 0.7
    replay = PrioritizedReplay(len(priorities), FIELDS, priority_exponent=alpha, seed=123)
    rows = replay.add(sequences(np.arange(len(priorities))))
    replay.update_priorities(rows, priorities)  # 0 is floored to a tiny MIN_PRIORITY
    counts = np.zeros(len(priorities))
    for _ in range(2000):
        batch, _ = replay.sample(100)
        np.add.at(counts, batch["indices"], 1)
    # Every sampled sequence is the one stored at its row.
    np.testing.assert_array_equal(batch["reward"][:, 0], batch["indices"])
    expected_p = np.maximum(priorities, 1e-6) ** alpha
    expected_p /= expected_p.sum()
    assert counts[0] <= 2  # ~1e-4 expected draws
    nonzero = priorities > 0
    expected = expected_p[nonzero] / expected_p[nonzero].sum() * counts[nonzero].sum()
    chi2, p_value = stats.chisquare(counts[nonzero], expected)
    assert p_value > 0.001, (chi2, counts, expected)
    np.testing.assert_allclose(counts / counts.sum(), expected_p, atol=0.003)


def test_importance_weights_match_hand_computed_values():
    replay = PrioritizedReplay(8, FIELDS, priority_exponent=0.5, importance_exponent=0.4)
    rows = replay.add(sequences([0, 1, 2, 3]))
    replay.update_priorities(rows, [1.0, 4.0, 9.0, 16.0])
    # p^alpha = 1, 2, 3, 4 (total 10): P = .1 .2 .3 .4; N = 4 stored.
    # w = (N P)^-beta = 0.4^-.4, 0.8^-.4, 1.2^-.4, 1.6^-.4, divided by the batch max.
    raw = np.array([0.4, 0.8, 1.2, 1.6]) ** -0.4
    np.testing.assert_allclose(replay.probabilities(rows), [0.1, 0.2, 0.3, 0.4])
    np.testing.assert_allclose(replay.importance_weights(rows), raw / raw.max(), rtol=1e-6)
    np.testing.assert_allclose(replay.importance_weights([1, 3]), raw[[1, 3]] / raw[1], rtol=1e-6)
    # Sampled batches carry the same weights for the rows they drew.
    batch, _ = replay.sample(64)
    np.testing.assert_allclose(
        batch["weights"], raw[batch["indices"]] / raw[batch["indices"]].max(), rtol=1e-6
    )
    assert batch["weights"].max() == 1.0 and batch["weights"].dtype == np.float32


def test_new_sequences_get_the_largest_priority_seen():
    replay = PrioritizedReplay(8, FIELDS, priority_exponent=1.0)
    first = replay.add(sequences([0, 1]))
    np.testing.assert_allclose(replay.probabilities(first), [0.5, 0.5])  # both at 1.0
    replay.update_priorities(first, [3.0, 0.5])
    new = replay.add(sequences([2]))
    assert replay._tree.get(new)[0] == pytest.approx(3.0)


def test_capacity_is_a_hard_bound_with_fifo_eviction():
    capacity = 100
    replay = PrioritizedReplay(capacity, FIELDS, seed=0)
    nbytes = replay.nbytes
    rng = np.random.default_rng(0)
    next_id = 0
    for _ in range(600):  # ~ 10k sequences through a buffer of 100
        k = int(rng.integers(1, 40))
        replay.add(sequences(np.arange(next_id, next_id + k)))
        next_id += k
        assert replay.size <= capacity
        assert replay.nbytes == nbytes  # preallocated, never grows
        batch, serials = replay.sample(16)
        # Only the newest `capacity` sequences can be drawn.
        assert batch["reward"][:, 0].min() >= next_id - capacity
        replay.update_priorities(batch["indices"], rng.uniform(0.1, 5, 16), serials)
    assert replay.size == capacity and replay.inserted == next_id
    stored = np.sort(replay._data["reward"][:, 0])
    np.testing.assert_array_equal(stored, np.arange(next_id - capacity, next_id))
    # A chunk larger than the whole buffer keeps its newest `capacity` sequences.
    replay.add(sequences(np.arange(next_id, next_id + 3 * capacity)))
    np.testing.assert_array_equal(
        np.sort(replay._data["reward"][:, 0]), np.arange(next_id + 2 * capacity, next_id + 3 * capacity)
    )


def test_priority_update_for_an_evicted_sequence_is_dropped():
    replay = PrioritizedReplay(4, FIELDS, priority_exponent=1.0)
    replay.add(sequences([0, 1, 2, 3]))
    batch, serials = replay.sample(4)
    replay.add(sequences([4, 5, 6, 7]))  # overwrites every row
    assert replay.update_priorities(batch["indices"], np.full(4, 50.0), serials) == 0
    np.testing.assert_allclose(replay._tree.get(np.arange(4)), 1.0)


# --- batch source: queue -> replay -> batches ------------------------------------


def _source(queue, **kwargs):
    defaults = dict(batch_size=8, min_size=16, replay_ratio=0.0)
    replay = PrioritizedReplay(kwargs.pop("capacity", 64), FIELDS, seed=0)
    return PrioritizedBatches(queue, replay, **{**defaults, **kwargs})


def test_batches_wait_for_min_fill_and_stop():
    queue = UnrollQueue(1000)
    source = _source(queue, min_size=16)
    queue.put(sequences(range(10)))
    stop = threading.Event()
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    assert source.next_batch(stop) is None  # only 10 < 16 sequences: no batch
    timer.cancel()
    queue.put(sequences(range(10, 20)))
    batch = source.next_batch(threading.Event())
    assert batch["obs"].shape == (8, L, 2) and set(batch) >= {"weights", "indices"}
    assert source.replay.size == 20


def test_after_update_writes_priorities_and_leaves_scalar_metrics():
    queue = UnrollQueue(1000)
    source = _source(queue, min_size=8)
    queue.put(sequences(range(8)))
    batch = source.next_batch(threading.Event())
    metrics = {"loss/total": 1.0, "priorities": np.arange(1, 9, dtype=np.float32)}
    source.after_update(batch, metrics)
    assert "priorities" not in metrics and metrics["loss/total"] == 1.0
    np.testing.assert_allclose(
        source.replay._tree.get(batch["indices"]), np.arange(1, 9) ** source.replay.alpha
    )
    for value in source.stats().values():
        float(value)


@pytest.mark.parametrize("ratio", [0.5, 2.0, 8.0])
def test_replay_ratio_is_held_both_ways(ratio):
    """Plenty of data waiting: inserts are held back to keep samples/insert ~ ratio.
    No data waiting: the learner waits rather than oversample."""
    queue = UnrollQueue(100_000)
    source = _source(queue, min_size=16, replay_ratio=ratio, capacity=4096)
    queue.put(sequences(range(20_000)))
    for _ in range(200):
        batch = source.next_batch(threading.Event())
        source.after_update(batch, {"priorities": np.ones(8)})
        inserted = source.replay.inserted - source._inserted_at_fill
        sampled = source.replay.sampled - source._sampled_at_fill
        assert sampled <= ratio * inserted + source.slack
        assert ratio * inserted <= sampled + source.slack + ratio * source.batch_size
    assert source.replay.sampled / source.replay.inserted == pytest.approx(ratio, rel=0.25)
    # Starved: with no new data, sampling stops once the credit is spent.
    queue2 = UnrollQueue(1000)
    starved = _source(queue2, min_size=16, replay_ratio=ratio)
    queue2.put(sequences(range(16)))
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    batches = 0
    while starved.next_batch(stop) is not None:
        batches += 1
    assert batches * 8 <= ratio * 0 + starved.slack  # nothing inserted after the fill


def test_long_run_memory_stays_bounded():
    """Thousands of sequences through a small replay: size, bytes and queue bounded."""
    queue = UnrollQueue(64)
    source = _source(queue, min_size=16, capacity=50, replay_ratio=1.0)
    nbytes = source.replay.nbytes
    stop = threading.Event()
    produced = []

    def producer():
        i = 0
        while not stop.is_set() and i < 5000:
            try:
                queue.put(sequences(range(i, i + 7)), timeout=0.2)
            except Exception:
                return
            i += 7
        produced.append(i)

    thread = threading.Thread(target=producer)
    thread.start()
    try:
        for _ in range(600):
            batch = source.next_batch(stop)
            source.after_update(batch, {"priorities": np.random.default_rng(0).uniform(0, 2, 8)})
            assert source.replay.size <= 50 and len(queue) <= 64 + 7
            assert source.replay.nbytes == nbytes
    finally:
        stop.set()
        queue.close()
        thread.join(10)
    assert source.replay.inserted > 1000


# --- actor restarts never leave half-built sequences in replay ------------------

SPEC = env_spec("CartPole-v1")
R2D2 = dataclasses.replace(
    R2D2Config(), burn_in=2, trace_length=3, n_step=2, lstm_size=4, hidden_sizes=(4,),
    head_hidden_size=4, batch_size=4, min_replay_size=1, replay_capacity=1000, replay_ratio=0.0,
)


def _steps(num_envs, run_marker, t):
    """Observations encode (run, time): obs[:, 0] = run marker, obs[:, 1] = t."""
    obs = np.zeros((num_envs, 4), np.float32)
    obs[:, 0] = run_marker
    obs[:, 1] = t
    obs[:, 3] = np.arange(num_envs)
    zeros = np.zeros(num_envs)
    return codec.Steps(
        np.arange(num_envs, dtype=np.int32), zeros.astype(np.float32), zeros.astype(bool),
        zeros.astype(bool), obs,
    )


def test_actor_restart_never_puts_a_partial_sequence_into_replay():
    agent = R2D2Agent(SPEC, R2D2, num_envs=6)
    L = agent.sequence_spec().length
    queue = UnrollQueue(10_000)
    server = InferenceServer(
        agent, SPEC, EnvTable(EpisodeLog()), queue, max_batch_size=8, batch_timeout_ms=0,
        rng=jax.random.PRNGKey(0),
    )
    server.publish(agent.init(jax.random.PRNGKey(0)).params, 0)
    source = agent.make_batch_source(queue)

    def run(entry, marker, steps):
        for t in range(steps):
            _, _, unrolls = serve(server, entry, _steps(entry.num_envs, marker, t))
            if unrolls is not None:
                queue.put(unrolls)

    a, _ = server.connect("actor-a", "run-1", 3)
    b, _ = server.connect("actor-b", "run-1", 3)
    run(a, 1.0, L + 2)  # one full sequence, then a partial one (overlap + 2 steps)
    run(b, 5.0, L - 1)  # partial: one step short
    assert held_steps(server.store, a.slots).tolist() == [agent.sequence_spec().overlap + 2] * 3
    a2, superseded = server.connect("actor-a", "run-2", 3)  # actor a restarts
    assert superseded is a and a2.slots.tolist() == a.slots.tolist()  # same slots reused
    server.release(b)  # actor b's stream ends
    assert held_steps(server.store, a2.slots).tolist() == [0] * 3
    b2, _ = server.connect("actor-c", "run-1", 3)  # a new actor takes b's slots
    run(a2, 2.0, 3 * L)
    run(b2, 7.0, 2 * L)

    source._drain()
    replay = source.replay
    obs = replay._data["obs"][: replay.size]
    stride = L - agent.sequence_spec().overlap
    full = lambda steps: 0 if steps < L else 1 + (steps - L) // stride  # noqa: E731
    # Every full sequence and nothing else: run 1 of a, 2 of a, and c (3 envs each).
    assert replay.size == 3 * (full(L + 2) + full(3 * L) + full(2 * L))
    for seq in obs:
        runs = np.unique(seq[:, 0])
        assert len(runs) == 1, f"sequence mixes runs {runs}"
        assert runs[0] != 5.0  # actor b's partial sequence was dropped
        np.testing.assert_array_equal(np.diff(seq[:, 1]), 1.0)  # contiguous steps
        assert len(np.unique(seq[:, 3])) == 1  # one env
        if runs[0] in (2.0, 7.0):  # new runs start from their own first step
            assert seq[0, 1] % stride == 0
    # The step that started each new run is marked first (the LSTM resets there).
    starts = replay._data["first"][: replay.size][obs[:, 0, 1] == 0]
    assert starts[:, 0].all()


def test_state_dict_round_trip_of_a_wrapped_ring_samples_identically():
    """A full replay whose ring has wrapped, saved and loaded into a fresh one
    (through JSON for the scalars, as a checkpoint's meta), holds the same rows
    and priorities and draws exactly the same samples as the original."""
    import json

    replay = PrioritizedReplay(8, FIELDS, seed=3)
    for start in range(0, 13, 3):  # 15 sequences into 8 rows: wrapped, next row = 7
        replay.add(sequences(range(start, start + 3)))
    replay.update_priorities([0, 5, 6], [4.0, 0.5, 9.0])
    replay.sample(4)  # the RNG has moved on
    arrays, scalars = replay.state_dict()
    assert scalars["size"] == 8 and scalars["next"] == 15 % 8 and scalars["inserted"] == 15

    loaded = PrioritizedReplay(8, FIELDS, seed=99)  # another seed: the state must override it
    loaded.load_state_dict(arrays, json.loads(json.dumps(scalars)))
    np.testing.assert_allclose(loaded.probabilities(np.arange(8)), replay.probabilities(np.arange(8)))
    for _ in range(3):
        (want, want_serials), (got, got_serials) = replay.sample(5), loaded.sample(5)
        np.testing.assert_array_equal(got["indices"], want["indices"])
        np.testing.assert_array_equal(got_serials, want_serials)
        for name in FIELDS:
            np.testing.assert_array_equal(got[name], want[name])
    loaded.add(sequences([100]))  # inserts continue at the saved ring position
    assert loaded._serial[7] == 15 and loaded.inserted == 16


def test_load_state_dict_names_the_field_that_does_not_fit():
    replay = PrioritizedReplay(8, FIELDS)
    replay.add(sequences([0, 1]))
    arrays, scalars = replay.state_dict()
    other = dict(FIELDS, obs=StepFieldSpec((L, 3), np.float32))
    with pytest.raises(ValueError, match=r"replay field obs is \[\[5, 2\], '<f4'\] in the checkpoint, \[\[5, 3\]"):
        PrioritizedReplay(8, other).load_state_dict(arrays, scalars)


class _LockThatLetsOthersIn:
    """The replay's lock, calling `between()` each time it is released: what
    the training thread would do while the reporting thread snapshots."""

    def __init__(self, between):
        self._lock, self._between, self._inside = threading.Lock(), between, False

    def __enter__(self):
        self._lock.acquire()

    def __exit__(self, *exc):
        self._lock.release()
        if not self._inside:
            self._inside = True
            try:
                self._between()
            finally:
                self._inside = False


@pytest.mark.unit
def test_a_snapshot_lets_adds_in_between_its_chunks_and_keeps_the_rows_as_they_were(monkeypatch):
    """The checkpoint's copy does not hold the lock for the whole replay (the
    training thread adds and samples between chunks), and rows overwritten
    before their chunk was copied are saved as they were when it began."""
    import seedq.replay.prioritized as prioritized

    capacity = 16
    replay = PrioritizedReplay(capacity, {"obs": StepFieldSpec((4,), np.int64)}, seed=0)
    replay.add({"obs": np.repeat(np.arange(capacity)[:, None], 4, axis=1)})  # row i holds i
    before = replay._data["obs"].copy()
    monkeypatch.setattr(prioritized, "SNAPSHOT_CHUNK_BYTES", 1, raising=False)  # one row per chunk
    adds_during = []

    def train_step():
        if replay._snapshot is not None:
            adds_during.append(replay._snapshot.copied)
            replay.add({"obs": np.full((3, 4), 100 + len(adds_during))})  # overwrites rows ahead of the copy
            replay.sample(2)

    replay._lock = _LockThatLetsOthersIn(train_step)
    arrays, scalars = replay.state_dict()
    assert len(adds_during) >= capacity - 1  # the training thread ran between chunks
    np.testing.assert_array_equal(arrays["data"][0], before)
    assert scalars["size"] == capacity and scalars["inserted"] == capacity
