"""seedq.config.state_layout: learner states saved by an older seedq restore
through the migration, and train on."""

from __future__ import annotations

import pathlib
import shutil

import numpy as np
import pytest

from seedq.config.state_layout import STATE_LAYOUT_VERSION, migrated_state

pytestmark = pytest.mark.unit

# Written by tools/make_state_checkpoints.py with commit 860a8cb^ (layout 0):
# three updates each, V-trace's annealed rate with its own count in Adam's state.
FIXTURES = pathlib.Path(__file__).parent.parent / "data" / "state_layout0"


def _old_vtrace_tree() -> dict:
    adam = {"count": np.int32(3), "mu": {"w": np.ones(2)}, "nu": {"w": np.ones(2)}}
    return {"learner": {"params": {"w": np.ones(2)}, "opt_state": {"0": {}, "1": {"0": adam, "1": {"count": 3}}},
                        "step": np.int32(3)}, "rng": np.zeros(2)}


def test_layout_0_drops_the_schedules_own_count_and_keeps_everything_else():
    old = _old_vtrace_tree()
    new = migrated_state(old, 0)
    assert new["learner"]["opt_state"]["1"]["1"] == {}
    assert new["learner"]["opt_state"]["1"]["0"] is old["learner"]["opt_state"]["1"]["0"]
    assert new["learner"]["params"] is old["learner"]["params"] and new["rng"] is old["rng"]
    assert old["learner"]["opt_state"]["1"]["1"] == {"count": 3}  # the saved tree is not changed in place
    assert migrated_state(new, STATE_LAYOUT_VERSION) is new


def test_a_newer_or_malformed_layout_is_refused_in_one_line():
    for version, words in ((STATE_LAYOUT_VERSION + 1, "newer than this seedq"), ("1", "expected a layout number")):
        with pytest.raises(ValueError, match=words) as raised:
            migrated_state(_old_vtrace_tree(), version)
        assert "\n" not in str(raised.value)


@pytest.mark.parametrize("agent_name", ["vtrace", "r2d2"])
def test_a_checkpoint_of_the_older_layout_restores_and_trains_on(agent_name, tmp_path):
    import jax

    from seedq import checkpoint, config, schema
    from seedq.agents import make_agent
    from seedq.envs import env_spec

    run_dir = tmp_path / agent_name
    shutil.copytree(FIXTURES / agent_name, run_dir)
    meta, _ = checkpoint.read_meta(str(run_dir))
    assert checkpoint.STATE_LAYOUT_KEY not in meta  # written before the layout was recorded
    cfg = config.from_saved(meta["config"])
    spec = env_spec(cfg.env)
    agent = make_agent(cfg, spec)
    like = agent.init(jax.random.PRNGKey(5))
    snapshot, _ = checkpoint.restore(str(run_dir), like, jax.random.PRNGKey(0), env=cfg.env)
    state = snapshot.state
    assert int(state.step) == 3 and int(state.opt_state[1][0].count) == 3
    assert jax.tree.structure(state) == jax.tree.structure(like)
    # The saved parameters and moments, not the fresh ones.
    assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(like.params)))
    assert any(np.any(leaf != 0) for leaf in jax.tree.leaves(state.opt_state[1][0].nu))  # fresh: all 0

    batch = agent.make_batch_source(None).example_batch()
    if batch is None:
        batch = {name: np.zeros((agent.config.batch_size, *f.shape), f.dtype)
                 for name, f in schema.stored_sequence_shapes(agent, spec).items()}
    new, metrics = jax.jit(agent.update)(state, batch)
    assert int(new.step) == 4
    # The anneal goes on from the saved step (max_frames 100k: well inside the horizon).
    assert float(metrics["learning_rate"]) == pytest.approx(float(agent.learning_rate(3)))
    assert float(agent.learning_rate(3)) < cfg.agent_section.learning_rate
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(new.params))
