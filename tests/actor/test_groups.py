"""The automatic group count (seedq.actor.groups): sized to what a request
really waits for, the network's round trip and the learner's serve time."""

import asyncio

import pytest

from seedq.actor import groups as groups_lib
from seedq.actor.groups import GROUP_SLACK, MAX_GROUPS, MIN_GROUPED_RTT_SECONDS, groups_for, rechoose_groups
from seedq.actor.seed_actor import ActorStats

pytestmark = pytest.mark.unit


def test_the_learners_serve_time_counts_toward_the_wait_the_groups_hide():
    for rtt, step, serve in ((0.025, 0.035, 0.015), (0.010, 0.040, 0.020), (0.025, 0.015, 0.015)):
        groups = groups_for(rtt, step, 64, serve)
        wait = rtt + serve
        assert wait + step / groups <= GROUP_SLACK * max(wait, step) + 1e-12
        if groups > 1:  # and one group fewer would not do
            assert wait + step / (groups - 1) > GROUP_SLACK * max(wait, step)


def test_a_serve_time_alone_never_groups_a_local_actor():
    # Below the network floor a learner's wait is what local actors always had.
    assert groups_for(MIN_GROUPED_RTT_SECONDS / 2, 0.035, 64, serve_seconds=0.030) == 1


def test_a_negative_serve_time_counts_as_none():
    # A request measured faster than the ping (a noisy ping) adds no wait.
    assert groups_for(0.025, 0.035, 64, serve_seconds=-0.005) == groups_for(0.025, 0.035, 64)


def test_the_count_is_chosen_again_from_the_requests_measured_waits(monkeypatch):
    """A fake actor whose requests take the ping's 25 ms plus 15 ms of the
    learner's, and whose 32 envs step in 35 ms: the re-choice sees both."""
    monkeypatch.setattr(groups_lib, "RECHOICE_POLL_SECONDS", 0.001)
    rtt, serve, step, num_envs, groups = 0.025, 0.015, 0.035, 32, 3
    stats = ActorStats()

    async def fake_groups() -> None:
        while True:
            for _ in range(groups):
                stats.record_rtt(rtt + serve, now=0.0)
                stats.env_seconds += step / groups
                stats.frames += num_envs // groups
            await asyncio.sleep(0)

    async def choose() -> int:
        serving = asyncio.create_task(fake_groups())
        try:
            return await asyncio.wait_for(rechoose_groups(stats, rtt, num_envs, groups, "a"), 10)
        finally:
            serving.cancel()

    chosen = asyncio.run(choose())
    # num_envs // groups frames per group step: the measured step is per frame x num_envs.
    measured_step = step / (num_envs // groups * groups) * num_envs
    assert chosen == groups_for(rtt, measured_step, num_envs, serve)
    assert chosen > groups_for(rtt, measured_step, num_envs)  # the ping alone chose fewer
    assert chosen <= MAX_GROUPS
