"""Unit tests of the learner-side bookkeeping: UnrollStore, and the EnvTable
that feeds it (the queue after it: tests/server/test_unrolls.py)."""

import asyncio

import jax
import numpy as np
import pytest

from seedq.agents.vtrace.agent import VTraceAgent
from seedq.config import VTraceConfig
from seedq.schema import EnvSpec, StepFieldSpec
from seedq.server.env_table import EnvTable, EpisodeLog
from seedq.rollout.core import EpisodeTracker
from seedq.rollout.store import UnrollStore
from seedq.server.inference import InferenceServer
from seedq.server.unrolls import UnrollQueue
from seedq.wire.codec import Steps
from tests.serving import held_steps

pytestmark = pytest.mark.unit

T = 4  # unroll_length: unrolls hold T+1 = 5 steps
FIELDS = {
    "obs": StepFieldSpec((3,), np.float32),
    "reward": StepFieldSpec((), np.float32),
    "first": StepFieldSpec((), bool),
    "action": StepFieldSpec((2,), np.int32),
}


def step_for(slots, t):
    """A step whose every field encodes (slot, t), so unroll contents can be traced."""
    slots = np.asarray(slots)
    n = len(slots)
    code = slots * 1000 + t
    return {
        "obs": np.stack([code, code + 0.25, -code], axis=1).astype(np.float32),
        "reward": code.astype(np.float32),
        "first": (code % 3 == 0),
        "action": np.stack([code, 7 * code], axis=1).astype(np.int32).reshape(n, 2),
    }


def expected_unroll(slot, ts):
    """The unroll [T+1, ...] of one slot made of its steps at times ts."""
    steps = [step_for([slot], t) for t in ts]
    return {name: np.concatenate([s[name] for s in steps]) for name in FIELDS}


def assert_unroll(unrolls, row, slot, ts):
    expected = expected_unroll(slot, ts)
    for name in FIELDS:
        np.testing.assert_array_equal(unrolls[name][row], expected[name], err_msg=name)


# --- UnrollStore -----------------------------------------------------------------


def test_store_rejects_bad_length():
    with pytest.raises(ValueError):
        UnrollStore(1, FIELDS)


def test_store_emits_unroll_of_t_plus_1_when_full():
    store = UnrollStore(T + 1, FIELDS, capacity=4)
    slots = np.array([0, 1, 2])
    for t in range(T):
        assert store.append(slots, step_for(slots, t)) is None
        np.testing.assert_array_equal(held_steps(store, slots), [t + 1] * 3)
    unrolls = store.append(slots, step_for(slots, T))
    assert unrolls is not None
    assert set(unrolls) == set(FIELDS)
    for name, spec in FIELDS.items():
        assert unrolls[name].shape == (3, T + 1, *spec.shape), name
        assert unrolls[name].dtype == np.dtype(spec.dtype), name
    for row, slot in enumerate(slots):
        assert_unroll(unrolls, row, slot, range(T + 1))
    # The finished unroll's last step is kept as the first of the next one.
    np.testing.assert_array_equal(held_steps(store, slots), [1, 1, 1])


def test_store_consecutive_unrolls_overlap_by_one_step():
    store = UnrollStore(T + 1, FIELDS, capacity=2)
    slots = np.array([0, 1])
    out = []
    for t in range(3 * T + 1):
        unrolls = store.append(slots, step_for(slots, t))
        if unrolls is not None:
            out.append((t, unrolls))
    # Unrolls complete at t = T, 2T, 3T.
    assert [t for t, _ in out] == [T, 2 * T, 3 * T]
    for k, (_, unrolls) in enumerate(out):
        for row, slot in enumerate(slots):
            assert_unroll(unrolls, row, slot, range(k * T, k * T + T + 1))
    for (_, a), (_, b) in zip(out, out[1:]):
        for name in FIELDS:
            np.testing.assert_array_equal(a[name][:, -1], b[name][:, 0], err_msg=name)
            # ... and only one step: the second step of b is new.
            assert not np.array_equal(a[name][:, -1], b[name][:, 1]) or name == "first"


def test_store_returned_unrolls_are_copies():
    store = UnrollStore(T + 1, FIELDS, capacity=1)
    slots = np.array([0])
    for t in range(T):
        store.append(slots, step_for(slots, t))
    unrolls = store.append(slots, step_for(slots, T))
    snapshot = {k: v.copy() for k, v in unrolls.items()}
    for t in range(T + 1, 2 * T + 1):  # overwrite the whole buffer
        store.append(slots, step_for(slots, t))
    for name in FIELDS:
        np.testing.assert_array_equal(unrolls[name], snapshot[name])


