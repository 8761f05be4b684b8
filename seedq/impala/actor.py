"""IMPALA actor: acts with a local copy of the policy and streams whole unrolls.

For the IMPALA-vs-SEED comparison (ARCHITECTURE.md section 2). The actor
holds the agent's network (JAX on the CPU), pulls the parameters from the
learner every `param_pull_every` unrolls (fp32, or int8 as in ActorQ), steps
its vector env with its own jitted `agent.act`, and sends finished unrolls
with their behaviour logits, policy versions and initial recurrent state.

Acting and unroll assembly are the SEED server's own acting core
(`seedq.rollout.core.ActingCore`: episode starts and book-keeping, the step
record, the unroll store with its overlap, reward clipping), fed the same
step stream the server would see, so the learner gets identical batches from
both architectures. The run config (agent, hyperparameters,
pull period, actor precision) comes from the learner in the handshake reply,
so actor and learner cannot disagree on it.

Connection handling (reconnect with backoff, fresh run id, stats file) is the
SEED actor's (`seed_actor.run_actor`), with `serve_connection` plugged in.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid

import grpc
import numpy as np

from seedq.actor.seed_actor import ActorStats, FatalActorError
from seedq.v1 import seed_pb2
from seedq.impala import codec as impala_codec
from seedq.wire import codec
from seedq import schema

log = logging.getLogger("seedq.actor")


class UnrollBuilder:
    """Local acting plus unroll assembly for one actor's N envs (slots 0..N-1
    of its own acting core).

    `step(params, version, obs [N, ...], rewards [N], terminated [N],
    truncated [N])` -> (actions [N, ...], finished unrolls or None), where the
    arguments are exactly what the SEED actor would send for one vector step
    and the unrolls are what the SEED server's store would emit for it.
    """

    def __init__(self, agent, spec: schema.EnvSpec, num_envs: int, rng, *, precision=None,
                 reward_clip: float = 0.0):
        """`precision`: an `InferencePrecision` for `agent` (fp32 when None)."""
        from seedq.rollout.core import ActingCore  # JAX: only IMPALA actors need it
        from seedq.quant.mode import InferencePrecision

        precision = precision or InferencePrecision(agent, spec, "fp32")
        self.core = ActingCore(agent, spec, precision, reward_clip=reward_clip, capacity=num_envs)
        self.slots = np.arange(num_envs)
        self.rng = rng
        self._frames = 0
        self._returns: list[float] = []
        self._lengths: list[int] = []

    def step(self, params, version: int, obs, rewards, terminated, truncated):
        result, self.rng = self.core.step(params, version, self.rng, self.slots, obs, rewards,
                                          terminated, truncated)
        self._frames += len(self.slots)
        self._returns += result.ended_returns.tolist()
        self._lengths += result.ended_lengths.tolist()
        return result.actions, result.unrolls

    def take_progress(self) -> tuple[int, list[float], list[int]]:
        """(frames stepped, episode returns, lengths) since the last call."""
        out = (self._frames, self._returns, self._lengths)
        self._frames, self._returns, self._lengths = 0, [], []
        return out


def learner_config(config_json: str, env_id: str):
    """The learner's run config as this actor acts with it: numbers and names
    only. Its env id is not used (one can name code to import or call:
    `factory:<module>:<function>`, gymnasium's `module:Env`); it must equal
    this actor's own `--env`, or the actor stops with one line."""
    import seedq
    from seedq import config as config_lib

    data = json.loads(config_json)
    if data.get("env") != env_id:
        raise FatalActorError(
            f"the learner trains on {data.get('env')!r}, this actor runs {env_id!r}: start it with the "
            f"learner's env (--env); an actor never takes the env from the learner")
    # A newer learner's fields this seedq does not know are left out (a
    # network they change shows as a parameter mismatch at the first pull).
    known, dropped = known_fields(config_lib.TrainConfig, data)
    if dropped:
        log.warning("the learner's config has fields this seedq does not know (ignored): %s", ", ".join(dropped))
    try:
        config = config_lib.from_saved(known)
    except (ValueError, TypeError) as e:
        raise FatalActorError(f"the learner's config does not fit this seedq {seedq.__version__}: {e}") from None
    if config.env != env_id:
        raise FatalActorError(
            f"the learner trains on {config.env!r}, this actor runs {env_id!r}: start it with the "
            f"learner's env (--env); an actor never takes the env from the learner")
    return config


def known_fields(cls, data: dict, where: str = "") -> tuple[dict, list[str]]:
    """(`data` without the keys `cls`, a config dataclass, lacks, nested; their dotted names)."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    known, dropped = {}, []
    for name, value in data.items():
        if name not in hints:
            dropped.append(where + name)
        elif dataclasses.is_dataclass(hints[name]) and isinstance(value, dict):
            known[name], more = known_fields(hints[name], value, f"{where}{name}.")
            dropped += more
        else:
            known[name] = value
    return known, dropped


def acting_for(config):
    """(agent, its precision mode) as actors run them: the learner's agent at
    the actor precision, built from the spec the learner builds it from. Not
    from the actor's own env spec: its vector env clips Box actions
    (ClipAction), so its bounds are infinite, and a network built from them
    would not squash the Gaussian's mean into the bounds as the learner's does
    (the behaviour policy would not be the policy the learner trains)."""
    from seedq.agents import make_agent
    from seedq.envs import env_spec
    from seedq.quant.mode import InferencePrecision

    spec = env_spec(config.env, config.env_options)
    agent = make_agent(config, spec)
    return agent, InferencePrecision(agent, spec, config.actor_precision)


def expected_params(agent, precision):
    """Shapes/dtypes of the parameters the learner publishes for `agent` at `precision`."""
    import jax

    return jax.eval_shape(
        lambda key: precision.publish(agent.inference_params(agent.init(key))),
        jax.ShapeDtypeStruct((2,), np.uint32),
    )


def check_params(params, expected) -> None:
    """Raises FatalActorError naming the first leaf that does not fit this actor's agent."""
    import jax

    got = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    want = dict(jax.tree_util.tree_flatten_with_path(expected)[0])
    for path in sorted(set(got) | set(want), key=str):
        name = jax.tree_util.keystr(path)
        if path not in got or path not in want:
            raise FatalActorError(f"params from the learner: leaf {name} is {'missing' if path in want else 'unexpected'}")
        g, w = got[path], want[path]
        if tuple(g.shape) != tuple(w.shape) or np.dtype(g.dtype) != np.dtype(w.dtype):
            raise FatalActorError(
                f"params from the learner: {name} is {g.dtype}{list(g.shape)}, "
                f"this actor expects {w.dtype}{list(w.shape)}"
            )


async def pull_params(stub, actor_id: str, have_version: int, stats: ActorStats, expected):
    """(params on the device, version) or None when the learner has nothing newer."""
    import jax

    started = time.perf_counter()
    call = stub.PullParams(seed_pb2.ParamsRequest(actor_id=actor_id, have_version=have_version))
    chunks = [chunk async for chunk in call]
    pulled = time.perf_counter()
    version, precision, data = impala_codec.join_chunks(chunks)
    stats.pull_seconds += pulled - started
    stats.pulls += 1
    stats.pull_bytes += sum(chunk.ByteSize() for chunk in chunks)
    if data is None:
        return None
    stats.params_pulled += 1
    params = impala_codec.deserialize_params(data)
    check_params(params, expected)
    params = jax.block_until_ready(jax.device_put(params))
    stats.load_seconds += time.perf_counter() - pulled
    return params, int(version)


async def serve_connection(
    stub, env, spec, *, actor_id, num_envs, env_id, seed, stats: ActorStats, skip_seconds=0.0
):
    """One PushUnrolls stream: handshake, then act locally and push unrolls until it breaks."""
    import jax

    run_id = uuid.uuid4().hex
    call = stub.PushUnrolls()
    try:
        hello = codec.encode_handshake(spec, actor_id=actor_id, run_id=run_id, num_envs=num_envs, env_id=env_id,
                                       reads_run_ended=True)
        await call.write(seed_pb2.UnrollMessage(handshake=hello.handshake))
        ack = await call.read()
        if ack is grpc.aio.EOF:
            raise ConnectionError("learner closed the stream during the handshake")
        raise_if_run_ended(ack)
        config = learner_config(ack.config_json, env_id)

        from seedq.rollout.core import training_reward_clip

        agent, precision = acting_for(config)
        expected = expected_params(agent, precision)
        stats.connections += 1
        log.info("impala actor %s connected (run %s, learner run %s)", actor_id, run_id, ack.learner_run)
        builder = UnrollBuilder(agent, spec, num_envs, jax.random.PRNGKey(seed), precision=precision,
                                reward_clip=training_reward_clip(config))
        params, version = await pull_params(stub, actor_id, -1, stats, expected)
        obs, _ = env.reset(seed=seed)
        rewards = np.zeros(num_envs, np.float32)
        terminated = np.zeros(num_envs, bool)
        truncated = np.zeros(num_envs, bool)
        awaiting_ack, since_pull = False, 0
        while True:
            started = time.perf_counter()
            actions, unrolls = builder.step(params, version, obs, rewards, terminated, truncated)
            acted = time.perf_counter()
            stats.inference_seconds += acted - started
            if unrolls is not None:
                # One batch in flight: the previous one's ack is read only now,
                # so the learner's queueing overlaps with our next unroll.
                if awaiting_ack:
                    ack = await call.read()
                    if ack is grpc.aio.EOF:
                        raise ConnectionError("learner closed the stream")
                    raise_if_run_ended(ack)
                await call.write(impala_codec.encode_unrolls(unrolls, *builder.take_progress()))
                awaiting_ack = True
                stats.unroll_batches += 1
                stats.communication_seconds += time.perf_counter() - acted
                since_pull += 1
                if since_pull >= config.param_pull_every:
                    since_pull = 0
                    pulled = await pull_params(stub, actor_id, version, stats, expected)
                    if pulled is not None:
                        params, version = pulled
            stepping = time.perf_counter()
            obs, rewards, terminated, truncated, _ = env.step(actions)
            stats.env_seconds += time.perf_counter() - stepping
            stats.frames += num_envs
            stats.steps += 1
            stats.step_done()
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.UNIMPLEMENTED:
            raise FatalActorError(
                "the learner does not run architecture=impala (start it with --architecture impala)"
            ) from None
        raise
    finally:
        call.cancel()


def raise_if_run_ended(ack: seed_pb2.UnrollAck) -> None:
    """codec.RunEnded when the learner's ack says the run is over (docs/wire.md "The end of a run")."""
    if ack.run_ended:
        raise codec.RunEnded(ack.run_ended, ack.learner_run)


def main(args) -> int:
    """Entry point of `seedq impala-actor`."""
    # JAX on the CPU (an accelerator belongs to the learner), set before JAX is imported.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from seedq.process import jax_setup
    from seedq.actor import seed_actor

    jax_setup.configure()
    return seed_actor.main(args, connection=serve_connection, prog="seedq impala-actor")
