"""The batcher's rule (seedq.server.batching): fixed rules, the `auto`
measurement driven by a simulated clock, and both rules on a real
InferenceServer."""

from __future__ import annotations

import asyncio

import jax
import numpy as np
import pytest

from seedq.agents.vtrace.agent import VTraceAgent
from seedq.config import ServerConfig, TrainConfig, VTraceConfig
from seedq.schema import EnvSpec
from seedq.server.batching import GREEDY, WAIT, BatchingRule, TrialSchedule
from seedq.server.env_table import EnvTable, EpisodeLog
from seedq.server.inference import InferenceServer
from seedq.server.unrolls import UnrollQueue
from seedq.wire.codec import Steps

pytestmark = pytest.mark.unit

SCHEDULE = TrialSchedule(warmup_seconds=2.0, window_seconds=1.0, rounds=3, hold_seconds=60.0)


class Workload:
    """A learner whose env steps per second depend on the batcher's rule:
    `advance` calls the rule once per simulated batch, as the batch loop does."""

    def __init__(self, rule: BatchingRule, rates: dict[str, float], streams: int = 2, dt: float = 0.01):
        self.rule, self.rates, self.streams, self.dt = rule, rates, streams, dt
        self.now, self.steps = 0.0, 0.0
        self.seen: list[tuple[float, str]] = []

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            mode = self.rule.current(self.now, int(self.steps), self.streams)
            self.seen.append((self.now, mode))
            self.steps += self.rates[mode] * self.dt
            self.now += self.dt

    def modes_between(self, start: float, end: float) -> set[str]:
        return {mode for t, mode in self.seen if start <= t < end}


@pytest.mark.parametrize("fixed", [WAIT, GREEDY])
def test_a_fixed_rule_never_changes(fixed):
    work = Workload(BatchingRule(fixed, SCHEDULE), {WAIT: 1000.0, GREEDY: 5000.0} if fixed == WAIT
                    else {WAIT: 5000.0, GREEDY: 1000.0})
    work.advance(200.0)
    assert work.modes_between(0, 200) == {fixed}
    assert work.rule.trials == 0


def test_auto_waits_through_the_warm_up_then_keeps_the_rule_that_served_more():
    work = Workload(BatchingRule("auto", SCHEDULE), {WAIT: 40_000.0, GREEDY: 55_000.0})
    work.advance(1.9)
    assert work.modes_between(0, 1.9) == {WAIT} and work.rule.trials == 0  # warm-up
    work.advance(6.5)  # six alternating one-second windows
    assert work.modes_between(2.0, 8.0) == {WAIT, GREEDY}
    assert work.rule.trials == 1 and work.rule.choice == GREEDY
    assert sorted(work.rule.last_rates) == [GREEDY, WAIT] and len(work.rule.last_rates[GREEDY]) == 3
    assert np.median(work.rule.last_rates[GREEDY]) == pytest.approx(55_000, rel=0.02)
    work.advance(50.0)
    assert work.modes_between(8.1, 58.0) == {GREEDY}  # held


def test_auto_keeps_waiting_when_waiting_serves_more_or_the_same():
    for greedy_rate in (30_000.0, 40_000.0):
        work = Workload(BatchingRule("auto", SCHEDULE), {WAIT: 40_000.0, GREEDY: greedy_rate})
        work.advance(60.0)
        assert work.rule.trials == 1 and work.rule.choice == WAIT
        assert work.modes_between(8.1, 60.0) == {WAIT}


def test_auto_measures_again_after_the_hold_and_follows_a_changed_load():
    work = Workload(BatchingRule("auto", SCHEDULE), {WAIT: 40_000.0, GREEDY: 55_000.0})
    work.advance(20.0)
    assert work.rule.choice == GREEDY
    work.rates = {WAIT: 30_000.0, GREEDY: 20_000.0}  # e.g. training started to need the cores
    work.advance(60.0)  # the hold ends at 68 s, the second trial at 74 s
    assert work.rule.trials == 2 and work.rule.choice == WAIT
    assert work.modes_between(74.1, 80.0) == {WAIT}


def test_auto_restarts_its_measurement_when_actors_come_or_go():
    work = Workload(BatchingRule("auto", SCHEDULE), {WAIT: 40_000.0, GREEDY: 55_000.0})
    work.advance(4.0)  # mid-trial
    work.streams = 8
    work.rates = {WAIT: 30_000.0, GREEDY: 25_000.0}
    work.advance(1.9)
    assert work.modes_between(4.0, 5.9) == {WAIT} and work.rule.trials == 0  # a fresh warm-up
    work.advance(7.0)
    assert work.rule.trials == 1 and work.rule.choice == WAIT  # the old windows were not counted


def test_an_unknown_rule_is_refused_in_one_line_naming_the_field():
    with pytest.raises(ValueError, match=r"^server.batching='fast': choose one of auto, wait, greedy$"):
        BatchingRule("fast")
    with pytest.raises(ValueError, match=r"^server.batching='fast': choose one of auto, wait, greedy$"):
        TrainConfig(server=ServerConfig(batching="fast")).validate()


def _server(rule: str, timeout_ms: float) -> InferenceServer:
    spec = EnvSpec("float32", (4,), num_actions=2)
    agent = VTraceAgent(spec, VTraceConfig())
    server = InferenceServer(agent, spec, EnvTable(EpisodeLog()), UnrollQueue(64), max_batch_size=8,
                             batch_timeout_ms=timeout_ms, rng=jax.random.PRNGKey(0),
                             batching=BatchingRule(rule))
    server.publish(agent.init(jax.random.PRNGKey(1)).params, 0)
    return server


def _steps(n: int) -> Steps:
    return Steps(np.arange(n, dtype=np.int32), np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool),
                 np.zeros((n, 4), np.float32))


@pytest.mark.parametrize("rule", [WAIT, GREEDY])
def test_the_wait_rule_waits_for_a_silent_stream_once_and_the_greedy_rule_never(rule):
    """Streams a and b share a first batch; then b falls silent while a sends
    five more steps. Waiting holds a's next batch for b until the timeout
    (once: b is not awaited after it missed a batch); greedy never waits."""
    server = _server(rule, timeout_ms=20.0)
    a, _ = server.connect("a", "run-a", 2)
    b, _ = server.connect("b", "run-b", 2)

    async def drive():
        batch_loop = asyncio.create_task(server.run())
        await asyncio.sleep(0)
        try:
            await asyncio.gather(server.submit(a, _steps(2)), server.submit(b, _steps(2)))
            for _ in range(5):
                await server.submit(a, _steps(2))
            await asyncio.sleep(0)
        finally:
            batch_loop.cancel()

    asyncio.run(drive())
    stats = server.stats
    assert stats.requests == 7 and stats.env_steps == 14
    if rule == WAIT:
        assert stats.timed_out_waits == 1 and b.timed_out_waits == 1
        assert stats.batches == 6 and stats.greedy_batches == 0  # a and b joined in the first
    else:
        assert stats.timed_out_waits == 0 and b.timed_out_waits == 0
        assert stats.greedy_batches == stats.batches >= 6