def test_store_slots_are_independent():
    store = UnrollStore(T + 1, FIELDS, capacity=8)
    # Slot 5 steps every time, slot 2 every other time, slot 7 only at the start.
    times = {2: 0, 5: 0, 7: 0}
    done = {2: [], 5: [], 7: []}
    for i in range(4 * T):
        slots = [5] + ([2] if i % 2 == 0 else []) + ([7] if i < 3 else [])
        # Mixed order (not sorted) on purpose.
        slots = np.array(slots[::-1] if i % 3 == 0 else slots)
        step = {
            name: np.concatenate([step_for([s], times[s])[name] for s in slots])
            for name in FIELDS
        }
        unrolls = store.append(slots, step)
        for s in slots:
            times[s] += 1
        completed = [s for s in slots if times[s] > T and (times[s] - 1) % T == 0]
        if unrolls is None:
            assert completed == []
            continue
        # Rows come in the order of the request's slots that completed.
        assert len(unrolls["obs"]) == len(completed)
        for row, s in enumerate(completed):
            start = times[s] - 1 - T
            assert_unroll(unrolls, row, s, range(start, start + T + 1))
            done[s].append(start)
    assert done[5] == [0, T, 2 * T]
    assert done[2] == [0]
    assert done[7] == []
    # Slot 2: 8 steps = one unroll (5) + 3 more after the kept overlap step -> 4.
    # Slot 5: 16 steps = unrolls at 5, 9, 13, then 3 more -> 4. Slot 7: 3 steps.
    assert (times[2], times[5], times[7]) == (2 * T, 4 * T, 3)
    np.testing.assert_array_equal(held_steps(store, np.array([2, 5, 7, 0])), [4, 4, 3, 0])


def test_store_drop_discards_partial_unroll():
    store = UnrollStore(T + 1, FIELDS, capacity=3)
    slots = np.array([0, 1, 2])
    for t in range(T - 1):
        store.append(slots, step_for(slots, t))
    np.testing.assert_array_equal(held_steps(store, slots), [T - 1] * 3)
    assert store.drop(np.array([1])) == T - 1  # never-emitted steps: all lost
    assert store.dropped_steps == T - 1
    np.testing.assert_array_equal(held_steps(store, slots), [T - 1, 0, T - 1])
    # Slots 0 and 2 complete after 2 more steps; slot 1 starts fresh at t = 100.
    out = None
    for t in range(T - 1, T + 1):
        out = store.append(np.array([0, 2]), step_for([0, 2], t))
    assert out is not None and len(out["obs"]) == 2
    for t in range(100, 100 + T):
        assert store.append(np.array([1]), step_for([1], t)) is None
    unrolls = store.append(np.array([1]), step_for([1], 100 + T))
    assert unrolls is not None
    assert_unroll(unrolls, 0, 1, range(100, 100 + T + 1))
    dropped = np.array([1000 + t for t in range(T - 1)], np.float32)  # slot 1's rewards at t < T-1
    assert not np.isin(unrolls["reward"][0], dropped).any()


def test_store_drop_after_full_unroll_discards_overlap_step():
    store = UnrollStore(T + 1, FIELDS, capacity=1)
    slots = np.array([0])
    for t in range(T + 1):
        store.append(slots, step_for(slots, t))
    assert held_steps(store, slots)[0] == 1
    # The held step went out as the last step of the emitted unroll: nothing lost.
    assert store.drop(slots) == 0
    assert held_steps(store, slots)[0] == 0
    for t in range(10, 13):
        store.append(slots, step_for(slots, t))
    assert store.drop(slots) == 3 and store.dropped_steps == 3  # fresh again: all 3 lost
    for t in range(50, 50 + T):
        assert store.append(slots, step_for(slots, t)) is None
    unrolls = store.append(slots, step_for(slots, 50 + T))
    assert unrolls is not None
    assert_unroll(unrolls, 0, 0, range(50, 51 + T))


