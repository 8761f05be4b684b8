"""`seedq bench learner`: what the learner alone can consume, and what its
inference can answer, for one env and one agent config.

Training runs the agent's own jitted update on synthetic batches of the
env's shapes (no actors, no server), so the figure is the learner's capacity
by itself; the SEED loop goes at the smallest of this, the inference capacity
and the actors' stepping (ARCHITECTURE.md section 9, `bench throughput`).

Figures:
  * train_steps_per_second: jitted updates per second;
  * learner_frames_per_second: new env frames those updates consume per
    second (a batch trained on `reuse` times counts its frames once; R2D2's
    steps each count batch x trace_length / replay_ratio);
  * macs_per_trained_frame: multiply-accumulates of one update (XLA's cost
    analysis: flops / 2) per new env frame;
  * inference_*: the same for the policy at the server's batch size for the
    run's actors (one call per batch of env steps).
"""

from __future__ import annotations

import time

import jax
import numpy as np

# Each measurement takes at least this many calls, however long they are.
MIN_CALLS = 3


def synthetic_batch(agent, spec, batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A training batch of the stored sequences' shapes with random contents
    (observations as the env's dtype, actions within the action space), plus
    the replay's importance weights and indices for agents that sample
    replay (their update reads them)."""
    from seedq import schema

    batch = {}
    for name, field in schema.stored_sequence_shapes(agent, spec).items():
        shape, dtype = (batch_size, *field.shape), np.dtype(field.dtype)
        if name == "action" and spec.discrete:
            batch[name] = rng.integers(0, spec.num_actions, shape).astype(dtype)
        elif dtype == np.uint8:
            batch[name] = rng.integers(0, 256, shape).astype(dtype)
        elif dtype.kind == "f":
            batch[name] = rng.standard_normal(shape).astype(dtype)
        else:
            batch[name] = np.zeros(shape, dtype)
    if agent.samples_replay:
        batch["weights"] = np.ones(batch_size, np.float32)
        batch["indices"] = np.arange(batch_size, dtype=np.int32)
    return batch


def compiled_macs(jitted, *args) -> float | None:
    """Multiply-accumulates of one call of `jitted` on `args` by XLA's cost
    analysis (flops / 2), or None where the backend gives none."""
    analysis = jitted.lower(*args).compile().cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older JAX: one dict per computation
        analysis = analysis[0] if analysis else None
    flops = (analysis or {}).get("flops")
    return float(flops) / 2 if flops and flops > 0 else None


def calls_per_second(call, seconds: float) -> float:
    """Calls of `call` (which blocks until its result is ready) per second over
    at least `seconds` and MIN_CALLS calls, after one untimed call."""
    call()
    calls, started = 0, time.perf_counter()
    while calls < MIN_CALLS or time.perf_counter() - started < seconds:
        call()
        calls += 1
    return calls / (time.perf_counter() - started)


def measure_training(config, agent, spec, seconds: float, seed: int = 0) -> dict:
    """Train steps/s, learner frames/s and MACs per trained frame of `agent`'s
    update on synthetic batches (one device: the first of this host's)."""
    batch_size = config.training_batch[1]
    batch = synthetic_batch(agent, spec, batch_size, np.random.default_rng(seed))
    update = jax.jit(agent.update)
    state = jax.jit(agent.init)(jax.random.PRNGKey(seed))
    macs = compiled_macs(update, state, batch)
    batch = jax.device_put(batch)
    holder = [state]

    def step():
        holder[0], _ = update(holder[0], batch)
        jax.block_until_ready(holder[0])

    steps = calls_per_second(step, seconds)
    frames_per_step = config.new_frames_per_train_step
    return {
        "train_batch": batch_size,
        "frames_per_train_step": frames_per_step,
        "train_steps_per_second": steps,
        "learner_frames_per_second": steps * frames_per_step,
        "macs_per_trained_frame": macs / frames_per_step if macs else None,
    }


def inference_batch_size(config) -> int:
    """The padded batch the server runs when every env of the run's actors
    steps at once (its smallest bucket that fits, as seedq.server.inference)."""
    from seedq.server.inference import bucket_sizes

    envs = config.num_actors * config.envs_per_actor
    return next((b for b in bucket_sizes(config.server.max_batch_size) if b >= envs), envs)


def measure_inference(config, agent, spec, seconds: float, seed: int = 0) -> dict:
    """Inference calls/s, frames/s and MACs per inferred frame at the run's
    precision and the server's batch size for the run's envs."""
    from seedq.quant.mode import InferencePrecision

    n = inference_batch_size(config)
    rng = np.random.default_rng(seed)
    state = jax.jit(agent.init)(jax.random.PRNGKey(seed))
    precision = InferencePrecision(agent, spec, config.precision)
    params = precision.publish(agent.inference_params(state))
    if np.dtype(spec.obs_dtype) == np.uint8:
        obs = rng.integers(0, 256, (n, *spec.obs_shape)).astype(np.uint8)
    else:
        obs = rng.standard_normal((n, *spec.obs_shape)).astype(spec.obs_dtype)
    first = np.zeros(n, bool)
    core = agent.initial_core_state(n)
    inputs = agent.actor_inputs(np.arange(n))
    act = jax.jit(precision.act)
    key = jax.random.PRNGKey(seed)
    macs = compiled_macs(act, params, key, obs, first, core, inputs)

    def call():
        jax.block_until_ready(act(params, key, obs, first, core, inputs))

    calls = calls_per_second(call, seconds)
    return {
        "inference_batch": n,
        "inference_calls_per_second": calls,
        "inference_frames_per_second": calls * n,
        "macs_per_inference_frame": macs / n if macs else None,
    }


def run(config, seconds: float = 5.0) -> dict:
    """Both measurements for a validated TrainConfig (resolved as `seedq train`
    resolves it), with the config figures they depend on."""
    from seedq.process import jax_setup
    from seedq.agents import make_agent
    from seedq.envs import env_spec

    jax_setup.configure()
    spec = env_spec(config.env, config.env_options)
    agent = make_agent(config, spec)
    result = {
        "env": config.env,
        "agent": config.agent,
        "network": agent.network_name,
        "observation_shape": list(spec.obs_shape),
        "precision": config.precision,
        "device": str(jax.devices()[0]),
        **learner_fields(config),
    }
    result.update(measure_training(config, agent, spec, seconds, config.seed))
    result.update(measure_inference(config, agent, spec, seconds, config.seed))
    return result


def learner_fields(config) -> dict:
    """{"vtrace.reuse": 1, ...}: the run's agent fields that set the learner's work per frame."""
    section = config.agent_section
    return {f"{config.agent}.{k}": getattr(section, k) for k in section.WORK_PER_FRAME_FIELDS}


def format_table(result: dict) -> str:
    """The result as aligned `name: value` lines."""
    return "\n".join(f"{key:>32}: {value}" for key, value in result.items())
