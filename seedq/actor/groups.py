"""Actor groups (docs/wire.md "Actor groups"): how many groups an actor's
envs form, from the channel's round trip, the env's step time and what the
learner's answers take, and the vector env of each group. `seed_actor`
streams each group on its own."""

from __future__ import annotations

import asyncio
import logging
import math
import time

import numpy as np

from seedq import schema
from seedq.envs import make_vector_env
from seedq.wire.groups import SMALLEST_BATCH_BUCKET

log = logging.getLogger("seedq.actor")

# Actor groups (docs/wire.md "Actor groups"): below this round trip a second
# group gains less than its extra messages cost the learner, so local runs
# keep one stream per actor, as before.
MIN_GROUPED_RTT_SECONDS = 0.002
# More groups than this add messages without hiding more of the round trip.
MAX_GROUPS = 8
# Groups are added until an actor's cycle is at most this factor above the
# better of stepping alone or a request's wait alone (`groups_for`).
GROUP_SLACK = 1.25
# Groups of a multiple of the learner's smallest batch bucket send messages
# that fill its padded batch sizes, where groups of 11 would be padded to 16
# and the learner would compute 5 steps in 16 for nothing.
ALIGNED_GROUP_ENVS = SMALLEST_BATCH_BUCKET
# Health-service pings that measure the channel's round trip (after one that
# may include connecting).
RTT_PINGS = 5
# Steps of one env, random actions, that time stepping before choosing groups.
TIMED_STEPS = 20
# The automatic count is chosen again once, from requests' measured waits:
# each group's first requests are left out (the learner compiles for new
# batch shapes and tries its batching rules), the next are sampled.
SETTLE_REQUESTS_PER_GROUP = 20
SAMPLED_REQUESTS_PER_GROUP = 20
# How often the re-choice looks at the requests counted so far.
RECHOICE_POLL_SECONDS = 0.1


def group_sizes(num_envs: int, groups: int) -> list[int]:
    """How `num_envs` envs split into `groups` groups: as evenly as possible, the larger first."""
    return [len(part) for part in np.array_split(np.arange(num_envs), groups)]


def groups_for(rtt_seconds: float, step_seconds: float, num_envs: int, serve_seconds: float = 0.0) -> int:
    """The automatic group count (seconds in, a count out). A request waits
    w = r + q: the network's round trip r (a ping's) and the learner's serve
    time q (batching and inference; 0 before any was measured). With G
    groups taking turns, one group's cycle is w plus its share s/G of the
    vector step s, and the actor's cycle can never beat max(s, w) (its CPU,
    or its requests): the fewest groups whose cycle w + s/G is within
    GROUP_SLACK of that bound. One group where r is below
    MIN_GROUPED_RTT_SECONDS (the learner's own wait alone is what a local
    actor has always had), and where stepping is so cheap against the wait
    that groups would add messages and gain nothing; at most MAX_GROUPS and
    one env per group, and rounded up to fill the learner's batch sizes
    (`aligned_groups`)."""
    if rtt_seconds < MIN_GROUPED_RTT_SECONDS or step_seconds <= 0:
        return 1
    wait = rtt_seconds + max(serve_seconds, 0.0)
    room = GROUP_SLACK * max(step_seconds, wait) - wait
    wanted = math.ceil(step_seconds / room - 1e-9)  # 4.0000001 is 4 groups
    return aligned_groups(max(1, min(num_envs, MAX_GROUPS, wanted)), num_envs)