def test_store_ensure_capacity_keeps_data():
    store = UnrollStore(T + 1, FIELDS, capacity=2)
    assert store.capacity == 2
    store.append(np.array([0, 1]), step_for([0, 1], 0))
    store.append(np.array([1]), step_for([1], 1))
    store.ensure_capacity(2)  # no-op
    assert store.capacity == 2
    store.ensure_capacity(9)
    assert store.capacity >= 9
    np.testing.assert_array_equal(held_steps(store, np.arange(9)), [1, 2] + [0] * 7)
    store.ensure_capacity(3)  # never shrinks
    assert store.capacity >= 9
    # Finish every unroll, new slots included: old steps survived the growth.
    t0, t1 = 1, 2
    results = []
    for _ in range(T + 1):
        slots = np.array([0, 1, 8])
        # slot 8 started now: its own timeline starting at 0.
        step = {
            name: np.concatenate(
                [step_for([0], t0)[name], step_for([1], t1)[name], step_for([8], t0 - 1)[name]]
            )
            for name in FIELDS
        }
        out = store.append(slots, step)
        if out is not None:
            results.append((t0, t1, out))
        t0 += 1
        t1 += 1
    # Slot 1 completes first (it had 2 steps), then slot 0, then slot 8.
    assert len(results) == 3
    assert_unroll(results[0][2], 0, 1, range(T + 1))
    assert_unroll(results[1][2], 0, 0, range(T + 1))
    assert_unroll(results[2][2], 0, 8, range(T + 1))


def test_store_append_rejects_wrong_fields():
    store = UnrollStore(T + 1, FIELDS, capacity=1)
    step = step_for([0], 0)
    del step["action"]
    with pytest.raises(KeyError):
        store.append(np.array([0]), step)


def test_a_stream_released_between_answer_and_record_leaves_no_step_behind():
    """The server records a batch one event-loop pass after answering it; a
    stream released in between (its actor gone) must not get that step written
    into its freed slots afterwards: release completes the record first, then
    drops the partial unroll."""
    spec = EnvSpec("float32", (4,), num_actions=2)
    agent = VTraceAgent(spec, VTraceConfig())
    server = InferenceServer(agent, spec, EnvTable(EpisodeLog()), UnrollQueue(64), max_batch_size=8,
                             batch_timeout_ms=0.0, rng=jax.random.PRNGKey(0))
    server.publish(agent.init(jax.random.PRNGKey(1)).params, 0)
    entry, _ = server.connect("a", "run", 2)
    steps = Steps(np.arange(2, dtype=np.int32), np.zeros(2, np.float32), np.zeros(2, bool), np.zeros(2, bool),
                  np.zeros((2, 4), np.float32))

    async def answered_then_released():
        batch_loop = asyncio.create_task(server.run())
        await asyncio.sleep(0)
        try:
            await server.submit(entry, steps)  # one step recorded
            await asyncio.sleep(0)
            held = list(held_steps(server.store, entry.slots))
            await server.submit(entry, steps)  # answered; its record is still to come
            server.release(entry)
            await asyncio.sleep(0)  # the batch loop's turn to record
            return held
        finally:
            batch_loop.cancel()

    assert asyncio.run(answered_then_released()) == [1, 1]
    np.testing.assert_array_equal(held_steps(server.store, entry.slots), [0, 0])
    assert server.store.dropped_steps == 4  # both steps of both envs, counted as lost


# --- EnvTable ----------------------------------------------------------------------


class BookedTable(EnvTable):
    """The env table with the acting core's episode tracker, booked as the
    server books each step (`InferenceServer.connect` and `_infer`)."""

    def __init__(self, log):
        super().__init__(log)
        self.tracker = EpisodeTracker()

    def connect(self, actor_id, run_id, num_envs):
        entry, superseded = super().connect(actor_id, run_id, num_envs)
        self.tracker.ensure_capacity(self.num_slots)
        self.tracker.start(entry.slots)
        return entry, superseded

    def observe(self, slots, rewards, terminated, truncated):
        first, ended, returns, lengths = self.tracker.observe(slots, rewards, terminated, truncated)
        self.book_episodes(len(slots), returns[ended], lengths[ended])
        return first


def make_table():
    log = EpisodeLog(window=10)
    return BookedTable(log), log


