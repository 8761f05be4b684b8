"""Writes a tiny checkpoint of each agent with whatever seedq is on the path,
for tests that restore a learner state saved by an older seedq.

    PYTHONPATH=<checkout of the older seedq> python tools/make_state_checkpoints.py OUT_DIR

OUT_DIR/<agent>/ gets a run's `checkpoints/` (CartPole's spec, small
networks, three updates on fixed random batches, no replay). The committed
copies in tests/data/state_layout0/ were written by commit 860a8cb^, whose
V-trace kept the annealed rate's own count in Adam's state.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import jax
import numpy as np

from seedq import checkpoint, config, schema
from seedq.agents import make_agent

UPDATES = 3


def tiny_config(agent: str):
    """A CartPole run of `agent` with small networks and an annealed rate."""
    base = config.TrainConfig(agent=agent, num_actors=1, envs_per_actor=4, max_frames=100_000)
    if agent == "vtrace":
        return dataclasses.replace(base, vtrace=dataclasses.replace(
            base.vtrace, hidden_sizes=(8,), batch_size=2, unroll_length=4, lookahead=2))
    return dataclasses.replace(base, r2d2=dataclasses.replace(
        base.r2d2, hidden_sizes=(8,), lstm_size=8, head_hidden_size=8, batch_size=2, burn_in=2, trace_length=4,
        n_step=2, checkpoint_replay=False))


def random_batch(agent, spec, source, seed: int) -> dict:
    """A batch of the update's shapes (the source's example where it has one:
    replay's weights and indices) with random observations, rewards and actions."""
    rng = np.random.default_rng(seed)
    batch = getattr(source, "example_batch", lambda: None)()  # (older seedqs: replay sources only)
    if batch is None:
        batch = {name: np.zeros((source.batch_size, *f.shape), f.dtype)
                 for name, f in schema.stored_sequence_shapes(agent, spec).items()}
    batch = dict(batch)
    for name in ("obs", "reward"):
        batch[name] = rng.normal(size=batch[name].shape).astype(batch[name].dtype)
    batch["action"] = rng.integers(0, spec.num_actions, batch["action"].shape).astype(batch["action"].dtype)
    return batch


def write(agent_name: str, out_dir: str) -> None:
    from seedq.envs import env_spec

    cfg = tiny_config(agent_name)
    spec = env_spec(cfg.env)
    agent = make_agent(cfg, spec)
    state = agent.init(jax.random.PRNGKey(0))
    source = agent.make_batch_source(None)
    update = jax.jit(agent.update)
    for i in range(UPDATES):
        state, _ = update(state, random_batch(agent, spec, source, seed=i))
    writer = checkpoint.CheckpointWriter(os.path.join(out_dir, agent_name), keep=1, asynchronous=False)
    counters = {"train_steps": UPDATES, "trained_frames": 0, "frames": 0, "episodes": 0, "policy_version": UPDATES,
                "elapsed_seconds": 0.0}
    writer.save(checkpoint.Snapshot(
        state=jax.device_get(state), rng=np.asarray(jax.random.PRNGKey(1)), counters=counters,
        episode_window={"returns": [], "lengths": []}, target={}, config=config.saved_dict(cfg),
    ), wait=True)
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    args = parser.parse_args()
    for agent_name in ("vtrace", "r2d2"):
        write(agent_name, args.out_dir)


if __name__ == "__main__":
    main()
