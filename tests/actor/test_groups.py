"""The automatic group count (seedq.actor.groups): sized to what a request
really waits for, the network's round trip and the learner's serve time."""

import asyncio

import pytest

from seedq.transport import netdelay
from seedq.actor import groups as groups_lib
from seedq.actor.groups import GROUP_SLACK, MAX_GROUPS, MIN_GROUPED_RTT_SECONDS, groups_for, rechoose_groups
from seedq.actor.seed_actor import ActorStats, run_actor
from seedq.wire import codec


@pytest.mark.unit
def test_the_learners_serve_time_counts_toward_the_wait_the_groups_hide():
    for rtt, step, serve in ((0.025, 0.035, 0.015), (0.010, 0.040, 0.020), (0.025, 0.015, 0.015)):
        groups = groups_for(rtt, step, 63, serve)  # 63: no count fills the batch sizes exactly
        wait = rtt + serve
        assert wait + step / groups <= GROUP_SLACK * max(wait, step) + 1e-12
        if groups > 1:  # and one group fewer would not do
            assert wait + step / (groups - 1) > GROUP_SLACK * max(wait, step)


@pytest.mark.unit
def test_a_serve_time_alone_never_groups_a_local_actor():
    # Below the network floor a learner's wait is what local actors always had.
    assert groups_for(MIN_GROUPED_RTT_SECONDS / 2, 0.035, 64, serve_seconds=0.030) == 1


@pytest.mark.unit
def test_a_negative_serve_time_counts_as_none():
    # A request measured faster than the ping (a noisy ping) adds no wait.
    assert groups_for(0.025, 0.035, 64, serve_seconds=-0.005) == groups_for(0.025, 0.035, 64)


@pytest.mark.unit
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


@pytest.mark.e2e
def test_an_actor_reconnects_its_envs_in_the_groups_its_measured_waits_call_for(monkeypatch):
    """Behind a 10 ms round trip an actor of 8 CartPole envs starts with one
    group (one env's probe steps in microseconds); its connections then
    report 40 ms vector steps and 15 ms requests, so the second choice asks
    for more groups, and the actor serves every env again in that many streams."""
    import grpc

    from seedq.transport import channel as channel_lib

    monkeypatch.setattr(groups_lib, "RECHOICE_POLL_SECONDS", 0.001)
    step_seconds, request_seconds, num_envs = 0.040, 0.015, 8
    streams: dict[int, list[tuple[str, int]]] = {}  # the actor's group count -> its streams

    async def connection(stub, env, spec, *, actor_id, num_envs, stats, **_):
        streams.setdefault(stats.groups, []).append((actor_id, num_envs))
        if stats.groups > 1:  # regrouped: once every group has connected, the run ends
            if len(streams[stats.groups]) == stats.groups:
                raise codec.RunEnded("max_seconds")
            await asyncio.Event().wait()
        while True:
            stats.record_rtt(request_seconds, now=0.0)
            stats.env_seconds += step_seconds * num_envs / 8
            stats.frames += num_envs
            await asyncio.sleep(0)

    async def serve() -> ActorStats:
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        await channel_lib.add_health_service(server)
        await server.start()
        proxy = netdelay.DelayProxy(f"127.0.0.1:{port}", 5.0)
        try:
            address = await asyncio.get_running_loop().run_in_executor(None, proxy.start)
            return await asyncio.wait_for(
                run_actor(address, "CartPole-v1", num_envs, actor_id="a", groups=0, connection=connection), 30)
        finally:
            proxy.stop()
            await server.stop(None)

    stats = asyncio.run(serve())
    wanted = groups_for(0.010, step_seconds, num_envs, request_seconds - 0.010)
    assert wanted > 1
    assert streams[1] == [("a", num_envs)]
    regrouped = streams[stats.groups]
    assert sorted(name for name, _ in regrouped) == [f"a/g{k}" for k in range(stats.groups)]
    assert sum(n for _, n in regrouped) == num_envs
    # The measured ping may exceed 10 ms on a busy host: its count, never one group.
    assert 1 < stats.groups <= wanted
    assert stats.run_ended == "max_seconds"


@pytest.mark.unit
def test_groups_are_rounded_up_to_fill_the_learners_batch_sizes():
    for num_envs in (32, 64, 48):
        for wanted in range(2, MAX_GROUPS + 1):
            groups = groups_lib.aligned_groups(wanted, num_envs)
            assert wanted <= groups <= MAX_GROUPS
            sizes = groups_lib.group_sizes(num_envs, groups)
            fits = [g for g in range(wanted, MAX_GROUPS + 1)
                    if num_envs % g == 0 and num_envs // g % groups_lib.ALIGNED_GROUP_ENVS == 0]
            if fits:  # the fewest such groups, each a whole multiple of the learner's smallest batch
                assert groups == fits[0]
                assert all(size % groups_lib.ALIGNED_GROUP_ENVS == 0 for size in sizes)
            else:
                assert groups == wanted
    assert groups_lib.aligned_groups(1, 32) == 1