def test_table_slot_allocation_and_reuse():
    table, _ = make_table()
    a, old = table.connect("a", "r", 3)
    assert old is None
    b, _ = table.connect("b", "r", 2)
    assert a.first_slot == 0 and list(a.slots) == [0, 1, 2]
    assert b.first_slot == 3 and list(b.slots) == [3, 4]
    assert table.num_slots == 5 and table.num_connected == 2
    np.testing.assert_array_equal(table.release(a), [0, 1, 2])
    assert a.closed and table.num_connected == 1
    assert table.release(a) is None  # second release: nothing
    c, _ = table.connect("c", "r", 3)
    assert list(c.slots) == [0, 1, 2]  # reused
    d, _ = table.connect("d", "r", 2)
    assert list(d.slots) == [5, 6]  # nothing free: new slots
    assert table.num_slots == 7
    table.release(b)
    e, _ = table.connect("e", "r", 1)
    f, _ = table.connect("f", "r", 1)
    assert (e.first_slot, f.first_slot) == (3, 4)  # a freed block split in two
    g, _ = table.connect("g", "r", 4)
    assert list(g.slots) == [7, 8, 9, 10]
    live = [c, d, e, f, g]
    all_slots = np.concatenate([x.slots for x in live])
    assert len(np.unique(all_slots)) == len(all_slots)  # no slot handed out twice
    assert table.num_connected == 5
    assert table.runs_started == 7


def test_table_same_run_twice_is_refused():
    table, _ = make_table()
    table.connect("a", "r1", 2)
    with pytest.raises(ValueError):
        table.connect("a", "r1", 2)
    assert table.num_connected == 1 and table.runs_started == 1


def test_table_first_flags():
    table, _ = make_table()
    a, _ = table.connect("a", "r", 3)
    slots = a.slots
    z = np.zeros(3, bool)
    r = np.zeros(3, np.float32)
    np.testing.assert_array_equal(table.observe(slots, r, z, z), [True] * 3)  # on connect
    np.testing.assert_array_equal(table.observe(slots, r, z, z), [False] * 3)
    term = np.array([True, False, False])
    trunc = np.array([False, False, True])
    np.testing.assert_array_equal(table.observe(slots, r, term, trunc), [False] * 3)
    np.testing.assert_array_equal(table.observe(slots, r, z, z), [True, False, True])
    np.testing.assert_array_equal(table.observe(slots, r, z, z), [False] * 3)
    # Subset of slots: only env 1 steps and terminates; env 0's flag is untouched.
    sub = slots[[1]]
    table.observe(sub, r[:1], np.array([True]), np.array([False]))
    np.testing.assert_array_equal(table.observe(slots[[0]], r[:1], z[:1], z[:1]), [False])
    np.testing.assert_array_equal(table.observe(sub, r[:1], z[:1], z[:1]), [True])
    assert table.frames == 3 * 5 + 3


def test_table_episode_log_from_scripted_sequence():
    table, log = make_table()
    a, _ = table.connect("a", "r", 2)
    # (rewards, terminated, truncated) per vector step of envs 0 and 1.
    script = [
        ([99.0, -99.0], [0, 0], [0, 0]),  # connection step: rewards belong to no episode
        ([1.0, 10.0], [0, 0], [0, 0]),
        ([2.0, 10.0], [0, 0], [0, 0]),
        ([3.0, 10.0], [1, 0], [0, 0]),  # env 0 terminates: 1 + 2 + 3 = 6, 3 steps
        ([0.0, 10.0], [0, 1], [0, 0]),  # env 0 reset step; env 1 terminates: 40, 4 steps
        ([0.5, 7.0], [0, 0], [0, 0]),  # env 1 reset step (reward ignored)
        ([0.5, -1.0], [0, 0], [1, 0]),  # env 0 truncated: 0.5 + 0.5 = 1.0, 2 steps
        ([5.0, -2.0], [0, 0], [0, 0]),  # env 0 reset step (reward ignored)
        ([4.0, -3.0], [0, 0], [0, 1]),  # env 1 truncated: -1 - 2 - 3 = -6, 3 steps
    ]
    firsts = []
    for rewards, term, trunc in script:
        firsts.append(
            table.observe(
                a.slots, np.array(rewards, np.float32), np.array(term, bool), np.array(trunc, bool)
            ).tolist()
        )
    assert firsts == [
        [True, True], [False, False], [False, False], [False, False],
        [True, False], [False, True], [False, False], [True, False], [False, False],
    ]
    count, mean_return, mean_length, full = log.snapshot()
    assert count == 4
    returns = [r for _, r in log.history]
    assert returns == [6.0, 40.0, 1.0, -6.0]
    frames = [f for f, _ in log.history]
    assert frames == [2 * 4, 2 * 5, 2 * 7, 2 * 9]  # table frames after the ending step
    assert mean_return == pytest.approx((6.0 + 40.0 + 1.0 - 6.0) / 4)
    assert mean_length == pytest.approx((3 + 4 + 2 + 3) / 4)
    assert not full
    # env 0 is mid-episode (4.0 after its reset step); env 1's next step is a first.
    assert table.observe(a.slots, np.zeros(2, np.float32), np.array([1, 0], bool),
                         np.zeros(2, bool)).tolist() == [False, True]
    assert log.snapshot()[0] == 5
    assert log.history[-1][1] == 4.0  # 4.0 + 0.0, 2 steps
    assert log.snapshot()[2] == pytest.approx((3 + 4 + 2 + 3 + 2) / 5)