def aligned_groups(groups: int, num_envs: int) -> int:
    """The fewest groups from `groups` up to MAX_GROUPS whose groups all hold
    a whole multiple of ALIGNED_GROUP_ENVS envs (32 envs: 3 -> 4 groups of
    8), or `groups` itself where there is none or one group is enough."""
    if groups == 1:
        return 1
    for count in range(groups, MAX_GROUPS + 1):
        if num_envs % count == 0 and (num_envs // count) % ALIGNED_GROUP_ENVS == 0:
            return count
    return groups


async def channel_rtt_seconds(channel, metadata=None, pings: int = RTT_PINGS) -> float:
    """The channel's round trip: the shortest of `pings` gRPC health Checks
    on it (not a StepBatch's, which includes batching and inference). The
    shortest, not the median: a busy host only ever adds to a ping, and a
    loopback proxy on a loaded machine gave medians over 2 ms."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    stub = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest(service="")
    await stub.Check(request, metadata=metadata)  # may connect: not timed
    times = []
    for _ in range(pings):
        sent = time.perf_counter()
        await stub.Check(request, metadata=metadata)
        times.append(time.perf_counter() - sent)
    return min(times)


def vector_step_seconds(env, spec, steps: int = TIMED_STEPS, seed: int = 0) -> float:
    """Median seconds of one step of the whole vector env under random actions
    (the connection resets it afterwards)."""
    from seedq.envs import random_actions

    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    times = []
    for _ in range(steps):
        actions = random_actions(spec, env.num_envs, rng)
        started = time.perf_counter()
        env.step(actions)
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def probe_env(env_id: str, num_envs: int, options, timed: bool) -> tuple[schema.EnvSpec, float]:
    """(spec, estimated seconds of one step of `num_envs` envs; 0 unless
    `timed`) from one env: making a whole vector env twice would double the
    actor's start-up (over 15 s for 32 Atari envs on a loaded machine)."""
    probe = make_vector_env(env_id, 1, options=options)
    try:
        spec = schema.spec_from_spaces(probe.single_observation_space, probe.single_action_space)
        return spec, vector_step_seconds(probe, spec) * num_envs if timed else 0.0
    finally:
        probe.close()


def make_groups(env_id: str, num_envs: int, options, groups: int) -> list:
    """The vector env of each of `groups` groups."""
    return [make_vector_env(env_id, n, options=options) for n in group_sizes(num_envs, groups)]


async def group_envs(channel, metadata, env_id, num_envs, options, groups, step_seconds,
                     actor_id) -> tuple[list, float | None]:
    """(the vector env of each group, the channel's round trip in seconds or
    None). `groups` 0: chosen from the round trip and the step time
    (`groups_for`); the round trip is returned for `rechoose_groups`, and is
    None where the count was given or the round trip is too short to group."""
    rtt = None
    if groups == 0:
        rtt = await channel_rtt_seconds(channel, metadata)
        groups = groups_for(rtt, step_seconds, num_envs)
        log.info("actor %s: round trip %.1f ms, vector step %.1f ms: %d env groups",
                 actor_id, rtt * 1e3, step_seconds * 1e3, groups)
        if rtt < MIN_GROUPED_RTT_SECONDS:
            rtt = None
    return make_groups(env_id, num_envs, options, groups), rtt


class Regroup(Exception):
    """The measured waits call for `groups` groups: reconnect with that many."""

    def __init__(self, groups: int):
        super().__init__(f"{groups} env groups")
        self.groups = groups


async def rechoose_groups(stats, rtt_seconds: float, num_envs: int, groups: int, actor_id: str) -> int:
    """The automatic count chosen again from what requests really waited,
    once an actor has served `groups` groups a while (its ActorStats
    `stats`): the median of the sampled requests' times (seen by the actor)
    less the ping's `rtt_seconds` is the learner's serve time, and the step
    time is the one measured meanwhile (env seconds per frame x `num_envs`)."""
    async def requests_reach(count: int) -> None:
        while stats.steps < count:
            await asyncio.sleep(RECHOICE_POLL_SECONDS)

    await requests_reach(stats.steps + SETTLE_REQUESTS_PER_GROUP * groups)
    since, env_seconds, frames = stats.requests.count, stats.env_seconds, stats.frames
    await requests_reach(stats.steps + SAMPLED_REQUESTS_PER_GROUP * groups)
    (request_seconds,) = stats.requests.percentiles((50,), since=since)
    step_seconds = (stats.env_seconds - env_seconds) / max(stats.frames - frames, 1) * num_envs
    serve_seconds = max(request_seconds - rtt_seconds, 0.0)
    chosen = groups_for(rtt_seconds, step_seconds, num_envs, serve_seconds)
    log.info("actor %s: requests wait %.1f ms (%.1f ms of it the learner's), vector step %.1f ms: "
             "%d env groups", actor_id, request_seconds * 1e3, serve_seconds * 1e3, step_seconds * 1e3, chosen)
    return chosen