def test_episode_log_window():
    log = EpisodeLog(window=2, history=3)
    assert log.snapshot() == (0, None, None, False)
    log.add(np.array([1.0, 2.0, 3.0]), np.array([1, 2, 3]), frames=10)
    count, mean_return, mean_length, full = log.snapshot()
    assert (count, mean_return, mean_length, full) == (3, 2.5, 2.5, True)
    log.add(np.array([5.0, 6.0]), np.array([5, 6]), frames=20)
    assert list(log.history) == [(10, 3.0), (20, 5.0), (20, 6.0)]


def test_table_restart_with_new_run_id_supersedes_old_entry():
    table, log = make_table()
    old, _ = table.connect("a", "r1", 2)
    other, _ = table.connect("b", "r1", 2)
    z = np.zeros(2, bool)
    table.observe(old.slots, np.zeros(2, np.float32), z, z)
    table.observe(old.slots, np.ones(2, np.float32), z, z)  # mid-episode
    new, superseded = table.connect("a", "r2", 2)
    assert superseded is old
    assert old.closed and not new.closed and not other.closed
    assert new.run_id == "r2" and new.actor_id == "a"
    assert table.runs_started == 3
    assert table.num_connected == 2  # "a" (new run) and "b"
    # Fresh episodes for the new run, whatever slots it got.
    np.testing.assert_array_equal(table.observe(new.slots, np.ones(2, np.float32), z, z), [True, True])
    # The abandoned episode was never logged.
    assert log.snapshot()[0] == 0
    # The old stream's late release must not evict the new run.
    assert table.release(old) is None
    assert table.num_connected == 2
    table.release(new)
    assert table.num_connected == 1
    # After the new run ends, the same actor can come back with yet another run.
    again, superseded = table.connect("a", "r3", 2)
    assert superseded is None or superseded.closed
    assert table.num_connected == 2 and table.runs_started == 4


def test_store_longer_overlap_trains_every_step_once():
    """R2D2-style cutting: sequences of L steps sharing `overlap` steps.

    Step t of an env lands in the non-overlapping tail of exactly one
    sequence, and sequence k starts at k * (L - overlap).
    """
    length, overlap = 7, 3
    store = UnrollStore(length, FIELDS, overlap=overlap, capacity=2)
    slots = np.array([0, 1])
    out = []
    for t in range(length + 3 * (length - overlap)):
        unrolls = store.append(slots, step_for(slots, t))
        if unrolls is not None:
            out.append(unrolls)
    assert len(out) == 4
    stride = length - overlap
    for k, unrolls in enumerate(out):
        for row, slot in enumerate(slots):
            assert_unroll(unrolls, row, slot, range(k * stride, k * stride + length))


def test_store_initial_only_fields_emit_first_step():
    fields = dict(FIELDS, core=StepFieldSpec((2,), np.float32))
    store = UnrollStore(4, fields, overlap=1, initial_only=frozenset({"core"}), capacity=1)
    slots = np.array([0])
    emitted = []
    for t in range(7):
        step = dict(step_for(slots, t), core=np.full((1, 2), t, np.float32))
        unrolls = store.append(slots, step)
        if unrolls is not None:
            emitted.append(unrolls)
    assert [u["core"].shape for u in emitted] == [(1, 2), (1, 2)]
    # Sequence k starts at step 3k: its stored state is the one of that step.
    assert [float(u["core"][0, 0]) for u in emitted] == [0.0, 3.0]
    assert emitted[0]["reward"].shape == (1, 4)


def test_store_rejects_overlap_not_below_length():
    with pytest.raises(ValueError):
        UnrollStore(4, FIELDS, overlap=4)


